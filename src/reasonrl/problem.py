"""``Problem``: one prompt with its answer, the unit every task yields and every reward scores.

It lives below tasks and rewards alike (a reward reads a problem; a task makes them), so neither
imports the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Problem"]


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str
    # What a supervised warm-up would imitate; tasks without one leave it empty.
    solution: str = ""
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
