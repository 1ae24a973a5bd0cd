"""COPC, Coupled Off-Policy Correction (``specs/methods-a.md`` §12): one behaviour ratio drives
both a token mask on the policy loss and the traces of a critic's advantage.

Formalised from the spec; the method's paper and code were not found, so this is the spec's
inferred form built from standard parts (V-trace/Retrace traces, IcePop/TRM-style token
masks, GAE). With ρ_t = π_prox(y_t|s_t)/μ(y_t|s_t) (the proximal pass, detached):

- token mask (the ``ratio_mask`` off-policy correction): m_t = 1[1/c_mask ≤ ρ_t ≤ c_mask];
  masked tokens carry no policy gradient;
- two-sided clipped trace, coupled to the mask: c_t = m_t · clip(ρ_t, c_low, c_high);
- TD residual δ_t = r_t + γ V(s_{t+1}) − V(s_t), the corrected advantage
  Â_t = Σ_l (γλ)^l (Π_{j=1..l} c_{t+j}) c_t δ_{t+l}, the critic target V^tgt = V + Â;
- the PPO clipped loss on m_t-masked tokens, its ratio taken against π_prox (the decoupled
  form) or μ (``ratio_mask``'s ``anchor``).

Here the mask is the ``ratio_mask`` correction's weights (``batch.is_weights``) and ρ its
ratio (``batch.behaviour_ratio``), so the two are the same tokens by construction; the
``copc`` advantage only adds the traces. With ``off_policy: {name: none}`` the mask is off
(c_mask = ∞) and only the clipped traces act; on-policy (ρ ≡ 1) COPC is exactly ``gae``.
"""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor

from reasonrl.algos.critic import RETURNS_KEY, VALUES_KEY, Unit, gae_advantages_and_returns
from reasonrl.algos.masked import as_float
from reasonrl.dataflow import declares
from reasonrl.params import Range
from reasonrl.registry import ADVANTAGES

__all__ = ["copc_traces", "copc"]

Positive = Annotated[float, Range(gt=0, why="a trace clip bound is a ratio > 0")]
MASKS = ("ratio_mask", "none")


def copc_traces(ratio: Tensor, mask_weights: Tensor, response_mask: Tensor, c_low: float = 0.5,
                c_high: float = 2.0) -> Tensor:
    """c_t = m_t · clip(ρ_t, c_low, c_high), ``[B, T]`` float32, 0 outside the mask."""
    if not 0 < c_low <= 1.0 <= c_high:
        raise ValueError(f"the trace clip needs 0 < c_low <= 1 <= c_high (ratio 1 unclipped); got [{c_low}, {c_high}]")
    valid = response_mask.bool()
    rho = torch.where(valid, as_float(ratio.detach()), 1.0)
    m = torch.where(valid, as_float(mask_weights.detach()), 0.0)
    return torch.where(valid, m * rho.clamp(c_low, c_high), 0.0)


@ADVANTAGES.register("copc")
@declares(produces=(RETURNS_KEY,), consumes=(VALUES_KEY,))
def copc(token_rewards: Tensor, response_mask: Tensor, group_ids: Tensor, *, values: Tensor, batch=None,
         gamma: Unit = 1.0, lam: Unit = 0.95, c_low: Positive = 0.5, c_high: Positive = 2.0,
         whiten: bool = True) -> Tensor:
    """COPC's corrected advantages (module docstring), whitened over the unmasked tokens, with
    the critic targets V + Â stored as ``batch.aux["returns"]``. Without a correction on the
    batch (on-policy, no ``off_policy``) ρ ≡ 1 and m ≡ 1: plain GAE. Defaults are the spec's
    (γ = 1, λ = 0.95, [c_low, c_high] = [0.5, 2])."""
    ones = torch.ones_like(as_float(token_rewards))
    ratio = ones if batch is None or batch.behaviour_ratio is None else batch.behaviour_ratio
    mask = ones if batch is None or batch.is_weights is None else batch.is_weights
    traces = copc_traces(ratio, mask, response_mask, c_low, c_high)
    advantages, returns = gae_advantages_and_returns(token_rewards, values, response_mask, gamma, lam, whiten,
                                                     traces=traces)
    if batch is not None:
        batch.aux[RETURNS_KEY] = returns
    return advantages


def _check_recipe(recipe, need) -> None:
    """The traces read the mask from the correction's weights: only a 0/1 mask (or none) means that."""
    off = recipe.off_policy
    need(off is None or off.name in MASKS, f"advantage 'copc' reads its token mask from off_policy's weights, so "
         f"off_policy must be one of {', '.join(MASKS)} (or absent); got '{off.name if off else None}'")


copc.check_recipe = _check_recipe
