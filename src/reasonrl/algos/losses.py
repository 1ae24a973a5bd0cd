"""Per-token policy-gradient losses (``POLICY_LOSSES``) and loss aggregation.

Registered losses share the signature::

    fn(logprobs[B,T], old_logprobs[B,T], advantages[B,T], response_mask[B,T], **params)
        -> PolicyLossOutput

``loss`` is the per-token loss to minimise, zero outside the mask; reduce it
with :func:`aggregate`. ``old_logprobs`` and ``advantages`` are treated as
constants (detached); gradient flows only through ``logprobs``. Clip widths use the offset convention everywhere: the
upper bound is ``1 + epsilon_high``. Padding is selected away before any
arithmetic, so NaN/inf there reaches neither the loss nor its gradient.
"""

from __future__ import annotations

import difflib
import typing
from dataclasses import dataclass, field
from typing import Annotated, Optional

import torch
from torch import Tensor

from reasonrl.algos.masked import as_float, mask_count, masked_mean
from reasonrl.params import Range
from reasonrl.registry import POLICY_LOSSES
from reasonrl.sections import AggMode

Width = Annotated[float, Range(ge=0, why='a clip width is an offset from 1')]

__all__ = [
    "PolicyLossOutput",
    "LOG_RATIO_CLAMP",
    "ppo_clip_loss",
    "gspo_loss",
    "cispo_loss",
    "no_policy_loss",
    "vanishes_without_advantage",
    "AGG_MODES",
    "aggregate",
]

# verl clamps the log-ratio to ±20 so exp() cannot overflow float32.
LOG_RATIO_CLAMP = 20.0


def vanishes_without_advantage(loss_fn):
    """Mark a policy loss whose every row is independent of the others and whose loss and gradient
    are exactly 0 on a row whose advantages are all 0 (finite log-probs): the learner may then leave
    such rows out of its forward and backward with the mini-batch's totals kept, and the step is the
    same (``train.skip_zero_advantage``). A loss that couples rows (a group-normalising one) or adds
    a term of its own must not carry the mark."""
    loss_fn.vanishes_without_advantage = True
    return loss_fn


@dataclass(frozen=True)
class PolicyLossOutput:
    """Per-token results, each [B,T] and zero outside the mask.

    ``clipped`` is a float 0/1 indicator of tokens whose value the clip (or
    truncation) changed; ``masked_mean(clipped, mask)`` is the clip fraction.
    ``extra`` holds further per-token statistics a loss wants logged.
    """

    loss: Tensor
    clipped: Tensor
    ratio: Tensor
    extra: dict[str, Tensor] = field(default_factory=dict)

    @property
    def token_metrics(self) -> dict[str, Tensor]:
        """Per-token statistics the trainer logs as their token mean, under these names."""
        return {"clip_fraction": self.clipped, "ratio/mean": self.ratio, **self.extra}


def _prepare(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor):
    if not (logprobs.shape == old_logprobs.shape == advantages.shape == response_mask.shape):
        raise ValueError(
            "logprobs, old_logprobs, advantages and response_mask must share one [B,T] shape; got "
            f"{tuple(logprobs.shape)}, {tuple(old_logprobs.shape)}, {tuple(advantages.shape)}, "
            f"{tuple(response_mask.shape)}"
        )
    valid = response_mask.bool()
    logp = torch.where(valid, as_float(logprobs), 0.0)
    old = torch.where(valid, as_float(old_logprobs.detach()), 0.0)
    adv = torch.where(valid, as_float(advantages.detach()), 0.0)
    return valid, logp, old, adv


def _clip_bounds(epsilon: float, epsilon_high: Optional[float]) -> tuple[float, float]:
    eps_high = epsilon if epsilon_high is None else epsilon_high
    if epsilon < 0 or eps_high < 0:
        raise ValueError(f"clip widths must be >= 0, got epsilon={epsilon}, epsilon_high={eps_high}")
    return 1.0 - epsilon, 1.0 + eps_high


def _clipped_surrogate(
    ratio: Tensor, adv: Tensor, valid: Tensor, low: float, high: float, dual_clip: Optional[float]
) -> PolicyLossOutput:
    unclipped = -adv * ratio
    clipped_branch = -adv * ratio.clamp(low, high)
    took_clip = clipped_branch > unclipped
    # where() rather than maximum(): maximum splits the gradient 50/50 on ties.
    loss = torch.where(took_clip, clipped_branch, unclipped)
    if dual_clip is not None:
        if not dual_clip > 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        bound = -adv * dual_clip
        dual_active = (adv < 0) & (loss > bound)
        loss = torch.where(dual_active, bound, loss)
        took_clip = took_clip | dual_active
    zero = torch.zeros_like(loss)
    return PolicyLossOutput(
        loss=torch.where(valid, loss, zero),
        clipped=(took_clip & valid).to(loss.dtype),
        ratio=torch.where(valid, ratio, zero),
    )


@POLICY_LOSSES.register("ppo_clip")
@vanishes_without_advantage
def ppo_clip_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    epsilon: Width = 0.2,
    epsilon_high: Optional[Width] = None,
    dual_clip: Optional[Annotated[float, Range(gt=1)]] = None,
) -> PolicyLossOutput:
    """PPO clipped surrogate per token (Schulman et al. 2017), with clip-higher and dual clip.

    ρ = exp(clamp(logp − old, ±20)),
    l = max(−A ρ, −A clip(ρ, 1 − ε, 1 + ε_high)), ε_high defaulting to ε
    (asymmetric clip-higher from DAPO, Yu et al. 2025). With ``dual_clip=c > 1``
    (Ye et al. 2020) l = min(l, −A c) where A < 0. ``clipped`` marks tokens where
    the clipped branch was strictly larger or the dual bound was active.
    Equals verl ``compute_policy_loss_vanilla`` (clip_ratio_low/high,
    clip_ratio_c) and TRL's token-level loss for loss_type grpo/bnpo/dr_grpo/dapo
    (TRL has no dual clip; its ``delta`` is not implemented here).
    """
    valid, logp, old, adv = _prepare(logprobs, old_logprobs, advantages, response_mask)
    low, high = _clip_bounds(epsilon, epsilon_high)
    ratio = torch.exp((logp - old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    return _clipped_surrogate(ratio, adv, valid, low, high, dual_clip)


@POLICY_LOSSES.register("gspo")
@vanishes_without_advantage
def gspo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    epsilon: Width = 3e-4,
    epsilon_high: Optional[Width] = 4e-4,
) -> PolicyLossOutput:
    """GSPO, sequence-level importance ratio (Zheng et al. 2025), GSPO-token form.

    s_i = exp(mean_{t valid}(logp − old)) (length-normalised sequence ratio),
    s_{i,t} = sg(s_i)·exp(logp_t − sg(logp_t)): its value is s_i but its gradient
    is s_i ∇logp_t per token. Then l = max(−A s_{i,t}, −A clip(s_{i,t}, 1 − ε,
    1 + ε_high)); defaults 3e-4 / 4e-4 are the paper's. The mean log-ratio is
    clamped to ±20 (verl clamps the log-ratio at +10).

    Equals verl loss_mode ``"gspo"``. TRL ``importance_sampling_level="sequence"``
    has the same values; its un-detached s_i gives per-token gradient
    s_i·mean_t ∇logp_t, so gradients coincide after ``seq-mean-token-mean``
    aggregation (TRL "grpo" loss) but differ under ``token-mean``.
    """
    valid, logp, old, adv = _prepare(logprobs, old_logprobs, advantages, response_mask)
    low, high = _clip_bounds(epsilon, epsilon_high)
    seq_log_ratio = masked_mean((logp - old).detach(), valid, dim=-1).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    # Adding the detached constant last keeps logp − sg(logp) exactly 0 (verl PR #2775).
    ratio = torch.exp(logp - logp.detach() + seq_log_ratio.unsqueeze(-1))
    return _clipped_surrogate(ratio, adv, valid, low, high, None)


@POLICY_LOSSES.register("cispo")
@vanishes_without_advantage
def cispo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    epsilon_high: Width = 4.0,
) -> PolicyLossOutput:
    """CISPO (MiniMax-M1, 2025): REINFORCE with a truncated, stop-gradient IS weight.

    l = −sg(min(ρ, 1 + ε_high))·A·logp, ρ = exp(clamp(logp − old, ±20)), so every
    token keeps gradient −min(ρ, 1 + ε_high)·A·∇logp (PPO would zero it).
    ``clipped`` marks ρ > 1 + ε_high. Default ε_high = 4.0, i.e. a cap of 5.0,
    TRL's recommended value. Note TRL ``loss_type="cispo"`` takes the cap itself
    (``epsilon_high=5.0`` there) while we use the offset 1 + ε_high as in every
    other loss here. verl ``compute_policy_loss_cispo`` clamps two-sided,
    clip(ρ, 1 − ε_low, 1 + ε_high); the paper leaves the lower bound unused,
    as we do.
    """
    valid, logp, old, adv = _prepare(logprobs, old_logprobs, advantages, response_mask)
    if epsilon_high < 0:
        raise ValueError(f"epsilon_high must be >= 0, got {epsilon_high}")
    cap = 1.0 + epsilon_high
    ratio = torch.exp((logp - old).detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    weight = ratio.clamp(max=cap)
    loss = -weight * adv * logp
    zero = torch.zeros_like(loss)
    return PolicyLossOutput(
        loss=torch.where(valid, loss, zero),
        clipped=((ratio > cap) & valid).to(loss.dtype),
        ratio=torch.where(valid, ratio, zero),
    )


@POLICY_LOSSES.register("none")
def no_policy_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, response_mask: Tensor) -> PolicyLossOutput:
    """No policy-gradient term: 0 on every token, with a zero gradient (the graph is kept, so a
    step whose only term is zero still runs). The objective is then what the methods add
    (``Method.loss_term``: pure on-policy distillation, ``methods: [{name: opd}]``) plus the
    recipe's KL and entropy terms. Rewards are still computed and logged."""
    valid, logp, old, _ = _prepare(logprobs, old_logprobs, advantages, response_mask)
    zero = torch.zeros_like(logp)
    return PolicyLossOutput(loss=logp * 0.0, clipped=zero, ratio=torch.where(valid, torch.ones_like(logp), zero))


# --------------------------------------------------------------------------- aggregation

AGG_MODES = typing.get_args(AggMode)


def aggregate(
    loss_mat: Tensor,
    mask: Tensor,
    mode: str,
    *,
    total_tokens: Optional[float] = None,
    total_seqs: Optional[float] = None,
    norm_len: Optional[float] = None,
) -> Tensor:
    """Reduce a [B,T] per-token loss to a scalar (verl ``agg_loss`` mode names).

    - ``token-mean``: Σ l m / N_tok (DAPO; TRL "dapo"/"bnpo").
    - ``seq-mean-token-mean``: Σ_i (Σ_t l m / max(Σ_t m, 1)) / N_seq (GRPO; TRL "grpo").
    - ``seq-mean-token-sum``: Σ_i Σ_t l m / N_seq.
    - ``seq-mean-token-sum-norm``: Σ l m / (N_seq · L) (Dr. GRPO; TRL "dr_grpo" with
      L = max_completion_length).

    N_tok = ``total_tokens`` (default: local Σ m, at least 1), N_seq = ``total_seqs``
    (default: local B; fully masked rows count, as in TRL), L = ``norm_len``
    (default T = mask.shape[1]; pass the max generation length). Passing the
    whole batch's N_tok / N_seq when the batch is split into micro-batches along
    B makes the micro-batch losses sum exactly to the full-batch loss (the
    gradient-accumulation fix; verl's ``batch_num_tokens``/``global_batch_size``).
    Under data parallelism with gradient averaging (DDP), pass the global totals
    and multiply by the world size, as verl does with ``dp_size``.
    """
    if mode not in AGG_MODES:
        close = difflib.get_close_matches(str(mode), AGG_MODES, n=1, cutoff=0.0)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown loss aggregation mode {mode!r}; allowed: {', '.join(AGG_MODES)}.{hint}")
    if loss_mat.dim() != 2 or loss_mat.shape != mask.shape:
        raise ValueError(f"loss_mat and mask must both be [B,T]; got {tuple(loss_mat.shape)}, {tuple(mask.shape)}")
    for name, value in (("total_tokens", total_tokens), ("total_seqs", total_seqs), ("norm_len", norm_len)):
        if value is not None and not value > 0:
            raise ValueError(f"{name} must be > 0, got {value}")
    valid = mask.bool()
    loss = torch.where(valid, as_float(loss_mat), 0.0)
    n_seq = float(loss.shape[0]) if total_seqs is None else float(total_seqs)

    if mode == "token-mean":
        n_tok = mask_count(valid).clamp_min(1.0) if total_tokens is None else float(total_tokens)
        return loss.sum() / n_tok
    if mode == "seq-mean-token-mean":
        return masked_mean(loss, valid, dim=-1).sum() / n_seq
    if mode == "seq-mean-token-sum":
        return loss.sum() / n_seq
    length = float(loss.shape[1]) if norm_len is None else float(norm_len)
    return loss.sum() / (n_seq * length)
