"""GRPODropout's rollout selection: which rows of each group to keep.

The per-group rules (:func:`balanced_push_select` for the ``balance`` and
``threshold`` variants, :func:`balanced_push_drop_pos_select` for ``drop_pos``) and
:func:`grpo_dropout_select`, which applies them over a batch. Pure tensor math: the
registered ``grpo_dropout`` selector that runs it on a rollout batch is in
:mod:`reasonrl.methods.grpo_dropout.stages`, which re-exports everything here.
"""

from __future__ import annotations

import math
import random

import torch
from torch import Tensor

from reasonrl.methods.grpo_dropout.stats import MAX_EXHAUSTIVE, PUSH_TOL, VARIANTS, check_choice, entropy_push, min_keep_count
from reasonrl.methods.grpo_dropout.stats import sequence_grpo_advantages, threshold_ratio

__all__ = ["balanced_push_drop_pos_select", "balanced_push_select", "check_n_update", "grpo_dropout_select",
           "judged_groups"]


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


def check_n_update(n_update: int | None) -> None:
    """``n_update`` must be None or an integer >= 1 (a ValueError naming it otherwise)."""
    if n_update is not None and (isinstance(n_update, bool) or not isinstance(n_update, int) or n_update < 1):
        raise ValueError(f"grpo_dropout: n_update must be None or an integer >= 1, got {n_update!r} (to train "
                         "on every row, leave the grpo_dropout selector out of the recipe)")


def judged_groups(group_size: Tensor, n_update: int | None) -> Tensor:
    """Which groups the selection rule judges, [num_groups] bool: those with more rows than
    ``n_update`` (every group when it is None); the others are kept whole.

    The authors' gate (GRPODropout ``selector_methods.select_indices``): update_count =
    min(|group|, n_update_samples_per_prompt), and a group with update_count >= |group| is
    returned whole before any rule runs. Their main variant (``configs/variants/balance.env``)
    sets n_update_samples_per_prompt = 7 with 8 rollouts per prompt, so every full group is
    judged; None is that case for any G.
    """
    check_n_update(n_update)
    if n_update is None:
        return torch.ones_like(group_size, dtype=torch.bool)
    return group_size > n_update


def grpo_dropout_select(rewards: Tensor, seq_logprob: Tensor, group_ids: Tensor, *, variant: str = "balance",
                        step: int = 0, total_steps: int = 1, min_keep: int | None = None, a0: float = 1.0,
                        a1: float = 0.0, seed: int = 3407, eps: float = 1e-6,
                        n_update: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """GRPODropout selection over a batch: returns (kept row indices [K] sorted, P [B], A [B]).

    A = full-group GRPO advantages of ``rewards`` (:func:`sequence_grpo_advantages`), P =
    :func:`entropy_push`, then per group ``variant``: ``balance`` (:func:`balanced_push_select`,
    ratio 0), ``threshold`` (ratio a(t) from :func:`threshold_ratio`) or ``drop_pos``
    (:func:`balanced_push_drop_pos_select`). A group with at most ``n_update`` rows is kept
    whole (:func:`judged_groups`: the authors' ``n_update < |group|`` gate). The random pick
    of an all-zero group depends only on (seed, step, group id), so resumed runs select the
    same rows. Statistics are in float64, as the authors' Python-float code.
    """
    check_choice("variant", variant, VARIANTS)
    check_n_update(n_update)
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
        if n_update is not None and rows.numel() <= n_update:
            kept.append(rows)  # the authors' gate (judged_groups): no fewer rows to keep than the group has
            continue
        if variant == "drop_pos":
            local = balanced_push_drop_pos_select(push[rows], adv[rows], min_keep=min_keep, key=key)
        else:
            local = balanced_push_select(push[rows], min_keep=min_keep, ratio=ratio, key=key)
        kept.append(rows[local.to(rows.device)])
    kept_rows = torch.sort(torch.cat(kept)).values if kept else torch.zeros(0, dtype=torch.long)
    return kept_rows, push, adv
