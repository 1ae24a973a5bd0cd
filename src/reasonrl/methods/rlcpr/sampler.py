"""``uncertainty``: a prompt sampler that prefers prompts whose group rewards disagree.

RLCPR's uncertainty-aware data sampling (INFERRED, after RLPR's std filter; RLCPR itself has
no paper, abstract or code that could be found): a prompt is worth training on while its G
rewards still spread, since a group-relative advantage is (r_i − mean)/std and a group that
agrees teaches nothing. Under the posterior concentration phenomenon the spread of
probability rewards shrinks as training goes on, so the sampler keeps looking for prompts
where it has not::

    w(x) ∝ σ̂(x) + floor        σ̂(x) = the unbiased std of x's last recorded group rewards
    drop x when σ̂(x) < scale · τ_σ,   τ_σ ← (1 − ema)·τ_σ + ema · mean_groups σ      (per update)

Each sampling round draws ``pool`` × count candidates from the task's stream and keeps
``count`` of them without replacement with probability ∝ w. An unseen prompt counts as
typical: σ̂ = τ_σ (before anything is recorded τ_σ = 0 and every candidate weighs ``floor``:
uniform). Dropped candidates weigh 0, unless fewer than ``count`` candidates survive, when
they come back with weight ``floor`` (a step always gets its prompts).

Which rewards it learns from (``feedback``):

- ``method`` (the default): the probability reward of the ``rlcpr`` method, handed over by the
  method in its ``annotate`` (``record_rewards``) once it has scored the step's groups: the
  rewards it writes for the advantage, coef · r_final (r̃ itself when the length penalty is
  off). The scorer's rewards (``observe``) are ignored, so a verifier in the recipe's
  ``rewards:`` never steers the prompts: the verifier-free arm stays verifier-free. Needs the
  ``rlcpr`` method (refused at load without it). Groups a selector drops before ``annotate``
  are not recorded (they keep their last σ̂, or count as unseen).
- ``scorer``: the rewards the scorer gives each group (``observe``), e.g. ``exact_answer``,
  whose group std is √(p̂(1 − p̂)·G/(G − 1)), the p̄(1 − p̄) alternative. With a verifier
  among the rewards, this reads it: not verifier-free.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import torch

from reasonrl.algos.selection import one_group_reward_std
from reasonrl.params import Range
from reasonrl.registry import PROMPT_SAMPLERS
from reasonrl.rollout.samplers import PromptSampler, weighted_choice
from reasonrl.problem import Problem

__all__ = ["UncertaintySampler"]


@PROMPT_SAMPLERS.register("uncertainty")
class UncertaintySampler(PromptSampler):
    def __init__(self, task: Any, seed: int = 0,
                 pool: Annotated[int, Range(ge=1, why="candidates drawn per prompt kept")] = 4,
                 floor: Annotated[float, Range(gt=0, why="every candidate keeps a chance")] = 0.01,
                 ema: Annotated[float, Range(gt=0, le=1, why="the threshold's EMA rate")] = 0.1,
                 scale: Annotated[float, Range(ge=0, why="drop below scale · τ_σ; 0 drops nothing")] = 0.5,
                 feedback: Literal["method", "scorer"] = "method") -> None:
        """``pool``: candidates drawn per prompt kept. ``floor``: added to every weight.
        ``ema``: the rate of τ_σ, the running mean group std. ``scale``: a seen prompt whose
        σ̂ < scale · τ_σ is dropped (0: none is). ``feedback``: learn from the ``rlcpr``
        method's probability rewards (``method``, verifier-free) or from the scorer's
        rewards (``scorer``)."""
        super().__init__(task, seed)
        self.pool, self.floor, self.ema, self.scale, self.feedback = pool, floor, ema, scale, feedback
        self.stds: dict[str, float] = {}  # prompt -> σ̂ of its last group
        self.tau: float | None = None  # τ_σ; None before the first update
        self.generator = torch.Generator().manual_seed(seed + 130363)

    @classmethod
    def check_recipe(cls, recipe: Any, need: Any) -> None:
        """Load-time rule (``recipe._check_semantics``): method feedback comes from ``rlcpr``."""
        if recipe.sampler.params.get("feedback", "method") == "method":
            need(any(m.name == "rlcpr" for m in recipe.methods),
                 "sampler 'uncertainty' (feedback: method) learns from the probability rewards of the method "
                 "'rlcpr'; add `methods: [{name: rlcpr}]`, or set `sampler.feedback: scorer` to learn from the "
                 "recipe's reward functions")

    def weight(self, problem: Problem) -> float:
        """w(x) (0 for a dropped prompt; see the module docstring)."""
        tau = self.tau or 0.0
        sigma = self.stds.get(problem.prompt)
        if sigma is None:
            return tau + self.floor
        return 0.0 if sigma < self.scale * tau else sigma + self.floor

    def problems(self, step: int, count: int, round: int = 0) -> list[Problem]:
        candidates = super().problems(step, count * self.pool, round)
        weights = torch.tensor([self.weight(p) for p in candidates], dtype=torch.float64)
        if int((weights > 0).sum()) < count:
            weights[weights == 0] = self.floor
        return weighted_choice(candidates, weights, count, self.generator)

    def _update(self, prompts: list[str], rewards: list[list[float]]) -> None:
        if not prompts:
            return
        stds = [one_group_reward_std(values) for values in rewards]
        for prompt, sigma in zip(prompts, stds):
            self.stds[prompt] = sigma
        mean = sum(stds) / len(stds)
        self.tau = mean if self.tau is None else (1.0 - self.ema) * self.tau + self.ema * mean

    def observe(self, problems: list[Problem], rewards: list[list[float]], step: int) -> None:
        """The scorer's rewards: learnt from with ``feedback: scorer`` only."""
        if self.feedback == "scorer":
            self._update([p.prompt for p in problems], rewards)

    def record_rewards(self, prompts: list[str], rewards: list[list[float]]) -> None:
        """The ``rlcpr`` method's rewards of the step's groups (prompt text, its rows' rewards):
        learnt from with ``feedback: method`` only."""
        if self.feedback == "method":
            self._update(prompts, rewards)

    def state_dict(self) -> dict[str, Any]:
        return {"stds": dict(self.stds), "tau": self.tau, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stds = dict(state["stds"])
        self.tau = state["tau"]
        self.generator.set_state(state["generator"])
