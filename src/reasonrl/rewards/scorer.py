"""The scoring stage: weighted sum of reward functions, with failures isolated.

r_i = Σ_k w_k · R_k(o_i)  (TRL's convention). A reward function that raises or
returns NaN/inf gives that sample 0 for that function and increments a
per-function failure count; ``None`` counts as "no opinion" (0, not a failure).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

from reasonrl.registry import REWARDS
from reasonrl.tasks.base import Problem


@dataclass
class RewardSpec:
    name: str
    weight: float = 1.0
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class Scores:
    total: list[float]
    per_function: dict[str, list[float]]
    failures: dict[str, int]


def group_reward(fn: Callable) -> Callable:
    """Mark a reward function as group-level: it scores all G completions of one prompt
    together (e.g. a coverage reward that pays for distinct correct answers)::

        fn(completions: list[str], problem: Problem, *, num_tokens: list[int],
           truncated: list[bool], **params) -> list[float]
    """
    fn.group_reward = True
    return fn


class Scorer:
    def __init__(self, specs: list[RewardSpec]) -> None:
        if not specs:
            raise ValueError("rewards: at least one reward function is required")
        self.specs = specs
        self.fns: list[Callable] = [REWARDS.get(s.name) for s in specs]
        self._warned: set[str] = set()

    def __call__(self, completions: list[str], problems: list[Problem], num_tokens: list[int],
                 truncated: list[bool], group_size: int = 1) -> Scores:
        """Rows ``[k·group_size, (k+1)·group_size)`` answer one problem (the sampler's layout)."""
        per_fn: dict[str, list[float]] = {}
        failures: dict[str, int] = {}
        for spec, fn in zip(self.specs, self.fns):
            score = self._score_groups if getattr(fn, "group_reward", False) else self._score_each
            per_fn[spec.name], failures[spec.name] = score(spec, fn, completions, problems, num_tokens, truncated,
                                                           group_size)
        total = [sum(s.weight * per_fn[s.name][i] for s in self.specs) for i in range(len(completions))]
        return Scores(total=total, per_function=per_fn, failures=failures)

    def _score_each(self, spec, fn, completions, problems, num_tokens, truncated, _) -> tuple[list[float], int]:
        values, failed = [], 0
        for text, problem, n, trunc in zip(completions, problems, num_tokens, truncated):
            try:
                values.append(_checked(fn(text, problem, num_tokens=n, truncated=trunc, **spec.params)))
            except Exception as exc:  # noqa: BLE001 — isolation is the point
                failed += 1
                values.append(0.0)
                self._warn(spec.name, exc)
        return values, failed

    def _score_groups(self, spec, fn, completions, problems, num_tokens, truncated,
                      group_size) -> tuple[list[float], int]:
        values, failed = [], 0
        for start in range(0, len(completions), group_size):
            end = min(start + group_size, len(completions))
            try:
                group = fn(completions[start:end], problems[start], num_tokens=num_tokens[start:end],
                           truncated=truncated[start:end], **spec.params)
                if len(group) != end - start:
                    raise ValueError(f"returned {len(group)} rewards for a group of {end - start}")
                values += [_checked(v) for v in group]
            except Exception as exc:  # noqa: BLE001
                failed += end - start
                values += [0.0] * (end - start)
                self._warn(spec.name, exc)
        return values, failed

    def _warn(self, name: str, exc: Exception) -> None:
        if name not in self._warned:
            self._warned.add(name)
            warnings.warn(f"reward '{name}' failed ({type(exc).__name__}: {exc}); "
                          "scoring 0 for that sample and counting failures", stacklevel=3)


def _checked(value: Any) -> float:
    value = 0.0 if value is None else float(value)
    if not math.isfinite(value):
        raise ValueError(f"non-finite reward {value}")
    return value
