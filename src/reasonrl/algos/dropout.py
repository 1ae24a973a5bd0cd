"""GRPODropout: drop the rollouts whose update would lower the policy entropy most.

Source: "GRPODropout: Less is More for Online Reinforcement Learning Rollouts",
implemented from the authors' code (github.com/hexuandeng/GRPODropout @ 4ad3b3b:
``verl/examples/grpo_dropout/selector.py``, ``selector_methods.py`` and
``_apply_adv_p_center_after_select`` in ``verl/verl/trainer/ppo/ray_trainer.py``).
Spec confidence VERIFIED-CODE; the paper text itself was not available.

Per group of G rollouts with GRPO advantages A_k and sequence log-prob proxy ℓ_k:

    s_k = −ℓ_k,  Ĥ = (1/G) Σ_k s_k,  P_k = A_k (s_k − Ĥ)   ("entropy push")

(1/G) Σ_k P_k = −Cov_k(A, ℓ), the Monte-Carlo estimate of the first-order
entropy change of a policy-gradient step (Cui et al. 2025, arXiv 2505.22617).
The selector keeps every positive-push rollout and as many negative-push ones
(least negative first) as keep the kept push sum strictly positive; the
advantage stage recomputes GRPO on the kept rows and recentres them so that
their π-weighted mean is zero.

Two pieces, both registered under ``grpo_dropout``: a selector (SELECTORS) and
an advantage estimator (ADVANTAGES). Everything else here is pure tensor math.
"""

from __future__ import annotations

import math
import random

import torch
from torch import Tensor

from reasonrl.algos.advantages import grpo_advantages, sequence_scores
from reasonrl.algos.masked import as_float, group_inverse, group_sum, masked_mean, masked_sum
from reasonrl.registry import ADVANTAGES, SELECTORS

__all__ = [
    "BASES",
    "CENTER_MODES",
    "MAX_EXHAUSTIVE",
    "PUSH_TOL",
    "VARIANTS",
    "balanced_push_drop_pos_select",
    "balanced_push_select",
    "entropy_push",
    "grpo_dropout_advantage",
    "grpo_dropout_advantages",
    "grpo_dropout_select",
    "grpo_dropout_selector",
    "min_keep_count",
    "sequence_grpo_advantages",
    "sequence_logprob",
    "threshold_ratio",
    "weighted_recenter",
]

VARIANTS = ("balance", "threshold", "drop_pos")
BASES = ("avg", "sum")
CENTER_MODES = ("none", "weighted_center", "weighted_center_rescale", "weighted_standardize")
# The authors' sign tolerance: |P| ≤ 1e-12 counts as a zero push (float64 statistics).
PUSH_TOL = 1e-12
# drop_pos enumerates every subset of its prune candidates: 2^18 subsets is the most we allow.
MAX_EXHAUSTIVE = 18


# --------------------------------------------------------------------------- statistics


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"grpo_dropout: {name}={value!r} is not allowed; expected one of {', '.join(allowed)}")


def sequence_logprob(logprobs: Tensor, mask: Tensor, basis: str = "avg") -> Tensor:
    """Trajectory log-prob proxy ℓ_k, shape [B].

    ``avg``: ℓ_k = (1/T_k) Σ_t m_{k,t} log π_old(y_{k,t}|s_{k,t}); ``sum``: ℓ_k = Σ_t m log π_old.
    A row with an empty mask gets ℓ = 0. Equals the authors' ``traj_logp_avglogprob`` /
    ``traj_logp_sumlogprob`` (GRPODropout ``selector.py``). Float64 input stays float64.
    """
    _check_choice("basis", basis, BASES)
    if logprobs.shape != mask.shape or logprobs.dim() != 2:
        raise ValueError(f"logprobs and mask must both be [B,T]; got {tuple(logprobs.shape)} and {tuple(mask.shape)}")
    logprobs = logprobs.detach()
    return masked_mean(logprobs, mask, dim=-1) if basis == "avg" else masked_sum(logprobs, mask, dim=-1)


def sequence_grpo_advantages(scores: Tensor, group_ids: Tensor, eps: float = 1e-6) -> Tensor:
    """GRPO sequence advantages A_k = (R_k − mean_g R)/(std_g R + eps), unbiased std, [B].

    Exactly :func:`reasonrl.algos.advantages.grpo_advantages` (``scale="group"``) applied to
    one-token sequences; singleton groups get 0 (verl gives A = R_k there).
    """
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D [B], got shape {tuple(scores.shape)}")
    ones = torch.ones(scores.shape[0], 1, dtype=torch.bool, device=scores.device)
    return grpo_advantages(scores.detach().unsqueeze(-1), ones, group_ids, eps=eps)[:, 0]


def entropy_push(advantages: Tensor, seq_logprob: Tensor, group_ids: Tensor) -> Tensor:
    """Entropy push P_k = A_k (s_k − Ĥ_g), s_k = −ℓ_k, Ĥ_g = mean of s over k's group, [B].

    P_k > 0: the rollout pushes the policy entropy up (a rare correct answer, or a likely
    wrong one); P_k < 0: it pushes entropy down (a likely correct answer, or a rare wrong
    one). With zero-mean A, (1/G) Σ_k P_k = −Cov_k(A, ℓ). Equals the authors'
    ``traj_entropy_push_before_*``.
    """
    if advantages.shape != seq_logprob.shape or advantages.shape != group_ids.shape or advantages.dim() != 1:
        raise ValueError("advantages, seq_logprob and group_ids must all be [B]; got "
                         f"{tuple(advantages.shape)}, {tuple(seq_logprob.shape)}, {tuple(group_ids.shape)}")
    surprisal = -as_float(seq_logprob.detach())
    inverse, num_groups = group_inverse(group_ids)
    count = group_sum(torch.ones_like(surprisal), inverse, num_groups)
    centre = (group_sum(surprisal, inverse, num_groups) / count)[inverse]
    return as_float(advantages.detach()) * (surprisal - centre)


def min_keep_count(group_size: int, min_keep: int | None = None) -> int:
    """Rollouts kept at least per group: m = max(1, ⌊G/4⌋) (2 for G = 8), or ``min_keep`` capped at G."""
    if min_keep is None:
        return max(1, group_size // 4)
    return min(int(min_keep), group_size)


def threshold_ratio(step: int, total_steps: int, a0: float = 1.0, a1: float = 0.0) -> float:
    """Linear schedule a(t) = a0 + (a1 − a0)(t − 1)/(T_total − 1), t = step + 1 (1-based).

    ``step`` is the pipeline's 0-based step, so the first step uses a0 and the last a1.
    Progress is clipped to [0, 1]; T_total ≤ 1 gives a0 (as the authors'
    ``_compute_balance_target_ratio``).
    """
    if total_steps <= 1:
        return float(a0)
    progress = min(max(step / (total_steps - 1), 0.0), 1.0)
    return float(a0 + (a1 - a0) * progress)


# --------------------------------------------------------------------------- per-group rules


def _desc(values: Tensor, idx: Tensor) -> Tensor:
    """``idx`` ordered by ``values[idx]`` descending; ties keep index order (Python's sorted)."""
    order = torch.sort(values[idx], descending=True, stable=True).indices
    return idx[order]


def _all_zero_pick(group_size: int, m: int, key: str) -> list[int]:
    # random.Random seeds a str through SHA-512: the pick depends on the key alone, so a
    # resumed run (same seed, step, group) keeps the same rows and no global RNG is touched.
    return sorted(random.Random(key).sample(range(group_size), m))


def _single_sign_pick(push: Tensor, pos: Tensor, neg: Tensor, zero: Tensor, m: int) -> list[int]:
    """Keep every positive push; below m fill with zero pushes, then negatives least negative first."""
    chosen = _desc(push, pos.nonzero().flatten()).tolist()
    for pool in (zero.nonzero().flatten().tolist(), _desc(push, neg.nonzero().flatten()).tolist()):
        chosen += pool[: max(0, m - len(chosen))]
    return chosen


def _greedy_prefix(push: Tensor, start_sum: Tensor, candidates: Tensor, floor: Tensor) -> Tensor:
    """Longest prefix of ``candidates`` (negative pushes, least negative first) whose running
    sum start_sum + Σ P stays > floor + PUSH_TOL; adding stops at the first that fails."""
    running = start_sum + torch.cumsum(push[candidates], 0)
    taken = int((running > floor + PUSH_TOL).long().cumprod(0).sum())
    return candidates[:taken]


def _fill_zeros(selected: list[int], zero: Tensor, m: int) -> list[int]:
    pool = [i for i in zero.nonzero().flatten().tolist() if i not in selected]
    return selected + pool[: max(0, m - len(selected))]


def balanced_push_select(push: Tensor, *, min_keep: int | None = None, ratio: float = 0.0,
                         key: str = "0") -> Tensor:
    """Kept positions (sorted, long) of one group under ``balanced_push_zero`` / ``_threshold``.

    With pos = {k : P_k > 0}, neg = {k : P_k < 0}, zero = the rest (|P| ≤ 1e-12), m = min kept:

    - all pushes zero (e.g. all-correct or all-wrong groups, A ≡ 0): a random subset of
      size m drawn from ``random.Random(key)``;
    - only one sign: every positive push; below m, fill with zero pushes (index order), then
      with negative pushes in descending order of P;
    - both signs: every positive push, then negatives in descending order of P (least
      negative first) while Σ_kept P > ratio · Σ_pos P; stop at the first that would break
      it. Below m, fill with zero pushes only (more negatives would break the bound).

    ``ratio = 0`` is ``balanced_push_zero`` (the smallest strictly positive kept push sum);
    ``ratio = a(t)`` is ``balanced_push_threshold`` (a = 1 drops every negative push).
    Equals GRPODropout ``select_balanced_push_zero`` / ``select_balanced_push_threshold``.
    """
    if push.dim() != 1 or push.numel() == 0:
        raise ValueError(f"push must be a non-empty 1-D group, got shape {tuple(push.shape)}")
    push = push.detach().to(torch.float64)
    g = push.numel()
    m = min_keep_count(g, min_keep)
    pos, neg = push > PUSH_TOL, push < -PUSH_TOL
    zero = ~pos & ~neg
    if bool(zero.all()):
        return torch.tensor(_all_zero_pick(g, m, key), dtype=torch.long)
    if not bool(pos.any()) or not bool(neg.any()):
        return torch.tensor(sorted(_single_sign_pick(push, pos, neg, zero, m)), dtype=torch.long)
    pos_sum = push[pos].sum()
    prefix = _greedy_prefix(push, pos_sum, _desc(push, neg.nonzero().flatten()), ratio * pos_sum)
    selected = pos.nonzero().flatten().tolist() + prefix.tolist()
    return torch.tensor(sorted(_fill_zeros(selected, zero, m)), dtype=torch.long)


def _best_drop(push_c: Tensor, running_sum: Tensor, kept: int, m: int) -> list[int]:
    """Positions (into the candidate list) of the subset to drop: the smallest kept sum that
    stays > 0 with ≥ m rows kept; near ties (within PUSH_TOL) go to the fewest dropped, then
    to the lowest bitmask (the authors' loop order)."""
    c = push_c.numel()
    if c == 0:
        return []
    if c > MAX_EXHAUSTIVE:
        raise ValueError(f"grpo_dropout variant='drop_pos': {c} prune candidates in one group exceeds the "
                         f"exhaustive-search limit of {MAX_EXHAUSTIVE}; use groups of at most {MAX_EXHAUSTIVE} "
                         "rollouts or variant='balance'")
    masks = torch.arange(1, 1 << c, dtype=torch.long)
    bits = (masks.unsqueeze(-1) >> torch.arange(c)) & 1
    sums = running_sum - bits.to(push_c.dtype) @ push_c
    sizes = bits.sum(-1)
    valid = (kept - sizes >= m) & (sums > PUSH_TOL)
    if not bool(valid.any()):
        return []
    best = sums[valid].min()
    near = valid & (sums <= best + PUSH_TOL)
    rank = torch.where(near, sizes * (1 << c) + masks, torch.iinfo(torch.long).max)
    chosen = bits[int(rank.argmin())]
    return chosen.nonzero().flatten().tolist()


def balanced_push_drop_pos_select(push: Tensor, advantages: Tensor, *, min_keep: int | None = None,
                                  key: str = "0") -> Tensor:
    """Kept positions of one group under the ablation ``balanced_push_zero_drop_negpush_posadv``.

    Only positive-advantage rollouts are ever dropped:

    1. all pushes zero, or no positive push: exactly :func:`balanced_push_select`;
    2. keep every positive push; add negative pushes *with A ≤ 0* least negative first while
       the sum stays > 0 (negative-push rollouts with A > 0 are always dropped); below m,
       fill with zero pushes;
    3. among the kept rollouts with P > 0 and A > 0, drop the subset (exhaustive search over
       all 2^c subsets) that leaves the smallest kept push sum still > 0 with ≥ m rows.

    Equals GRPODropout ``select_balanced_push_zero_drop_negpush_posadv``.
    """
    if push.shape != advantages.shape or push.dim() != 1 or push.numel() == 0:
        raise ValueError(f"push and advantages must be the same non-empty 1-D group; got "
                         f"{tuple(push.shape)} and {tuple(advantages.shape)}")
    push = push.detach().to(torch.float64)
    adv = advantages.detach().to(torch.float64)
    g = push.numel()
    m = min_keep_count(g, min_keep)
    pos, neg = push > PUSH_TOL, push < -PUSH_TOL
    zero = ~pos & ~neg
    if bool(zero.all()) or not bool(pos.any()):
        return balanced_push_select(push, min_keep=min_keep, key=key)
    positives = _desc(push, pos.nonzero().flatten())
    pos_sum = push[pos].sum()
    prefix = _greedy_prefix(push, pos_sum, _desc(push, (neg & (adv <= PUSH_TOL)).nonzero().flatten()),
                            torch.zeros((), dtype=torch.float64))
    selected = _fill_zeros(positives.tolist() + prefix.tolist(), zero, m)
    candidates = [i for i in selected if bool(push[i] > PUSH_TOL) and bool(adv[i] > PUSH_TOL)]
    drop_at = _best_drop(push[candidates], push[selected].sum(), len(selected), m)
    dropped = {candidates[j] for j in drop_at}
    return torch.tensor(sorted(i for i in selected if i not in dropped), dtype=torch.long)


# --------------------------------------------------------------------------- whole batch


def grpo_dropout_select(rewards: Tensor, seq_logprob: Tensor, group_ids: Tensor, *, variant: str = "balance",
                        step: int = 0, total_steps: int = 1, min_keep: int | None = None, a0: float = 1.0,
                        a1: float = 0.0, seed: int = 3407, eps: float = 1e-6) -> tuple[Tensor, Tensor, Tensor]:
    """GRPODropout selection over a batch: returns (kept row indices [K] sorted, P [B], A [B]).

    A = full-group GRPO advantages of ``rewards`` (:func:`sequence_grpo_advantages`), P =
    :func:`entropy_push`, then per group ``variant``: ``balance`` (:func:`balanced_push_select`,
    ratio 0), ``threshold`` (ratio a(t) from :func:`threshold_ratio`) or ``drop_pos``
    (:func:`balanced_push_drop_pos_select`). The random pick of an all-zero group depends
    only on (seed, step, group id), so resumed runs select the same rows. Statistics are in
    float64, as the authors' Python-float code.
    """
    _check_choice("variant", variant, VARIANTS)
    for name, value in (("a0", a0), ("a1", a1), ("eps", eps)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise ValueError(f"grpo_dropout: {name} must be a number, got {value!r}")
    if eps < 0:
        raise ValueError(f"grpo_dropout: eps must be >= 0, got {eps!r}")
    if min_keep is not None and (isinstance(min_keep, bool) or not isinstance(min_keep, int) or min_keep < 1):
        raise ValueError(f"grpo_dropout: min_keep must be None or an integer >= 1, got {min_keep!r}")
    if rewards.dim() != 1 or rewards.shape != seq_logprob.shape or rewards.shape != group_ids.shape:
        raise ValueError("rewards, seq_logprob and group_ids must all be [B]; got "
                         f"{tuple(rewards.shape)}, {tuple(seq_logprob.shape)}, {tuple(group_ids.shape)}")
    adv = sequence_grpo_advantages(rewards.detach().to(torch.float64), group_ids, eps)
    push = entropy_push(adv, seq_logprob.detach().to(torch.float64), group_ids)
    ratio = threshold_ratio(step, total_steps, a0, a1) if variant == "threshold" else 0.0
    kept = []
    for gid in torch.unique(group_ids).tolist():
        rows = (group_ids == gid).nonzero().flatten()
        key = f"{seed}:{step}:{gid}"
        if variant == "drop_pos":
            local = balanced_push_drop_pos_select(push[rows], adv[rows], min_keep=min_keep, key=key)
        else:
            local = balanced_push_select(push[rows], min_keep=min_keep, ratio=ratio, key=key)
        kept.append(rows[local.to(rows.device)])
    kept_rows = torch.sort(torch.cat(kept)).values if kept else torch.zeros(0, dtype=torch.long)
    return kept_rows, push, adv


def weighted_recenter(seq_adv: Tensor, seq_logprob: Tensor, group_ids: Tensor, mode: str = "weighted_center",
                      eps: float = 1e-6) -> Tensor:
    """Probability-weighted recentring of sequence advantages within each (kept) group, [B].

    w_k = softmax_{k∈g}(ℓ_k), E_w A = Σ_k w_k A_k, c_k = A_k − E_w A:

    - ``weighted_center``: Â = c (the π-weighted mean of Â is zero);
    - ``weighted_center_rescale``: Â = c · mean_g|A| / (mean_g|c| + eps) (plain group means);
    - ``weighted_standardize``: Â = c / (sqrt(Σ_k w_k c_k²) + eps);
    - ``none``: Â = A.

    A singleton group gets Â = 0 under every mode but ``none``. Equals GRPODropout
    ``_apply_adv_p_center_after_select`` (``ray_trainer.py``), vectorised over groups.
    """
    _check_choice("center", mode, CENTER_MODES)
    if seq_adv.dim() != 1 or seq_adv.shape != seq_logprob.shape or seq_adv.shape != group_ids.shape:
        raise ValueError("seq_adv, seq_logprob and group_ids must all be [B]; got "
                         f"{tuple(seq_adv.shape)}, {tuple(seq_logprob.shape)}, {tuple(group_ids.shape)}")
    adv = as_float(seq_adv.detach())
    if mode == "none" or adv.numel() == 0:
        return adv
    logits = seq_logprob.detach().to(adv.dtype)
    inverse, num_groups = group_inverse(group_ids)
    top = torch.full((num_groups,), -torch.inf, dtype=adv.dtype, device=adv.device)
    top = top.scatter_reduce(0, inverse, logits, reduce="amax")
    expo = torch.exp(logits - top[inverse])  # max-shifted: softmax over very negative sum-log-probs stays finite
    w = expo / group_sum(expo, inverse, num_groups)[inverse]
    centred = adv - group_sum(w * adv, inverse, num_groups)[inverse]
    if mode == "weighted_center":
        return centred
    if mode == "weighted_center_rescale":
        count = group_sum(torch.ones_like(adv), inverse, num_groups)
        mean_abs = group_sum(adv.abs(), inverse, num_groups) / count
        mean_abs_c = group_sum(centred.abs(), inverse, num_groups) / count
        return centred * (mean_abs / (mean_abs_c + eps))[inverse]
    weighted_std = group_sum(w * centred.square(), inverse, num_groups).sqrt()
    return centred / (weighted_std + eps)[inverse]


def grpo_dropout_advantages(token_rewards: Tensor, response_mask: Tensor, group_ids: Tensor, seq_logprob: Tensor,
                            *, center: str = "weighted_center", eps: float = 1e-6) -> Tensor:
    """GRPODropout advantages on the kept rows, broadcast to tokens, [B,T].

    A'_k = GRPO over the kept rows of each group (score s_k = Σ_t r_{k,t} m_{k,t}, unbiased
    std, eps), then Â = :func:`weighted_recenter`(A', ℓ, mode=center), broadcast to every
    response token. With ``center="none"`` this is exactly ``grpo`` (scale="group").
    """
    _check_choice("center", center, CENTER_MODES)
    if token_rewards.dim() != 2 or token_rewards.shape != response_mask.shape:
        raise ValueError("token_rewards and response_mask must both be [B,T]; got "
                         f"{tuple(token_rewards.shape)} and {tuple(response_mask.shape)}")
    seq_adv = sequence_grpo_advantages(sequence_scores(token_rewards, response_mask), group_ids, eps)
    final = weighted_recenter(seq_adv, seq_logprob, group_ids, center, eps)
    return torch.where(response_mask.bool(), final.unsqueeze(-1), 0.0)


# --------------------------------------------------------------------------- pipeline adapters


def _batch_logprobs(batch) -> Tensor:
    logprobs = batch.sample_logprobs if batch.sample_logprobs is not None else batch.old_logprobs
    if logprobs is None:
        raise ValueError("grpo_dropout needs the behaviour policy's token log-probs: the batch has neither "
                         "sample_logprobs nor old_logprobs")
    return logprobs


@SELECTORS.register("grpo_dropout")
def grpo_dropout_selector(batch, *, step: int, total_steps: int, variant: str = "balance", basis: str = "avg",
                          min_keep: int | None = None, a0: float = 1.0, a1: float = 0.0, seed: int = 3407,
                          eps: float = 1e-6):
    """GRPODropout rollout selection (see :func:`grpo_dropout_select`).

    ℓ comes from ``batch.sample_logprobs`` (else ``old_logprobs``) with ``basis`` avg|sum; the
    kept rows' ℓ is stored in ``aux["seq_logprob"]`` for the ``grpo_dropout`` advantage.
    Parameters: ``variant`` balance|threshold|drop_pos, ``basis`` avg|sum, ``min_keep``
    (default max(1, ⌊G/4⌋)), ``a0``/``a1`` (threshold schedule), ``seed`` (all-zero groups),
    ``eps`` (GRPO std epsilon). Metrics: ``dropped_fraction``; ``push_sum_before`` /
    ``push_sum_after``, the per-group Σ P over all / kept rows (centre Ĥ of the full group)
    averaged over groups; ``mixed_dropped_fraction``, the dropped share of the rows in groups
    with some non-zero push (the push rule proper; all-zero groups, whose A ≡ 0, lose G − m
    rows each and dominate ``dropped_fraction`` on easy or hard tasks); ``surprisal_before`` /
    ``surprisal_after``, the token-mean −log π_old over all / kept rows (the kept rows are not
    an unbiased sample of the policy).
    """
    _check_choice("basis", basis, BASES)
    if len(batch) == 0:
        return batch, {}
    logprobs = _batch_logprobs(batch)
    mask = batch.completion_mask
    seq_lp = sequence_logprob(logprobs.to(torch.float64), mask, basis)
    kept, push, _ = grpo_dropout_select(batch.rewards, seq_lp, batch.group_ids, variant=variant, step=step,
                                        total_steps=total_steps, min_keep=min_keep, a0=a0, a1=a1, seed=seed, eps=eps)
    inverse, num_groups = group_inverse(batch.group_ids)
    kept_mask = torch.zeros(len(batch), dtype=torch.bool)
    kept_mask[kept] = True
    active = torch.zeros(num_groups, dtype=torch.bool).index_put_((inverse,), push.abs() > PUSH_TOL, accumulate=True)
    mixed = active[inverse]
    out = batch.select(kept)
    out.aux["seq_logprob"] = seq_lp[kept].to(torch.float32)
    metrics = {
        "dropped_fraction": 1.0 - kept.numel() / len(batch),
        "push_sum_before": float(push.sum()) / num_groups,
        "push_sum_after": float(push[kept_mask].sum()) / num_groups,
        "mixed_dropped_fraction": float((mixed & ~kept_mask).sum()) / max(1, int(mixed.sum())),
        "surprisal_before": float(-masked_mean(logprobs, mask)),
        "surprisal_after": float(-masked_mean(logprobs[kept], mask[kept])),
    }
    return out, metrics


@ADVANTAGES.register("grpo_dropout")
def grpo_dropout_advantage(token_rewards: Tensor, response_mask: Tensor, group_ids: Tensor, *, batch,
                           center: str = "weighted_center", basis: str = "avg", eps: float = 1e-6) -> Tensor:
    """GRPODropout advantage: :func:`grpo_dropout_advantages` on the rows the selector kept.

    ℓ is ``batch.aux["seq_logprob"]`` (written by the ``grpo_dropout`` selector); without it
    ℓ is computed from the batch's sample (else old) log-probs with ``basis``. ``center``:
    none | weighted_center | weighted_center_rescale | weighted_standardize.
    """
    _check_choice("basis", basis, BASES)
    seq_lp = batch.aux.get("seq_logprob")
    if seq_lp is None:
        seq_lp = sequence_logprob(_batch_logprobs(batch).to(torch.float64), response_mask, basis)
    return grpo_dropout_advantages(token_rewards, response_mask, group_ids, seq_lp, center=center, eps=eps)
