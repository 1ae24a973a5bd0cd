"""Sampling-based evaluation metrics: pass@k, avg@k, maj@k, bootstrap intervals.

Pure functions over per-problem sample outcomes, so anyone can recompute a
reported number from the per-problem correct counts saved beside it.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import Callable, Hashable, Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021, Codex):

        pass@k = 1 − C(n−c, k) / C(n, k) = 1 − Π_{i=n−c+1}^{n} (1 − k/i)

    The product form avoids huge binomials. Equals the probability that at least one
    of k samples drawn without replacement from the n is correct.
    """
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def avg_at_k(correct: Sequence[bool]) -> float:
    """Mean accuracy over the samples of one problem (DeepSeek-R1's avg@k / verl mean@N)."""
    if not correct:
        raise ValueError("avg@k of no samples")
    return sum(map(bool, correct)) / len(correct)


def distinct_correct(texts: Sequence[str], correct: Sequence[bool]) -> int:
    """How many different correct solutions a problem's samples contain: distinct texts
    (whitespace-trimmed) among the correct ones. A diversity measure beside pass@k (two
    samples with the same answer but different steps count twice; ExpDis's headline)."""
    return len({t.strip() for t, c in zip(texts, correct) if c})


def majority_answer(answers: Sequence[Hashable | None]) -> Hashable | None:
    """The most frequent extracted answer, ties broken by first occurrence; ``None``
    (no answer extracted) never wins unless nothing else was extracted."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    best = max(counts.values())
    return next(a for a in answers if a is not None and counts[a] == best)


def maj_at_k(answers: Sequence[Hashable | None], is_correct: Callable[[Hashable], bool], k: int) -> float:
    """1.0 if the majority answer among the first k samples is correct (self-consistency,
    Wang et al. 2023), else 0.0."""
    if not 1 <= k <= len(answers):
        raise ValueError(f"need 1 <= k <= {len(answers)}, got k={k}")
    winner = majority_answer(answers[:k])
    return float(winner is not None and is_correct(winner))


def bootstrap_ci(values: Sequence[float], num_resamples: int = 1000, confidence: float = 0.95,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean over problems (resampling problems
    with replacement). Deterministic for a fixed seed."""
    if not values:
        raise ValueError("bootstrap of no values")
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(num_resamples))
    lo = means[int(math.floor((1 - confidence) / 2 * (num_resamples - 1)))]
    hi = means[int(math.ceil((1 + confidence) / 2 * (num_resamples - 1)))]
    return lo, hi


def paired_difference(a: Sequence[float], b: Sequence[float], num_resamples: int = 1000, confidence: float = 0.95,
                      seed: int = 0) -> dict[str, float]:
    """mean(a − b) over paired items (the same problems under two conditions: a cue and no
    cue, a base and a trained model) with a paired percentile bootstrap interval: problems
    are resampled with replacement and keep both their values, i.e. :func:`bootstrap_ci` of
    the per-problem differences d_i = a_i − b_i (Efron & Tibshirani 1993, §14.5 paired
    comparison). Pairing removes the between-problem spread that an unpaired interval keeps.
    """
    if len(a) != len(b) or not a:
        raise ValueError(f"a paired difference needs equally many values on both sides (>0), got {len(a)} and {len(b)}")
    diffs = [float(x) - float(y) for x, y in zip(a, b)]
    lo, hi = bootstrap_ci(diffs, num_resamples, confidence, seed)
    return {"mean": sum(diffs) / len(diffs), "ci_low": lo, "ci_high": hi}


def mean_with_ci(values: list[float]) -> dict[str, float]:
    """The mean of per-problem values with its bootstrap 95% interval (:func:`bootstrap_ci`): the
    one form in which every evaluation metric is reported (``mean``, ``ci_low``, ``ci_high``)."""
    lo, hi = bootstrap_ci(values)
    return {"mean": sum(values) / len(values), "ci_low": lo, "ci_high": hi}
