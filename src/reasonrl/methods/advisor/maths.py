"""The information gain of an advisor's answer, as pure tensor math: stage 2 of "Learning to Ask:
Information Acquisition for SLM-LLM Collaboration, under a budget" (Kim, Li, Lee; arXiv
2610.01236, https://arxiv.org/abs/2610.01236). Formalised from the abstract: the reward is INFERRED,
and so is everything below that the spec leaves open. The model side (the teacher-forced
forwards with and without the advice) is ``reasonrl.methods.advisor.method``.

The spec's stage-2 reward is::

    R₂ = 1[correct] + η·( p(correct | advice) − p(correct | no advice) ) − λ_tok·|query|/L

Here p(correct | ·) is the current policy's probability of the gold answer y* = (y₁ … y_m)
(the task's answer text, e.g. ``####472``, then EOS) appended to the episode's transcript x in
place of its own final answer (teacher-forced), with the advice tokens visible (x) or hidden
(x \\ advice)::

    ℓ_j          = log π(y_j | x, y_<j)                 (float32, no gradient)
    sequence:    p = exp( Σ_j ℓ_j )                     (default: the probability of writing y*)
    token_mean:  p = (1/m) Σ_j exp(ℓ_j)                 (RLCPR's mean token probability)
    gain         = g · (p_with − p_without),   g = 1[correct] when gated, else 1
    r            = η · gain                             (added to the reward; 0 for rows without advice)

``sequence`` is the default because it *is* a probability of answering y* (a lower bound on
p(correct): other spellings of the same number also score), so the difference is in [−1, 1] like
the spec's, and its size does not depend on how many format tokens (``####``, EOS) the answer
carries: those are near-certain in both views and multiply both by about 1, where the token mean
would average them in and shrink the gain by the share of format tokens. ``token_mean`` is kept
for long textual answers, whose sequence probability vanishes, and to compare with RLCPR.
"""

from __future__ import annotations

from typing import Literal, Optional

import torch
from torch import Tensor

from reasonrl.algos.masked import as_float

__all__ = ["answer_probability", "advice_gain"]

Aggregate = Literal["sequence", "token_mean"]


def answer_probability(logp: Tensor, mask: Tensor, aggregate: Aggregate = "sequence") -> Tensor:
    """p per row, ``[B]``, from the answer tokens' log-probs ``logp`` ``[B,m]`` on ``mask``
    (padding may hold anything, NaN included: it is selected away, never multiplied):
    ``sequence``: exp(Σ_j ℓ_j); ``token_mean``: (1/m) Σ_j exp(ℓ_j). A row with an empty mask gets 0."""
    mask = mask.bool()
    lp = torch.where(mask, as_float(logp), torch.zeros((), dtype=torch.float32, device=logp.device))
    count = mask.sum(-1)
    if aggregate == "sequence":
        p = lp.sum(-1).exp()
    elif aggregate == "token_mean":
        p = torch.where(mask, lp.exp(), torch.zeros_like(lp)).sum(-1) / count.clamp(min=1)
    else:
        raise ValueError(f"aggregate must be 'sequence' or 'token_mean', got {aggregate!r}")
    return torch.where(count > 0, p, torch.zeros_like(p))


def advice_gain(logp_with: Tensor, logp_without: Tensor, answer_mask: Tensor, has_advice: Tensor,
                aggregate: Aggregate = "sequence", correct: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
    """gain = g · (p_with − p_without) per row (see the module docstring), and p_with, p_without.

    ``logp_with`` / ``logp_without`` ``[B,m]``: log π of the gold answer's tokens given the
    transcript with / without the advice; ``answer_mask`` ``[B,m]``: the answer's tokens;
    ``has_advice`` ``[B]``: rows with an answered call (others get gain 0 and p = 0, whatever
    their log-probs); ``correct`` ``[B]`` (bool or 0/1): the gate g, None for no gate (the spec's
    formula). Returns ``(gain [B], p_with [B], p_without [B])``."""
    has = has_advice.to(logp_with.device).bool()
    zero = torch.zeros(has.shape, dtype=torch.float32, device=logp_with.device)
    p_with = torch.where(has, answer_probability(logp_with, answer_mask, aggregate), zero)
    p_without = torch.where(has, answer_probability(logp_without, answer_mask, aggregate), zero)
    gain = p_with - p_without
    if correct is not None:
        gain = torch.where(correct.to(gain.device).bool(), gain, zero)
    return gain, p_with, p_without
