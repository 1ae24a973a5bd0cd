"""``hindsight_regret``: measures macro2mind's per-example regret by sampling the current policy
on each prompt's hindsight variant, and hands it to the prompt sampler (arXiv 2610.07062,
https://arxiv.org/abs/2610.07062, INFERRED; ``docs/methods/hindsight_regret.md``)::

    methods:
      - {name: hindsight_regret, num_hindsight: 4}
    sampler: {name: regret_curriculum}

Each step, in ``annotate`` (after scoring, before the update, so both sides are answers of the
same policy version), for every group of the batch whose problem carries
``meta["hindsight_prompt"]`` (the same input plus what is known only with the outcome; the
``forecast`` task's training problems do, eval problems never):

1. ``num_hindsight`` completions are sampled by the current policy on the hindsight prompt (the
   run's generator, so a resumed run samples the same) and scored by the run's scorer against
   the same problem (answer, meta);
2. regret(x) = ℓ̄(policy answers) − ℓ̄(hindsight answers), ℓ = 1 − r
   (``algos.regret.hindsight_regret``), the policy answers being the group's own rollouts;
3. the regrets go to the prompt sampler's ``record_regrets`` (``regret_curriculum`` weights its
   next draws by them); with another sampler they are only logged.

The batch itself is untouched: hindsight answers are never trained on. They are extra sampling
cost, logged as ``hindsight/samples`` and ``hindsight/tokens`` per step. Other metrics:
``hindsight/regret`` (mean), ``hindsight/regret_positive`` (share > 0), ``hindsight/reward`` and
``hindsight/policy_reward`` (mean rewards of both sides), ``hindsight/covered`` (share of groups
with a hindsight prompt). The method holds no state of its own (its draws come from the run's
generator, which the checkpoint restores).
"""

from __future__ import annotations

from typing import Annotated, Any

import torch

from reasonrl.methods.hindsight_regret.maths import hindsight_regret
from reasonrl.batch import RolloutBatch
from reasonrl.hooks import Method, MethodContext, learner_scorer, need_learner_scorer
from reasonrl.params import Range
from reasonrl.policy.sampling import right_pad
from reasonrl.registry import METHODS
from reasonrl.problem import Problem

__all__ = ["HindsightRegret", "HINDSIGHT_KEY"]

HINDSIGHT_KEY = "hindsight_prompt"  # the Problem.meta key of the hindsight prompt (training problems only)


@METHODS.register("hindsight_regret")
class HindsightRegret(Method):
    def __init__(self, num_hindsight: Annotated[int, Range(ge=1, why="hindsight samples per prompt")] = 4) -> None:
        """``num_hindsight``: completions sampled on each prompt's hindsight variant (extra
        sampling cost: num_hindsight per trained prompt and step)."""
        self.num_hindsight = num_hindsight

    @classmethod
    def check(cls, recipe: Any, need, config: Any) -> None:
        need_learner_scorer(recipe, need, "methods[hindsight_regret] samples and scores hindsight answers")
        need(recipe.env is None, "methods[hindsight_regret] samples single completions; an env's episodes are "
                                 "not: drop the env")

    def setup(self, ctx: MethodContext) -> None:
        learner_scorer(ctx, "hindsight_regret", "hindsight answers")
        from reasonrl.rollout.collect import stop_strings

        self.policy, self.scorer, self.generator, self.recipe = ctx.policy, ctx.scorer, ctx.generator, ctx.recipe
        self.stop = stop_strings(ctx.recipe, ctx.task)
        self.sink = getattr(ctx.sampler, "record_regrets", None)  # None: another sampler, regrets only logged

    def annotate(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        problems = batch.meta.get("problem")
        if problems is None or not len(batch):
            return {}
        rows: dict[int, list[int]] = {}
        for i, g in enumerate(batch.group_ids.tolist()):
            rows.setdefault(g, []).append(i)
        groups = [(g, idx) for g, idx in rows.items() if HINDSIGHT_KEY in problems[idx[0]].meta]
        covered = len(groups) / len(rows)
        if not groups:
            raise ValueError(f"method 'hindsight_regret': no problem of step {step} carries "
                             f"meta['{HINDSIGHT_KEY}']; the task '{self.recipe.task.name}' gives no hindsight "
                             "prompts (the forecast task does)")
        h, ro = self.num_hindsight, self.recipe.rollout
        originals = [problems[idx[0]] for _, idx in groups]
        hindsight = [Problem(p.meta[HINDSIGHT_KEY], p.answer, p.solution, p.meta) for p in originals]
        samples = self.policy.sample([p.prompt for p in hindsight], h, ro.max_new_tokens, ro.temperature,
                                     self.generator, self.stop)
        num_tokens = samples.completion_mask.sum(-1).tolist()
        scores = self.scorer(samples.texts, [p for p in hindsight for _ in range(h)], num_tokens,
                             samples.truncated.tolist(), group_size=h)
        hind = torch.tensor(scores.total, dtype=torch.float64).view(len(groups), h)
        policy, mask = right_pad([batch.rewards[idx].double() for _, idx in groups])
        regret = hindsight_regret(policy, hind, policy_mask=mask)
        if self.sink is not None:
            self.sink({p.prompt: float(r) for p, r in zip(originals, regret)})
        return {"hindsight/regret": float(regret.mean()), "hindsight/regret_positive": float((regret > 0).double().mean()),
                "hindsight/reward": float(hind.mean()),
                "hindsight/policy_reward": float((policy * mask).sum() / mask.sum()),
                "hindsight/covered": covered, "hindsight/samples": float(len(groups) * h),
                "hindsight/tokens": float(sum(num_tokens))}
