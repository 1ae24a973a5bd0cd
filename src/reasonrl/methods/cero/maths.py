"""CERO, Cross-Epoch Adaptive Rollout Optimization (arXiv 2606.05606): the pure parts.

Confidence PARTIAL (https://arxiv.org/abs/2606.05606, abstract only): the components (a Beta posterior per prompt, the
posterior expected Bernoulli variance as the value of more rollouts, a concave saturating utility
of cumulative exposure, a Fenchel-dual reformulation solved by projected online gradient descent on
prompt slopes and a budget price) are from the abstract; every exact form below is INFERRED.

Units: exposure is counted in **groups** of G rollouts (each admitted prompt gets one fixed-size
group per step, as the abstract describes), so the spec's c = 8 rollouts is c = 1 group of 8.
All functions are tensors in, tensors out, over a pool of P prompts.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["beta_update", "posterior_value", "saturating_utility", "target_exposure", "slope_step",
           "price_step", "admission_order", "admitted_count"]


def beta_update(alpha: Tensor, beta: Tensor, successes: Tensor, trials: Tensor, discount: float = 1.0,
                prior: float = 1.0) -> tuple[Tensor, Tensor]:
    """The Beta posterior of each prompt's success rate after new rollouts (INFERRED, 2606.05606)::

        α ← α₀ + γ (α − α₀) + s        β ← β₀ + γ (β − β₀) + (n − s)

    s: successes (0/1-clipped rewards summed), n: trials, α₀ = β₀ = ``prior`` (the spec's
    Beta(1, 1) start), γ = ``discount`` ∈ (0, 1]: old evidence fades as the policy changes. The
    spec writes α ← γα; discounting the evidence and not the prior keeps v_i away from 0 for a
    prompt that goes unobserved for long (γα → 0 would make v → 0, "nothing to learn")."""
    if not 0 < discount <= 1:
        raise ValueError(f"discount must be in (0, 1], got {discount}")
    if bool((successes < 0).any()) or bool((successes > trials).any()):
        raise ValueError("successes must lie in [0, trials]")
    alpha = prior + discount * (alpha - prior) + successes
    beta = prior + discount * (beta - prior) + (trials - successes)
    return alpha, beta


def posterior_value(alpha: Tensor, beta: Tensor) -> Tensor:
    """v_i = E[p(1 − p)] under Beta(α, β) = αβ / ((α + β)(α + β + 1)) (2606.05606: the posterior
    expected Bernoulli variance, the value of more rollouts: a group-relative advantage learns
    only from reward contrast, whose expected size is p(1 − p)). Beta(1, 1): 1/6; at most ¼."""
    s = alpha + beta
    return alpha * beta / (s * (s + 1))


def saturating_utility(value: Tensor, exposure: Tensor, saturation: float) -> Tensor:
    """U_i(N) = v_i · c · (1 − exp(−N/c)) (INFERRED, 2606.05606 "concave saturating utility of
    cumulative exposure"): marginal utility U′(N) = v_i e^{−N/c}, v_i at N = 0, falling with each
    group; c (``saturation``, in groups) is how many groups it takes to use up ~63% of U(∞) = v_i c."""
    return value * saturation * (1 - torch.exp(-exposure / saturation))


def target_exposure(value: Tensor, slope: Tensor, saturation: float, cap: float = math.inf) -> Tensor:
    """N_i*(λ) = (U_i′)⁻¹(λ) = c · log(v_i/λ)₊, capped at ``cap`` (INFERRED, 2606.05606): the
    cumulative exposure at which the marginal utility falls to the slope λ_i. λ = 0 (or v/λ above
    e^{cap/c}) gives ``cap``; the sampler passes the horizon K (one group per step at most)."""
    ratio = value / slope.clamp_min(torch.finfo(slope.dtype).tiny)
    out = saturation * torch.log(ratio).clamp_min(0.0)
    return torch.where(slope > 0, out, torch.full_like(out, math.inf)).clamp_max(cap)


def slope_step(slope: Tensor, served: Tensor, target: Tensor, horizon: int, lr: float,
               upper: Tensor | float) -> Tensor:
    """Projected online gradient step on the prompt slopes (INFERRED, 2606.05606)::

        λ_i ← Proj_[0, λ_max,i] [ λ_i − η_λ (n_i,k − N_i*(λ_i)/K) ]

    n_i,k: groups prompt i got this step, N_i*/K its pace toward the target exposure, K the
    ``horizon``. A prompt served faster than its pace loses slope (diminishing returns); one left
    out regains it while λ_i < v_i. ``upper`` = λ_max (the sampler uses v_i = U_i′(0): a slope above
    the utility's largest marginal value means nothing)."""
    if horizon < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    step = slope - lr * (served - target / horizon)
    upper = torch.as_tensor(upper, dtype=slope.dtype)
    return torch.minimum(step.clamp_min(0.0), upper)


def price_step(price: float, spent: float, pace: float, lr: float) -> float:
    """Projected online gradient step on the budget price (INFERRED, 2606.05606)::

        μ ← max(0, μ + η_μ (Σ_i n_i,k − B/K) / (B/K))

    Σ_i n_i,k: the step's groups, B/K the pace. The spec's gradient Σn − B/K is divided by the pace
    so that η_μ is unit-free (the same OGD with a rescaled step): spending ahead of pace raises the
    price, which admits fewer prompts; spending behind lowers it."""
    if pace <= 0:
        raise ValueError(f"pace must be > 0, got {pace}")
    return max(0.0, price + lr * (spent - pace) / pace)


def admission_order(slope: Tensor, price: float, tiebreak: Tensor) -> tuple[Tensor, Tensor]:
    """The per-step primal of the dual (INFERRED, 2606.05606): n_i,k = argmax_n (λ_i − μ) n, so
    prompt i is admitted iff λ_i − μ > 0, best first. Returns (every index ranked by λ − μ
    descending, ties in the order of ``tiebreak``, a permutation; how many have λ − μ > 0)."""
    if tiebreak.shape != slope.shape:
        raise ValueError(f"tiebreak must be a permutation of {slope.numel()} indices")
    margin = slope - price
    ranked = tiebreak[torch.argsort(margin[tiebreak], descending=True, stable=True)]
    return ranked, int((margin > 0).sum())


def admitted_count(ranked_slope: Tensor, price: float, pace: float, lr: float, low: int, high: int) -> int:
    """How many of the ranked prompts a step admits: the largest m ≤ ``high`` such that each of the
    first m beats the price its own admission produces (INFERRED; the implicit, proximal form of
    :func:`price_step`)::

        λ_(j) − μ_j > 0 for j = 1..m,   μ_j = max(0, μ + η_μ (j − B/K) / (B/K))

    then clipped to [``low``, ``high``]. λ_(j) is the j-th largest slope (``ranked_slope``), B/K
    the ``pace`` in groups. The explicit rule (admit iff λ_i − μ > 0) turns on or off a whole
    cluster of prompts with equal slopes at once (every unseen prompt starts at v = 1/6), so
    a step would get all ``high`` groups or one; here the admission uses the price the step's
    own spend leads to, so a step at the price's level gets about the pace."""
    if pace <= 0 or low < 1 or high < low:
        raise ValueError(f"need pace > 0 and 1 <= low <= high; got pace={pace}, low={low}, high={high}")
    j = torch.arange(1, min(high, ranked_slope.numel()) + 1, dtype=ranked_slope.dtype)
    running = (price + lr * (j - pace) / pace).clamp_min(0.0)
    beats = ranked_slope[:len(j)] > running
    # A prefix: the slopes fall and the running price rises with j.
    m = int(beats.long().cumprod(0).sum())
    return max(low, min(high, m))
