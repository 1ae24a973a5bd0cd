"""LoGRA: low-rank gradient sketches with a predicted-KL step size (pure tensor math).

Source: arXiv 2610.06647, "LoGRA: Scaling LLM Reinforcement Learning with Low-Rank Gradient
Sketches" (Zhang et al., NVIDIA). Formulas and defaults follow NVIDIA's NeMo RL integration
(``nemo_rl/models/automodel/logra.py`` and its controller; VERIFIED-CODE; paper:
https://arxiv.org/abs/2610.06647). The optimiser that wires these functions to a model
(hooks, the forward-mode probe, the update) is ``reasonrl.methods.logra.optimizer``.

For a target linear layer W ∈ R^{d_out×d_in}, a Rademacher projection A ∈ R^{r×d_in} turns the
weight gradient G into the sketch S = G Aᵀ ∈ R^{d_out×r}; the update is ΔW = −α D A with D the
RowAdam-preconditioned, globally normalised sketch and α set by a KL budget.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from reasonrl.algos.distill import reverse_kl, scaled_log_softmax
from reasonrl.algos.masked import masked_mean
from reasonrl.policy.lowrank import projection_seed, rademacher_projection  # LoGRA's A: the sync payload's too

__all__ = ["projection_seed", "rademacher_projection", "row_adam", "lowrank_sq_norm", "global_scale",
           "predicted_kl", "cosine_budget", "update_mismatch", "floored_budget", "step_scale", "exact_kl"]


def row_adam(sketch: Tensor, v: Tensor, step: int, beta2: float = 0.95, eps: float = 1e-8) -> tuple[Tensor, Tensor]:
    """RowAdam: a second moment per output row, no first moment (NeMo RL ``RowAdam``).

        v ← β₂ v + (1−β₂)·mean_j Ŝ_{:,j}²;  v̂ = v / (1 − β₂^k);  ρ = √v̂
        den = ρ + ε·mean(ρ);  s = min(den)/den;  s ← s / RMS(s)
        D̃ = diag(s) Ŝ;  D = D̃ · ‖Ŝ‖_F / ‖D̃‖_F

    ``sketch`` Ŝ ``[d_out, r]``; ``v`` ``[d_out]`` (the previous moment, zeros at first);
    ``step`` k ≥ 1 counts updates including this one. Rows with a large running magnitude are
    damped relative to the quietest row; the direction keeps the sketch's Frobenius norm.
    Returns (D, the new v)."""
    if step < 1:
        raise ValueError(f"row_adam: step counts updates from 1, got {step}")
    s_hat = sketch.float()
    v = beta2 * v + (1 - beta2) * s_hat.pow(2).mean(dim=1)
    rho = (v / (1 - beta2 ** step)).sqrt()
    den = rho + eps * rho.mean()
    if not bool((den > 0).all()):  # a zero sketch (no signal): keep it, do not divide by 0
        return torch.zeros_like(s_hat), v
    s = den.min() / den
    s = s / s.pow(2).mean().sqrt()
    d_tilde = s.unsqueeze(1) * s_hat
    return d_tilde * (s_hat.norm() / d_tilde.norm()), v


def lowrank_sq_norm(d: Tensor, a: Tensor) -> Tensor:
    """‖D A‖_F² = Σ (D (A Aᵀ)) ⊙ D, through the r×r Gram matrix: no d_out×d_in product."""
    return ((d @ (a @ a.T)) * d).sum()


def global_scale(weight_sq_sum: Tensor | float, update_sq_sum: Tensor | float, update_ratio: float) -> float:
    """c = η · √( Σ_ℓ ‖W_ℓ‖_F² / Σ_ℓ ‖D_ℓ A_ℓ‖_F² ), η = ``update_ratio``: the whole proposed
    update then has norm η·‖W‖ over all target layers together (D_ℓ ← c·D_ℓ). 0 when every
    direction is zero."""
    u = float(update_sq_sum)
    return 0.0 if u <= 0 else update_ratio * math.sqrt(float(weight_sq_sum) / u)


def predicted_kl(logits: Tensor, tangents: Tensor, mask: Tensor, temperature: float = 1.0) -> Tensor:
    """The second-order (Fisher) KL of a step, per position, averaged over ``mask``:

        q = softmax(z/T),  u = δz/T,  KL̂ = ½ Σ_v q_v (u_v − Σ_w q_w u_w)²

    ``logits`` z ``[N, T, V]``; ``tangents`` δz = J_z·vec(ΔW), the logit change per unit step
    (from one forward-mode pass). KL̂ is half the variance of u under q, so a step scaled by α
    predicts α²·KL̂ (and KL(π_W ‖ π_{W+εΔW}) = ε²·KL̂ + O(ε³))."""
    t = temperature if temperature > 0 else 1.0
    q = scaled_log_softmax(logits, t).exp()
    u = tangents.to(q.dtype) / t
    mean_u = (q * u).sum(-1, keepdim=True)
    per_position = 0.5 * (q * (u - mean_u).pow(2)).sum(-1)
    return masked_mean(per_position, mask)


def exact_kl(old_logits: Tensor, new_logits: Tensor, mask: Tensor, temperature: float = 1.0) -> Tensor:
    """KL(π_old ‖ π_new) = Σ_v q_old,v (log q_old,v − log q_new,v) at temperature T, averaged over
    ``mask``: the measured KL of a step, which :func:`predicted_kl` forecasts."""
    t = temperature if temperature > 0 else 1.0
    return masked_mean(reverse_kl(scaled_log_softmax(old_logits, t), scaled_log_softmax(new_logits, t)), mask)


def cosine_budget(k: int, start: float, final: float, horizon: int) -> float:
    """b_k = b_fin + ½(b₀ − b_fin)(1 + cos(π·min(k/(H−1), 1))): b₀ at update k = 0, b_fin from
    k = H − 1 on (H = ``horizon`` = schedule_steps; H = 1 gives b_fin at once)."""
    frac = 1.0 if horizon <= 1 else min(k / (horizon - 1), 1.0)
    return final + 0.5 * (start - final) * (1 + math.cos(math.pi * frac))


def update_mismatch(m: float, gen_logprobs: Tensor, prev_logprobs: Tensor, mask: Tensor, weight: float) -> float:
    """The rollout/trainer mismatch EMA: m ← (1−w)·m + w·max(0, mean_t[log π_gen − log π_prev])
    over the tokens in ``mask`` (tokens of completed sequences). An empty mask leaves m."""
    if not bool(mask.bool().any()):
        return m
    gap = float(masked_mean(gen_logprobs.float() - prev_logprobs.float(), mask))
    return (1 - weight) * m + weight * max(0.0, gap)


def floored_budget(budget: float, mismatch: float, floor: float) -> float:
    """b ← max(b − m, φ·b): the mismatch the sampler already adds is taken out of the budget,
    but never more than a fraction 1 − φ of it."""
    return max(budget - mismatch, floor * budget)


def step_scale(budget: float, kl_hat: float, alpha_max: float) -> float:
    """α = min(α_max, √(b / KL̂)), and α = 1 when KL̂ = 0 (the probe sees no change): the step
    whose predicted KL α²·KL̂ meets the budget, capped."""
    if kl_hat <= 0:
        return 1.0
    return min(alpha_max, math.sqrt(budget / kl_hat))
