"""How far a stale prefix of a partial rollout is from the current policy, and what a prefix
check kept: the measurements of a weight switch mid-generation, whatever check decides it.

A pending prefix y_{<k} (right-padded ``prefix_mask[B,T]``: row i's prefix is t < k_i) was
sampled by μ. With d_t = clamp(log π_θ(y_t|s_t) − log μ(y_t|s_t), ±``LOG_RATIO_CLAMP``),
:func:`ops` is its off-policy shift (OPS) and :func:`verification_metrics` summarises the kept
lengths. The partial rollouts of ``reasonrl.rollout.partial`` log both for every check (``keep``,
``discard``, and RollVerify's, ``reasonrl.methods.rollverify``, which decides by them); the
metric names keep RollVerify's ``rollverify/`` prefix they were published under.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from reasonrl.algos.kl import kl_k3
from reasonrl.algos.losses import LOG_RATIO_CLAMP
from reasonrl.algos.masked import masked_mean
from reasonrl.algos.offpolicy import _log_ratio as offpolicy_log_ratio

__all__ = ["prefix_valid", "prefix_log_ratio", "first_false", "ops", "verification_metrics"]


def prefix_valid(mask: Tensor, *others: Tensor) -> Tensor:
    """The prefix mask as bool, checked to be [B,T], right-padded and shaped like ``others``."""
    if mask.dim() != 2 or any(o.shape != mask.shape for o in others):
        raise ValueError(f"expected tensors of one [B,T] shape; got {tuple(mask.shape)} and "
                         f"{[tuple(o.shape) for o in others]}")
    valid = mask.bool()
    pos = torch.arange(valid.shape[-1], device=valid.device)
    if not bool((valid == (pos < valid.sum(-1, keepdim=True))).all()):
        raise ValueError("prefix_mask must be right-padded: each row's prefix is positions 0..k-1")
    return valid


def prefix_log_ratio(current: Tensor, behaviour: Tensor, valid: Tensor) -> Tensor:
    """d_t = clamp(log π − log μ, ±20) on the prefix, 0 elsewhere (float32, detached)."""
    return offpolicy_log_ratio(current, behaviour, valid)[1].clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def first_false(ok: Tensor, valid: Tensor) -> Tensor:
    """Per row, the number of prefix tokens before the first prefix token where ``ok`` is False."""
    run = (ok | ~valid).long().cumprod(-1).bool()
    return (run & valid).sum(-1)


def ops(current_logprobs: Tensor, behaviour_logprobs: Tensor, prefix_mask: Tensor) -> dict[str, Tensor]:
    """Off-policy shift of each prefix, three forms, each [B] float32 (0 for an empty prefix).

    - ``mean_abs`` = (1/k) Σ_{t<k} |d_t| — the spec's OPS, compared with RollVerify's τ_seq;
    - ``k3`` = (1/k) Σ_{t<k} (e^{−d_t} − 1 + d_t), as the spec writes it: :func:`kl_k3` with
      logp = π, ref = μ (its ±20 / ≤10 clamps apply per token). Caveat: this is the unbiased k3 of
      KL(π‖μ) only for tokens drawn from π; on μ's tokens its mean tends to χ²(μ‖π) − KL(μ‖π) ≥ 0.
      It weighs tokens π now finds unlikely (d ≪ 0, the ones acceptance rejects) most. The unbiased
      KL(μ‖π) from μ's samples is e^{d} − 1 − d (``offpolicy/kl_behaviour``);
    - ``max_abs`` = max_{t<k} |d_t| — the TRM-style bound (arXiv 2512.23075), on τ_tok's scale.
    """
    valid = prefix_valid(prefix_mask, current_logprobs, behaviour_logprobs)
    d = prefix_log_ratio(current_logprobs, behaviour_logprobs, valid)
    k3 = torch.where(valid, kl_k3(d, torch.zeros_like(d)), 0.0)
    return {"mean_abs": masked_mean(d.abs(), valid, dim=-1), "k3": masked_mean(k3, valid, dim=-1),
            "max_abs": torch.where(valid, d.abs(), 0.0).amax(-1)}


def verification_metrics(prefix_lengths: Tensor, kept_lengths: Tensor,
                         sequence_keep: Optional[Tensor] = None) -> dict[str, float]:
    """Verification statistics as plain floats, over rows with a non-empty prefix (0.0 if none).

    A row dropped by sequence verification (``sequence_keep`` False) keeps 0 tokens.
    - ``rollverify/sequence_kept_fraction``: share of prefixes that passed a sequence-level check;
    - ``rollverify/truncation_mean``: mean kept length (the truncation point t*), in tokens;
    - ``rollverify/truncation_fraction``: mean of kept / k per row;
    - ``rollverify/fully_accepted_fraction``: share of prefixes kept whole;
    - ``rollverify/regenerated_tokens``: Σ (k − kept), the stale tokens that must be resampled.
    """
    k = prefix_lengths.detach().to(torch.float64).flatten()
    kept = kept_lengths.detach().to(torch.float64).flatten()
    seq = torch.ones_like(k, dtype=torch.bool) if sequence_keep is None else sequence_keep.bool().flatten()
    if not k.shape == kept.shape == seq.shape:
        raise ValueError(f"expected [B] tensors of one shape; got {tuple(k.shape)}, {tuple(kept.shape)}, "
                         f"{tuple(seq.shape)}")
    rows = k > 0
    kept = torch.where(seq & rows, torch.minimum(kept, k), 0.0)
    frac = torch.where(rows, kept / k.clamp_min(1.0), 0.0)
    return {
        "rollverify/sequence_kept_fraction": float(masked_mean(seq.double(), rows)),
        "rollverify/truncation_mean": float(masked_mean(kept, rows)),
        "rollverify/truncation_fraction": float(masked_mean(frac, rows)),
        "rollverify/fully_accepted_fraction": float(masked_mean((kept == k).double(), rows)),
        "rollverify/regenerated_tokens": float(torch.where(rows, k - kept, 0.0).sum()),
    }
