"""An update as one sparse payload: the error-compensated update, budgets, top-k, and back.

Blocks are the trainable tensors (full weights, or a LoRA model's adapter matrices) in the
order of the policy's ``weights()``. A client first forms u = e + Δ per block (``compensate``,
what top-k selects from; e = 0 without error feedback) and reports ‖u‖₂ and its non-zero count
(``update_stats``); the server gives it a number of slots k_c (``maths.client_budgets``); then
``encode`` sends k_c entries of u. The payload is two flat arrays over the concatenation of the
blocks: ``indices`` (int32 while d < 2³¹) and ``values`` (float32). When the recipe is dense
(κ = 1) ``indices`` is empty and ``values`` is the dense update in block order. Its size is
``maths.payload_bytes``: indices plus values, nothing else.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from reasonrl.methods.fed_grpo.maths import block_budgets, block_informativeness, payload_bytes, topk_error_feedback

__all__ = ["Layout", "SparseUpdate", "compensate", "update_stats", "encode", "decode"]


@dataclass(frozen=True)
class Layout:
    """Names and shapes of the blocks, in payload order."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @staticmethod
    def of(state: dict[str, Tensor]) -> "Layout":
        names = tuple(k for k, v in state.items() if v.is_floating_point())
        return Layout(names, tuple(tuple(state[k].shape) for k in names))

    @property
    def sizes(self) -> list[int]:
        return [int(torch.Size(s).numel()) for s in self.shapes]

    @property
    def dim(self) -> int:
        return sum(self.sizes)


@dataclass
class SparseUpdate:
    indices: Tensor  # [k] int32/int64 positions in the concatenated blocks; empty when dense
    values: Tensor  # [k] float32
    residual: dict[str, Tensor]  # the error-feedback residual after this round (flat per block)
    budgets: list[int]  # k_ℓ per block

    @property
    def nbytes(self) -> int:
        return payload_bytes(self.indices, self.values)


def compensate(delta: dict[str, Tensor], layout: Layout, residual: dict[str, Tensor] | None,
               error_feedback: bool = True) -> dict[str, Tensor]:
    """u_ℓ = e_ℓ + Δ_ℓ per block, flat float32 (e = 0 without error feedback or before any)."""
    residual = residual or {}
    flat = {n: delta[n].detach().reshape(-1).float() for n in layout.names}
    return {n: f + residual[n] if error_feedback and n in residual else f for n, f in flat.items()}


def update_stats(u: dict[str, Tensor]) -> tuple[float, int]:
    """(‖u‖₂, its number of non-zero entries): what a client reports before its upload."""
    blocks = list(u.values())
    norm = math.sqrt(sum(float(b.double().square().sum()) for b in blocks))
    return norm, sum(int(torch.count_nonzero(b)) for b in blocks)


def encode(u: dict[str, Tensor], layout: Layout, budget: int, *, dense: bool = False,
           allocation: str = "adaptive", error_feedback: bool = True) -> SparseUpdate:
    """Send ``budget`` entries of the compensated update ``u`` (:func:`compensate`).

    - ``dense`` (κ = 1): every value, no indices, nothing left over;
    - ``adaptive``: per-block budgets k_ℓ ∝ I_ℓ = ‖u_ℓ‖₂/√d_ℓ, k_ℓ ≤ nnz(u_ℓ), Σ k_ℓ =
      min(budget, nnz(u)) (``maths.block_budgets``), then top-k_ℓ in each block;
    - ``uniform``: one top-k over the whole update, k = min(budget, nnz(u)).

    Only non-zero entries are ever sent. The residual (error feedback) is u minus what was
    sent; without error feedback it is zero (what is cut is lost)."""
    flat = [u[n].reshape(-1).float() for n in layout.names]
    index_dtype = torch.int32 if layout.dim < 2 ** 31 else torch.int64
    if dense:
        values = torch.cat(flat) if flat else torch.zeros(0)
        return SparseUpdate(torch.zeros(0, dtype=index_dtype), values,
                            {n: torch.zeros_like(f) for n, f in zip(layout.names, flat)}, list(layout.sizes))
    if budget < 0:
        raise ValueError(f"encode: budget must be >= 0, got {budget}")
    nonzeros = [int(torch.count_nonzero(f)) for f in flat]
    if allocation == "adaptive":
        budgets = block_budgets(block_informativeness(flat), nonzeros, budget)
        idx_parts, val_parts, offset = [], [], 0
        for f, k, size in zip(flat, budgets, layout.sizes):
            idx, val, _ = topk_error_feedback(f, None, k, error_feedback=False)
            idx_parts.append(idx + offset)
            val_parts.append(val)
            offset += size
        indices = torch.cat(idx_parts) if idx_parts else torch.zeros(0, dtype=torch.long)
        values = torch.cat(val_parts) if val_parts else torch.zeros(0)
    elif allocation == "uniform":
        whole = torch.cat(flat) if flat else torch.zeros(0)
        indices, values, _ = topk_error_feedback(whole, None, min(budget, sum(nonzeros)), error_feedback=False)
        bounds = torch.tensor([0, *itertools.accumulate(layout.sizes)])
        budgets = [int(((indices >= lo) & (indices < hi)).sum()) for lo, hi in zip(bounds[:-1], bounds[1:])]
    else:
        raise ValueError(f"encode: allocation must be 'adaptive' or 'uniform', got {allocation!r}")
    residual = {}
    offset = 0
    sent = torch.zeros(layout.dim, dtype=torch.float32)
    sent[indices] = values
    for name, f, size in zip(layout.names, flat, layout.sizes):
        residual[name] = f - sent[offset:offset + size] if error_feedback else torch.zeros_like(f)
        offset += size
    return SparseUpdate(indices.to(index_dtype), values.float(), residual, budgets)


def decode(indices: Tensor, values: Tensor, layout: Layout) -> dict[str, Tensor]:
    """The dense update a payload stands for (zeros where nothing was sent)."""
    d = layout.dim
    if indices.numel() == 0 and values.numel() == d:
        flat = values.float().clone()
    else:
        if indices.numel() != values.numel():
            raise ValueError(f"sparse payload: {indices.numel()} indices but {values.numel()} values")
        if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= d):
            raise ValueError(f"sparse payload: an index is outside 0..{d - 1}")
        flat = torch.zeros(d, dtype=torch.float32)
        flat[indices.long()] = values.float()
    out, offset = {}, 0
    for name, shape, size in zip(layout.names, layout.shapes, layout.sizes):
        out[name] = flat[offset:offset + size].reshape(shape)
        offset += size
    return out
