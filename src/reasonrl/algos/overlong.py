"""Handling of over-long completions (DAPO, Yu et al. 2025)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["soft_overlong_punishment", "mask_truncated_completions"]


def soft_overlong_punishment(
    lengths: Tensor, max_len: int, buffer_len: int, penalty_factor: float = 1.0
) -> Tensor:
    """DAPO soft overlong punishment, a reward term per sequence, [B] float32.

    With L the completion length and L_exp = max_len − buffer_len:
    0 if L ≤ L_exp; (L_exp − L)/buffer_len · penalty_factor if L_exp < L ≤ max_len
    (linear from 0 down to −penalty_factor); −penalty_factor if L > max_len.
    Equals TRL ``get_soft_overlong_punishment(max_completion_len, soft_punish_cache)``
    for penalty_factor = 1, and verl's DAPO ``overlong_buffer`` reward with
    ``penalty_factor``.
    """
    if not 0 < buffer_len <= max_len:
        raise ValueError(f"need 0 < buffer_len <= max_len, got buffer_len={buffer_len}, max_len={max_len}")
    lengths = lengths.to(torch.float32)
    expected = float(max_len - buffer_len)
    ramp = (expected - lengths) / buffer_len * penalty_factor
    out = torch.where(lengths <= expected, torch.zeros_like(lengths), ramp)
    return torch.where(lengths > max_len, torch.full_like(lengths, -float(penalty_factor)), out)


def mask_truncated_completions(response_mask: Tensor, truncated: Tensor) -> Tensor:
    """Zero the mask rows of completions that did not finish (no EOS before the limit).

    mask'_{i,t} = m_{i,t}·(1 − truncated_i); dtype of ``response_mask`` is kept.
    Equals TRL ``mask_truncated_completions=True`` (DAPO's overlong filtering).
    """
    if truncated.shape != response_mask.shape[:1]:
        raise ValueError(f"truncated must be [B]={response_mask.shape[0]}, got {tuple(truncated.shape)}")
    return torch.where(truncated.bool().unsqueeze(-1), torch.zeros_like(response_mask), response_mask)
