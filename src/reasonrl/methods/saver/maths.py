"""SAVER's grounding score and reliability-gated reference reward, as pure functions.

Source: SAVER (paired dense and sparse views; arXiv id not found). Every formula here is
INFERRED from the abstract (paper not located); every constant is a tunable default.

A prediction ŷ = (t̂_s, t̂_e, â) is an inclusive span of frame indices and an answer.

- Temporal IoU of inclusive integer spans (frames counted):
  IoU([a_s, a_e], [b_s, b_e]) = |∩| / |∪|, |∩| = max(0, min(a_e, b_e) − max(a_s, b_s) + 1),
  |∪| = (a_e − a_s + 1) + (b_e − b_s + 1) − |∩|.
- Grounding reward: r_g(ŷ) = w_iou · IoU(ŷ, y) + w_ans · 1[â = a] + w_fmt · 1[ŷ parses].
- For one input x with dense-view rollouts {y_d,j} and sparse-view rollouts {y_s,i}:
  ȳ_d = argmax_j R(y_d,j) (the best-rewarded dense rollout; the first on ties);
  reliability ρ = IoU(ȳ_d, y) (the spec's τ_rel is an IoU; an unparsable ȳ_d has ρ = 0);
  gate g = 1[ρ ≥ τ_rel] (``soft``: g = ρ);
  r_ref(y_s) = sim(y_s, ȳ_d) = IoU(y_s, ȳ_d) + w_agree · 1[â_s = â_d] (0 when y_s does not parse);
  R(y_s) = r_g(y_s) + λ · g · r_ref(y_s);   R(y_d) = r_g(y_d).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

__all__ = ["Prediction", "span_iou", "grounding_score", "reference_similarity", "PairReference", "pair_reference"]

Prediction = tuple[int, int, str]  # (start, end, answer); spans are inclusive, start <= end


def span_iou(pred: Optional[Sequence[int]], gold: Sequence[int]) -> float:
    """Temporal IoU of two inclusive integer spans (0 when ``pred`` is None)."""
    if pred is None:
        return 0.0
    (ps, pe), (gs, ge) = pred, gold
    if ps > pe or gs > ge:
        raise ValueError(f"a span needs start <= end, got {tuple(pred)} and {tuple(gold)}")
    inter = max(0, min(pe, ge) - max(ps, gs) + 1)
    return inter / ((pe - ps + 1) + (ge - gs + 1) - inter)


def grounding_score(pred: Optional[Prediction], gold: Prediction, iou_weight: float = 1.0,
                    answer_weight: float = 1.0, format_weight: float = 0.1) -> float:
    """r_g = w_iou · IoU + w_ans · 1[â = a] + w_fmt · 1[parses]; 0 for an unparsable prediction."""
    if pred is None:
        return 0.0
    return (iou_weight * span_iou(pred[:2], gold[:2]) + answer_weight * float(pred[2] == gold[2])
            + format_weight)


def reference_similarity(pred: Optional[Prediction], reference: Prediction, agree_weight: float = 1.0) -> float:
    """sim(y_s, ȳ_d) = IoU of the spans + w_agree · 1[same answer]; 0 when ``pred`` is None."""
    if pred is None:
        return 0.0
    return span_iou(pred[:2], reference[:2]) + agree_weight * float(pred[2] == reference[2])


@dataclass(frozen=True)
class PairReference:
    best: int  # index of ȳ_d among the dense rollouts
    reliability: float  # ρ = IoU(ȳ_d, gold)
    gate: float  # g
    similarity: list[float]  # r_ref(y_s,i) per sparse rollout
    bonus: list[float]  # λ · g · r_ref(y_s,i), what is added to the sparse rewards


def pair_reference(dense_rewards: Sequence[float], dense_preds: Sequence[Optional[Prediction]],
                   sparse_preds: Sequence[Optional[Prediction]], gold: Prediction, coef: float = 0.5,
                   tau: float = 0.5, soft: bool = False, agree_weight: float = 1.0) -> PairReference:
    """The reference reward of one input's sparse rollouts from its dense rollouts (module docstring)."""
    if not dense_rewards or len(dense_rewards) != len(dense_preds):
        raise ValueError(f"pair_reference needs one prediction per dense reward and at least one, got "
                         f"{len(dense_rewards)} rewards and {len(dense_preds)} predictions")
    best = max(range(len(dense_rewards)), key=lambda j: (dense_rewards[j], -j))
    ref = dense_preds[best]
    rho = span_iou(ref[:2], gold[:2]) if ref is not None else 0.0
    gate = rho if soft else float(rho >= tau)
    if ref is None:
        sim = [0.0] * len(sparse_preds)
    else:
        sim = [reference_similarity(p, ref, agree_weight) for p in sparse_preds]
    return PairReference(best, rho, gate, sim, [coef * gate * s for s in sim])
