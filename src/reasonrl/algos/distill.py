"""Token-level divergences between a student π_S and a teacher π_T for on-policy distillation.

On-policy distillation (OPD; Agarwal et al. 2024, "On-Policy Distillation of Language Models:
Learning from Self-Generated Mistakes", arXiv 2306.13649 — TRL's ``GKDTrainer``; the per-token
reverse-KL form of Thinking Machines' "On-Policy Distillation" post, also in verl and slime):
the student samples y ∼ π_S(·|x), the teacher scores the same tokens, and at every completion
position s_t = (x, y_<t) the student is pulled toward the teacher by one of

- **reverse KL** (mode-seeking): KL(π_S‖π_T)(s_t) = Σ_a π_S(a|s_t) [log π_S(a|s_t) − log π_T(a|s_t)];
- **forward KL** (mode-covering): KL(π_T‖π_S)(s_t) = Σ_a π_T(a|s_t) [log π_T(a|s_t) − log π_S(a|s_t)];
- **generalised JSD(β)** (GKD, Eq. 1): with M = β π_T + (1 − β) π_S,
  JSD_β = β KL(π_T‖M) + (1 − β) KL(π_S‖M); at the end points, as in TRL's
  ``generalized_jsd_loss``, β = 0 is the forward KL and β = 1 the reverse KL (the mixture
  form would vanish there). β = 0.5 is the symmetric JSD;
- **sampled reverse KL**: only the sampled token's log-ratio
  k_t = log π_S(y_t|s_t) − log π_T(y_t|s_t), an unbiased one-sample estimate of the reverse KL
  at s_t. It needs no distributions (an engine that returns only the sampled token's log-prob
  suffices). Its gradient is the score-function one: the surrogate sg(k_t) · log π_S(y_t|s_t)
  (:func:`sampled_reverse_kl_surrogate`), whose expected gradient is ∇ KL(π_S‖π_T)(s_t) —
  the per-token, undiscounted "advantage −k_t" of the Thinking Machines post.

The exact divergences sum over the whole vocabulary, or with ``top_k`` over the teacher's k
most probable tokens at each position with both distributions renormalised over that set
(a proper divergence ≥ 0 between the restricted distributions, equal to the full one when k is
the vocabulary; engines that return top-k log-probs give exactly this set).

Distributions are softmax(logits / temperature), the temperature the student sampled with.
All functions are pure; gradients flow through the student's logits only (the teacher's are
detached). Results are per token, ``[N, T]``; reduce them with
``reasonrl.algos.losses.aggregate`` under the response mask.
"""

from __future__ import annotations

import math
from typing import Literal, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["DIVERGENCES", "Divergence", "scaled_log_softmax", "restrict_top_k", "forward_kl", "reverse_kl",
           "generalized_jsd", "token_divergence", "logprob_divergence", "sampled_reverse_kl_surrogate"]

Divergence = Literal["reverse_kl", "forward_kl", "jsd", "sampled_reverse_kl"]
DIVERGENCES = ("reverse_kl", "forward_kl", "jsd", "sampled_reverse_kl")


def scaled_log_softmax(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """log softmax(logits / τ) in float32 (float64 kept)."""
    logits = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    return F.log_softmax(logits, dim=-1)


def restrict_top_k(student_logp: Tensor, teacher_logp: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Both log-distributions restricted to the teacher's ``k`` most probable tokens at each
    position and renormalised there: log p(a) − log Σ_{b∈K} p(b) for a ∈ K. ``[..., k]``."""
    if k < 1:
        raise ValueError(f"top_k must be >= 1, got {k}")
    if k >= teacher_logp.shape[-1]:
        return student_logp, teacher_logp
    idx = teacher_logp.topk(k, dim=-1).indices
    s, t = student_logp.gather(-1, idx), teacher_logp.gather(-1, idx)
    return s - s.logsumexp(-1, keepdim=True), t - t.logsumexp(-1, keepdim=True)


def _kl(p_logp: Tensor, q_logp: Tensor) -> Tensor:
    """KL(p‖q) = Σ_a p(a)(log p(a) − log q(a)) over the last dim; 0·log 0 = 0."""
    return torch.where(p_logp > -math.inf, p_logp.exp() * (p_logp - q_logp), 0.0).sum(-1)


def forward_kl(student_logp: Tensor, teacher_logp: Tensor) -> Tensor:
    """KL(π_T‖π_S) per position (mode-covering: the student must put mass wherever the teacher does)."""
    return _kl(teacher_logp.detach(), student_logp)


def reverse_kl(student_logp: Tensor, teacher_logp: Tensor) -> Tensor:
    """KL(π_S‖π_T) per position (mode-seeking: the student may drop teacher modes, not add its own)."""
    return _kl(student_logp, teacher_logp.detach())


def generalized_jsd(student_logp: Tensor, teacher_logp: Tensor, beta: float = 0.5) -> Tensor:
    """GKD's JSD_β = β KL(π_T‖M) + (1−β) KL(π_S‖M), M = β π_T + (1−β) π_S; β = 0 → forward KL,
    β = 1 → reverse KL (TRL's convention; see the module docstring)."""
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"jsd beta must be in [0, 1], got {beta}")
    teacher_logp = teacher_logp.detach()
    if beta == 0.0:
        return forward_kl(student_logp, teacher_logp)
    if beta == 1.0:
        return reverse_kl(student_logp, teacher_logp)
    mixture = torch.logaddexp(teacher_logp + math.log(beta), student_logp + math.log1p(-beta))
    return beta * _kl(teacher_logp, mixture) + (1.0 - beta) * _kl(student_logp, mixture)


def token_divergence(student_logits: Tensor, teacher_logits: Tensor, divergence: Divergence = "reverse_kl",
                     beta: float = 0.5, top_k: Optional[int] = None, temperature: float = 1.0) -> Tensor:
    """The exact per-position divergence ``[N, T]`` between the two models' next-token
    distributions (``divergence`` one of reverse_kl, forward_kl, jsd), over the vocabulary or
    the teacher's ``top_k``. ``sampled_reverse_kl`` needs only the sampled tokens' log-probs:
    see :func:`sampled_reverse_kl_surrogate`."""
    return logprob_divergence(scaled_log_softmax(student_logits, temperature),
                              scaled_log_softmax(teacher_logits.detach(), temperature), divergence, beta, top_k)


def logprob_divergence(student_logp: Tensor, teacher_logp: Tensor, divergence: Divergence = "reverse_kl",
                       beta: float = 0.5, top_k: Optional[int] = None) -> Tensor:
    """:func:`token_divergence` on log-distributions already computed (``scaled_log_softmax``),
    for a caller that reads them for something else too."""
    s, t = student_logp, teacher_logp
    if top_k is not None:
        s, t = restrict_top_k(s, t, top_k)
    if divergence == "reverse_kl":
        return reverse_kl(s, t)
    if divergence == "forward_kl":
        return forward_kl(s, t)
    if divergence == "jsd":
        return generalized_jsd(s, t, beta)
    raise ValueError(f"unknown exact divergence '{divergence}'; allowed: reverse_kl, forward_kl, jsd")


def sampled_reverse_kl_surrogate(student_logp: Tensor, teacher_logp: Tensor) -> tuple[Tensor, Tensor]:
    """For the sampled tokens' log-probs ``[N, T]``: (surrogate, estimate). ``estimate`` is
    k_t = log π_S(y_t) − log π_T(y_t) (detached), the one-sample reverse KL; ``surrogate`` is
    k_t · log π_S(y_t), whose gradient k_t ∇log π_S(y_t) has expectation ∇KL(π_S‖π_T)(s_t)
    under y_t ∼ π_S (E[∇log π_S] = 0 removes the baseline term). Valid on-policy: the tokens
    must be the student's own samples."""
    k = (student_logp - teacher_logp).detach()
    return k * student_logp, k
