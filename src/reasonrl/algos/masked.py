"""Masked reductions and per-group statistics.

Every helper selects valid entries with ``torch.where`` rather than multiplying
by the mask, so NaN/inf sitting in padding can never leak into a result (``nan *
0`` is ``nan``). Inputs are computed in at least float32: half precision is
upcast, float64 is kept.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

__all__ = [
    "as_float",
    "mask_count",
    "masked_sum",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "group_inverse",
    "group_sum",
    "group_first_rows",
    "group_count",
    "group_mean",
    "group_std",
    "group_stats",
]


def as_float(x: Tensor) -> Tensor:
    """Return ``x`` as float32, or unchanged when it is already float32/float64."""
    if x.dtype in (torch.float32, torch.float64):
        return x
    return x.to(torch.float32)


def _valid(mask: Tensor) -> Tensor:
    return mask.bool() if mask.dtype != torch.bool else mask


def masked_sum(x: Tensor, mask: Tensor, dim: Optional[int] = None) -> Tensor:
    """Σ x·m over valid entries (all of them when ``dim`` is None, else along ``dim``).

    Equals verl ``verl_F.masked_sum`` except that padding values are selected
    away, not multiplied by zero.
    """
    x = torch.where(_valid(mask), as_float(x), 0.0)
    return x.sum() if dim is None else x.sum(dim)


def mask_count(mask: Tensor, dim: Optional[int] = None) -> Tensor:
    """Number of valid entries (float), overall or along ``dim``."""
    m = _valid(mask).to(torch.float32)
    return m.sum() if dim is None else m.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: Optional[int] = None) -> Tensor:
    """Σ x·m / Σ m; an empty mask gives 0.

    verl ``masked_mean`` divides by ``Σ m + 1e-8`` instead; the two agree
    whenever at least one entry is valid.
    """
    return masked_sum(x, mask, dim) / mask_count(mask, dim).clamp_min(1.0)


def masked_var(x: Tensor, mask: Tensor, dim: Optional[int] = None, unbiased: bool = True) -> Tensor:
    """Variance of the valid entries, Bessel-corrected when ``unbiased``.

    var = Σ m (x − μ)² / (n − 1), n = Σ m (``n`` without Bessel). Fewer than two
    valid entries (one when biased) give 0; verl ``masked_var`` raises instead.
    """
    x = as_float(x)
    mean = masked_mean(x, mask, dim)
    centered = x - (mean if dim is None else mean.unsqueeze(dim))
    sq = masked_sum(centered.square(), mask, dim)
    n = mask_count(mask, dim)
    denom = n - 1.0 if unbiased else n
    return torch.where(denom > 0, sq / denom.clamp_min(1.0), torch.zeros_like(sq))


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-8, shift_mean: bool = True) -> Tensor:
    """(x − μ)·rsqrt(var + eps) over all valid entries of ``x``; zero outside the mask.

    μ and the unbiased var are taken over every valid entry of the whole tensor.
    Equals verl ``verl_F.masked_whiten`` followed by ``* response_mask`` (verl
    leaves garbage at padding until the caller multiplies). With
    ``shift_mean=False`` μ is added back, as in verl.
    """
    x = as_float(x)
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(_valid(mask), out, 0.0)


# --------------------------------------------------------------------------- groups


def last_token_mask(mask: Tensor) -> Tensor:
    """Bool ``[B,T]``: the last position of each row where ``mask`` is set (all False for an
    empty row). Where a scalar outcome reward sits (verl's convention)."""
    valid = _valid(mask)
    count = valid.long()
    return valid & (count.cumsum(-1) == count.sum(-1, keepdim=True))


def group_inverse(group_ids: Tensor) -> Tuple[Tensor, int]:
    """Map arbitrary non-negative group ids to dense indices 0..G-1.

    Returns ``(inverse[B], G)``; ``torch.unique`` keeps memory O(G) even when the
    ids are large or sparse (e.g. prompt hashes).
    """
    if group_ids.dim() != 1:
        raise ValueError(f"group_ids must be 1-D [B], got shape {tuple(group_ids.shape)}")
    if group_ids.dtype.is_floating_point:
        raise ValueError(f"group_ids must be an integer tensor, got {group_ids.dtype}")
    uniq, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, int(uniq.numel())


def _check_values(values: Tensor, group_ids: Tensor) -> Tensor:
    if values.dim() != 1 or values.shape != group_ids.shape:
        raise ValueError(
            f"values must be 1-D and match group_ids; got {tuple(values.shape)} vs {tuple(group_ids.shape)}"
        )
    return as_float(values)


def group_sum(values: Tensor, inverse: Tensor, num_groups: int) -> Tensor:
    """Σ of ``values`` over each dense group index of ``inverse`` (from :func:`group_inverse`),
    shaped [num_groups, ...]."""
    return torch.zeros((num_groups, *values.shape[1:]), dtype=values.dtype, device=values.device).index_add_(
        0, inverse, values)


def group_first_rows(inverse: Tensor, num_groups: int) -> Tensor:
    """The index of each dense group's first row, [num_groups] (from :func:`group_inverse`): one
    representative row per group (its prompt, its problem) without a Python loop."""
    rows = torch.arange(inverse.shape[0], device=inverse.device)
    first = torch.full((num_groups,), inverse.shape[0], dtype=torch.long, device=inverse.device)
    return first.scatter_reduce(0, inverse, rows, reduce="amin")


def group_stats(values: Tensor, group_ids: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """Per-sample (group mean, unbiased group std, group size), each shaped [B].

    μ_g = Σ_{j∈g} v_j / n_g, σ_g = sqrt(Σ_{j∈g} (v_j − μ_g)² / (n_g − 1)).
    Singleton groups get σ = 0 (torch.std would give NaN). Two-pass (mean, then
    squared deviations) for numerical stability; no Python loop over the batch.
    """
    values = _check_values(values, group_ids)
    inverse, num_groups = group_inverse(group_ids)
    count = group_sum(torch.ones_like(values), inverse, num_groups)
    mean = group_sum(values, inverse, num_groups) / count
    sq = group_sum((values - mean[inverse]).square(), inverse, num_groups)
    var = torch.where(count > 1, sq / (count - 1).clamp_min(1.0), torch.zeros_like(sq))
    return mean[inverse], var.sqrt()[inverse], count[inverse]


def group_mean(values: Tensor, group_ids: Tensor) -> Tensor:
    """Per-sample mean of the sample's group, [B]."""
    return group_stats(values, group_ids)[0]


def group_std(values: Tensor, group_ids: Tensor) -> Tensor:
    """Per-sample unbiased std of the sample's group, [B]; 0 for singleton groups."""
    return group_stats(values, group_ids)[1]


def group_count(group_ids: Tensor) -> Tensor:
    """Per-sample size of the sample's group, [B] (float)."""
    inverse, num_groups = group_inverse(group_ids)
    ones = torch.ones(group_ids.shape[0], dtype=torch.float32, device=group_ids.device)
    return group_sum(ones, inverse, num_groups)[inverse]
