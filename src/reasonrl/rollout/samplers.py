"""Prompt samplers (``PROMPT_SAMPLERS``): which problems each step trains on, with feedback.

A sampler is a class built as ``cls(task=..., seed=..., **params)`` with

- ``problems(step, count, round) -> list[Problem]``: the problems of sampling round ``round``
  of training step ``step`` (dynamic sampling may ask for several rounds per step);
- ``observe(problems, rewards, step)``: after scoring, every sampled problem with the rewards
  of its G completions (``rewards[i]`` is the list for ``problems[i]``), so a curriculum or
  budget scheduler can learn from results;
- ``metrics() -> dict[str, float]``: logged with the step after its rounds (e.g. a budget
  scheduler's spend), named ``<sampler>/<metric>``;
- ``state_dict()`` / ``load_state_dict(state)``: all it has learned and every random stream it
  owns, saved in each checkpoint, so a resumed run draws exactly the prompts the
  uninterrupted run would have drawn.

A recipe chooses one with ``sampler: {name: ..., ...params}``; the default is ``stream``.
"""

from __future__ import annotations

from typing import Annotated, Any

import torch

from reasonrl.params import Range
from reasonrl.registry import PROMPT_SAMPLERS
from reasonrl.problem import Problem

__all__ = ["PromptSampler", "TaskStream", "Learnability", "build_sampler", "weighted_choice"]

# Round r of a step draws a prompt stream of its own (dynamic sampling's top-up rounds).
ROUND_SEED_STRIDE = 7919


class PromptSampler:
    """Base class: the task's stream, no feedback, no state. Subclasses override what they need."""

    def __init__(self, task: Any, seed: int = 0) -> None:
        self.task = task
        self.seed = seed

    def problems(self, step: int, count: int, round: int = 0) -> list[Problem]:
        return self.task.train_problems(step, count, self.seed + ROUND_SEED_STRIDE * round)

    def observe(self, problems: list[Problem], rewards: list[list[float]], step: int) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def build_sampler(recipe: Any, task: Any) -> PromptSampler:
    """The recipe's prompt sampler. The pipeline supplies ``task`` and ``seed`` (train.seed), and
    to a sampler that declares them ``total_steps`` (train.steps) and ``group_size``
    (rollout.num_generations): a budget over the whole run (``cero``) needs its horizon."""
    from reasonrl.params import inject

    pipeline = {"task": task, "seed": recipe.train.seed, "total_steps": recipe.train.steps,
                "group_size": recipe.rollout.num_generations}
    return inject(PROMPT_SAMPLERS.get(recipe.sampler.name), (), pipeline, recipe.sampler.params)


def weighted_choice(candidates: list[Problem], weights: torch.Tensor, count: int,
                    generator: torch.Generator) -> list[Problem]:
    """``count`` of the candidates without replacement, with probability ∝ ``weights``, in the
    stream's order (all of them when there are no more than ``count``: no draw is made)."""
    if len(candidates) <= count:
        return candidates
    chosen = torch.multinomial(weights, count, replacement=False, generator=generator)
    return [candidates[i] for i in sorted(chosen.tolist())]


@PROMPT_SAMPLERS.register("stream")
class TaskStream(PromptSampler):
    """The task's own seeded stream (``Task.train_problems(step, count, seed)``): a pure
    function of the step, so it needs no state to resume. The default."""


@PROMPT_SAMPLERS.register("learnability")
class Learnability(PromptSampler):
    """Prefer problems the policy solves sometimes: weight w = p̂(1 − p̂) + ``floor``.

    Each round draws ``pool`` × count candidates from the task's stream and keeps ``count``
    of them without replacement, with probability ∝ w, where p̂ = (S + ½)/(n + 1) is the
    smoothed mean reward of that problem's past samples (S their reward sum, n their count;
    an unseen problem has p̂ = ½, the largest weight). p(1 − p) is the variance of a 0/1
    reward, which is what a group-relative advantage learns from (a group whose answers all
    agree has zero advantage); the score is the "learnability" of Tzannetos et al. (2023)
    and Foster & Foerster (2025). Rewards outside [0, 1] are clipped into it for p̂.
    """

    def __init__(self, task: Any, seed: int = 0, pool: Annotated[int, Range(ge=1)] = 4,
                 floor: Annotated[float, Range(ge=0)] = 0.01) -> None:
        super().__init__(task, seed)
        self.pool, self.floor = pool, floor
        self.stats: dict[str, list[float]] = {}  # prompt -> [reward sum, count]
        self.generator = torch.Generator().manual_seed(seed + 104729)

    def weight(self, problem: Problem) -> float:
        s, n = self.stats.get(problem.prompt, (0.0, 0))
        p = (s + 0.5) / (n + 1.0)
        return p * (1.0 - p) + self.floor

    def problems(self, step: int, count: int, round: int = 0) -> list[Problem]:
        candidates = super().problems(step, count * self.pool, round)
        weights = torch.tensor([self.weight(p) for p in candidates], dtype=torch.float64)
        return weighted_choice(candidates, weights, count, self.generator)

    def observe(self, problems: list[Problem], rewards: list[list[float]], step: int) -> None:
        for problem, values in zip(problems, rewards):
            entry = self.stats.setdefault(problem.prompt, [0.0, 0])
            entry[0] += sum(min(1.0, max(0.0, v)) for v in values)
            entry[1] += len(values)

    def state_dict(self) -> dict[str, Any]:
        return {"stats": {k: list(v) for k, v in self.stats.items()}, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stats = {k: list(v) for k, v in state["stats"].items()}
        self.generator.set_state(state["generator"])
