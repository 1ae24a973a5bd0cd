"""The objective on one micro-batch: policy loss + KL + entropy, aggregated.

Every term is aggregated with the totals of the whole mini-batch (tokens and
sequences), so summing micro-batch losses gives exactly the mini-batch loss
whatever the split.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from reasonrl.algos.losses import aggregate
from reasonrl.algos.masked import masked_sum
from reasonrl.batch import RolloutBatch
from reasonrl.config import LossConfig
from reasonrl.policy.hf import HFPolicy
from reasonrl.registry import KL_ESTIMATORS, POLICY_LOSSES


@dataclass
class Totals:
    tokens: int
    seqs: int
    norm_len: int  # Dr.GRPO's constant: the generation budget


def loss_mask(batch: RolloutBatch, cfg: LossConfig) -> Tensor:
    mask = batch.completion_mask.float()
    if cfg.mask_truncated:
        mask = mask * (~batch.truncated).float().unsqueeze(-1)
    return mask


def policy_loss_params(cfg: LossConfig) -> dict:
    params = {"epsilon": cfg.epsilon, "epsilon_high": cfg.epsilon_high, "dual_clip": cfg.dual_clip}
    return {k: v for k, v in params.items() if v is not None}


def completion_logprobs(policy: HFPolicy, batch: RolloutBatch, temperature: float, share_prompt: bool,
                        with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    return policy.completion_logprobs(batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                      batch.completion_mask, batch.group_ids if share_prompt else None,
                                      temperature=temperature, with_entropy=with_entropy)


def micro_batch_loss(policy: HFPolicy, micro: RolloutBatch, cfg: LossConfig, totals: Totals,
                     temperature: float, share_prompt: bool) -> tuple[Tensor, dict[str, float]]:
    """Returns the loss to back-propagate and token-summed statistics for metrics."""
    mask = loss_mask(micro, cfg)
    logp, entropy = completion_logprobs(policy, micro, temperature, share_prompt, with_entropy=True)
    # With one optimisation pass over freshly sampled data, π_old = π_θ: no extra forward pass.
    old = micro.old_logprobs if micro.old_logprobs is not None else logp.detach()
    out = POLICY_LOSSES.get(cfg.policy)(logp, old, micro.advantages, mask, **policy_loss_params(cfg))
    agg = dict(mode=cfg.agg, total_tokens=totals.tokens, total_seqs=totals.seqs, norm_len=totals.norm_len)
    loss = aggregate(out.loss, mask, **agg)
    stats = {
        "tokens": float(mask.sum()),
        "clipped": float(masked_sum(out.clipped, mask)),
        "entropy": float(masked_sum(entropy.detach(), mask)),
        "ratio": float(masked_sum(out.ratio.detach(), mask)),
        "pg_loss": float(loss.detach()),
    }
    if micro.ref_logprobs is not None:
        kl = KL_ESTIMATORS.get(cfg.kl.estimator)(logp, micro.ref_logprobs)
        stats["kl"] = float(masked_sum(kl.detach(), mask))
        if not cfg.kl.in_reward and cfg.kl.coef > 0:
            loss = loss + cfg.kl.coef * aggregate(kl, mask, **agg)
    if cfg.entropy_coef:
        loss = loss - cfg.entropy_coef * aggregate(entropy, mask, **agg)
    return loss, stats


@torch.no_grad()
def batch_logprobs(policy: HFPolicy, batch: RolloutBatch, micro_batch_size: int, temperature: float,
                   share_prompt: bool) -> Tensor:
    """Log-probs of the batch's completion tokens under ``policy`` (old or reference policy)."""
    parts = [completion_logprobs(policy, m, temperature, share_prompt)[0] for m in batch.split(micro_batch_size)]
    return torch.cat(parts) * batch.completion_mask
