"""ARG (Adaptive Reference Guidance): the maths of the prefix selector and the prefix tokens.

**Confidence: INFERRED** (``specs/methods-a.md`` §6; no paper or code was found). The method is
put together from verified neighbours: POPE (arXiv 2601.18779, oracle-solution prefixes on
hard problems), SEELE (arXiv 2509.06923, an adaptive hint length per problem), G²RPO-A
(arXiv 2508.13023, adaptive guidance strength), Prefix Sampling (arXiv 2605.05112, replayed
prefix tokens masked from the loss) and LUFFY (arXiv 2504.14945, off-policy guidance with
policy shaping). Every constant here is a proposed default, not a reported value.

For a group whose G rollouts all failed (GRPO's advantage is 0 there) and a verified
reference solution y* of L tokens:

- **Prefix length**: ℓ = ⌊ρ L⌋ for a prefix ratio ρ from a fixed set of bins {ρ_1 … ρ_B}
  (default {0, 0.1, …, 0.9}); the guided rollouts continue from x ⊕ y*_{≤ℓ}.
- **Selector** (one shared softmax bandit, the spec's simplest form): q_ψ(b) = softmax(ψ)_b
  over the bins, ψ ∈ R^B global (no per-question features).
- **Selector reward**: u = −(p̂ − p*)², p̂ the success rate of the guided continuations of a
  group, p* the target (0.5: the rate at which a binary group's reward variance, and hence
  GRPO's signal, is largest).
- **Update**: REINFORCE with a baseline b̄ over the K groups guided in a step,
  ψ ← ψ + η · (1/K) Σ_k (u_k − b̄) (e_{b_k} − q_ψ),
  since ∇_ψ log q_ψ(b) = e_b − q_ψ. b̄ is an exponential moving average of past steps' mean
  u (b̄ ← λ b̄ + (1 − λ) ū after the step; the first step uses its own mean ū), so a single
  guided group still moves ψ.
- **Prefix tokens, option (ii)**: trained with the clipped importance weight
  w_t = clip(π_θ(y*_t|s_t) / π_ref(y*_t|s_t), 0, c) (LUFFY-style; c = 1 by default), a
  detached weight evaluated at the policy that samples the step (π_old).

All functions are pure; random draws take the caller's generator.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
from torch import Tensor

__all__ = ["DEFAULT_BINS", "check_bins", "prefix_length", "selector_probs", "sample_bin", "selector_reward",
           "reinforce_update", "update_baseline", "expected_ratio", "selector_entropy", "prefix_weights",
           "all_failure_groups"]

DEFAULT_BINS = tuple(round(0.1 * i, 1) for i in range(10))  # 0.0, 0.1, …, 0.9


def check_bins(bins: Sequence[float]) -> None:
    """Bins must be a non-empty, strictly increasing list of ratios in [0, 1) (ρ = 1 would hand
    the model the whole solution: nothing left to sample)."""
    if not bins:
        raise ValueError("bins must list at least one prefix ratio in [0, 1), e.g. [0.0, 0.1, ..., 0.9]")
    bad = [b for b in bins if not 0.0 <= b < 1.0]
    if bad:
        raise ValueError(f"bins must be prefix ratios in [0, 1); got {list(bins)} (out of range: {bad})")
    if any(a >= b for a, b in zip(bins, bins[1:])):
        raise ValueError(f"bins must be strictly increasing; got {list(bins)}")


def prefix_length(rho: float, length: int, max_len: Optional[int] = None) -> int:
    """ℓ = ⌊ρ L⌋ (a 1e-9 guard keeps e.g. 0.29·100 at 29 despite float rounding), at most
    ``max_len`` (the room the completion budget leaves for a continuation)."""
    if not 0.0 <= rho < 1.0:
        raise ValueError(f"prefix ratio must be in [0, 1), got {rho}")
    ell = min(int(math.floor(rho * length + 1e-9)), length)
    return ell if max_len is None else max(0, min(ell, max_len))


def selector_probs(logits: Tensor) -> Tensor:
    """q_ψ = softmax(ψ) over the bins."""
    return torch.softmax(logits.double(), dim=-1)


def sample_bin(logits: Tensor, generator: Optional[torch.Generator] = None) -> int:
    """One bin index b ∼ q_ψ, drawn with ``generator`` (the run's: a resumed run draws the same)."""
    return int(torch.multinomial(selector_probs(logits), 1, generator=generator))


def selector_reward(success_rate: Tensor | float, target: float = 0.5) -> Tensor:
    """u = −(p̂ − p*)²: 0 when the guided group succeeds at exactly the target rate."""
    return -(torch.as_tensor(success_rate, dtype=torch.float64) - target) ** 2


def reinforce_update(logits: Tensor, chosen: Sequence[int], rewards: Tensor, baseline: float,
                     lr: float) -> Tensor:
    """ψ + η (1/K) Σ_k (u_k − b̄)(e_{b_k} − q_ψ): REINFORCE on the bandit (see module doc)."""
    if len(chosen) == 0:
        return logits.clone()
    q = selector_probs(logits)
    onehot = torch.zeros(len(chosen), len(q), dtype=torch.float64)
    onehot[torch.arange(len(chosen)), torch.as_tensor(list(chosen))] = 1.0
    adv = rewards.double() - baseline
    grad = (adv.unsqueeze(-1) * (onehot - q)).mean(0)
    return (logits.double() + lr * grad).to(logits.dtype)


def update_baseline(baseline: Optional[float], mean_reward: float, decay: float) -> float:
    """b̄ ← λ b̄ + (1 − λ) ū; the first step starts it at ū."""
    return mean_reward if baseline is None else decay * baseline + (1.0 - decay) * mean_reward


def expected_ratio(logits: Tensor, bins: Sequence[float]) -> float:
    """E_{q_ψ}[ρ] = Σ_b q_ψ(b) ρ_b."""
    return float((selector_probs(logits) * torch.tensor(list(bins), dtype=torch.float64)).sum())


def selector_entropy(logits: Tensor) -> float:
    """H(q_ψ) in nats (log B when uniform)."""
    q = selector_probs(logits)
    return float(-(q * q.clamp_min(1e-300).log()).sum())


def prefix_weights(policy_logp: Tensor, ref_logp: Tensor, clip: float = 1.0) -> Tensor:
    """w_t = clip(π_θ(y*_t)/π_ref(y*_t), 0, c) from log-probs (detached). With c = 1 a prefix
    token the policy already likes more than the reference counts fully, one it likes less is
    down-weighted by the ratio (LUFFY's motivation: imitate only where the policy follows)."""
    if clip <= 0:
        raise ValueError(f"clip must be > 0, got {clip}")
    return (policy_logp.detach().double() - ref_logp.detach().double()).exp().clamp(0.0, clip).to(policy_logp.dtype)


def all_failure_groups(rewards: Tensor, group_ids: Tensor, threshold: float = 0.0) -> list[int]:
    """The group ids (in order of first appearance) none of whose rows has a reward above
    ``threshold``: all failed, so their group-relative advantage is 0."""
    seen: dict[int, bool] = {}
    for gid, r in zip(group_ids.tolist(), rewards.tolist()):
        seen[gid] = seen.get(gid, False) or r > threshold
    return [g for g, ok in seen.items() if not ok]
