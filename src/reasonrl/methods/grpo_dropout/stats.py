"""GRPODropout's per-rollout statistics, shared by its selector and its advantage.

ℓ_k (:func:`sequence_logprob`), the GRPO sequence advantage A_k, the entropy push
P_k (:func:`entropy_push`), the least number of rollouts kept per group m
(:func:`min_keep_count`) and the threshold schedule a(t) (:func:`threshold_ratio`),
with the option names and the tolerance both stages use. The method itself is
described in :mod:`reasonrl.methods.grpo_dropout.stages`, which re-exports everything here.
"""

from __future__ import annotations

import torch
from torch import Tensor

from reasonrl.algos.advantages import grpo_advantages
from reasonrl.algos.masked import as_float, group_inverse, group_sum, masked_mean, masked_sum

__all__ = ["BASES", "CENTER_MODES", "MAX_EXHAUSTIVE", "PUSH_TOL", "VARIANTS", "check_choice", "entropy_push",
           "min_keep_count", "sequence_grpo_advantages", "sequence_logprob", "threshold_ratio"]

VARIANTS = ("balance", "threshold", "drop_pos")
BASES = ("avg", "sum")
CENTER_MODES = ("none", "weighted_center", "weighted_center_rescale", "weighted_standardize")
# The authors' sign tolerance: |P| ≤ 1e-12 counts as a zero push (float64 statistics).
PUSH_TOL = 1e-12
# drop_pos enumerates every subset of its prune candidates: 2^18 subsets is the most we allow.
MAX_EXHAUSTIVE = 18


def check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    """Raise a ValueError naming ``name`` unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"grpo_dropout: {name}={value!r} is not allowed; expected one of {', '.join(allowed)}")


def sequence_logprob(logprobs: Tensor, mask: Tensor, basis: str = "avg") -> Tensor:
    """Trajectory log-prob proxy ℓ_k, shape [B].

    ``avg``: ℓ_k = (1/T_k) Σ_t m_{k,t} log π_old(y_{k,t}|s_{k,t}); ``sum``: ℓ_k = Σ_t m log π_old.
    A row with an empty mask gets ℓ = 0. Equals the authors' ``traj_logp_avglogprob`` /
    ``traj_logp_sumlogprob`` (GRPODropout ``selector.py``). Float64 input stays float64.
    """
    check_choice("basis", basis, BASES)
    if logprobs.shape != mask.shape or logprobs.dim() != 2:
        raise ValueError(f"logprobs and mask must both be [B,T]; got {tuple(logprobs.shape)} and {tuple(mask.shape)}")
    logprobs = logprobs.detach()
    return masked_mean(logprobs, mask, dim=-1) if basis == "avg" else masked_sum(logprobs, mask, dim=-1)


def sequence_grpo_advantages(scores: Tensor, group_ids: Tensor, eps: float = 1e-6) -> Tensor:
    """GRPO sequence advantages A_k = (R_k − mean_g R)/(std_g R + eps), unbiased std, [B].

    Exactly :func:`reasonrl.algos.advantages.grpo_advantages` (``scale="group"``) applied to
    one-token sequences; singleton groups get 0 (verl gives A = R_k there).
    """
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D [B], got shape {tuple(scores.shape)}")
    ones = torch.ones(scores.shape[0], 1, dtype=torch.bool, device=scores.device)
    return grpo_advantages(scores.detach().unsqueeze(-1), ones, group_ids, eps=eps)[:, 0]


def entropy_push(advantages: Tensor, seq_logprob: Tensor, group_ids: Tensor) -> Tensor:
    """Entropy push P_k = A_k (s_k − Ĥ_g), s_k = −ℓ_k, Ĥ_g = mean of s over k's group, [B].

    P_k > 0: the rollout pushes the policy entropy up (a rare correct answer, or a likely
    wrong one); P_k < 0: it pushes entropy down (a likely correct answer, or a rare wrong
    one). With zero-mean A, (1/G) Σ_k P_k = −Cov_k(A, ℓ). Equals the authors'
    ``traj_entropy_push_before_*``.
    """
    if advantages.shape != seq_logprob.shape or advantages.shape != group_ids.shape or advantages.dim() != 1:
        raise ValueError("advantages, seq_logprob and group_ids must all be [B]; got "
                         f"{tuple(advantages.shape)}, {tuple(seq_logprob.shape)}, {tuple(group_ids.shape)}")
    surprisal = -as_float(seq_logprob.detach())
    inverse, num_groups = group_inverse(group_ids)
    count = group_sum(torch.ones_like(surprisal), inverse, num_groups)
    centre = (group_sum(surprisal, inverse, num_groups) / count)[inverse]
    return as_float(advantages.detach()) * (surprisal - centre)


def min_keep_count(group_size: int, min_keep: int | None = None) -> int:
    """Rollouts kept at least per group: m = max(1, ⌊G/4⌋) (2 for G = 8), or ``min_keep`` capped at G."""
    if min_keep is None:
        return max(1, group_size // 4)
    return min(int(min_keep), group_size)


def threshold_ratio(step: int, total_steps: int, a0: float = 1.0, a1: float = 0.0) -> float:
    """Linear schedule a(t) = a0 + (a1 − a0)(t − 1)/(T_total − 1), t = step + 1 (1-based).

    ``step`` is the pipeline's 0-based step, so the first step uses a0 and the last a1.
    Progress is clipped to [0, 1]; T_total ≤ 1 gives a0 (as the authors'
    ``_compute_balance_target_ratio``).
    """
    if total_steps <= 1:
        return float(a0)
    progress = min(max(step / (total_steps - 1), 0.0), 1.0)
    return float(a0 + (a1 - a0) * progress)
