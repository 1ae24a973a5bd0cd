"""ARG's two prefix selectors, one state shared by all questions (maths in
``reasonrl.methods.arg.maths``):

- ``surprisal`` (the paper's criterion, the default): EXP3 over the bins on
  x = mean_j 1[passes_j ∧ differs_j] · S(ℓ) / S(0);
- ``success_target`` (the earlier version, kept as an ablation): a softmax bandit trained by
  REINFORCE with a moving-average baseline on u = −(p̂ − p*)².

Each step draws every guided group's bin from one distribution, then updates once with all of
the step's observations (``Observation``), so the order of groups within a step does not matter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from reasonrl.methods.arg.maths import (draw_bin, exp3_probs, exp3_update, reinforce_update, selector_probs,
                                        selector_reward, update_baseline)

__all__ = ["Observation", "Exp3Selector", "SuccessTargetSelector", "SELECTORS"]


@dataclass(frozen=True)
class Observation:
    """One guided group's outcome: its bin, the criterion's observation x ∈ [0, 1] (EXP3's
    reward) and its continuation success rate p̂ (the ablation's input)."""
    bin: int
    x: float
    success: float


class Exp3Selector:
    """EXP3 with exploration γ over B bins (uniform at the start)."""

    def __init__(self, num_bins: int, gamma: float = 0.1, **_: Any) -> None:
        self.gamma = gamma
        self.log_weights = torch.zeros(num_bins, dtype=torch.float64)

    def probs(self) -> Tensor:
        return exp3_probs(self.log_weights, self.gamma)

    def draw(self, count: int, generator: Optional[torch.Generator]) -> list[int]:
        p = self.probs()
        return [draw_bin(p, generator) for _ in range(count)]

    def update(self, observations: Sequence[Observation]) -> float:
        """Apply a step's observations; returns the mean selector reward it learned from."""
        if observations:
            self.log_weights = exp3_update(self.log_weights, [o.bin for o in observations],
                                           [o.x for o in observations], self.probs(), self.gamma)
        return sum(o.x for o in observations) / max(1, len(observations))

    def state_dict(self) -> dict[str, Any]:
        return {"log_weights": self.log_weights.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.log_weights = state["log_weights"].clone().to(torch.float64)


class SuccessTargetSelector:
    """The ablation: softmax(ψ) trained by REINFORCE on u = −(p̂ − p*)² with learning rate η and
    a moving-average baseline (decay λ; the first step uses its own mean)."""

    def __init__(self, num_bins: int, target: float = 0.5, lr: float = 5.0, baseline_decay: float = 0.9,
                 **_: Any) -> None:
        self.target, self.lr, self.decay = target, lr, baseline_decay
        self.logits = torch.zeros(num_bins, dtype=torch.float64)
        self.baseline: Optional[float] = None

    def probs(self) -> Tensor:
        return selector_probs(self.logits)

    def draw(self, count: int, generator: Optional[torch.Generator]) -> list[int]:
        p = self.probs()
        return [draw_bin(p, generator) for _ in range(count)]

    def update(self, observations: Sequence[Observation]) -> float:
        if not observations:
            return 0.0
        u = selector_reward(torch.tensor([o.success for o in observations], dtype=torch.float64), self.target)
        base = float(u.mean()) if self.baseline is None else self.baseline
        self.logits = reinforce_update(self.logits, [o.bin for o in observations], u, base, self.lr)
        self.baseline = update_baseline(self.baseline, float(u.mean()), self.decay)
        return float(u.mean())

    def state_dict(self) -> dict[str, Any]:
        return {"logits": self.logits.clone(), "baseline": self.baseline}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.logits = state["logits"].clone().to(torch.float64)
        self.baseline = state["baseline"]


SELECTORS = {"surprisal": Exp3Selector, "success_target": SuccessTargetSelector}
