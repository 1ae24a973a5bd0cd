"""Group-level sample selection helpers (DAPO dynamic sampling)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from reasonrl.algos.masked import as_float, group_inverse, group_std

__all__ = ["ZERO_VARIANCE_TOL", "zero_variance_groups", "group_reward_std", "one_group_reward_std"]

ZERO_VARIANCE_TOL = 1e-6


def zero_variance_groups(rewards: Tensor, group_ids: Tensor, tol: float = ZERO_VARIANCE_TOL) -> Tensor:
    """True for samples whose group's rewards are all equal: max_g − min_g ≤ tol. [B] bool.

    These groups have zero GRPO advantage and are what DAPO dynamic sampling
    (Yu et al. 2025; verl ``filter_groups``) drops and resamples. verl filters on
    std == 0 of a chosen metric; the range with a tolerance is robust to float
    noise in summed rewards. A singleton group counts as zero-variance.
    """
    if rewards.dim() != 1 or rewards.shape != group_ids.shape:
        raise ValueError(f"rewards and group_ids must both be [B]; got {tuple(rewards.shape)}, {tuple(group_ids.shape)}")
    rewards = as_float(rewards)
    inverse, num_groups = group_inverse(group_ids)
    hi = torch.full((num_groups,), -torch.inf, dtype=rewards.dtype, device=rewards.device)
    lo = torch.full((num_groups,), torch.inf, dtype=rewards.dtype, device=rewards.device)
    hi = hi.scatter_reduce(0, inverse, rewards, reduce="amax")
    lo = lo.scatter_reduce(0, inverse, rewards, reduce="amin")
    return (hi - lo)[inverse] <= tol


def group_reward_std(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Per-sample unbiased std of the sample's group rewards, [B]; 0 for singletons."""
    return group_std(rewards, group_ids)


def one_group_reward_std(values: list[float]) -> float:
    """The unbiased std of one group's rewards (GRPO's, as verl and TRL compute it); 0 for a
    group of one and for non-finite rewards (a failed reward already scores 0)."""
    finite = [v for v in values if math.isfinite(v)]
    return float(torch.tensor(finite, dtype=torch.float64).std()) if len(finite) > 1 else 0.0
