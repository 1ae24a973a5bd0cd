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


class Scorer:
    def __init__(self, specs: list[RewardSpec]) -> None:
        if not specs:
            raise ValueError("rewards: at least one reward function is required")
        self.specs = specs
        self.fns: list[Callable] = [REWARDS.get(s.name) for s in specs]
        self._warned: set[str] = set()

    def __call__(self, completions: list[str], problems: list[Problem], num_tokens: list[int],
                 truncated: list[bool]) -> Scores:
        per_fn: dict[str, list[float]] = {}
        failures: dict[str, int] = {}
        for spec, fn in zip(self.specs, self.fns):
            values, failed = [], 0
            for text, problem, n, trunc in zip(completions, problems, num_tokens, truncated):
                try:
                    value = fn(text, problem, num_tokens=n, truncated=trunc, **spec.params)
                    value = 0.0 if value is None else float(value)
                    if not math.isfinite(value):
                        raise ValueError(f"non-finite reward {value}")
                except Exception as exc:  # noqa: BLE001 — isolation is the point
                    failed += 1
                    value = 0.0
                    if spec.name not in self._warned:
                        self._warned.add(spec.name)
                        warnings.warn(f"reward '{spec.name}' failed ({type(exc).__name__}: {exc}); "
                                      "scoring 0 for that sample and counting failures", stacklevel=2)
                values.append(value)
            per_fn[spec.name] = values
            failures[spec.name] = failed
        total = [sum(s.weight * per_fn[s.name][i] for s in self.specs) for i in range(len(completions))]
        return Scores(total=total, per_function=per_fn, failures=failures)
