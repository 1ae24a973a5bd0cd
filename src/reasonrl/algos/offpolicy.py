"""Off-policy corrections (``OFF_POLICY``) and their metrics.

Three log-probs of each sampled token: behaviour μ (as sampled, maybe by stale weights or a
bf16 sampler), proximal π_prox (recomputed under the learner's weights before the update)
and current π_θ. A correction turns (proximal, behaviour, mask) into detached per-token
weights that multiply the per-token policy loss, and names the ``anchor``: the old
log-probs the policy loss's ratio π_θ/π_old is taken against. Registered corrections share::

    fn(proximal_logprobs[B,T], behaviour_logprobs[B,T], response_mask[B,T], **params) -> Correction

Every ratio is ρ = exp(clamp(log π_prox − log μ, ±20)) (``LOG_RATIO_CLAMP``; sequence levels
clamp the row's summed or mean log-ratio). Padding is selected away with ``where`` before
any arithmetic, so NaN/inf there never reaches a weight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal, Optional

import torch
from torch import Tensor

from reasonrl.algos.kl import kl_k3
from reasonrl.algos.losses import LOG_RATIO_CLAMP
from reasonrl.algos.masked import mask_count, masked_mean, masked_sum
from reasonrl.params import Range
from reasonrl.registry import OFF_POLICY

__all__ = ["Correction", "tis", "mis", "decoupled_ppo", "ratio_mask", "behaviour_ppo", "no_correction", "offpolicy_metrics"]

Cap = Annotated[float, Range(ge=1, why="an importance-weight cap is a ratio bound >= 1")]
Level = Literal["token", "sequence", "geometric"]
LEVELS = ("token", "sequence", "geometric")


@dataclass(frozen=True)
class Correction:
    """Per-token results, each [B,T] float32, detached and zero outside the mask.

    ``weights`` multiply the per-token policy loss; ``anchor`` ("proximal" or "behaviour")
    names the old log-probs of the PPO ratio; ``ratio`` is the behaviour ratio ρ = π_prox/μ
    (sequence levels: the row's ratio on every token); ``truncated`` / ``masked`` are 0/1
    indicators of tokens whose weight was capped / set to 0 by the rule.
    """

    weights: Tensor
    anchor: str
    ratio: Tensor
    truncated: Tensor
    masked: Tensor


def _log_ratio(proximal: Tensor, behaviour: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    if not (proximal.dim() == 2 and proximal.shape == behaviour.shape == mask.shape):
        raise ValueError(
            "proximal_logprobs, behaviour_logprobs and response_mask must share one [B,T] shape; got "
            f"{tuple(proximal.shape)}, {tuple(behaviour.shape)}, {tuple(mask.shape)}")
    valid = mask.bool()
    prox = torch.where(valid, proximal.detach().to(torch.float32), 0.0)
    behav = torch.where(valid, behaviour.detach().to(torch.float32), 0.0)
    return valid, prox - behav


def _ratio(log_ratio: Tensor, valid: Tensor, level: str) -> Tensor:
    """ρ per token, or the row's ρ_i broadcast over its tokens; 0 outside the mask."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}, got {level!r}")
    if level == "token":
        lr = log_ratio
    elif level == "sequence":
        lr = masked_sum(log_ratio, valid, dim=-1).unsqueeze(-1).expand_as(log_ratio)
    else:
        lr = masked_mean(log_ratio, valid, dim=-1).unsqueeze(-1).expand_as(log_ratio)
    rho = torch.exp(lr.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    return torch.where(valid, rho, 0.0)


def _check_cap(cap: Optional[float]) -> None:
    if cap is not None and not cap >= 1.0:
        raise ValueError(f"cap must be >= 1, got {cap}")


def _out(weights: Tensor, anchor: str, rho: Tensor, valid: Tensor, truncated: Tensor, masked: Tensor) -> Correction:
    f = torch.float32
    return Correction(weights=torch.where(valid, weights, 0.0), anchor=anchor, ratio=rho,
                      truncated=(truncated & valid).to(f), masked=(masked & valid).to(f))


@OFF_POLICY.register("tis")
def tis(proximal_logprobs: Tensor, behaviour_logprobs: Tensor, response_mask: Tensor, *,
        level: Level = "token", cap: Cap = 2.0) -> Correction:
    """Truncated importance sampling (Yao et al. 2025, "Your efficient RL framework secretly
    brings you off-policy RL training").

    token: w_t = min(ρ_t, c), ρ_t = exp(clamp(log π_prox − log μ, ±20));
    sequence: w = min(ρ_i, c) on every token of row i, ρ_i = exp(clamp(Σ_t (log π_prox − log μ), ±20));
    geometric: the same with ρ_i = exp(clamp(mean_t(...), ±20)) (length-normalised).
    ``truncated`` marks ρ > c. Anchor "proximal". Equals verl ``rollout_is`` truncate mode
    and TRL ``vllm_importance_sampling_mode="token_truncate"/"sequence_truncate"``
    (``vllm_importance_sampling_cap`` = c).
    """
    _check_cap(cap)
    valid, lr = _log_ratio(proximal_logprobs, behaviour_logprobs, response_mask)
    rho = _ratio(lr, valid, level)
    over = rho > cap
    return _out(rho.clamp(max=cap), "proximal", rho, valid, over, torch.zeros_like(over))


@OFF_POLICY.register("mis")
def mis(proximal_logprobs: Tensor, behaviour_logprobs: Tensor, response_mask: Tensor, *,
        level: Level = "token", cap: Cap = 2.0) -> Correction:
    """Masked importance sampling (IcePop, Ling team 2025): w = ρ if 1/c ≤ ρ ≤ c, else 0.

    ρ as in :func:`tis` at the same ``level``; at sequence levels a row outside the band is
    dropped whole. ``masked`` marks the zeroed tokens. Anchor "proximal". Equals verl
    ``rollout_is`` mask mode with its default lower threshold 1/upper. IcePop's bounds
    [α, β] are independent (paper: 0.5, 5); TRL ``"token_mask"/"sequence_mask"`` masks only
    ρ > c (no lower bound).
    """
    _check_cap(cap)
    valid, lr = _log_ratio(proximal_logprobs, behaviour_logprobs, response_mask)
    rho = _ratio(lr, valid, level)
    out = (rho < 1.0 / cap) | (rho > cap)
    return _out(torch.where(out, 0.0, rho), "proximal", rho, valid, torch.zeros_like(out), out)


@OFF_POLICY.register("decoupled_ppo")
def decoupled_ppo(proximal_logprobs: Tensor, behaviour_logprobs: Tensor, response_mask: Tensor, *,
                  cap: Optional[Cap] = 5.0, mode: Literal["mask", "truncate"] = "mask") -> Correction:
    """Decoupled PPO (Fu et al. 2025, "AReaL: a large-scale asynchronous RL system").

    The PPO clip is taken around π_prox (anchor "proximal") and each token's loss is
    weighted by the behaviour ratio w_t = ρ_t = π_prox/μ (clamped log-ratio, as everywhere
    here). ``mode="mask"``: w_t = 0 where ρ_t > cap (AReaL's ``behav_imp_weight_cap``;
    no lower bound), marked in ``masked``. ``mode="truncate"``: w_t = min(ρ_t, cap), marked
    in ``truncated``; this equals token-level :func:`tis` with the same cap. ``cap=None``:
    w_t = ρ_t uncapped.
    """
    _check_cap(cap)
    if mode not in ("mask", "truncate"):
        raise ValueError(f"mode must be 'mask' or 'truncate', got {mode!r}")
    valid, lr = _log_ratio(proximal_logprobs, behaviour_logprobs, response_mask)
    rho = _ratio(lr, valid, "token")
    over = rho > cap if cap is not None else torch.zeros_like(valid)
    none = torch.zeros_like(over)
    if mode == "mask":
        return _out(torch.where(over, 0.0, rho), "proximal", rho, valid, none, over)
    weights = rho if cap is None else rho.clamp(max=cap)
    return _out(weights, "proximal", rho, valid, over, none)


@OFF_POLICY.register("ratio_mask")
def ratio_mask(proximal_logprobs: Tensor, behaviour_logprobs: Tensor, response_mask: Tensor, *,
               cap: Cap = 5.0, anchor: Literal["proximal", "behaviour"] = "proximal") -> Correction:
    """Token ratio masking: w_t = 1[1/c ≤ ρ_t ≤ c], ρ_t = π_prox/μ per token; a masked token
    keeps no policy gradient, a kept one its plain (unweighted) loss.

    Unlike :func:`mis` the kept tokens are not multiplied by ρ: the mask only removes tokens
    whose behaviour is too far from the learner (the token rejection of verl's rollout
    correction; IcePop's band without its ratio weight). COPC's mask (paper: "COPC: Coupled Off-Policy
    Correction", not located; default c = 5), whose ``copc`` advantage reads these weights to cut its traces at the same
    tokens. ``anchor``: the PPO ratio's π_old, the proximal policy (COPC's decoupled form) or μ.
    ``masked`` marks the dropped tokens.
    """
    _check_cap(cap)
    if anchor not in ("proximal", "behaviour"):
        raise ValueError(f"anchor must be 'proximal' or 'behaviour', got {anchor!r}")
    valid, lr = _log_ratio(proximal_logprobs, behaviour_logprobs, response_mask)
    rho = _ratio(lr, valid, "token")
    out = (rho < 1.0 / cap) | (rho > cap)
    return _out((~out).to(torch.float32), anchor, rho, valid, torch.zeros_like(out), out)


@OFF_POLICY.register("behaviour_ppo")
def behaviour_ppo(proximal_logprobs: Tensor, behaviour_logprobs: Tensor, response_mask: Tensor) -> Correction:
    """Plain ("coupled") PPO on stale data: the ratio π_θ/μ is taken against the behaviour
    log-probs themselves (anchor "behaviour"), so no correction weight: w = mask.

    AReaL's non-decoupled baseline. ``ratio`` still reports ρ = π_prox/μ for diagnostics
    (it is used by nothing; pass ``proximal=behaviour`` when no proximal pass was run).
    """
    valid, lr = _log_ratio(proximal_logprobs, behaviour_logprobs, response_mask)
    rho = _ratio(lr, valid, "token")
    none = torch.zeros_like(valid)
    return _out(torch.ones_like(rho), "behaviour", rho, valid, none, none)


@OFF_POLICY.register("none")
def no_correction(proximal_logprobs: Tensor, behaviour_logprobs: Tensor, response_mask: Tensor) -> Correction:
    """Measure, do not correct: w = mask, anchor "proximal" (the PPO ratio against π_prox).

    The uncorrected baseline of the staleness test bed, with every ``offpolicy/*`` metric
    (the proximal pass runs, so the behaviour–learner KL is logged). On a single pass
    π_prox = sg(π_θ) up to float noise, so the update is that of no ``off_policy`` at all.
    """
    valid, lr = _log_ratio(proximal_logprobs, behaviour_logprobs, response_mask)
    rho = _ratio(lr, valid, "token")
    none = torch.zeros_like(valid)
    return _out(torch.ones_like(rho), "proximal", rho, valid, none, none)


def offpolicy_metrics(proximal: Tensor | None, behaviour: Tensor, mask: Tensor, correction: Correction | None,
                      token_versions: Tensor | int, current_version: int) -> dict[str, float]:
    """Off-policy statistics over the masked tokens, as plain floats (0.0 for an empty mask).

    - ``offpolicy/staleness_mean|max``: current_version − token_versions (an int
      ``token_versions`` means every token was sampled at that version).
    - ``offpolicy/kl_behaviour`` (with ``proximal``): k3 estimate of KL(μ ‖ π_prox) from
      tokens sampled by μ, mean of (ρ − 1) − log ρ, ρ = π_prox/μ (:func:`kl_k3` with its clamps);
      ``offpolicy/max_abs_logp_diff``: max |log π_prox − log μ| (the worst token's mismatch).
    - with ``correction``: ``is_weight_mean|max``, ``truncated_fraction``, ``masked_fraction``
      and ``ess`` = (Σw)² / (n Σw²) ∈ (0, 1], the normalised effective sample size
      (0 when every weight is 0).
    """
    valid = mask.bool()
    n = mask_count(valid)
    empty = not bool(n > 0)

    def mx(x: Tensor) -> float:
        return 0.0 if empty else float(x.detach().to(torch.float32)[valid].max())

    if isinstance(token_versions, int):
        token_versions = torch.full(mask.shape, token_versions, device=mask.device)
    stale = torch.where(valid, current_version - token_versions.to(torch.float32), 0.0)
    out = {"offpolicy/staleness_mean": float(masked_mean(stale, valid)), "offpolicy/staleness_max": mx(stale)}
    if proximal is not None:
        _, lr = _log_ratio(proximal, behaviour, mask)
        out["offpolicy/kl_behaviour"] = float(masked_mean(kl_k3(torch.zeros_like(lr), lr), valid))
        out["offpolicy/max_abs_logp_diff"] = mx(lr.abs())
    if correction is not None:
        w = torch.where(valid, correction.weights.detach().to(torch.float32), 0.0)
        sum_w, sum_w2 = w.sum(), w.square().sum()
        ess = sum_w.square() / (n * sum_w2) if bool(sum_w2 > 0) else 0.0
        out.update({
            "offpolicy/is_weight_mean": float(masked_mean(w, valid)),
            "offpolicy/is_weight_max": mx(w),
            "offpolicy/truncated_fraction": float(masked_mean(correction.truncated, valid)),
            "offpolicy/masked_fraction": float(masked_mean(correction.masked, valid)),
            "offpolicy/ess": float(ess),
        })
    return out
