"""OmniSeek's audio-visual necessity reward, as pure tensor math (arXiv 2610.02181, "OmniSeek:
Native Tool Integration for Multi-turn Audio-Visual Reasoning", Wang et al.;
https://arxiv.org/abs/2610.02181). The model side (the masked forwards) is ``reasonrl.methods.omniseek.method``.

For a sampled trajectory, ℓ^full_t is the log-likelihood of token t under the policy and
ℓ^{\\X}_t the same with the attention keys of channel X's tokens masked (no position attends to
them). Then, per row::

    Δ^X_t   = ℓ^full_t − ℓ^{\\X}_t                       (per-token drop when X is hidden)
    nec_X   = (1/|M|) Σ_{t∈M} [Δ^X_t]₊                    ([x]₊ = max(x, 0); 0 when M is empty)
    r_nec   = c · min_X nec_X,   c = 1[answer correct]    (min over the channels: both A and V)

The paper has two channels (audio A, visual V); with K channels the min runs over all K, so a
trajectory scores only when every channel is needed.

M, precisely (INFERRED: the paper says "thinking + answer tokens")::

    M_t = response_mask_t · 1[∃ s < t : channel_s > 0]

the trained (model-written) tokens that come after the first token of any tagged observation.
The paper's thinking and answer tokens are the model's tokens; the tool-call tokens of later
turns are model tokens too and are kept. Tokens before the first observation are left out: they
cannot attend to any channel, so their Δ is 0 by causality and would only dilute the mean by the
length of the first turn (the paper's rollouts see the audio-visual input from the start, so the
question does not arise there). Also INFERRED: the gate reads the correctness reward as c =
1[score > 0.5] (for a 0/1 reward, the reward itself).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from reasonrl.algos.masked import as_float, masked_mean

__all__ = ["necessity_mask", "positive_drops", "channel_necessity", "necessity_reward"]


def necessity_mask(response_mask: Tensor, channel: Tensor) -> Tensor:
    """Bool ``[B,T]``: M_t = response_mask_t ∧ ∃ s < t with channel_s > 0 (see the module
    docstring). ``channel`` holds 0 on untagged tokens, k ≥ 1 on channel k's tokens."""
    tagged = (channel > 0).long()
    seen_before = (tagged.cumsum(-1) - tagged) > 0  # a tagged token strictly before t
    return response_mask.bool() & seen_before


def positive_drops(logp_full: Tensor, logp_masked: Tensor, mask: Tensor) -> Tensor:
    """[Δ_t]₊ = max(ℓ^full_t − ℓ^{\\X}_t, 0) on ``mask``, 0 elsewhere (NaN-safe: padding is
    selected away, never multiplied)."""
    drop = (as_float(logp_full) - as_float(logp_masked)).clamp_min(0.0)
    return torch.where(mask.bool(), drop, torch.zeros_like(drop))


def channel_necessity(logp_full: Tensor, logp_masked: Tensor, mask: Tensor) -> Tensor:
    """nec_X per row, ``[B]``: (1/|M|) Σ_{t∈M} [Δ^X_t]₊; a row with an empty M gets 0."""
    return masked_mean(positive_drops(logp_full, logp_masked, mask), mask, dim=-1)


def necessity_reward(logp_full: Tensor, logp_masked: Sequence[Tensor], mask: Tensor,
                     correct: Tensor) -> tuple[Tensor, Tensor]:
    """r_nec = c · min_X nec_X per row, and the per-channel nec_X.

    ``logp_full`` ``[B,T]``: ℓ^full; ``logp_masked``: one ``[B,T]`` ℓ^{\\X} per channel X;
    ``mask``: M (:func:`necessity_mask`); ``correct`` ``[B]``: c (bool or 0/1). Returns
    ``(r_nec [B], nec [K,B])``."""
    if not logp_masked:
        raise ValueError("necessity_reward needs the log-probs of at least one masked channel")
    nec = torch.stack([channel_necessity(logp_full, lp, mask) for lp in logp_masked])
    gate = correct.to(nec.device).bool()
    return torch.where(gate, nec.min(0).values, torch.zeros_like(nec[0])), nec
