"""ARG (Adaptive Reference Guidance): the maths of the prefix selectors, the reference
surprisal and the prefix tokens.

**Confidence: INFERRED** from the abstract's own argument (paper: "Adaptive Reference Guidance",
full text and code not located). Neighbours it borrows from: POPE (arXiv 2601.18779,
oracle-solution prefixes on hard problems), SEELE (arXiv 2509.06923), Prefix Sampling
(arXiv 2605.05112, prefix tokens out of the loss), LUFFY (arXiv 2504.14945, a clipped importance
weight on off-policy guidance). Every constant here is a proposed default, not a reported value.

For a group whose G rollouts all failed and a verified reference solution y* of L tokens:

- **Prefix length**: ℓ = ⌊ρ L⌋ for a prefix ratio ρ from bins {ρ_1 … ρ_B} (default
  {0, 0.1, …, 0.9}); the continuation ŷ ∼ π_θ(· | x, y*_{≤ℓ}).
- **The paper's criterion.** The KL from a continuation to the ideal distribution
  π(y | x, correct) decreases with q(ℓ) · S(ℓ), where q(ℓ) is the probability that the
  continuation is correct *and differs from the reference*, and S(ℓ) = −log π_θ(y*_{>ℓ} | x,
  y*_{≤ℓ}) is the reference surprisal of the remaining suffix. A longer prefix raises q and lowers
  S, so success alone does not pick ℓ. One continuation gives an unbiased one-sample estimate
  u = 1[passes ∧ ŷ ≠ y*_{>ℓ}] · S(ℓ), E[u] = q(ℓ) S(ℓ), with no success-rate estimate and no
  extra generation (S comes from one forward pass over the reference).
- **Selector** (``Exp3Selector``): one EXP3 bandit over the bins, shared by all questions.
  EXP3 needs rewards in [0, 1], so a group's observation is x = mean_j u_j / S(0) (S(ℓ) ≤ S(0),
  the surprisal of the whole reference, so x ∈ [0, 1]). Dividing by the question's own S(0)
  keeps, for each question, the ℓ that maximises q(ℓ)S(ℓ); across questions it weighs each
  question's criterion by 1/S(0). Our choice: the abstract gives no scale.
- **Ablation** (``SuccessTargetSelector``, the earlier version): a softmax bandit trained by
  REINFORCE on u = −(p̂ − p*)², p̂ the continuation success rate — the success-only criterion
  the abstract argues is insufficient.
- **Prefix and fallback tokens** that the policy did not sample carry the clipped weight
  w_t = clip(π_θ(y*_t|s_t) / π_ref(y*_t|s_t), 0, c) (LUFFY-style; c = 1), detached, evaluated
  at the policy that samples the step.

All functions are pure; random draws take the caller's generator.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
from torch import Tensor

__all__ = ["DEFAULT_BINS", "check_bins", "prefix_length", "selector_probs", "sample_bin", "draw_bin", "selector_reward",
           "reinforce_update", "update_baseline", "expected_ratio", "selector_entropy", "prefix_weights",
           "all_failure_groups", "exp3_probs", "exp3_update", "suffix_surprisal", "surprisal_reward", "same_text"]

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


def draw_bin(probs: Tensor, generator: Optional[torch.Generator] = None) -> int:
    """One bin index b ∼ ``probs``, drawn with ``generator`` (the run's: a resumed run draws the same)."""
    return int(torch.multinomial(probs, 1, generator=generator))


def sample_bin(logits: Tensor, generator: Optional[torch.Generator] = None) -> int:
    """One bin index b ∼ q_ψ = softmax(ψ)."""
    return draw_bin(selector_probs(logits), generator)


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


def expected_ratio(probs: Tensor, bins: Sequence[float]) -> float:
    """E_q[ρ] = Σ_b q(b) ρ_b for a selector's bin probabilities ``probs``."""
    return float((probs.double() * torch.tensor(list(bins), dtype=torch.float64)).sum())


def selector_entropy(probs: Tensor) -> float:
    """H(q) in nats (log B when uniform)."""
    q = probs.double()
    return float(-(q * q.clamp_min(1e-300).log()).sum())


# -- the paper's criterion and its bandit ----------------------------------------------------------

def exp3_probs(log_weights: Tensor, gamma: float) -> Tensor:
    """EXP3's draw distribution p_b = (1 − γ) w_b / Σ w + γ / B (``log_weights`` = log w)."""
    if not 0.0 < gamma <= 1.0:
        raise ValueError(f"EXP3's gamma must be in (0, 1], got {gamma}")
    return (1.0 - gamma) * torch.softmax(log_weights.double(), dim=-1) + gamma / len(log_weights)


def exp3_update(log_weights: Tensor, chosen: Sequence[int], rewards: Sequence[float], probs: Tensor,
                gamma: float) -> Tensor:
    """log w_b ← log w_b + γ x̂_b / B with the importance-weighted estimate x̂_b = x / p_b, once
    per observation (b_k, x_k), x_k ∈ [0, 1]; ``probs`` is the distribution the bins were
    drawn from (all of a step's draws come from one p, then all its observations update).
    The result is shifted so its maximum is 0 (the softmax does not change; no overflow)."""
    bad = [x for x in rewards if not 0.0 <= x <= 1.0]
    if bad:
        raise ValueError(f"EXP3 needs rewards in [0, 1], got {bad}")
    out = log_weights.clone().double()
    for b, x in zip(chosen, rewards):
        out[b] += gamma * x / (float(probs[b]) * len(out))
    return out - out.max()


def suffix_surprisal(logprobs: Tensor, ell: int) -> float:
    """S(ℓ) = −log π(y*_{>ℓ} | x, y*_{≤ℓ}) = −Σ_{t ≥ ℓ} log π(y*_t | ·), from the per-token
    log-probs of the whole reference (0-based: the prefix is tokens 0..ℓ−1)."""
    return float(-logprobs[ell:].double().sum())


def surprisal_reward(passed: Sequence[bool], differs: Sequence[bool], s_ell: float, s_full: float) -> tuple[float, float]:
    """The group's mean one-sample estimate ū = mean_j 1[passes_j ∧ differs_j] · S(ℓ) and its
    EXP3 observation x = ū / S(0) ∈ [0, 1] (0 when S(0) = 0: a reference the model already
    writes with certainty leaves nothing to learn)."""
    hit = sum(bool(p) and bool(d) for p, d in zip(passed, differs)) / max(1, len(passed))
    u = hit * s_ell
    return u, (min(1.0, max(0.0, u / s_full)) if s_full > 0 else 0.0)


def same_text(a: str, b: str) -> bool:
    """Whether two trajectories are the same text up to whitespace (a continuation that
    reproduces the reference's suffix, token boundaries aside)."""
    return a.split() == b.split()


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
