"""TS-OPD (Transfer-Stratified On-Policy Distillation): strata, token gates, the entropy brake.

Source: arXiv 2610.05974, "Transfer-Stratified On-Policy Distillation for RL-Improved
Reasoning Teachers" (Chen et al.). No public code; only the abstract and a short note are
verified ("stratify training problems by the sampled success of student and teacher; different
strata use different KL directions and token gates; add an entropy brake"). The formulas are
INFERRED (paper: https://arxiv.org/abs/2610.05974; formalised from the abstract and a short note):

- **Strata** from the sampled success rates p̂_S(x), p̂_T(x) of student and teacher:
  acquisition A = {p̂_S ≤ δ_lo, p̂_T ≥ δ_hi} (the teacher solves what the student cannot),
  consolidation C = {p̂_S > δ_lo, p̂_T ≥ δ_hi} (both can), and no teacher supervision when
  p̂_T < δ_hi (both fail, or only the student succeeds).
- **Per-stratum divergence** on the student's own prefixes s_t: A uses the forward KL
  KL(π_T‖π_θ) (mode-covering: acquire what the teacher knows), C the reverse KL
  KL(π_θ‖π_T) (mode-seeking: sharpen what the student already does).
- **Token gates** g_t ∈ {0, 1} (one per run), with d_t = |log π_T(y_t|s_t) − log π_θ(y_t|s_t)|:
  ``disagreement``: the top-ρ fraction of each response's tokens by d_t (⌈ρ·T_i⌉ tokens);
  ``confidence``: max_a π_T(a|s_t) ≥ τ_conf; ``first_divergent``: the first maximal run of
  consecutive tokens with d_t > τ_div; ``none``: every token.
- **Entropy brake** (protects pass@k coverage): L_H = λ_H · max(0, H_0 − H̄_θ), H̄_θ the mean
  token entropy of the student and H_0 its initial value (or a target); or, as the ``scale``
  form, L_C multiplied by min(1, H̄_θ/H_0).
- Total L = L_A + L_C + L_H, normalised per token.

Everything here is pure and without gradients except where stated; the method
(``reasonrl.methods.ts_opd.method``) owns the teacher and the screening.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

__all__ = ["SKIP", "ACQUIRE", "CONSOLIDATE", "Gate", "strata", "disagreement_gate", "confidence_gate",
           "first_divergent_gate", "token_gate", "brake_active", "brake_scale"]

SKIP, ACQUIRE, CONSOLIDATE = 0, 1, 2
STRATUM_NAMES = {SKIP: "skip", ACQUIRE: "acquisition", CONSOLIDATE: "consolidation"}
Gate = Literal["disagreement", "confidence", "first_divergent", "none"]


def strata(p_student: Tensor, p_teacher: Tensor, delta_lo: float = 0.25, delta_hi: float = 0.5) -> Tensor:
    """The stratum of each problem (long: SKIP 0, ACQUIRE 1, CONSOLIDATE 2) from the sampled
    success rates: A where p̂_S ≤ δ_lo and p̂_T ≥ δ_hi, C where p̂_S > δ_lo and p̂_T ≥ δ_hi."""
    teacher_ok = p_teacher >= delta_hi
    out = torch.full(p_student.shape, SKIP, dtype=torch.long)
    out[teacher_ok & (p_student <= delta_lo)] = ACQUIRE
    out[teacher_ok & (p_student > delta_lo)] = CONSOLIDATE
    return out


def disagreement_gate(disagreement: Tensor, mask: Tensor, rho: float) -> Tensor:
    """1 on each row's ⌈ρ·T_i⌉ valid tokens of largest d_t (ties: the earlier token), else 0."""
    valid = mask.bool()
    keep = torch.ceil(rho * valid.sum(-1).float()).long()  # [N]
    # Rank tokens within each row by d (descending); padding last.
    d = torch.where(valid, disagreement.float(), -math.inf)
    order = torch.sort(d, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(d.shape[-1]).expand_as(order))
    return ((rank < keep.unsqueeze(-1)) & valid).float()


def confidence_gate(teacher_max_prob: Tensor, mask: Tensor, threshold: float) -> Tensor:
    """1 where the teacher's most probable next token has probability ≥ ``threshold``."""
    return ((teacher_max_prob >= threshold) & mask.bool()).float()


def first_divergent_gate(disagreement: Tensor, mask: Tensor, threshold: float) -> Tensor:
    """1 on the first maximal run of consecutive valid tokens with d_t > ``threshold``."""
    hot = (disagreement > threshold) & mask.bool()
    # A token is in the first run if it is hot and no cold token lies between it and the row's
    # first hot token: count hot→cold transitions before each position.
    started = hot.long().cumsum(-1) > 0
    ended = (started & ~hot).long().cumsum(-1) > 0
    return (hot & ~ended).float()


def token_gate(gate: Gate, *, disagreement: Tensor, teacher_max_prob: Tensor, mask: Tensor, rho: float,
               confidence: float, divergence: float) -> Tensor:
    """The gate g_t ``[N, T]`` of the named kind."""
    if gate == "disagreement":
        return disagreement_gate(disagreement, mask, rho)
    if gate == "confidence":
        return confidence_gate(teacher_max_prob, mask, confidence)
    if gate == "first_divergent":
        return first_divergent_gate(disagreement, mask, divergence)
    if gate == "none":
        return mask.bool().float()
    raise ValueError(f"unknown TS-OPD gate '{gate}'; allowed: disagreement, confidence, first_divergent, none")


def brake_active(mean_entropy: float, h0: float) -> bool:
    """Whether L_H = λ_H·max(0, H_0 − H̄) has a gradient: H̄ < H_0. Its gradient is then
    −λ_H ∇H̄ (a linear term), so it can be reduced like any per-token term."""
    return mean_entropy < h0


def brake_scale(mean_entropy: float, h0: float) -> float:
    """The ``scale`` form of the brake: L_C is multiplied by min(1, H̄/H_0)."""
    return 1.0 if h0 <= 0 else min(1.0, mean_entropy / h0)
