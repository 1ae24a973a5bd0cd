"""COPC, Coupled Off-Policy Correction: one behaviour ratio drives both a token mask on the
policy loss and the traces of a critic's advantage.

Formalised from the abstract: the paper's text and code were not available, so this is an
inferred form built from standard parts (V-trace/Retrace traces, IcePop/TRM-style token masks,
GAE over a critic). With ρ_t = π_prox(y_t|s_t)/μ(y_t|s_t) (the proximal pass, detached):

- token mask (the ``ratio_mask`` off-policy correction): m_t = 1[1/c_mask ≤ ρ_t ≤ c_mask];
  masked tokens carry no policy gradient;
- clipped trace, coupled to the mask: c_t = m_t · clip(ρ_t, c_low, c_high) (c_low = 0 is
  V-trace's one-sided min(c_high, ρ_t));
- TD residual δ_t = r_t + γ V(s_{t+1}) − V(s_t), the traced residual sum
  B_t = δ_t + γλ c_{t+1} B_{t+1}, the corrected advantage Â_t = c_t B_t
  = Σ_l (γλ)^l (Π_{j=1..l} c_{t+j}) c_t δ_{t+l}, and the critic target V^tgt = V + Â.
  This is V-trace (Espeholt et al. 2018, "IMPALA", arXiv:1802.01561) with a λ and ρ̄ = c̄:
  V + Â is its target v_t, and Â_t = c_t (r_t + γ v_{t+1}^λ − V_t) its policy-gradient term
  (tested against that form);
- the PPO clipped loss on m_t-masked tokens, its ratio taken against π_prox (the decoupled
  form) or μ (``ratio_mask``'s ``anchor``).

Whitening (``whiten_at``). The trace c_t on the current token is an importance weight, and an
importance-weighted estimate is unbiased in its baseline only when the baseline sits inside
the weight: E_μ[c_t (B_t − b) ∇log π] = E_π[(B_t − b) ∇log π] (up to clipping) for any
constant b. ``"residual"`` (the default) whitens B over the kept tokens and then weights it,
Â_t = c_t (B_t − mean B)/std B. ``"advantage"`` (the form first built from the spec) whitens
c_t B_t itself, so its mean m is subtracted *outside* the weight; the extra term
−m Σ_t ∇log π(y_t) over tokens drawn from μ has the expectation −m E_μ[∇log π] ≠ 0, which,
when the critic lags the returns (m > 0), pushes π further from μ in the direction it moved
since μ sampled: a momentum on the policy's own drift that grows with the staleness and
collapsed every stale run (``docs/methods/copc.md``). Both are plain GAE whitening on-policy.

Here the mask is the ``ratio_mask`` correction's weights (``batch.is_weights``) and ρ its
ratio (``batch.behaviour_ratio``), so the two are the same tokens by construction; the
``copc`` advantage only adds the traces. With ``off_policy: {name: none}`` the mask is off
(c_mask = ∞) and only the clipped traces act; on-policy (ρ ≡ 1) COPC is exactly ``gae``.
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch
from torch import Tensor

from reasonrl.algos.critic import RETURNS_KEY, VALUES_KEY, Unit, traced_residuals
from reasonrl.algos.masked import as_float, masked_whiten
from reasonrl.dataflow import declares
from reasonrl.params import Range
from reasonrl.registry import ADVANTAGES

__all__ = ["copc_traces", "copc_advantages_and_returns", "copc"]

Low = Annotated[float, Range(ge=0, le=1, why="the trace's lower clip bound lies in [0, 1] (0: no floor)")]
High = Annotated[float, Range(ge=1, why="the trace's upper clip bound is a ratio >= 1")]
WhitenAt = Literal["residual", "advantage"]
MASKS = ("ratio_mask", "none")


def copc_traces(ratio: Tensor, mask_weights: Tensor, response_mask: Tensor, c_low: float = 0.5,
                c_high: float = 2.0) -> Tensor:
    """c_t = m_t · clip(ρ_t, c_low, c_high), ``[B, T]`` float32, 0 outside the mask; c_low = 0
    is the one-sided min(c_high, ρ_t) of V-trace/Retrace."""
    if not 0 <= c_low <= 1.0 <= c_high:
        raise ValueError(f"the trace clip needs 0 <= c_low <= 1 <= c_high (ratio 1 unclipped); got [{c_low}, {c_high}]")
    valid = response_mask.bool()
    rho = torch.where(valid, as_float(ratio.detach()), 1.0)
    m = torch.where(valid, as_float(mask_weights.detach()), 0.0)
    return torch.where(valid, m * rho.clamp(c_low, c_high), 0.0)


def copc_advantages_and_returns(token_rewards: Tensor, values: Tensor, response_mask: Tensor, traces: Tensor,
                                gamma: float = 1.0, lam: float = 0.95, whiten: bool = True,
                                whiten_at: WhitenAt = "residual",
                                weight: bool = True) -> tuple[Tensor, Tensor]:
    """COPC's advantages and critic targets, ``[B, T]`` each, 0 outside the mask and at c_t = 0.

    The traced recursion is :func:`reasonrl.algos.critic.traced_residuals`: it gives B_t,
    c_t and the targets V + c_t B_t (V-trace's v_t). Then, over the
    kept tokens (c_t > 0): ``whiten_at="residual"``: Â_t = c_t · whiten(B)_t;
    ``"advantage"``: Â_t = whiten(c B)_t (the baseline outside the weight; see the module
    docstring); ``whiten=False``: Â_t = c_t B_t. ``weight=False`` drops the current token's own
    trace from its policy term (Â_t = B_t, whitened or not; c_t still enters the sum through
    the later tokens' traces and still zeroes a masked token); the targets are unchanged."""
    if whiten_at not in ("residual", "advantage"):
        raise ValueError(f"whiten_at must be 'residual' or 'advantage', got {whiten_at!r}")
    valid = response_mask.bool()
    b, c, returns = traced_residuals(token_rewards, values, response_mask, gamma, lam, traces)
    live = valid & (c > 0)
    residual = torch.where(live, b, 0.0)  # B_t; 0 where the token is masked (c_t = 0)
    weighted = c * residual
    if not whiten:
        return (weighted if weight else residual), returns
    if whiten_at == "advantage" and weight:
        return masked_whiten(weighted, live), returns
    normal = masked_whiten(residual, live)
    return (c * normal if weight else normal), returns


@ADVANTAGES.register("copc")
@declares(produces=(RETURNS_KEY,), consumes=(VALUES_KEY,))
def copc(token_rewards: Tensor, response_mask: Tensor, group_ids: Tensor, *, values: Tensor, batch=None,
         gamma: Unit = 1.0, lam: Unit = 0.95, c_low: Low = 0.5, c_high: High = 2.0,
         whiten: bool = True, whiten_at: WhitenAt = "residual", weight: bool = True) -> Tensor:
    """COPC's corrected advantages (:func:`copc_advantages_and_returns`), with the critic targets
    V + Â (before whitening) stored as ``batch.aux["returns"]``. Without a correction on the
    batch (on-policy, no ``off_policy``) ρ ≡ 1 and m ≡ 1: plain GAE. Defaults: γ = 1,
    λ = 0.95, [c_low, c_high] = [0.5, 2] (the inferred formalisation's); ``whiten_at:
    advantage`` restores the first, collapsing, form."""
    ones = torch.ones_like(as_float(token_rewards))
    ratio = ones if batch is None or batch.behaviour_ratio is None else batch.behaviour_ratio
    mask = ones if batch is None or batch.is_weights is None else batch.is_weights
    traces = copc_traces(ratio, mask, response_mask, c_low, c_high)
    advantages, returns = copc_advantages_and_returns(token_rewards, values, response_mask, traces, gamma, lam,
                                                      whiten, whiten_at, weight)
    if batch is not None:
        batch.aux[RETURNS_KEY] = returns
    return advantages


def _check_recipe(recipe, need) -> None:
    """The traces read the mask from the correction's weights: only a 0/1 mask (or none) means that."""
    off = recipe.off_policy
    need(off is None or off.name in MASKS, f"advantage 'copc' reads its token mask from off_policy's weights, so "
         f"off_policy must be one of {', '.join(MASKS)} (or absent); got '{off.name if off else None}'")


copc.check_recipe = _check_recipe
