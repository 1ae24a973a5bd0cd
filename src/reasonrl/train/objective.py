"""The objective on one micro-batch: (IS-weighted) policy loss + KL + entropy, aggregated.

Every term is aggregated with the totals of the whole mini-batch (tokens and
sequences), so summing micro-batch losses gives exactly the mini-batch loss
whatever the split. Statistics come back as sums (``token/<name>`` summed over
tokens, ``loss`` and ``loss_total`` over optimiser steps) and :func:`reduce_stats` turns the sums of
a whole training step into the logged means; the policy loss names its own
per-token statistics (``PolicyLossOutput.token_metrics``).

A policy loss whose signature declares ``group_ids`` (``gmc_grpo``) receives the
micro-batch's group ids and normalises over each group's rows; such a loss needs every
group whole in one micro-batch, which :func:`check_whole_groups` enforces against the
mini-batch's group sizes.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import Tensor

from reasonrl.algos.losses import aggregate
from reasonrl.algos.masked import masked_sum
from reasonrl.batch import RolloutBatch
from reasonrl.params import ConfigError, inject
from reasonrl.sections import LossConfig
from reasonrl.policy.hf import HFPolicy, token_logprobs_and_entropy
from reasonrl.registry import KL_ESTIMATORS, POLICY_LOSSES

TOKEN = "token/"


@dataclass
class Totals:
    tokens: int
    seqs: int
    norm_len: int  # Dr.GRPO's constant: the generation budget
    # Rows per group id in the mini-batch ({id: rows}) for a loss that takes group_ids, which
    # micro_batch_loss checks each micro-batch against; None (built by hand): no check.
    group_rows: dict[int, int] | None = None


def takes_group_ids(loss_fn) -> bool:
    """Whether a policy loss declares ``group_ids`` (it then sees whole groups; see module doc)."""
    try:
        return "group_ids" in inspect.signature(loss_fn).parameters
    except (TypeError, ValueError):  # a builtin or C callable: no inspectable signature
        return False


def group_rows(group_ids: Tensor) -> dict[int, int]:
    ids, counts = torch.unique(group_ids, return_counts=True)
    return dict(zip(ids.tolist(), counts.tolist()))


def check_whole_groups(micro: RolloutBatch, mini_rows: dict[int, int], policy: str) -> None:
    """Raise a ConfigError when a group of the micro-batch has rows outside it (a group split
    across micro-batches would make a group-normalising loss see part of the group)."""
    for gid, n in group_rows(micro.group_ids).items():
        total = mini_rows.get(gid, n)
        if n != total:
            raise ConfigError(
                f"loss.policy '{policy}' normalises over whole prompt groups, but group {gid} has {n} of its "
                f"{total} rows in this micro-batch of {len(micro)}: set train.micro_batch_size to at least the "
                f"rows of a mini-batch ({sum(mini_rows.values())}), or to a multiple of rollout.num_generations "
                f"when no selection stage drops rows inside groups (train.mini_batch_size likewise)")


def loss_mask(batch: RolloutBatch, cfg: LossConfig) -> Tensor:
    """The tokens the loss sees: the batch's trained tokens, less truncated rows if asked."""
    mask = batch.response_mask.float()
    if cfg.mask_truncated:
        mask = mask * (~batch.truncated).float().unsqueeze(-1)
    return mask


def totals(mini: RolloutBatch, cfg: LossConfig, norm_len: int) -> Totals:
    rows = group_rows(mini.group_ids) if takes_group_ids(POLICY_LOSSES.get(cfg.policy)) else None
    return Totals(tokens=max(1, int(loss_mask(mini, cfg).sum())), seqs=len(mini), norm_len=norm_len, group_rows=rows)


def completion_logits(policy: HFPolicy, batch: RolloutBatch, share_prompt: bool = True) -> Tensor:
    """Next-token logits ``[N, T, V]`` at the batch's completion positions (with gradient, unless
    the caller disables it); ``share_prompt``: each group's prompt runs once (the full
    distributions a distillation term, a teacher or a reference needs)."""
    return policy.completion_logits(batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                    batch.completion_mask, batch.group_ids if share_prompt else None)


def completion_logprobs(policy: HFPolicy, batch: RolloutBatch, temperature: float, share_prompt: bool,
                        with_entropy: bool = False, length_buckets: int = 1) -> tuple[Tensor, Tensor | None]:
    """Log-probs (and entropies) of the batch's completion tokens; ``length_buckets``: see
    ``HFPolicy.completion_logprobs`` (a stand-in policy without the parameter is called without it)."""
    return inject(policy.completion_logprobs, (batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                               batch.completion_mask, batch.group_ids if share_prompt else None),
                  {"length_buckets": length_buckets}, {"temperature": temperature, "with_entropy": with_entropy})


@dataclass
class TermInputs:
    """What a method's extra loss term (``Method.loss_term``) sees on one micro-batch."""

    micro: RolloutBatch
    mini: RolloutBatch  # the micro-batch's mini-batch: for totals of the method's own
    logits: Tensor  # [n, T, V] the policy's next-token logits at the completion positions, with gradient
    logprobs: Tensor  # [n, T] log-probs of the sampled tokens at the sampling temperature, with gradient
    mask: Tensor  # [n, T] the tokens the policy loss sees (``loss_mask``)
    temperature: float
    agg: dict  # the recipe's aggregation with the mini-batch's totals

    def aggregate(self, per_token: Tensor, mask: Tensor | None = None) -> Tensor:
        """Reduce a per-token term like the policy loss (same mode, same mini-batch totals), so
        the term, too, does not depend on the micro-batch split."""
        return aggregate(per_token, self.mask if mask is None else mask, **self.agg)


LossTerm = Callable[[TermInputs], "tuple[Tensor, dict[str, float]]"]


def zero_advantage_skip_blocker(recipe, terms: Sequence[LossTerm] = (), learner=None) -> str | None:
    """Why ``train.skip_zero_advantage`` cannot leave rows out of this run's learner (None: it can).
    Leaving a row out is exact only when its loss and gradient are exactly 0 whatever the
    parameters: a policy loss marked ``vanishes_without_advantage`` and nothing else in the loss."""
    loss = recipe.loss
    if not getattr(POLICY_LOSSES.get(loss.policy), "vanishes_without_advantage", False):
        return f"loss.policy '{loss.policy}' is not marked as vanishing on rows without advantage"
    if loss.kl.coef > 0 and not loss.kl.in_reward:
        return "the loss has a KL term (loss.kl.coef > 0, not in the reward)"
    if loss.entropy_coef:
        return "the loss has an entropy term (loss.entropy_coef)"
    if terms:
        return "a method adds a loss term"
    if learner is not None and not getattr(learner, "row_skipping", True):
        return f"the learner ({type(learner).__name__}) computes every row (its row_skipping is False)"
    return None


def rows_with_signal(micro: RolloutBatch, cfg: LossConfig) -> RolloutBatch:
    """The rows of ``micro`` with a nonzero advantage on a token the loss sees (all of it when every
    row has one). When no row has, its first row stays: the backward then still leaves an exactly
    zero gradient on every parameter, as the whole micro-batch would, and AdamW steps on it as it
    would (moments decaying, weight decay) rather than skipping parameters without a gradient."""
    if micro.advantages is None:
        return micro
    signal = ((micro.advantages != 0) & loss_mask(micro, cfg).bool()).any(dim=-1)
    if bool(signal.all()):
        return micro
    keep = signal.nonzero().flatten()
    return micro.select(keep if len(keep) else [0])


def micro_batch_loss(policy: HFPolicy, micro: RolloutBatch, cfg: LossConfig, totals: Totals,
                     temperature: float, share_prompt: bool, terms: Sequence[LossTerm] = (),
                     mini: RolloutBatch | None = None, length_buckets: int = 1,
                     skip_zero_advantage: bool = False) -> tuple[Tensor, dict[str, float]]:
    """Returns the loss to back-propagate and summed statistics for metrics. ``terms``: the
    methods' extra loss terms (``Method.loss_term``), each added as it returns it;
    ``length_buckets``: ``train.length_buckets`` (a term needs full logits: one forward then);
    ``skip_zero_advantage``: compute only :func:`rows_with_signal` (the caller has checked
    :func:`zero_advantage_skip_blocker`; ``totals`` still count every row)."""
    if totals.group_rows is not None:  # before the forward pass: fail fast
        check_whole_groups(micro, totals.group_rows, cfg.policy)
    skip_stats = {}
    if skip_zero_advantage:
        rows = len(micro)
        micro = rows_with_signal(micro, cfg)
        skip_stats = {"skip/rows": float(rows), "skip/left_out": float(rows - len(micro))}
    device = getattr(policy, "device", None)  # a stand-in policy without one computes where its inputs are
    if device is not None and micro.advantages is not None and micro.advantages.device != device:
        micro = micro.to(device)  # the batch lives on the CPU; the loss is computed beside the model
    mask = loss_mask(micro, cfg)
    if terms:  # a term may need the full distributions: one forward pass serves both
        logits = completion_logits(policy, micro, share_prompt)
        logp, entropy = token_logprobs_and_entropy(logits, micro.completion_ids, temperature, with_entropy=True)
    else:
        logp, entropy = completion_logprobs(policy, micro, temperature, share_prompt, with_entropy=True,
                                            length_buckets=length_buckets)
    # With one optimisation pass over freshly sampled data, π_old = π_θ: no extra forward pass.
    old = micro.old_logprobs if micro.old_logprobs is not None else logp.detach()
    loss_fn = POLICY_LOSSES.get(cfg.policy)
    # inject: a loss declaring group_ids gets them; every other loss is called exactly as before.
    out = inject(loss_fn, (logp, old, micro.advantages, mask), {"group_ids": micro.group_ids}, cfg.policy_params())
    agg = dict(mode=cfg.agg, total_tokens=totals.tokens, total_seqs=totals.seqs, norm_len=totals.norm_len)
    # Off-policy correction weights (``train.behaviour``) multiply the policy term only, as verl's
    # rollout IS weights do; the KL and entropy terms are not importance-weighted.
    policy_term = out.loss if micro.is_weights is None else out.loss * micro.is_weights
    loss = aggregate(policy_term, mask, **agg)
    stats = {"tokens": float(mask.sum()), "loss": float(loss.detach()), **skip_stats}
    per_token = {**out.token_metrics, "entropy": entropy}
    if micro.ref_logprobs is not None:
        kl = KL_ESTIMATORS.get(cfg.kl.estimator)(logp, micro.ref_logprobs)
        per_token["kl"] = kl
        if not cfg.kl.in_reward and cfg.kl.coef > 0:
            loss = loss + cfg.kl.coef * aggregate(kl, mask, **agg)
    if cfg.entropy_coef:
        loss = loss - cfg.entropy_coef * aggregate(entropy, mask, **agg)
    if terms:
        inputs = TermInputs(micro=micro, mini=micro if mini is None else mini, logits=logits, logprobs=logp,
                            mask=mask, temperature=temperature, agg=agg)
        for term in terms:
            extra, term_stats = term(inputs)
            loss = loss + extra
            stats.update(term_stats)
    stats["loss_total"] = float(loss.detach())
    stats.update({TOKEN + k: float(masked_sum(v.detach(), mask)) for k, v in per_token.items()})
    return loss, stats


def reduce_stats(sums: dict[str, float], optimizer_steps: int) -> dict[str, float]:
    """Token-summed statistics → token means; the summed losses → their means per optimiser step:
    ``loss`` the policy term, ``loss/total`` the whole objective back-propagated (policy, KL,
    entropy and the methods' terms: a pure distillation run's ``loss`` is 0, its ``loss/total`` not)."""
    tokens = max(sums.get("tokens", 0.0), 1.0)
    steps = max(optimizer_steps, 1)
    out = {"loss": sums.get("loss", 0.0) / steps, "loss/total": sums.get("loss_total", 0.0) / steps}
    out.update({k[len(TOKEN):]: v / tokens for k, v in sums.items() if k.startswith(TOKEN)})
    if sums.get("skip/rows"):  # train.skip_zero_advantage was on
        out["train/skipped_fraction"] = sums.get("skip/left_out", 0.0) / sums["skip/rows"]
    return out


@torch.no_grad()
def batch_logprobs(policy: HFPolicy, batch: RolloutBatch, micro_batch_size: int, temperature: float,
                   share_prompt: bool, length_buckets: int = 1) -> Tensor:
    """Log-probs of the batch's completion tokens under ``policy`` (old or reference policy)."""
    parts = [completion_logprobs(policy, m, temperature, share_prompt, length_buckets=length_buckets)[0].cpu()
             for m in batch.split(micro_batch_size)]
    return torch.cat(parts) * batch.completion_mask


def policy_loss_fn(policy: HFPolicy, recipe, terms: Sequence[LossTerm] = (), learner=None):
    """The learner's loss function (``reasonrl.train.optim.LossFn``) for ``recipe``: the policy
    objective of :func:`micro_batch_loss` on each micro-batch with its mini-batch's totals
    (computed once per mini-batch), plus the methods' ``terms``; rows without advantage left out
    when ``train.skip_zero_advantage`` is on and exact for this run (``learner``: the learner that
    back-propagates it). Every learner rank builds the same one (``reasonrl.train.fsdp``)."""
    r = recipe
    skip = r.train.skip_zero_advantage and zero_advantage_skip_blocker(r, terms, learner) is None
    # Holding the mini-batch itself (not its id), so a later one can never be mistaken for it.
    current: dict = {"mini": None, "totals": None}

    def loss_fn(micro: RolloutBatch, mini: RolloutBatch, _pass: int, _j: int):
        if current["mini"] is not mini:
            current.update(mini=mini, totals=totals(mini, r.loss, r.rollout.max_new_tokens))
        return micro_batch_loss(policy, micro, r.loss, current["totals"], r.rollout.temperature, r.train.share_prompt,
                                terms, mini, r.train.length_buckets, skip)

    return loss_fn
