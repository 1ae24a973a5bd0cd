"""SURGE checkpoint fusion, per weight matrix, as pure functions.

Source: SURGE (fusing an anchor and a donor checkpoint of one RL run by a spectral
decomposition of their updates). The paper was NOT FOUND; every formula here is INFERRED
from the abstract (paper not located). Nearest published relatives:
SAR / Spectral Rewiring (arXiv 2607.03065) and ResMerge (arXiv 2606.02252).

For one weight matrix with base W₀, anchor W_a and donor W_d (same shape m×n):

- task vectors Δ_a = W_a − W₀, Δ_d = W_d − W₀;
- thin SVD of the anchor update Δ_a = U Σ Vᵀ, σ₁ ≥ σ₂ ≥ … ≥ 0;
- rank from the retention target ρ: k(ρ) = min{k : Σ_{i≤k} σ_i² / Σ_i σ_i² ≥ ρ};
- dominant anchor component P_a = U_k Σ_k V_kᵀ, anchor residual R_a = Δ_a − P_a;
- the donor's component outside the anchor's dominant subspaces
  C_d = (I − U_k U_kᵀ) Δ_d (I − V_k V_kᵀ)     (``projection="two_sided"``),
  C_d = (I − U_k U_kᵀ) Δ_d                     (``projection="one_sided"``, left only);
- fused weight W_f = W₀ + P_a + β_res · R_a + γ · C_d.

The projectors are never formed: (I − UUᵀ)X = X − U(UᵀX) costs O(mnk), not O(m²n).

Geometric control (the abstract's "random directions of the same norm"): C_d is replaced by
a Gaussian direction N, projected into the same complement (``control="random"``) or not
(``control="random_unconstrained"``), rescaled to ‖N‖_F = ‖C_d‖_F. If the donor's particular
direction matters, fusing C_d must beat fusing N.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

__all__ = ["retained_rank", "project_out", "complement", "fuse_matrix", "MatrixFusion", "Projection", "Control"]

Projection = Literal["two_sided", "one_sided"]
Control = Literal["none", "random", "random_unconstrained"]

# Energy below this fraction of the total is treated as round-off when ρ = 1, so that k(1)
# is the numerical rank of Δ_a, not always min(m, n).
ENERGY_TOL = 1e-12


def retained_rank(singular_values: Tensor, retain: float) -> int:
    """k(ρ) = min{k : Σ_{i≤k} σ_i² / Σ_i σ_i² ≥ ρ} for σ sorted in descending order.

    0 when ρ = 0 or when every σ is 0 (an unchanged matrix has no dominant subspace).
    A relative tolerance of 1e-12 on the energy absorbs round-off, so k(1) is the numerical
    rank. Example: σ = (3, 2, 1), energies 9, 4, 1 of 14: k(0.5) = 1 (9/14 = 0.64),
    k(0.9) = 2 (13/14 = 0.93), k(0.95) = 3.
    """
    if not 0.0 <= retain <= 1.0:
        raise ValueError(f"retain must be in [0, 1], got {retain}")
    energy = singular_values.to(torch.float64) ** 2
    total = float(energy.sum())
    if total == 0.0 or retain == 0.0:
        return 0
    cumulative = torch.cumsum(energy, 0) / total
    reached = cumulative >= retain - ENERGY_TOL
    return int(torch.nonzero(reached)[0, 0]) + 1


def project_out(x: Tensor, basis: Tensor, side: Literal["left", "right"]) -> Tensor:
    """(I − B Bᵀ) X (``left``, B m×k) or X (I − B Bᵀ) (``right``, B n×k), for orthonormal B."""
    if basis.shape[1] == 0:
        return x
    if side == "left":
        return x - basis @ (basis.T @ x)
    return x - (x @ basis) @ basis.T


def complement(x: Tensor, u_k: Tensor, v_k: Tensor, projection: Projection = "two_sided") -> Tensor:
    """The part of X outside the anchor's top-k subspaces: (I − U_kU_kᵀ) X (I − V_kV_kᵀ),
    or (I − U_kU_kᵀ) X for ``one_sided``."""
    out = project_out(x, u_k, "left")
    if projection == "two_sided":
        out = project_out(out, v_k, "right")
    elif projection != "one_sided":
        raise ValueError(f"projection must be two_sided or one_sided, got {projection!r}")
    return out


@dataclass
class MatrixFusion:
    """The fused matrix and what ``fuse.json`` reports about it."""

    fused: Tensor
    rank: int  # k(ρ)
    full_rank: int  # min(m, n)
    retained_energy: float  # Σ_{i≤k} σ_i² / Σ σ_i² actually kept (1.0 for Δ_a = 0)
    anchor_norm: float  # ‖Δ_a‖_F
    donor_norm: float  # ‖Δ_d‖_F
    donor_component_norm: float  # ‖C_d‖_F (before γ; for a control, the norm the random direction got)


def fuse_matrix(base: Tensor, anchor: Tensor, donor: Tensor, *, retain: float = 0.9, gamma: float = 1.0,
                beta_res: float = 0.0, projection: Projection = "two_sided", control: Control = "none",
                generator: torch.Generator | None = None, compute_dtype: torch.dtype = torch.float64) -> MatrixFusion:
    """W_f = W₀ + P_a + β_res·R_a + γ·C_d for one 2-D weight (formulas in the module docstring).

    Computed in ``compute_dtype`` (float64 by default: the SVD of a near-rank-deficient update
    is then stable) and returned in ``anchor``'s dtype. When k(ρ) = min(m, n), P_a is Δ_a
    itself (no SVD round-off), so retain = 1, γ = 0 gives back W_a exactly.
    ``generator`` drives the random direction of a ``control`` (required then).
    """
    if not (base.shape == anchor.shape == donor.shape) or anchor.dim() != 2:
        raise ValueError(f"fuse_matrix needs three 2-D tensors of one shape, got {tuple(base.shape)}, "
                         f"{tuple(anchor.shape)}, {tuple(donor.shape)}")
    if control not in ("none", "random", "random_unconstrained"):
        raise ValueError(f"control must be none, random or random_unconstrained, got {control!r}")
    w0 = base.to(compute_dtype)
    delta_a = anchor.to(compute_dtype) - w0
    delta_d = donor.to(compute_dtype) - w0
    u, s, vh = torch.linalg.svd(delta_a, full_matrices=False)
    k = retained_rank(s, retain)
    full = s.numel()
    energy = s ** 2
    total = float(energy.sum())
    u_k, v_k = u[:, :k], vh[:k].T
    dominant = delta_a if k == full else (u_k * s[:k]) @ vh[:k]
    donor_part = complement(delta_d, u_k, v_k, projection)
    donor_norm = float(torch.linalg.matrix_norm(donor_part))
    if control != "none":
        if generator is None:
            raise ValueError("a random control needs a generator")
        noise = torch.randn(delta_d.shape, generator=generator, dtype=torch.float64).to(compute_dtype)
        if control == "random":
            noise = complement(noise, u_k, v_k, projection)
        scale = float(torch.linalg.matrix_norm(noise))
        donor_part = noise * (donor_norm / scale) if scale > 0 else torch.zeros_like(noise)
    fused = w0 + dominant + gamma * donor_part
    if beta_res:
        fused = fused + beta_res * (delta_a - dominant)
    return MatrixFusion(
        fused=fused.to(anchor.dtype), rank=k, full_rank=full,
        retained_energy=float(energy[:k].sum()) / total if total > 0 else 1.0,
        anchor_norm=float(total ** 0.5), donor_norm=float(torch.linalg.matrix_norm(delta_d)),
        donor_component_norm=donor_norm)
