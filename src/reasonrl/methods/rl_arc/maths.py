"""RL-ARC: calibration-aware reward from reasoning and answer confidence (pure functions).

**Formalised from the abstract (INFERRED): no paper text was found.** Paper: RL-ARC ("calibration-aware
RL with reasoning and answer confidence"), not located; its closest verified relatives are RLCR
(arXiv 2507.16806: reward 1[correct] − (q − 1[correct])² with a verbalised q) and RLCM (arXiv 2604.23333).
The model side (reading the batch, adding to its rewards) is ``reasonrl.methods.rl_arc.method``. The answer span
and the span confidences are the core's (``reasonrl.evaluate.answer_spans``), which the
evaluation's ``calibration/answer/*`` family uses too.

A completion is split into reasoning tokens Z and answer tokens Y (``reasonrl.evaluate.answer_spans.split_spans``), and

    c_r = exp((1/|Z|) Σ_{t∈Z} log π(z_t|·))      c_a = exp((1/|Y|) Σ_{t∈Y} log π(y_t|·))

(geometric-mean token probabilities under the behaviour policy; detached: they are data). The
reward of a row with correctness R ∈ {0, 1} is (:func:`arc_reward`)

    R = 1:  r = 1 − λ_1 (c_a − c_r)_+ − λ_2 ((c_a − c_r)_−)²      reasoning-guided regulariser
    R = 0:  r = −λ_3 c_a²                                          overconfidence penalty (Brier form)

with x_+ = max(x, 0), x_− = max(−x, 0); the spec's alternatives are ``regulariser="abs"``
(r = 1 − λ_1 |c_a − c_r|) and ``penalty="linear"`` (−λ_3 c_a) / ``"max_brier"``
(−λ_3 max(c_a, c_r)²). With λ_1 + λ_2 < 1 every correct answer still earns more than any wrong one.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor

__all__ = ["arc_reward", "arc_adjustment", "Regulariser", "Penalty"]

Regulariser = Literal["hinge", "abs"]
Penalty = Literal["brier", "linear", "max_brier"]

def arc_reward(correct: Tensor, c_answer: Tensor, c_reasoning: Tensor, lambda1: float = 0.5,
               lambda2: float = 0.0, lambda3: float = 0.5, regulariser: Regulariser = "hinge",
               penalty: Penalty = "brier") -> Tensor:
    """The spec's r per row (module docstring): 1 − regulariser(c_a − c_r) for correct rows,
    −λ_3·penalty for wrong ones. ``correct`` is bool ``[N]``; the confidences are in [0, 1]."""
    gap = (c_answer - c_reasoning).float()
    if regulariser == "hinge":
        reg = lambda1 * gap.clamp(min=0.0) + lambda2 * (-gap).clamp(min=0.0) ** 2
    elif regulariser == "abs":
        reg = lambda1 * gap.abs()
    else:
        raise ValueError(f"regulariser must be 'hinge' or 'abs', got {regulariser!r}")
    if penalty == "brier":
        pen = c_answer.float() ** 2
    elif penalty == "linear":
        pen = c_answer.float()
    elif penalty == "max_brier":
        pen = torch.maximum(c_answer, c_reasoning).float() ** 2
    else:
        raise ValueError(f"penalty must be 'brier', 'linear' or 'max_brier', got {penalty!r}")
    return torch.where(correct.bool(), 1.0 - reg, -lambda3 * pen)


def arc_adjustment(correct: Tensor, c_answer: Tensor, c_reasoning: Tensor, **kwargs: Any) -> Tensor:
    """r − R: what RL-ARC adds to a reward whose correctness part R is 1[correct] (weight 1),
    so that the row's reward becomes the spec's r. Same arguments as :func:`arc_reward`."""
    return arc_reward(correct, c_answer, c_reasoning, **kwargs) - correct.float()
