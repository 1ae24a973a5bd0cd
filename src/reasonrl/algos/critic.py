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

The advantage ``gae``
--------------------
Registered with the uniform advantage signature: the critic's values arrive as ``values``
(``batch.aux["values"]``, written by the ``critic`` method before the advantage stage) and the
returns go to ``batch.aux["returns"]``, the critic's regression targets after the policy
update. The critic itself (a model, its learner, its warm-up) is ``reasonrl.train.critic``;
this module holds only the pure functions.
"""

from __future__ import annotations

import torch
from torch import Tensor

from typing import Annotated

from reasonrl.algos.masked import as_float, masked_mean, masked_whiten
from reasonrl.dataflow import declares
from reasonrl.params import Range
from reasonrl.registry import ADVANTAGES

__all__ = ["traced_residuals", "VALUES_KEY", "RETURNS_KEY", "gae_advantages_and_returns", "gae", "clipped_value_loss"]

VALUES_KEY = "values"  # V(s_t) per completion token, [B,T], from the critic at sampling time
RETURNS_KEY = "returns"  # R_t = A_t + V_t (before whitening), the critic's targets
Unit = Annotated[float, Range(ge=0, le=1, why="a discount or trace factor lies in [0, 1]")]


def traced_residuals(token_rewards: Tensor, values: Tensor, response_mask: Tensor, gamma: float = 1.0,
                     lam: float = 1.0, traces: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The backward recursion of :func:`gae_advantages_and_returns`, unwhitened: (B, c, returns),
    ``[B, T]`` each, 0 outside the mask. B_t = δ_t + γλ·c_next·B_next is the traced sum before
    the current token's own trace c_t (c ≡ 1 without ``traces``); returns = c·B + V. A
    correction that must keep the whole advantage under its weight (COPC: Â = c · whiten(B))
    needs B itself, not c·B."""
    if not (token_rewards.shape == values.shape == response_mask.shape) or token_rewards.dim() != 2:
        raise ValueError(f"token_rewards, values and response_mask must all be [B,T]; got "
                         f"{tuple(token_rewards.shape)}, {tuple(values.shape)}, {tuple(response_mask.shape)}")
    if traces is not None and traces.shape != response_mask.shape:
        raise ValueError(f"traces must be [B,T] like response_mask; got {tuple(traces.shape)}")
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gamma and lam must lie in [0, 1]; got gamma={gamma}, lam={lam}")
    valid = response_mask.bool()
    r = torch.where(valid, as_float(token_rewards.detach()), 0.0)
    v = torch.where(valid, as_float(values.detach()), 0.0)
    c = torch.ones_like(r) if traces is None else torch.where(valid, as_float(traces.detach()), 0.0)
    residual = torch.zeros_like(r)
    next_value = torch.zeros_like(r[:, 0])
    next_b = torch.zeros_like(r[:, 0])
    next_c = torch.zeros_like(r[:, 0])
    for t in reversed(range(r.shape[1])):  # O(T): a closed form would need γλ-powers over gaps
        step = valid[:, t]
        b = r[:, t] + gamma * next_value - v[:, t] + gamma * lam * next_c * next_b
        next_b = torch.where(step, b, next_b)
        next_c = torch.where(step, c[:, t], next_c)
        next_value = torch.where(step, v[:, t], next_value)
        residual[:, t] = torch.where(step, b, 0.0)
    returns = torch.where(valid, c * residual + v, 0.0)
    return residual, c, returns


def gae_advantages_and_returns(
    token_rewards: Tensor,
    values: Tensor,
    response_mask: Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = True,
    traces: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """GAE(γ, λ) advantages and returns ``R = A + V``, both ``[B, T]``, zero outside the mask,
    detached (targets, not model outputs). See the module docstring for the recursion.

    ``traces`` (per-token c_t ≥ 0, COPC's clipped and masked ratios) weights the recursion the
    Retrace way: B_t = δ_t + γλ·c_next·B_next and A_t = c_t·B_t, i.e.
    A_t = Σ_l (γλ)^l (Π_{j=1..l} c_{t+j}) c_t δ_{t+l}; c ≡ 1 is plain GAE, and a token with
    c_t = 0 gets A_t = 0 and cuts the trace for the tokens before it. Whitening then runs over
    the tokens with c_t > 0 only (the others carry no policy gradient)."""
    residual, c, returns = traced_residuals(token_rewards, values, response_mask, gamma, lam, traces)
    valid = response_mask.bool()
    advantages = torch.where(valid, c * residual, 0.0)
    if whiten:
        live = valid if traces is None else valid & (c > 0)
        advantages = masked_whiten(advantages, live)
    return advantages, returns


@ADVANTAGES.register("gae")
@declares(produces=(RETURNS_KEY,), consumes=(VALUES_KEY,))
def gae(token_rewards: Tensor, response_mask: Tensor, group_ids: Tensor, *, values: Tensor, batch=None,
        gamma: Unit = 1.0, lam: Unit = 1.0, whiten: bool = True) -> Tensor:
    """GAE(γ, λ) advantages over the critic's ``values`` (:func:`gae_advantages_and_returns`);
    the returns R = A + V (before whitening) are stored as ``batch.aux["returns"]`` for the
    critic. ``group_ids`` is unused: the baseline is the critic, not the group. Defaults γ = λ = 1
    are verl's (``algorithm.gamma``, ``algorithm.lam``); with one reward on the last token, λ = 1
    makes A_t = r − V_t, and λ < 1 leans on the critic's later values (less variance, more bias)."""
    advantages, returns = gae_advantages_and_returns(token_rewards, values, response_mask, gamma, lam, whiten)
    if batch is not None:
        batch.aux[RETURNS_KEY] = returns
    return advantages


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
