"""A critic's math: GAE advantages over its token values, and its clipped value loss.

GAE
---

Schulman et al. (2016), "High-Dimensional Continuous Control Using Generalized Advantage
Estimation" (arXiv:1506.02438). For one sequence with token rewards r_t, critic values V_t and
response mask m_t, walking backwards over the valid tokens only::

    δ_t = r_t + γ·V_next − V_t
    A_t = δ_t + γ·λ·A_next
    R_t = A_t + V_t                    (the critic's regression target)

where V_next and A_next are those of the next *valid* token (0 after the last one). A masked
position inside the response (a tool's output between turns) is skipped: it neither adds a
TD error nor breaks the trace, so the tokens on either side of it are chained as if adjacent
(γ is applied once across the gap). These are the semantics of verl's
``compute_gae_advantage_return`` ("skip values and TD-error on observation tokens"); verl
also returns the carried values at masked positions, here everything outside the mask is 0.
With ``whiten`` (verl's default) the advantages are whitened over every valid token of the
batch; the returns are not.

Edge cases: γ = λ = 1 gives A_t = Σ_{t'≥t} r_{t'} − V_t (the Monte-Carlo return minus the
value); λ = 0 gives the one-step TD error δ_t.

Value loss
----------
PPO's clipped value loss (Schulman et al. 2017; the form of OpenAI baselines, verl
``compute_value_loss``): with the critic's new prediction v, its prediction at sampling time
v_old, the return R and clip range c::

    l_t = ½ · max((v_t − R_t)², (clip(v_t, v_old,t − c, v_old,t + c) − R_t)²)

so a value update gains nothing from moving more than c from the value the advantages were
computed with. ``clip=None`` is the plain ½(v − R)². The per-token matrix is reduced with
``reasonrl.algos.losses.aggregate`` (the batch totals passed down, as for the policy loss).

The critic that supplies ``values`` (and trains on ``returns``) is a method that owns a
model; this module holds only the pure functions.
"""

from __future__ import annotations

import torch
from torch import Tensor

from reasonrl.algos.masked import as_float, masked_mean, masked_whiten

__all__ = ["gae_advantages_and_returns", "clipped_value_loss"]


def gae_advantages_and_returns(
    token_rewards: Tensor,
    values: Tensor,
    response_mask: Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = True,
) -> tuple[Tensor, Tensor]:
    """GAE(γ, λ) advantages and returns ``R = A + V``, both ``[B, T]``, zero outside the mask,
    detached (targets, not model outputs). See the module docstring for the recursion."""
    if not (token_rewards.shape == values.shape == response_mask.shape) or token_rewards.dim() != 2:
        raise ValueError(f"token_rewards, values and response_mask must all be [B,T]; got "
                         f"{tuple(token_rewards.shape)}, {tuple(values.shape)}, {tuple(response_mask.shape)}")
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gamma and lam must lie in [0, 1]; got gamma={gamma}, lam={lam}")
    valid = response_mask.bool()
    r = torch.where(valid, as_float(token_rewards.detach()), 0.0)
    v = torch.where(valid, as_float(values.detach()), 0.0)
    advantages = torch.zeros_like(r)
    next_value = torch.zeros_like(r[:, 0])
    next_adv = torch.zeros_like(r[:, 0])
    for t in reversed(range(r.shape[1])):  # O(T): a closed form would need γλ-powers over gaps
        step = valid[:, t]
        adv = r[:, t] + gamma * next_value - v[:, t] + gamma * lam * next_adv
        next_adv = torch.where(step, adv, next_adv)
        next_value = torch.where(step, v[:, t], next_value)
        advantages[:, t] = torch.where(step, adv, 0.0)
    returns = torch.where(valid, advantages + v, 0.0)
    if whiten:
        advantages = masked_whiten(advantages, response_mask)
    return advantages, returns


def clipped_value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, response_mask: Tensor, clip: float | None = 0.2
) -> tuple[Tensor, Tensor]:
    """Per-token ½·max((v − R)², (clip(v, v_old ± c) − R)²), ``[B, T]`` with gradients through
    ``values`` only and 0 outside the mask, and the clipped fraction (the share of valid tokens
    where the clipped term is the larger, verl ``vf_clipfrac``). See the module docstring."""
    if not (values.shape == old_values.shape == returns.shape == response_mask.shape) or values.dim() != 2:
        raise ValueError(f"values, old_values, returns and response_mask must all be [B,T]; got "
                         f"{tuple(values.shape)}, {tuple(old_values.shape)}, {tuple(returns.shape)}, "
                         f"{tuple(response_mask.shape)}")
    if clip is not None and not clip > 0:
        raise ValueError(f"the value clip range must be > 0 (or None for no clipping), got {clip}")
    valid = response_mask.bool()
    v, target = as_float(values), as_float(returns.detach())
    plain = (v - target).square()
    if clip is None:
        return torch.where(valid, 0.5 * plain, 0.0), torch.zeros((), device=v.device)
    old = as_float(old_values.detach())
    clipped = (torch.clamp(v, old - clip, old + clip) - target).square()
    loss = torch.where(valid, 0.5 * torch.maximum(plain, clipped), 0.0)
    return loss, masked_mean((clipped > plain).float(), valid)
