"""An update as one sparse payload: per-block budgets, top-k with error feedback, and back.

Blocks are the trainable tensors (full weights, or a LoRA model's adapter matrices) in the
order of the policy's ``weights()``. The payload is two flat arrays over the concatenation
of the blocks: ``indices`` (int32 while d < 2³¹) and ``values`` (float32). When every entry is
kept (κ = 1) ``indices`` is empty and ``values`` is the dense update in block order. Its size
is ``algos.federated.payload_bytes``: indices plus values, nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from reasonrl.methods.fed_grpo.maths import block_budgets, block_informativeness, payload_bytes, topk_error_feedback

__all__ = ["Layout", "SparseUpdate", "encode", "decode"]


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


def encode(delta: dict[str, Tensor], layout: Layout, kappa: float, residual: dict[str, Tensor] | None = None,
           error_feedback: bool = True) -> SparseUpdate:
    """Budgets k_ℓ ∝ I_ℓ of the error-compensated update u_ℓ = e_ℓ + Δ_ℓ (the vector top-k then
    selects from), Σ k_ℓ = ⌊d/κ⌋; top-k per block with error feedback (``algos.federated``)."""
    residual = residual or {}
    flat = [delta[n].detach().reshape(-1).float() for n in layout.names]
    compensated = [f + residual[n] if error_feedback and n in residual else f for n, f in zip(layout.names, flat)]
    budgets = block_budgets(block_informativeness(compensated), layout.sizes, kappa)
    index_dtype = torch.int32 if layout.dim < 2 ** 31 else torch.int64
    if sum(budgets) == layout.dim:  # dense: every entry goes, no indices needed, nothing left over
        values = torch.cat(compensated) if compensated else torch.zeros(0)
        return SparseUpdate(torch.zeros(0, dtype=index_dtype), values,
                            {n: torch.zeros_like(f) for n, f in zip(layout.names, flat)}, budgets)
    idx_parts, val_parts, new_residual, offset = [], [], {}, 0
    for name, u, k, size in zip(layout.names, compensated, budgets, layout.sizes):
        # u already holds e + Δ: top-k of it, and (with error feedback) what is left over as e
        idx, val, res = topk_error_feedback(u, None, k, error_feedback)
        idx_parts.append(idx + offset)
        val_parts.append(val)
        new_residual[name] = res
        offset += size
    return SparseUpdate(torch.cat(idx_parts).to(index_dtype), torch.cat(val_parts).float(), new_residual, budgets)


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
