"""macro2mind's hindsight-regret curriculum and its direction + magnitude reward, as pure maths.

Source: "Learning to Simulate Individuals from Macro Social Signals", Zhao et al., arXiv
2610.07062 (https://arxiv.org/abs/2610.07062). Abstract verified; **every formula here is INFERRED**
(formalised from the abstract), and the constants are tunable defaults.

- reward: r = 1[sign(p̂ − p0) = sign(p1 − p0)] + η · max(0, 1 − |p̂ − p1| / scale)
- regret: regret(x) = ℓ̄(answers of π on x) − ℓ̄(answers of π on the hindsight prompt of x),
  ℓ = 1 − r, each a mean over that prompt's samples
- weight: w(x) = ([regret(x)]₊ + floor) · 4 p̂_x (1 − p̂_x), p̂_x the group's success rate; 0 (drop)
  at p̂_x ∈ {0, 1}

Used by ``rewards.forecast``, ``methods.hindsight_regret`` and ``rollout.regret_sampler``.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from reasonrl.algos.masked import as_float, masked_mean

__all__ = ["direction_magnitude_reward", "hindsight_regret", "success_rate", "difficulty_weight",
           "curriculum_weight"]


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def direction_magnitude_reward(forecast: float, p0: float, p1: float, eta: float = 1.0,
                               scale: float = 10.0) -> float:
    """r = 1[sign(p̂ − p0) = sign(p1 − p0)] + η · max(0, 1 − |p̂ − p1| / scale).

    macro2mind's reward (arXiv 2610.07062, INFERRED): the direction of the move plus its
    magnitude. The spec writes 1 − |p̂ − p1| for prices in [0, 1]; prices here are in points
    (0..99), so ``scale`` is the miss that earns nothing (scale = 100 is the spec's form on a
    0..1 price; the default 10 makes a few points' miss matter) and the term is clipped at 0.
    sign(0) = 0: "no move" is a direction of its own. Format gating is the caller's (0 when
    the decomposition does not parse)."""
    if scale <= 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    direction = float(_sign(forecast - p0) == _sign(p1 - p0))
    return direction + eta * max(0.0, 1.0 - abs(forecast - p1) / scale)


def hindsight_regret(policy_rewards: Tensor, hindsight_rewards: Tensor, policy_mask: Optional[Tensor] = None,
                     hindsight_mask: Optional[Tensor] = None) -> Tensor:
    """regret(x) = ℓ̄_π(x) − ℓ̄_h(x) with ℓ = 1 − r, i.e. r̄_h(x) − r̄_π(x), per row, ``[n]``.

    ``policy_rewards`` ``[n, G]``: the rewards of the policy's answers on each example;
    ``hindsight_rewards`` ``[n, H]``: of its answers on the hindsight prompt (the same input
    plus what is known only with the outcome). Masks mark the valid entries (groups of unequal
    size); a row with no valid entry on either side is an error. Positive regret: hindsight
    would have improved the forecast, which is where the curriculum trains (macro2mind,
    arXiv 2610.07062, INFERRED)."""
    if policy_rewards.dim() != 2 or hindsight_rewards.dim() != 2 or policy_rewards.shape[0] != hindsight_rewards.shape[0]:
        raise ValueError(f"policy_rewards [n, G] and hindsight_rewards [n, H] need the same n; got "
                         f"{tuple(policy_rewards.shape)} and {tuple(hindsight_rewards.shape)}")
    pm = torch.ones_like(policy_rewards, dtype=torch.bool) if policy_mask is None else policy_mask.bool()
    hm = torch.ones_like(hindsight_rewards, dtype=torch.bool) if hindsight_mask is None else hindsight_mask.bool()
    if not (bool(pm.any(-1).all()) and bool(hm.any(-1).all())):
        raise ValueError("every example needs at least one policy reward and one hindsight reward")
    policy_loss = 1.0 - masked_mean(as_float(policy_rewards), pm, dim=-1)
    hindsight_loss = 1.0 - masked_mean(as_float(hindsight_rewards), hm, dim=-1)
    return policy_loss - hindsight_loss


def success_rate(rewards: Tensor, threshold: float, mask: Optional[Tensor] = None) -> Tensor:
    """p̂ = (1/G) Σ_i 1[r_i ≥ threshold] per row of ``rewards`` ``[n, G]`` (over the valid
    entries of ``mask``): the group success rate the difficulty weight reads."""
    hits = (as_float(rewards) >= threshold).float()
    return masked_mean(hits, torch.ones_like(hits, dtype=torch.bool) if mask is None else mask.bool(), dim=-1)


def difficulty_weight(p: Tensor) -> Tensor:
    """4 p̂ (1 − p̂): 1 at p̂ = ½, 0 at p̂ ∈ {0, 1} (the variance of a 0/1 reward, scaled to 1;
    the "still learnable" factor of macro2mind's sampler, arXiv 2610.07062, INFERRED)."""
    p = as_float(p)
    if bool(((p < 0) | (p > 1)).any()):
        raise ValueError(f"success rates must be in [0, 1], got {p.tolist()}")
    return 4.0 * p * (1.0 - p)


def curriculum_weight(regret: Tensor, p: Tensor, floor: float = 0.0) -> Tensor:
    """w(x) = ([regret(x)]₊ + floor) · 4 p̂_x (1 − p̂_x)  (macro2mind, arXiv 2610.07062, INFERRED).

    The spec's w ∝ regret · 4p̂(1 − p̂), with negative regret (the hindsight answer was worse)
    clipped to 0 and ``floor`` added so an example with zero regret keeps a small chance while
    it is learnable. Examples at p̂ ∈ {0, 1} get exactly 0: the spec's drop."""
    if floor < 0:
        raise ValueError(f"floor must be >= 0, got {floor}")
    return (as_float(regret).clamp_min(0.0) + floor) * difficulty_weight(p)
