"""The task protocol: a deterministic, seekable stream of problems."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str
    # What a supervised warm-up would imitate; tasks without one leave it empty.
    solution: str = ""
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


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
