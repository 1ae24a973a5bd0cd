"""SAVER on the method hooks: paired dense and sparse views with a reliability-gated reference
reward (paper not located, arXiv id not found; INFERRED from the abstract; the maths is in
``reasonrl.methods.saver.maths``; ``docs/methods/saver.md``).

Named in the recipe's ``methods:`` list, with a task that emits each input as two problems, its
dense view and its sparse view, sharing ``meta["pair"]`` (``meta["view"]`` = ``dense`` /
``sparse``), e.g. the embedded ``grounding`` task with ``views: paired``::

    task: {name: grounding, views: paired, budget: 4}
    rewards: [{name: grounding}]
    methods: [{name: saver, coef: 0.5, tau: 0.5}]

Each view is its own problem, so it gets its own G rollouts and its own group id: GRPO normalises
the dense and the sparse group of an input separately, and both train in the same step. In
``annotate`` (after scoring, before the advantages; the dense group is already scored, so no
second sampling round is needed), for every input whose two groups are both in the batch:
ȳ_d = the dense rollout with the highest reward, ρ = IoU(ȳ_d, gold), g = 1[ρ ≥ tau] (``gate:
soft``: g = ρ), and each sparse rollout's reward gains coef · g · sim(y_s, ȳ_d). Dense rewards are
unchanged. Rows without their partner (a selection stage dropped it) are left as they are and
counted in ``saver/unpaired``.

Metrics: ``saver/pairs`` (inputs with both groups), ``saver/gate`` (mean g), ``saver/reliability``
(mean ρ), ``saver/similarity`` and ``saver/bonus`` (means of r_ref and of coef · g · r_ref over
the paired sparse rows), ``saver/iou_dense`` and ``saver/iou_sparse`` (mean span IoU with the gold
over each view's rows: the gap SAVER means to close), ``saver/unpaired``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Annotated, Any, Literal

import torch

from reasonrl.methods.saver.maths import pair_reference, span_iou
from reasonrl.batch import RolloutBatch
from reasonrl.dataflow import REWARDS
from reasonrl.hooks import Method
from reasonrl.params import Range
from reasonrl.registry import METHODS
from reasonrl.methods.saver.reward import parse_grounding

__all__ = ["SaverReference"]

PAIR, VIEW = "meta/pair", "meta/view"


@METHODS.register("saver")
class SaverReference(Method):
    @classmethod
    def declared_keys(cls, config: Any) -> dict:
        return {"annotate": ((REWARDS,), ())}

    def __init__(self, coef: Annotated[float, Range(ge=0, why="λ, the weight of the reference reward")] = 0.5,
                 tau: Annotated[float, Range(ge=0, le=1, why="τ_rel, an IoU")] = 0.5,
                 gate: Literal["hard", "soft"] = "hard",
                 agree_weight: Annotated[float, Range(ge=0)] = 1.0) -> None:
        """``coef``: λ. ``tau``: τ_rel, the IoU the best dense rollout needs for its reference to be
        trusted (``gate: hard``; ``soft`` uses g = ρ and ignores ``tau``). ``agree_weight``: the
        weight of answer agreement in sim(y_s, ȳ_d) = IoU + agree_weight · 1[â_s = â_d]."""
        self.coef, self.tau, self.soft, self.agree_weight = coef, tau, gate == "soft", agree_weight

    @classmethod
    def check(cls, recipe: Any, need, config: Any) -> None:
        from reasonrl.registry import TASKS

        try:
            task = TASKS.get(recipe.task.name)(**recipe.task.params)
        except (TypeError, ValueError) as exc:  # reported now rather than when the run has started
            need(False, f"task '{recipe.task.name}': {exc}")
            return
        need(getattr(task, "views", None) == "paired",
             f"needs a task that emits each input's dense and sparse views as a pair (e.g. task: {{name: grounding, "
             f"views: paired}}); task '{recipe.task.name}' has views={getattr(task, 'views', None)!r}")
        need(recipe.train.prompts_per_step % 2 == 0,
             f"train.prompts_per_step counts views, two per input: it must be even, got "
             f"{recipe.train.prompts_per_step}")
        need(recipe.sampler.name == "stream",
             f"needs the task's own stream of pairs (sampler: stream); sampler '{recipe.sampler.name}' chooses "
             "problems one by one and would split the pairs")

    def _prediction(self, batch: RolloutBatch, i: int):
        return None if bool(batch.truncated[i]) else parse_grounding(batch.meta["completion"][i])

    @torch.no_grad()
    def annotate(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        if PAIR not in batch.meta or VIEW not in batch.meta:
            raise ValueError("saver: the batch's rows carry no meta 'pair'/'view'; use a task that emits paired "
                             "views (task: {name: grounding, views: paired})")
        rows: dict[Any, dict[str, list[int]]] = defaultdict(lambda: {"dense": [], "sparse": []})
        for i, (pair, view) in enumerate(zip(batch.meta[PAIR], batch.meta[VIEW])):
            rows[pair][view].append(i)
        preds = [self._prediction(batch, i) for i in range(len(batch))]
        rewards = batch.rewards.tolist()
        bonus = [0.0] * len(batch)
        iou = {"dense": [], "sparse": []}
        gates, rhos, sims, unpaired = [], [], [], 0
        for views in rows.values():
            dense, sparse = views["dense"], views["sparse"]
            for view, idx in views.items():
                for i in idx:
                    gold = parse_grounding(batch.meta["problem"][i].answer)
                    iou[view].append(span_iou(preds[i][:2] if preds[i] else None, gold[:2]))
            if not dense or not sparse:
                unpaired += len(dense) + len(sparse)
                continue
            gold = parse_grounding(batch.meta["problem"][dense[0]].answer)
            ref = pair_reference([rewards[i] for i in dense], [preds[i] for i in dense], [preds[i] for i in sparse],
                                 gold, self.coef, self.tau, self.soft, self.agree_weight)
            for i, b in zip(sparse, ref.bonus):
                bonus[i] = b
            gates.append(ref.gate)
            rhos.append(ref.reliability)
            sims += ref.similarity
        batch.rewards = batch.rewards + torch.tensor(bonus, dtype=batch.rewards.dtype, device=batch.rewards.device)
        paired_bonus = [bonus[i] for v in rows.values() if v["dense"] and v["sparse"] for i in v["sparse"]]

        def mean(xs: list[float]) -> float:
            return sum(xs) / len(xs) if xs else 0.0

        return {"saver/pairs": float(len(gates)), "saver/gate": mean(gates), "saver/reliability": mean(rhos),
                "saver/similarity": mean(sims), "saver/bonus": mean(paired_bonus),
                "saver/iou_dense": mean(iou["dense"]), "saver/iou_sparse": mean(iou["sparse"]),
                "saver/unpaired": float(unpaired)}
