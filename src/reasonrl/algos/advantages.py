"""Critic-free advantage estimators (GRPO family), registered in ``ADVANTAGES``.

Uniform signature::

    fn(token_rewards[B,T], response_mask[B,T], group_ids[B], **params) -> advantages[B,T]

The caller puts a sequence's outcome reward at its last valid token (and may
spread KL-in-reward penalties over tokens), so the sequence score is
s_i = Σ_t r_{i,t} m_{i,t}. Results are zero outside the mask and carry no
gradient history of their own (advantages are targets, not model outputs).
"""

from __future__ import annotations

import torch
from torch import Tensor

from reasonrl.algos.masked import as_float, group_stats, masked_sum, masked_whiten
from reasonrl.registry import ADVANTAGES

__all__ = [
    "base_advantage",
    "GRPO_SCALES",
    "sequence_scores",
    "grpo_advantages",
    "rloo_advantages",
    "discounted_returns",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
]

GRPO_SCALES = ("group", "batch", "none")


def check_shapes(token_rewards: Tensor, response_mask: Tensor, group_ids: Tensor) -> None:
    if token_rewards.dim() != 2 or token_rewards.shape != response_mask.shape:
        raise ValueError(
            "token_rewards and response_mask must both be [B,T]; got "
            f"{tuple(token_rewards.shape)} and {tuple(response_mask.shape)}"
        )
    if group_ids.shape != token_rewards.shape[:1]:
        raise ValueError(f"group_ids must be [B]={token_rewards.shape[0]}, got {tuple(group_ids.shape)}")


def broadcast(seq_values: Tensor, response_mask: Tensor) -> Tensor:
    return torch.where(response_mask.bool(), seq_values.unsqueeze(-1), 0.0)


def sequence_scores(token_rewards: Tensor, response_mask: Tensor) -> Tensor:
    """s_i = Σ_t r_{i,t} m_{i,t}, shape [B]."""
    return masked_sum(token_rewards.detach(), response_mask, dim=-1)


@ADVANTAGES.register("grpo")
def grpo_advantages(
    token_rewards: Tensor,
    response_mask: Tensor,
    group_ids: Tensor,
    *,
    scale: str = "group",
    eps: float = 1e-6,
) -> Tensor:
    """GRPO group-relative advantage (Shao et al. 2024, DeepSeekMath), broadcast to tokens.

    With s_i the sequence score and μ_g, σ_g the mean and unbiased (Bessel) std of
    the scores in i's group:

    - ``scale="group"``: A_i = (s_i − μ_g) / (σ_g + eps). Equals verl
      ``compute_grpo_outcome_advantage`` with ``norm_adv_by_std_in_grpo=True`` and
      TRL ``scale_rewards="group"`` (TRL's eps is 1e-4, verl's and ours 1e-6).
    - ``scale="batch"``: A_i = (s_i − μ_g) / (σ_batch + eps), σ_batch the unbiased
      std of all B scores (TRL ``scale_rewards="batch"``; LitePPO, Liu et al. 2025).
      The std is over the local batch: a distributed caller that wants TRL's
      gathered std must gather scores first.
    - ``scale="none"``: A_i = s_i − μ_g (Dr. GRPO, Liu et al. 2025; verl
      ``norm_adv_by_std_in_grpo=False``, TRL ``scale_rewards="none"``).

    A singleton group gets A = 0 (it carries no relative signal); verl instead
    uses μ = 0, σ = 1, i.e. A = s_i.
    """
    if scale not in GRPO_SCALES:
        raise ValueError(f"unknown GRPO scale {scale!r}; allowed: {', '.join(GRPO_SCALES)}")
    check_shapes(token_rewards, response_mask, group_ids)
    scores = sequence_scores(token_rewards, response_mask)
    mean, std, count = group_stats(scores, group_ids)
    centered = scores - mean
    if scale == "group":
        adv = centered / (std + eps)
    elif scale == "batch":
        batch_std = scores.std() if scores.numel() > 1 else scores.new_zeros(())
        adv = centered / (batch_std + eps)
    else:
        adv = centered
    adv = torch.where(count > 1, adv, 0.0)
    return broadcast(adv, response_mask)


@ADVANTAGES.register("rloo")
def rloo_advantages(token_rewards: Tensor, response_mask: Tensor, group_ids: Tensor) -> Tensor:
    """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024), broadcast to tokens.

    A_i = s_i − (1/(G−1)) Σ_{j≠i, j∈g} s_j = G/(G−1)·(s_i − μ_g), G the group size.
    Equals verl ``compute_rloo_outcome_advantage`` and TRL ``RLOOTrainer``'s
    baseline for G > 1. Singleton groups get A = 0; verl leaves A = s_i there.
    """
    check_shapes(token_rewards, response_mask, group_ids)
    scores = sequence_scores(token_rewards, response_mask)
    mean, _, count = group_stats(scores, group_ids)
    adv = torch.where(count > 1, count / (count - 1).clamp_min(1.0) * (scores - mean), 0.0)
    return broadcast(adv, response_mask)


def discounted_returns(token_rewards: Tensor, response_mask: Tensor, gamma: float = 1.0) -> Tensor:
    """G_t = Σ_{t'≥t, m_{t'}=1} γ^{t'−t} r_{t'}, zero outside the mask.

    Only valid tokens' rewards enter; the exponent counts positions, masked ones
    included. verl's loop additionally resets the running return at every
    masked position, which differs only when the mask has interior gaps (e.g.
    masked tool output between turns): there verl cuts the return, we carry it.
    """
    valid = response_mask.bool()
    r = torch.where(valid, as_float(token_rewards.detach()), 0.0)
    if gamma == 1.0:
        returns = r.flip(-1).cumsum(-1).flip(-1)
    else:
        # A closed form (γ^{-t}·revcumsum(γ^t r)) overflows for long T; the loop is O(T).
        returns = torch.zeros_like(r)
        running = torch.zeros_like(r[:, 0])
        for t in reversed(range(r.shape[1])):
            running = r[:, t] + gamma * running
            returns[:, t] = running
    return torch.where(valid, returns, 0.0)


@ADVANTAGES.register("reinforce_pp")
def reinforce_pp_advantages(
    token_rewards: Tensor, response_mask: Tensor, group_ids: Tensor, *, gamma: float = 1.0
) -> Tensor:
    """REINFORCE++ (Hu 2025): discounted returns whitened over the batch.

    A_{i,t} = whiten(G_{i,t}) with G from :func:`discounted_returns` and
    whiten = masked_whiten over every valid token of the batch (eps 1e-8).
    Equals verl ``compute_reinforce_plus_plus_outcome_advantage`` for
    right-padded masks (see :func:`discounted_returns` for interior gaps).
    ``group_ids`` is accepted for the uniform signature and ignored.
    """
    check_shapes(token_rewards, response_mask, group_ids)
    returns = discounted_returns(token_rewards, response_mask, gamma)
    return masked_whiten(returns, response_mask)


@ADVANTAGES.register("reinforce_pp_baseline")
def reinforce_pp_baseline_advantages(token_rewards: Tensor, response_mask: Tensor, group_ids: Tensor) -> Tensor:
    """REINFORCE++-baseline (Hu 2025): group-mean baseline, then batch whitening.

    A_{i,t} = whiten(s_i − μ_g) with (s_i − μ_g) broadcast to i's valid tokens and
    whiten = masked_whiten over every valid token of the batch (so longer
    sequences weigh more in the batch statistics, as in verl). Equals verl
    ``compute_reinforce_plus_plus_baseline_outcome_advantage`` except that
    singleton groups are centred to 0 (verl subtracts a baseline of 0) and the
    score sums only valid tokens (verl sums the whole row).
    """
    check_shapes(token_rewards, response_mask, group_ids)
    scores = sequence_scores(token_rewards, response_mask)
    mean, _, _ = group_stats(scores, group_ids)
    return masked_whiten(broadcast(scores - mean, response_mask), response_mask)


def base_advantage(wrapper: str, base: str, base_params: dict | None, token_rewards: Tensor, response_mask: Tensor,
                   group_ids: Tensor, batch=None, step: int | None = None, total_steps: int | None = None) -> Tensor:
    """The advantage of the registered estimator ``base`` with ``base_params``, for an advantage
    ``wrapper`` that adds its own term to another's (``residual``, ``novelty``): the name and
    parameters are checked (errors name ``advantage.base`` / ``advantage.base_params``), and the
    base gets the pipeline values (batch, step, total_steps) its signature declares."""
    from reasonrl.params import check_component_params, inject
    from reasonrl.registry import UnknownNameError

    if base == wrapper:
        raise ValueError(f"advantage.base must be a base estimator (grpo, rloo, reinforce_pp, ...), not '{wrapper}'")
    if base_params is not None and not isinstance(base_params, dict):
        raise ValueError(f"advantage.base_params must be a mapping of the base estimator's parameters, "
                         f"got {base_params!r}")
    try:
        base_fn = ADVANTAGES.get(base)
    except UnknownNameError as exc:
        raise ValueError(f"advantage.base: {exc}") from None
    pipeline = {"batch": batch, "step": step, "total_steps": total_steps}
    params = check_component_params(base_fn, base_params or {}, f"advantage '{base}'", "advantage.base_params",
                                    ("token_rewards", "response_mask", "group_ids", *pipeline))
    return inject(base_fn, (token_rewards, response_mask, group_ids), pipeline, params)
