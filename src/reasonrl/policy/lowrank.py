"""Low-rank weight updates as a payload: W_ℓ ← W_ℓ − α D_ℓ A_ℓ, with each A_ℓ rebuilt from a
seed instead of sent.

An optimiser whose steps are low-rank (LoGRA, ``reasonrl.methods.logra``) hands its updates to
the rollout side as ``{"seed", "rank", "updates": [(k, α, {layer: D_ℓ}), ...]}``; an async
sampler applies them with :func:`apply_newer_updates` and ends with the learner's bits. The
payload's format and its projection live here, in the core, because the rollout source
(``reasonrl.rollout.async_source``, ``sampler_worker``) speaks it without knowing the optimiser.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import torch
from torch import Tensor

__all__ = ["projection_seed", "rademacher_projection", "apply_lowrank_updates", "apply_newer_updates",
           "lowrank_payload_bytes"]


def projection_seed(seed: int, update: int, layer: str) -> int:
    """hash(seed, k, layer name) as a 63-bit integer: stable across processes and Python runs
    (``hash()`` of a str is salted per process, so a sampler could not rebuild A from it)."""
    digest = hashlib.sha256(f"{seed}:{update}:{layer}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def rademacher_projection(rank: int, d_in: int, seed: int, update: int, layer: str,
                          dtype: torch.dtype = torch.float32) -> Tensor:
    """A ∈ R^{r×d_in} with i.i.d. entries ±1/√r (LoGRA §3, "rademacher"), drawn on CPU from a
    generator seeded by :func:`projection_seed`, so every process rebuilds the same A from
    (seed, update k, layer name) alone. E[AᵀA] = I, so E[S A] = G AᵀA is G in expectation."""
    g = torch.Generator().manual_seed(projection_seed(seed, update, layer))
    signs = torch.randint(0, 2, (rank, d_in), generator=g).to(dtype) * 2 - 1
    return signs / math.sqrt(rank)


@torch.no_grad()
def apply_lowrank_updates(model: torch.nn.Module, payload: dict[str, Any]) -> None:
    """W_ℓ ← W_ℓ − α D_ℓ A_ℓ for each update in ``payload`` (``{"seed", "rank", "updates": [(k, α,
    {layer: D_ℓ}), ...]}``), rebuilding A_ℓ from (seed, k, ℓ). The learner applies its own
    updates with this function too, so a sampler that receives them ends with the same bits."""
    modules = dict(model.named_modules())
    for k, alpha, directions in payload["updates"]:
        for name, d in directions.items():
            w = modules[name].weight
            a = rademacher_projection(payload["rank"], w.shape[1], payload["seed"], k, name, d.dtype)
            w.sub_(((alpha * d) @ a).to(w.dtype))


def apply_newer_updates(model: torch.nn.Module, held: int, payload: dict[str, Any]) -> None:
    """A sampler's side of the sync: apply the payload's updates newer than the version ``held``
    (whole weights sent at a restart already contain the older ones); a gap raises."""
    updates = [u for u in payload["updates"] if u[0] > held]
    if updates and updates[0][0] != held + 1:
        raise RuntimeError(f"LoGRA sync: the sampler holds version {held} but the next update is {updates[0][0]}; "
                           "an update was lost")
    apply_lowrank_updates(model, {**payload, "updates": updates})


def lowrank_payload_bytes(payload: dict[str, Any]) -> int:
    """Bytes of a payload as sent: every D_ℓ's tensor bytes plus 8 per integer or float
    (seed, rank, and each update's k and α)."""
    tensors = sum(d.numel() * d.element_size() for _, _, ds in payload["updates"] for d in ds.values())
    return tensors + 16 + 16 * len(payload["updates"])
