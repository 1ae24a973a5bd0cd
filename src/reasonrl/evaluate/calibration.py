"""Calibration of stated (or token-probability) confidence against correctness.

Needed by calibration-aware methods (RL-ARC) and reported by ``reasonrl eval``.
"""

from __future__ import annotations

import math
from typing import Sequence


def _check(confidence: Sequence[float], correct: Sequence[bool]) -> None:
    if len(confidence) != len(correct) or not confidence:
        raise ValueError(f"need equally many confidences and outcomes (>0), got {len(confidence)} and {len(correct)}")
    bad = [c for c in confidence if not 0.0 <= c <= 1.0]
    if bad:
        raise ValueError(f"confidences must lie in [0, 1], got e.g. {bad[0]}")


def expected_calibration_error(confidence: Sequence[float], correct: Sequence[bool], num_bins: int = 10) -> float:
    """ECE (Naeini et al. 2015; Guo et al. 2017) with equal-width bins on [0, 1]:

        ECE = Σ_b (|B_b| / N) · |acc(B_b) − conf(B_b)|

    Bin b holds confidences in ((b−1)/M, b/M], the first bin also holds 0.
    """
    _check(confidence, correct)
    bins: dict[int, list[tuple[float, bool]]] = {}
    for c, ok in zip(confidence, correct):
        # ceil(c·M) − 1; rounding first keeps 0.3·10 = 3.0000000000000004 in bin (0.2, 0.3]
        b = min(num_bins - 1, max(0, math.ceil(round(c * num_bins, 9)) - 1))
        bins.setdefault(b, []).append((c, bool(ok)))
    n = len(confidence)
    return sum(len(items) / n * abs(sum(ok for _, ok in items) / len(items) - sum(c for c, _ in items) / len(items))
               for items in bins.values())


def brier_score(confidence: Sequence[float], correct: Sequence[bool]) -> float:
    """Mean squared error of the confidence as a probability of being correct (Brier 1950)."""
    _check(confidence, correct)
    return sum((c - float(ok)) ** 2 for c, ok in zip(confidence, correct)) / len(confidence)


def auroc(confidence: Sequence[float], correct: Sequence[bool]) -> float:
    """Area under the ROC curve of confidence as a detector of correct answers: the
    probability that a random correct answer has higher confidence than a random wrong
    one, ties counting one half (Mann–Whitney U). NaN when only one class is present."""
    _check(confidence, correct)
    pos = [c for c, ok in zip(confidence, correct) if ok]
    neg = [c for c, ok in zip(confidence, correct) if not ok]
    if not pos or not neg:
        return float("nan")
    wins = sum((p > q) + 0.5 * (p == q) for p in pos for q in neg)
    return wins / (len(pos) * len(neg))


def overconfidence_rate(confidence: Sequence[float], correct: Sequence[bool], threshold: float = 0.8) -> float:
    """Fraction of wrong answers given with confidence >= ``threshold`` (0 if none are wrong)."""
    _check(confidence, correct)
    wrong = [c for c, ok in zip(confidence, correct) if not ok]
    return sum(c >= threshold for c in wrong) / len(wrong) if wrong else 0.0
