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
an advantage estimator (ADVANTAGES), both defined here. Everything else is pure
tensor math, in three modules whose names this one re-exports: the shared
statistics (``stats.py``), the selection rules (``selection.py``) and the advantage
(``advantage.py``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from reasonrl.methods.grpo_dropout.advantage import grpo_dropout_advantages, weighted_recenter
from reasonrl.methods.grpo_dropout.selection import balanced_push_drop_pos_select, balanced_push_select, check_n_update
from reasonrl.methods.grpo_dropout.selection import grpo_dropout_select, judged_groups
from reasonrl.methods.grpo_dropout.stats import BASES, CENTER_MODES, MAX_EXHAUSTIVE, PUSH_TOL, VARIANTS, check_choice
from reasonrl.methods.grpo_dropout.stats import entropy_push, min_keep_count, sequence_grpo_advantages, sequence_logprob, threshold_ratio
from reasonrl.algos.masked import group_inverse, masked_mean
from reasonrl.dataflow import declares
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
    "judged_groups",
    "min_keep_count",
    "sequence_grpo_advantages",
    "sequence_logprob",
    "threshold_ratio",
    "weighted_recenter",
]


SEQ_LOGPROB = "seq_logprob"
"""``batch.aux`` key: the kept rows' sequence log-prob proxy ℓ, from the selector to the advantage."""


def _batch_logprobs(batch) -> Tensor:
    logprobs = batch.sample_logprobs if batch.sample_logprobs is not None else batch.old_logprobs
    if logprobs is None:
        raise ValueError("grpo_dropout needs the behaviour policy's token log-probs: the batch has neither "
                         "sample_logprobs nor old_logprobs")
    return logprobs


@SELECTORS.register("grpo_dropout")
@declares(produces=(SEQ_LOGPROB,))
def grpo_dropout_selector(batch, *, step: int, total_steps: int, variant: str = "balance", basis: str = "avg",
                          min_keep: int | None = None, a0: float = 1.0, a1: float = 0.0, seed: int = 3407,
                          eps: float = 1e-6, n_update: int | None = None):
    """GRPODropout rollout selection (see :func:`grpo_dropout_select`).

    ℓ comes from ``batch.sample_logprobs`` (else ``old_logprobs``) with ``basis`` avg|sum; the
    kept rows' ℓ is stored in ``aux["seq_logprob"]`` for the ``grpo_dropout`` advantage.
    Parameters: ``variant`` balance|threshold|drop_pos, ``basis`` avg|sum, ``min_keep``
    (default max(1, ⌊G/4⌋)), ``a0``/``a1`` (threshold schedule), ``seed`` (all-zero groups),
    ``eps`` (GRPO std epsilon), ``n_update`` (groups of at most that many rows are kept whole,
    the authors' ``n_update_samples_per_prompt``; None: every group is judged).
    Metrics: ``dropped_fraction``; ``push_sum_before`` / ``push_sum_after``, the per-group Σ P
    over all / kept rows (centre Ĥ of the full group) averaged over groups;
    ``mixed_dropped_fraction``, the dropped share of the rows in groups with some non-zero push
    (the push rule proper; all-zero groups, whose A ≡ 0, lose G − m rows each and dominate
    ``dropped_fraction`` on easy or hard tasks); ``mixed_dropped_per_group``, the rows dropped
    per such group (the abstract's "a small number"); ``mixed_group_fraction``, the share of
    groups that are mixed; ``kept_whole_fraction``, the share of groups the ``n_update`` gate
    kept whole; ``surprisal_before`` / ``surprisal_after``, the token-mean −log π_old over all
    / kept rows (the kept rows are not an unbiased sample of the policy).
    """
    check_choice("basis", basis, BASES)
    check_n_update(n_update)
    if len(batch) == 0:
        return batch, {}
    logprobs = _batch_logprobs(batch)
    mask = batch.response_mask  # the model's tokens (not an episode's environment tokens)
    seq_lp = sequence_logprob(logprobs.to(torch.float64), mask, basis)
    kept, push, _ = grpo_dropout_select(batch.rewards, seq_lp, batch.group_ids, variant=variant, step=step,
                                        total_steps=total_steps, min_keep=min_keep, a0=a0, a1=a1, seed=seed, eps=eps,
                                        n_update=n_update)
    inverse, num_groups = group_inverse(batch.group_ids)
    kept_mask = torch.zeros(len(batch), dtype=torch.bool)
    kept_mask[kept] = True
    active = torch.zeros(num_groups, dtype=torch.bool).index_put_((inverse,), push.abs() > PUSH_TOL, accumulate=True)
    mixed = active[inverse]
    sizes = torch.zeros(num_groups, dtype=torch.long).index_add_(0, inverse, torch.ones_like(inverse))
    mixed_dropped = int((mixed & ~kept_mask).sum())
    out = batch.select(kept)
    out.aux[SEQ_LOGPROB] = seq_lp[kept].to(torch.float32)
    metrics = {
        "dropped_fraction": 1.0 - kept.numel() / len(batch),
        "push_sum_before": float(push.sum()) / num_groups,
        "push_sum_after": float(push[kept_mask].sum()) / num_groups,
        "mixed_dropped_fraction": mixed_dropped / max(1, int(mixed.sum())),
        "mixed_dropped_per_group": mixed_dropped / max(1, int(active.sum())),
        "mixed_group_fraction": float(active.float().mean()),
        "kept_whole_fraction": float((~judged_groups(sizes, n_update)).float().mean()),
        "surprisal_before": float(-masked_mean(logprobs, mask)),
        "surprisal_after": float(-masked_mean(logprobs[kept], mask[kept])),
    }
    return out, metrics


@ADVANTAGES.register("grpo_dropout")
@declares(optional=(SEQ_LOGPROB,))
def grpo_dropout_advantage(token_rewards: Tensor, response_mask: Tensor, group_ids: Tensor, *, batch,
                           center: str = "weighted_center", basis: str = "avg", eps: float = 1e-6) -> Tensor:
    """GRPODropout advantage: :func:`grpo_dropout_advantages` on the rows the selector kept.

    ℓ is ``batch.aux["seq_logprob"]`` (written by the ``grpo_dropout`` selector); without it
    ℓ is computed from the batch's sample (else old) log-probs with ``basis``. ``center``:
    none | weighted_center | weighted_center_rescale | weighted_standardize.
    """
    check_choice("basis", basis, BASES)
    seq_lp = batch.aux.get(SEQ_LOGPROB)
    if seq_lp is None:
        seq_lp = sequence_logprob(_batch_logprobs(batch).to(torch.float64), response_mask, basis)
    return grpo_dropout_advantages(token_rewards, response_mask, group_ids, seq_lp, center=center, eps=eps)
