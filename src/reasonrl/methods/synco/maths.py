"""SynCo's rewards, pure: task quality, answer reliability, teachability, the Synthesizer's
reward and the reliability filter.

**Confidence: INFERRED.** Paper: SynCo ("Synthesizer + Reasoner co-trained with multi-agent RL"); paper not
located; formalised from its abstract (neighbours: SOAR arXiv 2601.18778, Learning to Pose Problems
arXiv 2511.09907, Multi-Agent Evolve arXiv 2510.23595). The Synthesizer proposes a task τ = (q, a_S);
the Reasoner answers it M times, â_1..â_M. With p̂ = (1/M) Σ_m 1[â_m = a_S]:

- task quality (the formalisation's "well-formedness, dedup or novelty"):
  R_q = (1 − ν) · 1[q is of one of the real task's forms] + ν · novelty(q),
  novelty(q) = 1 − max_{b ∈ buffer} J(n-grams(q), n-grams(b)) (character n-grams, Jaccard J;
  1 for an empty buffer, 0 for an exact duplicate). Parsability and a single final answer are
  the validity gate 1[valid] below, not part of R_q. (The form term and ν are this library's
  choice: the spec names no form score.)
- answer reliability (majority vote of the Reasoner):
  R_rel = 1[a_S = mode(â)] · (count of the mode)/M. A tie for the mode counts a_S as the mode
  when it is one of the tied answers. An answer the Reasoner did not give (None) is a value of
  its own: it can be the mode, and then R_rel = 0.
  Note: when a_S is the mode, R_rel = p̂, so R_rel ≥ τ_rel implies p̂ ≥ τ_rel.
- teachability (the default learnability proxy): R_teach = 4 p̂ (1 − p̂), 1 at p̂ = ½.
- the Synthesizer's reward: R_S = 1[valid] · (w_q R_q + w_rel R_rel + w_teach R_teach),
  w = (0.2, 0.3, 0.5) (proposed defaults, not the paper's).
- the reliability filter: the Reasoner trains on τ only if R_rel ≥ τ_rel (0.5, a proposed default),
  with reward 1[â = a_S].
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

__all__ = ["DEFAULT_WEIGHTS", "Agreement", "agreement", "canonical_answer", "char_ngrams", "is_reliable",
           "novelty", "synthesizer_reward", "task_quality", "teachability"]

DEFAULT_WEIGHTS = (0.2, 0.3, 0.5)  # (w_q, w_rel, w_teach), proposed defaults


def canonical_answer(answer: Optional[str]) -> Optional[str]:
    """One text per number (``"07"``, ``"7.0"`` → ``"7"``), so that equal answers compare equal;
    a non-number is stripped; None stays None."""
    if answer is None:
        return None
    text = answer.strip().replace(",", "")
    try:
        value = float(text)
    except ValueError:
        return text
    return str(int(value)) if value == int(value) else repr(value)


@dataclass(frozen=True)
class Agreement:
    p_hat: float  # (1/M) Σ 1[â_m = a_S]
    mode_count: int  # how many answers the most common one has
    reference_is_mode: bool  # a_S is (one of) the most common answer(s)
    reliability: float  # R_rel = 1[a_S = mode(â)] · mode_count / M


def agreement(answers: Sequence[Optional[str]], reference: str) -> Agreement:
    """p̂ and R_rel of the Reasoner's ``answers`` against a_S = ``reference`` (see module doc)."""
    if not answers:
        raise ValueError("agreement needs at least one answer (M >= 1)")
    ref = canonical_answer(reference)
    canon = [canonical_answer(a) for a in answers]
    counts = Counter(canon)
    top = max(counts.values())
    m = len(canon)
    p_hat = sum(a is not None and a == ref for a in canon) / m
    is_mode = ref is not None and counts.get(ref, 0) == top
    return Agreement(p_hat=p_hat, mode_count=top, reference_is_mode=is_mode,
                     reliability=top / m if is_mode else 0.0)


def teachability(p_hat: float) -> float:
    """R_teach = 4 p̂ (1 − p̂)."""
    if not 0.0 <= p_hat <= 1.0:
        raise ValueError(f"p_hat must be in [0, 1], got {p_hat}")
    return 4.0 * p_hat * (1.0 - p_hat)


def char_ngrams(text: str, n: int) -> frozenset[str]:
    """The character n-grams of ``text`` (the text itself when shorter than n)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if len(text) < n:
        return frozenset([text])
    return frozenset(text[i:i + n] for i in range(len(text) - n + 1))


def novelty(question: str, buffer: Iterable[str], n: int = 3) -> float:
    """1 − max over the buffer of the Jaccard overlap of character n-grams (1: nothing alike in
    the buffer, or an empty buffer; 0: an exact duplicate)."""
    mine = char_ngrams(question, n)
    best = 0.0
    for other in buffer:
        if other == question:
            return 0.0
        theirs = char_ngrams(other, n)
        best = max(best, len(mine & theirs) / len(mine | theirs))
    return 1.0 - best


def task_quality(in_form: bool, novelty_score: float, novelty_weight: float = 0.5) -> float:
    """R_q = (1 − ν) · 1[in form] + ν · novelty."""
    if not 0.0 <= novelty_weight <= 1.0:
        raise ValueError(f"novelty_weight must be in [0, 1], got {novelty_weight}")
    return (1.0 - novelty_weight) * float(in_form) + novelty_weight * novelty_score


def synthesizer_reward(valid: bool, r_q: float, r_rel: float, r_teach: float,
                       weights: Sequence[float] = DEFAULT_WEIGHTS) -> float:
    """R_S = 1[valid] · (w_q R_q + w_rel R_rel + w_teach R_teach)."""
    if len(weights) != 3:
        raise ValueError(f"weights are (w_q, w_rel, w_teach); got {list(weights)}")
    if not valid:
        return 0.0
    w_q, w_rel, w_teach = weights
    return w_q * r_q + w_rel * r_rel + w_teach * r_teach


def is_reliable(r_rel: float, tau_rel: float = 0.5) -> bool:
    """The reliability filter: the Reasoner trains on the task iff R_rel ≥ τ_rel."""
    return r_rel >= tau_rel
