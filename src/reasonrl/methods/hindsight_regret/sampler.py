"""``regret_curriculum``: macro2mind's hindsight-regret curriculum with difficulty-aware weights
(arXiv 2610.07062, https://arxiv.org/abs/2610.07062, INFERRED; ``docs/methods/hindsight_regret.md``)::

    w(x) = ([regret(x)]₊ + floor) · 4 p̂_x (1 − p̂_x)          (algos.regret.curriculum_weight)

- p̂_x: the success rate of x's **last** observed group (the current policy's), a sample
  succeeding when its reward ≥ ``success_threshold``; x with p̂_x ∈ {0, 1} is dropped (w = 0);
- regret(x): the last regret the ``hindsight_regret`` method reported for x
  (``record_regrets``), r̄(hindsight answers) − r̄(policy answers);
- an unseen x (no group observed yet) counts as typical and learnable: p̂ = ½ and the mean of
  the regrets known so far (0 before any), so the pool is explored first; a seen x without a
  regret yet (its group was dropped before the method ran) takes that same mean regret.

Each round draws ``pool`` × count candidates from the task's stream and keeps ``count`` of them
without replacement with probability ∝ w (``rollout.samplers.weighted_choice``). A dropped candidate
keeps the weight ``DROPPED`` (1e-12), so it is chosen only when fewer than ``count`` candidates
survive: a step always gets its prompts.

Needs the method ``hindsight_regret`` (the regrets come from sampling the policy on hindsight
prompts, which a sampler cannot do): a recipe without it is refused at load (``check_recipe``),
and a sampler that never receives regrets fails at step 1 with the same message.

Metrics (each step): ``regret/mean`` (mean regret of the prompts with one), ``regret/known``
(how many), ``regret/dropped`` (share of candidates at p̂ ∈ {0, 1}), ``regret/unseen`` (share
of candidates never observed), ``regret/weight_chosen`` and ``regret/weight_candidates`` (mean
w of the chosen and of all candidates; chosen > candidates shows the curriculum choosing).
"""

from __future__ import annotations

from typing import Annotated, Any

import torch

from reasonrl.methods.hindsight_regret.maths import curriculum_weight, success_rate
from reasonrl.params import Range
from reasonrl.registry import PROMPT_SAMPLERS
from reasonrl.rollout.samplers import Learnability, PromptSampler, weighted_choice
from reasonrl.problem import Problem

__all__ = ["RegretCurriculum", "DROPPED"]

DROPPED = 1e-12  # a dropped candidate's weight: chosen only when too few others survive


@PROMPT_SAMPLERS.register("regret_curriculum")
class RegretCurriculum(Learnability):
    def __init__(self, task: Any, seed: int = 0,
                 pool: Annotated[int, Range(ge=1, why="candidates drawn per prompt kept")] = 4,
                 floor: Annotated[float, Range(ge=0, why="added to the clipped regret")] = 0.01,
                 success_threshold: float = 1.0) -> None:
        """``pool``: candidates drawn per prompt kept. ``floor``: added to [regret]₊ so a
        learnable prompt with zero regret keeps a small chance. ``success_threshold``: a sample
        succeeds when its reward is ≥ this (1.0: the ``forecast`` reward's right direction, a
        0/1 reward's hit)."""
        super().__init__(task, seed, pool=pool, floor=floor)
        self.success_threshold = success_threshold
        self.success: dict[str, float] = {}  # prompt -> p̂ of its last group
        self.regrets: dict[str, float] = {}  # prompt -> its last reported regret
        self.reported = False  # the method has called record_regrets at least once
        self._reset_step()

    @classmethod
    def check_recipe(cls, recipe: Any, need: Any) -> None:
        """Load-time rule (``config._check_semantics``): the regrets come from the method."""
        need(any(m.name == "hindsight_regret" for m in recipe.methods),
             "sampler 'regret_curriculum' weights prompts by regrets that the method 'hindsight_regret' measures; "
             "add `methods: [{name: hindsight_regret}]`")

    def _reset_step(self) -> None:
        self.step_stats = {"candidates": 0, "dropped": 0, "unseen": 0, "w_candidates": 0.0, "chosen": 0,
                           "w_chosen": 0.0}

    # -- the weights ---------------------------------------------------------------------------
    def mean_regret(self) -> float:
        return sum(self.regrets.values()) / len(self.regrets) if self.regrets else 0.0

    def weights(self, problems: list[Problem]) -> torch.Tensor:
        """w of each problem (0 for a dropped one), float64."""
        default = self.mean_regret()
        p = torch.tensor([self.success.get(x.prompt, 0.5) for x in problems], dtype=torch.float64)
        regret = torch.tensor([self.regrets.get(x.prompt, default) for x in problems], dtype=torch.float64)
        return curriculum_weight(regret, p, self.floor)

    def problems(self, step: int, count: int, round: int = 0) -> list[Problem]:
        if step >= 1 and self.success and not self.reported:
            raise ValueError("sampler 'regret_curriculum' has received no regrets: it needs the method that "
                             "measures them; add `methods: [{name: hindsight_regret}]` to the recipe")
        candidates = PromptSampler.problems(self, step, count * self.pool, round)
        w = self.weights(candidates)
        chosen = weighted_choice(candidates, w.clamp_min(DROPPED), count, self.generator)
        s = self.step_stats
        s["candidates"] += len(candidates)
        s["dropped"] += int(sum(1 for x in candidates if self.success.get(x.prompt) in (0.0, 1.0)))
        s["unseen"] += int(sum(1 for x in candidates if x.prompt not in self.success))
        s["w_candidates"] += float(w.sum())
        s["chosen"] += len(chosen)
        s["w_chosen"] += float(self.weights(chosen).sum())
        return chosen

    # -- feedback ------------------------------------------------------------------------------
    def observe(self, problems: list[Problem], rewards: list[list[float]], step: int) -> None:
        for problem, values in zip(problems, rewards):
            if values:
                self.success[problem.prompt] = float(success_rate(torch.tensor([values]), self.success_threshold)[0])

    def record_regrets(self, regrets: dict[str, float]) -> None:
        """The ``hindsight_regret`` method's per-prompt regrets of this step (prompt text → regret)."""
        self.reported = True
        self.regrets.update({k: float(v) for k, v in regrets.items()})

    def metrics(self) -> dict[str, float]:
        s = self.step_stats
        out = {"regret/mean": self.mean_regret(), "regret/known": float(len(self.regrets))}
        if s["candidates"]:
            out.update({"regret/dropped": s["dropped"] / s["candidates"], "regret/unseen": s["unseen"] / s["candidates"],
                        "regret/weight_candidates": s["w_candidates"] / s["candidates"],
                        "regret/weight_chosen": s["w_chosen"] / max(1, s["chosen"])})
        self._reset_step()
        return out

    # -- exact resume --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "success": dict(self.success), "regrets": dict(self.regrets),
                "reported": self.reported, "step_stats": dict(self.step_stats)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.success, self.regrets = dict(state["success"]), dict(state["regrets"])
        self.reported, self.step_stats = state["reported"], dict(state["step_stats"])
