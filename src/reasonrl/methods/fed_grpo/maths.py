"""Fed-GRPO's pure pieces: client signal, aggregation weights, reward calibration, sparse updates.

INFERRED: the Fed-GRPO repository (github.com/HKU-HealthAI/Fed-GRPO) and its paper were not
available; these are formalised from its abstract (docs/methods/fed_grpo.md). Not FGRPO (arXiv
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
           "block_informativeness", "proportional_budgets", "block_budgets", "client_budgets", "per_client_budget",
           "topk_error_feedback", "payload_bytes"]


def client_signal(group_rewards: list[list[float]]) -> float:
    """S_c = (1/|B_c|) Σ_{q∈B_c} σ_{c,q}: the mean within-group reward std (unbiased, as GRPO
    computes it: ``algos.selection.one_group_reward_std``) over the groups the client trained on. 0 for no groups.
    INFERRED: a group with σ = 0 gives GRPO no gradient."""
    if not group_rewards:
        return 0.0
    return sum(one_group_reward_std(g) for g in group_rewards) / len(group_rewards)


def aggregation_weights(counts: Tensor, signals: Tensor, alpha: float = 1.0) -> Tensor:
    """w_c = n_c S_c^α / Σ_{c'} n_{c'} S_{c'}^α (INFERRED).

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
    round's n-weighted mean (INFERRED from the abstract: "an EMA over client reports")."""
    counts = counts.double()
    mean = float((counts * client_means.double()).sum() / counts.sum())
    return mean if previous is None else momentum * previous + (1.0 - momentum) * mean


def calibration_weights(global_reward: float | None, prompt_means: Tensor, beta: float = 1.0,
                        omega_min: float = 0.5, omega_max: float = 2.0, form: str = "clip") -> Tensor:
    """ω_{c,q} from the local–global gap g_q = R̄ − r̄_{c,q} (INFERRED):

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
    """I_ℓ = ‖Δ_ℓ‖₂ / √d_ℓ for each block (INFERRED): the update's RMS per entry."""
    return torch.tensor([float(b.double().norm()) / math.sqrt(b.numel()) if b.numel() else 0.0 for b in blocks],
                        dtype=torch.float64)


def proportional_budgets(scores: Tensor, caps: list[int], total: int) -> list[int]:
    """Integer budgets k_i ∝ s_i with 0 ≤ k_i ≤ cap_i and Σ_i k_i = min(total, Σ_{s_i > 0} cap_i).

    Water-filling: ``total`` is shared as total·s_i/Σ s over the entries not yet full; an entry
    whose share reaches its cap keeps the cap and what it could not take is shared again among
    the others, until nothing is left or every entry is full. The integer parts go out by largest
    remainder (ties to the earlier entry), never past a cap. An entry with s_i = 0 or cap_i = 0
    gets nothing: what no entry can take is not spent (a budget is never filled with zeros)."""
    if total < 0 or any(c < 0 for c in caps) or len(caps) != len(scores):
        raise ValueError(f"proportional_budgets: need total >= 0, caps >= 0, one score per cap; got {total}, "
                         f"{caps}, {len(scores)} scores")
    if (scores < 0).any():
        raise ValueError(f"proportional_budgets: scores must be >= 0, got {scores.tolist()}")
    cap = torch.tensor(caps, dtype=torch.float64)
    score = scores.double().clone()
    open_ = (cap > 0) & (score > 0)
    total = min(int(total), int(cap[open_].sum()))
    share = torch.zeros(len(caps), dtype=torch.float64)
    left = float(total)
    while left > 1e-9 and open_.any():
        part = torch.where(open_, score, torch.zeros_like(score))
        share = torch.minimum(share + left * part / part.sum(), cap)
        full = open_ & (share >= cap - 1e-9)
        share[full] = cap[full]
        left = total - float(share.sum())
        if not full.any():
            break
        open_ = open_ & ~full
    k = [min(int(math.floor(float(x) + 1e-9)), c) for x, c in zip(share, caps)]
    remainder = total - sum(k)
    order = sorted(range(len(caps)), key=lambda i: (-(float(share[i]) - k[i]), i))
    for i in order:
        if remainder <= 0:
            break
        if k[i] < caps[i] and float(score[i]) > 0:
            k[i] += 1
            remainder -= 1
    return k


def block_budgets(informativeness: Tensor, nonzeros: list[int], budget: int) -> list[int]:
    """k_ℓ ∝ I_ℓ over a client's blocks, Σ_ℓ k_ℓ = min(budget, Σ nnz_ℓ), k_ℓ ≤ nnz_ℓ (the
    block's non-zero entries, so top-k never picks a zero; a cap at d_ℓ would let a block get
    more slots than it has non-zeros): :func:`proportional_budgets`."""
    return proportional_budgets(informativeness, nonzeros, budget)


def client_budgets(norms: Tensor, nonzeros: list[int], per_client: int, allocation: str = "adaptive") -> list[int]:
    """The round's upload slots per client, from the replies of its C clients.

    - ``adaptive`` (mechanism (iii) across clients): the round's K = C·``per_client`` slots
      (``per_client`` = max(1, ⌊d/κ⌋)) split k_c ∝ ‖u_c‖₂, the L2 norm of client c's
      error-compensated update u_c = e_c + Δ_c (the vector its top-k selects from), capped at
      nnz_c, the non-zero entries of u_c; a client's excess goes to the others by the same rule
      (:func:`proportional_budgets`). Σ_c k_c = min(K, Σ_c nnz_c).
    - ``uniform`` (the ablation and top-k FedAvg): k_c = min(``per_client``, nnz_c), nothing
      redistributed."""
    if allocation == "adaptive":
        return proportional_budgets(norms, nonzeros, per_client * len(nonzeros))
    if allocation == "uniform":
        return [min(per_client, int(n)) for n in nonzeros]
    raise ValueError(f"client_budgets: allocation must be 'adaptive' or 'uniform', got {allocation!r}")


def per_client_budget(dim: int, kappa: float) -> int:
    """⌊d/κ⌋ slots (at least 1): one client's share of a round's upload budget."""
    if kappa < 1:
        raise ValueError(f"kappa must be >= 1, got {kappa}")
    return max(1, int(dim // kappa))


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
