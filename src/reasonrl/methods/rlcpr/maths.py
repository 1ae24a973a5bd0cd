"""RLCPR: the tensor maths of verifier-free RL with probability rewards.

No RLCPR paper text, abstract or code could be found: everything here is INFERRED,
formalised from its closest published relatives, RLPR (the mean-probability reward) and
VeriFree (arxiv.org/abs/2505.21493; the reference answer scored after the trace). The
model side (the teacher-forced forward of the policy) is ``reasonrl.methods.rlcpr.method``; the
prompt sampler is ``reasonrl.methods.rlcpr.sampler``.

Notation: x the prompt, z a sampled reasoning trace of T tokens, y* = (y*_1..y*_m) the
reference answer (its tokens after the answer marker), p_t = r(z_{≤t}) the reward of the
trace cut after its first t tokens (p_0 = r(∅), the empty trace).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from reasonrl.algos.masked import as_float, masked_mean

__all__ = ["Kind", "answer_reward", "debias", "concentration_point", "concentration_penalty"]

Kind = Literal["prob", "logprob"]


def answer_reward(answer_logprobs: Tensor, answer_mask: Tensor, kind: Kind = "prob") -> Tensor:
    """The probability reward of each row, [N] (INFERRED, RLPR's mean-probability form)::

        prob:     r(z) = (1/m) Σ_j π_θ(y*_j | x, z, y*_{<j})
        logprob:  r(z) = (1/m) Σ_j log π_θ(y*_j | x, z, y*_{<j})

    ``answer_logprobs`` [N, L]: log π of every scored token; ``answer_mask`` [N, L]: the m
    positions of y* (the marker before them is context, not answer). The mean of the
    per-token probabilities (not the probability of the whole answer, Π_j) keeps the reward
    on the same [0, 1] scale for answers of every length, which is why RLPR prefers it.
    A row with an empty mask gets 0."""
    if answer_logprobs.shape != answer_mask.shape:
        raise ValueError(f"answer_logprobs and answer_mask must match; got {tuple(answer_logprobs.shape)} "
                         f"and {tuple(answer_mask.shape)}")
    if kind not in ("prob", "logprob"):
        raise ValueError(f"kind must be 'prob' or 'logprob', got {kind!r}")
    logp = as_float(answer_logprobs)
    values = logp.exp() if kind == "prob" else logp
    return masked_mean(values, answer_mask, dim=-1)


def debias(reward: Tensor, empty_reward: Tensor, kind: Kind = "prob") -> Tensor:
    """Empty-trace debiasing (INFERRED): what the trace adds to the answer's
    probability over answering at once::

        prob:     r̃(z) = clip(r(z) − r(∅), 0, 1)
        logprob:  r̃(z) = r(z) − r(∅)        (a log-likelihood ratio; no natural clip)

    r(∅) is per prompt, so within a group it is a constant: it leaves a group-normalised
    advantage unchanged except through the clip (traces that lower the answer's probability
    all tie at 0) and the length penalty's gate, which reads r̃."""
    out = as_float(reward) - as_float(empty_reward)
    return out.clamp(0.0, 1.0) if kind == "prob" else out


def concentration_point(p: Tensor, valid: Tensor, positions: Tensor, delta: float) -> Tensor:
    """The concentration point t* of each row's posterior p_t along its trace, [N]
    (INFERRED)::

        t* = min{ t : |p_{t'} − p_T| ≤ δ for all t' ≥ t }

    over the measured boundaries t_0 < t_1 < … < t_K = T of the row (its segment ends).
    ``p`` [N, K+1] the answer probability at each boundary, ``valid`` [N, K+1] bool (a row's
    boundaries come first, padding after), ``positions`` [N, K+1] the boundaries in tokens.
    The last boundary is T, where |p_T − p_T| = 0, so t* ≤ T always; a trace whose p_t never
    leaves the δ-band of p_T has t* = t_0 (0 when the empty trace is measured)."""
    if p.shape != valid.shape or p.shape != positions.shape or p.dim() != 2:
        raise ValueError(f"p, valid and positions must be [N, K] of one shape; got {tuple(p.shape)}, "
                         f"{tuple(valid.shape)}, {tuple(positions.shape)}")
    if not bool(valid[:, 0].all()):
        raise ValueError("every row needs at least one boundary (valid[:, 0] must be True)")
    valid = valid.bool()
    last = valid.long().sum(-1, keepdim=True) - 1  # index of t_K = T
    p_end = p.gather(-1, last)
    off = ((p - p_end).abs() > delta) & valid
    index = torch.arange(p.shape[-1], device=p.device).expand_as(p)
    last_off = torch.where(off, index, torch.full_like(index, -1)).max(-1, keepdim=True).values
    return positions.gather(-1, last_off + 1).squeeze(-1)  # the boundary after the last excursion


def concentration_penalty(reward: Tensor, gate_value: Tensor, t_star: Tensor, trace_len: Tensor,
                          coef: float, gate: float) -> Tensor:
    """Concentration-aware length regularisation (INFERRED)::

        r_final = r̃ − λ_len · (T − t*)/T · 1[r̃ ≥ gate]

    (T − t*)/T is the share of the trace written after the answer was already settled:
    padding. The gate applies it only to traces whose reward is high (right but padded), so a
    wrong trace is never pushed to be shorter. ``gate_value`` is the probability-form r̃ the
    gate reads (equal to ``reward`` in the prob form). An empty trace (T = 0) has no padding."""
    t_len = as_float(trace_len)
    frac = torch.where(t_len > 0, (t_len - as_float(t_star)) / t_len.clamp(min=1.0), torch.zeros_like(t_len))
    return as_float(reward) - coef * frac * (as_float(gate_value) >= gate).to(frac.dtype)
