"""The task protocol: a deterministic, seekable stream of problems."""

from __future__ import annotations

import hashlib
from typing import Protocol

from reasonrl.problem import Problem


class Task(Protocol):
    name: str

    def train_problems(self, step: int, count: int, seed: int) -> list[Problem]:
        """Problems for one training step. A pure function of (step, count, seed), so a
        resumed run sees exactly the prompts an uninterrupted one would have seen."""

    def eval_problems(self, count: int) -> list[Problem]:
        """A fixed held-out set that never overlaps the training problems."""


def in_eval_split(text: str, eval_fraction: float) -> bool:
    """Stable train/eval assignment by a hash of the problem's text: the held-out set
    never overlaps training, on every machine and in every Python process."""
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32 < eval_fraction


MAX_DRAWS_PER_PROBLEM = 10_000


def split_draws(draw, count: int, held_out: bool, eval_fraction: float, task: str, hint: str) -> list[Problem]:
    """``count`` problems of one split from a generator of random problems: ``draw()`` until
    ``count`` of them fall on the ``held_out`` side of :func:`in_eval_split` (at most
    ``MAX_DRAWS_PER_PROBLEM`` draws per problem; else a ValueError naming the task and ``hint``)."""
    out: list[Problem] = []
    for _ in range(max(1, count) * MAX_DRAWS_PER_PROBLEM):
        if len(out) == count:
            return out
        p = draw()
        if in_eval_split(p.prompt, eval_fraction) == held_out:
            out.append(p)
    raise ValueError(f"task '{task}' found only {len(out)} of {count} {'eval' if held_out else 'train'} problems; "
                     f"{hint}")


def build_task(recipe):
    """The recipe's training task; a task that yields no problems is a recipe error."""
    from reasonrl.params import ConfigError
    from reasonrl.registry import TASKS

    try:
        task = TASKS.get(recipe.task.name)(**recipe.task.params)
        first = task.train_problems(0, 1, recipe.train.seed)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"task '{recipe.task.name}': {exc}") from None
    if not first:
        raise ConfigError(f"task '{recipe.task.name}' has no training problems")
    return task
