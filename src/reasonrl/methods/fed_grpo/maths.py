"""Fed-GRPO's pure pieces: client signal, aggregation weights, reward calibration, sparse updates.

INFERRED (``specs/methods-a.md`` §3): the Fed-GRPO repository (HKU-HealthAI/Fed-GRPO) and its
paper were not available; the spec formalised these from the abstract. Not FGRPO (arXiv
2606.03094) nor FedGRPO (arXiv 2602.12014). Error feedback is the standard one of Stich et al.
2018 (arXiv 1809.07599) and Karimireddy et al. 2019 (arXiv 1901.09847); FedAvg is McMahan et
al. 2017 (arXiv 1602.05629). Tensors in, tensors out; ``reasonrl.methods.fed_grpo`` wires them into Flower.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from reasonrl.algos.selection import one_group_reward_std

__all__ = ["client_signal", "aggregation_weights", "update_reward_ema", "calibration_weights",
           "block_informativeness", "block_budgets", "topk_error_feedback", "payload_bytes"]


def client_signal(group_rewards: list[list[float]]) -> float:
    """S_c = (1/|B_c|) Σ_{q∈B_c} σ_{c,q}: the mean within-group reward std (unbiased, as GRPO
    computes it: ``algos.selection.one_group_reward_std``) over the groups the client trained on. 0 for no groups.
    INFERRED (spec §3a): a group with σ = 0 gives GRPO no gradient."""
    if not group_rewards:
        return 0.0
    return sum(one_group_reward_std(g) for g in group_rewards) / len(group_rewards)


def aggregation_weights(counts: Tensor, signals: Tensor, alpha: float = 1.0) -> Tensor:
    """w_c = n_c S_c^α / Σ_{c'} n_{c'} S_{c'}^α (INFERRED, spec §3a).

    α = 0 gives w_c = n_c / Σ n (FedAvg's weights, arXiv 1602.05629; 0^0 = 1). When every
    n_c S_c^α is 0 (no client saw a group whose rewards differ) the weights fall back to
    n_c / Σ n, so the round still averages rather than dividing by zero."""
    counts, signals = counts.double(), signals.double()
    if (counts < 0).any() or (signals < 0).any():
        raise ValueError(f"aggregation_weights: counts and signals must be >= 0, got {counts.tolist()}, "
                         f"{signals.tolist()}")
    if float(counts.sum()) <= 0:
        raise ValueError("aggregation_weights: every client reported n_c = 0")
    raw = counts * signals.pow(alpha)
    if float(raw.sum()) <= 0:
        raw = counts
    return raw / raw.sum()


def update_reward_ema(previous: float | None, client_means: Tensor, counts: Tensor, momentum: float) -> float:
    """R̄ ← m R̄ + (1 − m) Σ_c (n_c/Σn) r̄_c; the first round (``previous`` None) sets R̄ to the
    round's n-weighted mean (INFERRED, spec §3a: "an EMA over client reports")."""
    counts = counts.double()
    mean = float((counts * client_means.double()).sum() / counts.sum())
    return mean if previous is None else momentum * previous + (1.0 - momentum) * mean


def calibration_weights(global_reward: float | None, prompt_means: Tensor, beta: float = 1.0,
                        omega_min: float = 0.5, omega_max: float = 2.0, form: str = "clip") -> Tensor:
    """ω_{c,q} from the local–global gap g_q = R̄ − r̄_{c,q} (INFERRED, spec §3a):

    - ``clip``: ω_q = clip(1 + β g_q, ω_min, ω_max);
    - ``softmax``: ω_q = Q · exp(β g_q) / Σ_{q'} exp(β g_{q'}) over the Q prompts given (mean 1,
      so the loss keeps its scale; not clipped).

    ``global_reward`` None (before the server has any report) gives ω = 1."""
    if global_reward is None:
        return torch.ones_like(prompt_means, dtype=torch.float32)
    gap = (global_reward - prompt_means.double())
    if form == "clip":
        if omega_min > omega_max:
            raise ValueError(f"calibration_weights: omega_min {omega_min} > omega_max {omega_max}")
        return (1.0 + beta * gap).clamp(omega_min, omega_max).float()
    if form == "softmax":
        return (len(gap) * torch.softmax(beta * gap, dim=0)).float()
    raise ValueError(f"calibration_weights: form must be 'clip' or 'softmax', got {form!r}")


def block_informativeness(blocks: list[Tensor]) -> Tensor:
    """I_ℓ = ‖Δ_ℓ‖₂ / √d_ℓ for each block (INFERRED, spec §3a): the update's RMS per entry."""
    return torch.tensor([float(b.double().norm()) / math.sqrt(b.numel()) if b.numel() else 0.0 for b in blocks],
                        dtype=torch.float64)


def block_budgets(informativeness: Tensor, sizes: list[int], kappa: float) -> list[int]:
    """k_ℓ ∝ I_ℓ with Σ_ℓ k_ℓ = k_tot = max(1, ⌊d/κ⌋) and 0 ≤ k_ℓ ≤ d_ℓ (INFERRED, spec §3a).

    Water-filling: shares k_tot·I_ℓ/ΣI over the blocks not yet full, caps a block at d_ℓ and
    shares what it could not take among the rest; the integer parts go out by largest
    remainder (ties to the earlier block). Blocks with I_ℓ = 0 get nothing unless every other
    block is full; all I_ℓ = 0 (nothing changed): all zero. κ = 1 keeps every entry."""
    if kappa < 1:
        raise ValueError(f"block_budgets: kappa must be >= 1, got {kappa}")
    d = sum(sizes)
    if d == 0 or float(informativeness.sum()) <= 0:
        return [0] * len(sizes)
    total = max(1, int(d // kappa))
    cap = torch.tensor(sizes, dtype=torch.float64)
    share = torch.zeros(len(sizes), dtype=torch.float64)
    score = informativeness.double().clone()
    left = float(total)
    open_ = (cap > 0) & (score > 0)
    while left > 1e-9 and open_.any():
        part = torch.where(open_, score, torch.zeros_like(score))
        add = left * part / part.sum()
        share = torch.minimum(share + add, cap)
        full = share >= cap - 1e-9
        left = total - float(share.sum())
        if not (open_ & full).any():
            break
        open_ = open_ & ~full
    if left > 1e-9:  # every informative block is full: the rest goes to the others, in order
        for i in range(len(sizes)):
            take = min(cap[i] - share[i], left)
            share[i] += take
            left -= float(take)
    k = share.floor().long()
    remainder = total - int(k.sum())
    order = sorted(range(len(sizes)), key=lambda i: (-(float(share[i]) - int(k[i])), i))
    for i in order:
        if remainder <= 0:
            break
        if k[i] < sizes[i]:
            k[i] += 1
            remainder -= 1
    return [int(x) for x in k]


def topk_error_feedback(update: Tensor, residual: Tensor | None, k: int,
                        error_feedback: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """Top-k of one flat block with error feedback (arXiv 1809.07599, 1901.09847):

        u = e + Δ;  send Topk(u) (the k entries of largest |u|);  e ← u − Topk(u)

    Returns ``(indices, values, new_residual)``: ``indices`` int64 ascending, ``values`` = u
    there. Without error feedback u = Δ and the residual stays zero (what is not sent is lost)."""
    flat = update.reshape(-1).float()
    u = flat + residual.reshape(-1).float() if (error_feedback and residual is not None) else flat.clone()
    if not 0 <= k <= u.numel():
        raise ValueError(f"topk_error_feedback: k must be in 0..{u.numel()}, got {k}")
    idx = torch.topk(u.abs(), k, sorted=False).indices.sort().values if k else torch.zeros(0, dtype=torch.long)
    values = u[idx]
    if not error_feedback:
        return idx, values, torch.zeros_like(u)
    new_residual = u.clone()
    new_residual[idx] = 0.0
    return idx, values, new_residual


def payload_bytes(indices: Tensor, values: Tensor) -> int:
    """The exact size of a sparse payload: its indices plus its values (element size × count).
    A dense payload (κ = 1) sends values only: pass an empty ``indices``."""
    return indices.numel() * indices.element_size() + values.numel() * values.element_size()
