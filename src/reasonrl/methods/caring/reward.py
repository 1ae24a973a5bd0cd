"""CARing's coverage reward for multi-label prediction, and its per-rollout precursor.

A prompt has a gold label SET Y; each of the G rollouts of a group names one
label ŝ_i (or, in the set variant, a ranked list Ŝ_i). The precursor
(SIDReasoner) pays every rollout on its own, r_i = 1[ŝ_i ∈ Y] (``label_hit``):
a group that repeats the easiest label earns full reward, so GRPO has no
reason to spread the group over Y. The coverage reward couples the rollouts so
that the group's reward sum counts DISTINCT correct labels.

Paper: CARing ("coverage reward for multi-label prediction with semantic IDs"); paper not located;
formalised from its abstract. The coverage reward is INFERRED (the CARing code was not indexed), so every
formula and default here is our reading of the abstract, not the paper's.

Unparsable output (and truncated output: a partial label) never counts: it
scores 0 and is not a prediction when n(ŝ) is counted.
"""

from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache
from typing import Collection, Hashable, Sequence

from reasonrl.registry import REWARDS
from reasonrl.rewards.scorer import group_reward
from reasonrl.problem import Problem

__all__ = [
    "VARIANTS",
    "DEFAULT_LABEL_PATTERN",
    "parse_label",
    "parse_label_list",
    "gold_labels",
    "marginal_coverage",
    "normalised_coverage",
    "f_beta",
    "set_coverage",
    "check_coverage_params",
    "coverage",
    "label_hit",
]

VARIANTS = ("marginal", "normalised", "set")
DEFAULT_LABEL_PATTERN = r"[^\s,;]+"
"""One label: a non-empty run without whitespace, ',' or ';' (',' separates labels in a list)."""


@lru_cache(maxsize=32)
def _compiled(pattern: str) -> re.Pattern:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"label_pattern {pattern!r} is not a valid regular expression: {exc}") from None


def parse_label(text: str, label_pattern: str = DEFAULT_LABEL_PATTERN) -> str | None:
    """The single label a completion names (surrounding whitespace ignored), or None when
    the text is not exactly one label matching ``label_pattern``."""
    text = text.strip()
    return text if _compiled(label_pattern).fullmatch(text) else None


def parse_label_list(text: str, label_pattern: str = DEFAULT_LABEL_PATTERN) -> list[str] | None:
    """A ranked, comma-separated list of labels with repeats dropped (first occurrence
    keeps its rank), or None when any item is empty or malformed."""
    items = [item.strip() for item in text.strip().split(",")]
    if not all(_compiled(label_pattern).fullmatch(item) for item in items):
        return None
    return list(dict.fromkeys(items))


def gold_labels(problem: Problem) -> frozenset[str]:
    """Y: ``problem.meta["labels"]`` when the task stores it, else the comma-separated answer."""
    labels = problem.meta.get("labels")
    if labels is None:
        labels = [x.strip() for x in problem.answer.split(",") if x.strip()]
    gold = frozenset(str(x) for x in labels)
    if not gold:
        raise ValueError(f"problem {problem.prompt!r} has an empty gold label set; a multi-label reward needs |Y| >= 1")
    return gold


def _check_gold(gold: Collection) -> None:
    if len(gold) == 0:
        raise ValueError("gold label set Y is empty; expected at least one label")


def marginal_coverage(predictions: Sequence[Hashable | None], gold: Collection) -> list[float]:
    """Per-rollout marginal coverage  r_i = 1[ŝ_i ∈ Y] / n(ŝ_i).

    n(ŝ) = #{j : ŝ_j = ŝ} counts the group's rollouts predicting ŝ; ``None`` (unparsable)
    scores 0. A correct label found by several rollouts shares one unit of reward
    among them, so  Σ_i r_i = |{ŝ_i} ∩ Y|, the number of distinct correct labels.
    Formalised from the spec (paper not available).
    """
    _check_gold(gold)
    counts = Counter(p for p in predictions if p is not None)
    return [1.0 / counts[p] if p is not None and p in gold else 0.0 for p in predictions]


def normalised_coverage(predictions: Sequence[Hashable | None], gold: Collection) -> list[float]:
    """r_i = 1[ŝ_i ∈ Y] · (1/n(ŝ_i)) · G / min(G, |Y|), with G = len(predictions).

    The factor makes the best achievable group mean 1 whatever |Y| is: a group can hold
    at most min(G, |Y|) distinct correct labels, so Σ_i r_i ≤ G.
    Formalised from the spec (paper not available).
    """
    scale = len(predictions) / min(len(predictions), len(gold)) if predictions else 0.0
    return [r * scale for r in marginal_coverage(predictions, gold)]


def f_beta(hits: int, predicted: int, gold: int, beta: float) -> float:
    """F_β = (1+β²)·P·R / (β²·P + R) with P = hits/predicted, R = hits/gold; 0 when hits = 0.
    β > 1 weights recall more than precision (β = 1 is F1)."""
    if hits == 0:
        return 0.0
    p, r = hits / predicted, hits / gold
    return (1 + beta**2) * p * r / (beta**2 * p + r)


def set_coverage(predictions: Sequence[Sequence[Hashable] | None], gold: Collection, *,
                 gamma: float = 1.0, beta: float = 2.0) -> list[float]:
    """Rank-aware set variant:  r_i = F_β(L_i, Y) + γ · c_i.

    Ŝ_i is a ranked list of distinct labels; only its top-|Y| prefix L_i counts (the
    "oracle cardinality" cut of the precursor's weighted-F1 metric), which is what makes
    the reward rank-aware: a correct label ranked below |Y| earns nothing.
    F_β(L_i, Y) uses P = |L_i ∩ Y|/|L_i|, R = |L_i ∩ Y|/|Y| (recall-weighted for β > 1).
    The marginal coverage of L_i relative to the other rollouts is
        c_i = (1/|Y|) Σ_{ℓ ∈ L_i ∩ Y} 1/m(ℓ),   m(ℓ) = #{j : ℓ ∈ L_j},
    so Σ_i c_i = |∪_j L_j ∩ Y| / |Y|, the recall of the group's union. ``None``
    (unparsable) and empty lists score 0. With one label per rollout, c_i is the
    marginal coverage divided by |Y|. Formalised from the spec (paper not available);
    the top-|Y| cut, the β default and the 1/|Y| scale of c_i are our choices.
    """
    _check_gold(gold)
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    k = len(gold)
    tops = [list(dict.fromkeys(p))[:k] if p is not None else [] for p in predictions]
    m = Counter(label for top in tops for label in top if label in gold)
    out = []
    for top in tops:
        correct = [label for label in top if label in gold]
        fit = f_beta(len(correct), len(top), k, beta)
        out.append(fit + gamma * sum(1.0 / m[label] for label in correct) / k)
    return out


def check_coverage_params(variant: str = "marginal", gamma: float | None = None, beta: float | None = None,
                          label_pattern: str = DEFAULT_LABEL_PATTERN) -> None:
    """Raise a ValueError naming the bad ``coverage`` parameter. The scorer isolates a reward
    that raises (zeros and a warning), so this is also exposed as ``coverage.check_params``
    for a load-time check."""
    if variant not in VARIANTS:
        raise ValueError(f"coverage: variant must be one of {', '.join(VARIANTS)}; got {variant!r}")
    if variant != "set" and (gamma is not None or beta is not None):
        raise ValueError(f"coverage: gamma and beta apply only to variant 'set', not {variant!r}")
    if gamma is not None and gamma < 0:
        raise ValueError(f"coverage: gamma must be >= 0, got {gamma}")
    if beta is not None and beta <= 0:
        raise ValueError(f"coverage: beta must be > 0, got {beta}")
    _compiled(label_pattern)


@REWARDS.register("coverage")
@group_reward
def coverage(completions: list[str], problem: Problem, *, num_tokens: list[int], truncated: list[bool],
             variant: str = "marginal", gamma: float | None = None, beta: float | None = None,
             label_pattern: str = DEFAULT_LABEL_PATTERN) -> list[float]:
    """CARing's coverage reward for one group (see the module docstring and the pure functions).

    variant: ``marginal`` (r_i = 1[ŝ_i∈Y]/n(ŝ_i)), ``normalised`` (× G/min(G,|Y|)) or
    ``set`` (each completion a comma-separated ranked list; r_i = F_β + γ·c_i, with
    ``gamma`` default 1.0 and ``beta`` default 2.0; they apply to ``set`` only).
    label_pattern: the regular expression one label must match in full.
    Y comes from ``problem.meta["labels"]`` (else the comma-separated answer).
    Formalised from the spec (paper not available).
    """
    check_coverage_params(variant=variant, gamma=gamma, beta=beta, label_pattern=label_pattern)
    gold = gold_labels(problem)
    if variant == "set":
        lists = [None if cut else parse_label_list(text, label_pattern) for text, cut in zip(completions, truncated)]
        return set_coverage(lists, gold, gamma=1.0 if gamma is None else gamma, beta=2.0 if beta is None else beta)
    labels = [None if cut else parse_label(text, label_pattern) for text, cut in zip(completions, truncated)]
    return (marginal_coverage if variant == "marginal" else normalised_coverage)(labels, gold)


@REWARDS.register("label_hit")
def label_hit(completion: str, problem: Problem, *, num_tokens: int = 0, truncated: bool = False,
              label_pattern: str = DEFAULT_LABEL_PATTERN) -> float:
    """The precursor's per-rollout outcome reward r_i = 1[ŝ_i ∈ Y] (SIDReasoner,
    ``doc/2026-07-18-cot-rl.md``): unparsable, truncated or several labels give 0.
    The baseline for ``coverage``; usable as ``eval.reward`` (greedy hit rate)."""
    label = None if truncated else parse_label(completion, label_pattern)
    return float(label is not None and label in gold_labels(problem))


coverage.check_params = check_coverage_params
# How an evaluation reads a completion's answer (majority voting, format failures).
label_hit.extract = parse_label
coverage.extract = parse_label
