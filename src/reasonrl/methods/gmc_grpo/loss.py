"""Trajectory-level importance ratios for stale rollouts: TIC-GRPO and GMC-GRPO (``POLICY_LOSSES``).

Both losses weight a whole completion o_i by its trajectory ratio against the log-probs in
``old_logprobs`` (the behaviour policy μ when the recipe has ``off_policy: {name:
behaviour_ppo}``; sg(π_θ) on a single on-policy pass, where every ratio is exactly 1):

    log w_i = clamp(Σ_{t valid} (log π_θ(o_{i,t}) − log μ(o_{i,t})), ±LOG_RATIO_CLAMP)

and use the GSPO per-token trick: the token value exp(logp_t − sg(logp_t) + sg(log w_i))
equals w_i on every token of row i and its gradient is w_i ∇logp_t, so that
Σ_t ∇(token value) = w_i Σ_t ∇logp_t = ∇w_i — the trajectory gradient — while the
loss stays per-token and goes through :func:`reasonrl.algos.losses.aggregate`.

Aggregation: the trajectory surrogates' gradient (1/N) Σ_i A_i ∇w_i is recovered exactly
by ``loss.agg: seq-mean-token-sum`` (Σ_t per row, mean over rows; the loss *value* is then
Σ_t of the per-token values, L_i·(−A_i w_i) per row — only the gradient is the trajectory
surrogate's). ``token-mean`` (Σ over all tokens / N_tok) is the same gradient times one
constant per batch, N_seq/N_tok, and ``seq-mean-token-sum-norm`` divides it by the generation
budget; only ``seq-mean-token-mean`` changes the direction (row i weighted by w_i/L_i, a
length-normalised variant).

Papers: GMC-GRPO, "Asynchronous LLM Post-Training: Group-Mass Capping and Convergence Analysis",
https://arxiv.org/abs/2610.01896; TIC-GRPO, https://arxiv.org/abs/2508.02833. Docs: ``docs/methods/gmc_grpo.md``.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from reasonrl.algos.losses import (LOG_RATIO_CLAMP, PolicyLossOutput, Width, _clip_bounds, _clipped_surrogate,
                                   _prepare)
from reasonrl.algos.masked import group_inverse, masked_sum
from reasonrl.registry import POLICY_LOSSES

__all__ = ["trajectory_log_ratio", "group_mass_cap", "tic_grpo_loss", "gmc_grpo_loss"]


def trajectory_log_ratio(logp: Tensor, old: Tensor, valid: Tensor) -> Tensor:
    """[B] detached log w_i = clamp(Σ_{t valid}(logp − old), ±LOG_RATIO_CLAMP).

    The sum (not GSPO's mean) makes w_i the ratio of the completion's probabilities,
    π_θ(o_i|q)/μ(o_i|q). The clamp keeps exp() finite in float32 (verl's ±20).
    """
    return masked_sum((logp - old).detach(), valid, dim=-1).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _token_weight(logp: Tensor, log_weight: Tensor) -> Tensor:
    # Value exp(log_weight_i) on every token, gradient exp(log_weight_i)·∇logp_t. Adding the
    # detached constant last keeps logp − sg(logp) exactly 0, so at log_weight = 0 the value is
    # exactly 1.0 and equals ppo_clip's ratio bit for bit (verl PR #2775, as in gspo).
    return torch.exp(logp - logp.detach() + log_weight.unsqueeze(-1))


@POLICY_LOSSES.register("tic_grpo")
def tic_grpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    epsilon: Width = 0.2,
    epsilon_high: Optional[Width] = None,
) -> PolicyLossOutput:
    """TIC-GRPO: PPO clipping of the trajectory ratio (Pang, Luo, Jin; arXiv 2508.02833).

    J = E[(1/G) Σ_i min(w_i A_i, clip(w_i, 1 − ε, 1 + ε_high) A_i)], w_i = π_θ(o_i)/μ(o_i),
    per token l_{i,t} = max(−A w_{i,t}, −A clip(w_{i,t}, 1 − ε, 1 + ε_high)) with
    w_{i,t} = sg(w_i)·exp(logp_t − sg(logp_t)): value w_i, gradient w_i ∇logp_t on
    unclipped rows, 0 on clipped ones. Like ``gspo`` but with the SUM of the token
    log-ratios (the sequence's probability ratio), not their mean. ε_high defaults to ε.
    With token-wise advantages the clip branch is chosen per token by the sign of A_t (the
    same for every token of a row under outcome advantages).

    Default ε = 0.2: the GMC-GRPO abstract gives no value, and our formalisation
    recommends ε ∈ [0.2, 1] for trajectory ratios; 0.2 is the lower, most conservative
    end (PPO's customary width), and the same default as ``gmc_grpo`` so the two compare at
    one threshold 1 + ε (both then satisfy Σ_i ω_i ≤ G(1 + ε)). Trajectory ratios spread far
    more than token ratios under staleness; widen ε toward 1 when most rows clip.

    Confidence: the surrogate is TIC-GRPO's (https://arxiv.org/abs/2508.02833) as quoted
    second-hand (the paper itself was not read). ``clipped`` marks tokens where the clipped branch was
    strictly larger (so ``clip_fraction`` is the token fraction of clipped rows);
    ``ratio`` is w_i on every token.
    """
    valid, logp, old, adv = _prepare(logprobs, old_logprobs, advantages, response_mask)
    low, high = _clip_bounds(epsilon, epsilon_high)
    ratio = _token_weight(logp, trajectory_log_ratio(logp, old, valid))
    return _clipped_surrogate(ratio, adv, valid, low, high, None)


def group_mass_cap(log_w: Tensor, present: Tensor, group_ids: Tensor, epsilon: float) -> dict[str, Tensor]:
    """Per-row ([B]) group statistics of the mass cap, all detached.

    For each group g, over its rows present (``present``: the row has a token in the loss):
    G_g = their number, log M_g = logsumexp_j log w_j (the mass Σ_j w_j in log space, so a
    large w_j cannot overflow), log s_g = min(0, log(G_g(1 + ε)) − log M_g),
    ``active`` = M_g > G_g(1 + ε) (i.e. w̄_g > 1 + ε), and the normalised effective sample
    size ESS_g = (Σ_j ω_j)²/(G_g Σ_j ω_j²) = 1/(G_g Σ_j p_j²), p_j = w_j/M_g (the common
    scale s_g cancels; p_j ≤ 1 so nothing overflows). ESS ∈ [1/G_g, 1], 1 when all w_j agree.
    Rows not present get s = 1, active = False, ESS = 1 (they carry no loss). Keys
    ``log_scale``, ``active`` (bool), ``ess``.
    """
    inverse, n = group_inverse(group_ids)
    member = (inverse.unsqueeze(0) == torch.arange(n, device=inverse.device).unsqueeze(1)) & present.unsqueeze(0)
    size = member.sum(-1).to(log_w.dtype)  # [n]
    has = size > 0
    log_mass = torch.logsumexp(torch.where(member, log_w.unsqueeze(0), float("-inf")), dim=-1)
    log_mass = torch.where(has, log_mass, 0.0)  # an empty group would give −inf − (−inf) = nan below
    log_cap = torch.log(size.clamp_min(1.0) * (1.0 + epsilon))
    log_scale = torch.where(has, (log_cap - log_mass).clamp(max=0.0), 0.0)
    active = has & (log_mass > log_cap)
    p = torch.where(member, torch.exp(log_w.unsqueeze(0) - log_mass.unsqueeze(1)), 0.0)
    # Σ_j p_j = 1 gives G Σ p² ≥ 1, so the division is safe wherever the group has rows.
    ess = torch.where(has, 1.0 / (size * p.square().sum(-1)).clamp_min(1.0), 1.0)
    return {"log_scale": torch.where(present, log_scale[inverse], 0.0),
            "active": present & active[inverse],
            "ess": torch.where(present, ess[inverse], 1.0)}


@POLICY_LOSSES.register("gmc_grpo")
def gmc_grpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    group_ids: Optional[Tensor] = None,
    epsilon: Width = 0.2,
) -> PolicyLossOutput:
    """GMC-GRPO, group-mass capping (He, Jin, Luo, Zou, Liang; arXiv 2610.01896). INFERRED form.

    ω_i = w_i · sg(s_g), s_g = min(1, G_g(1 + ε)/Σ_{j∈g} w_j) = min(1, (1 + ε)/w̄_g),
    surrogate L = −(1/G) Σ_i ω_i A_i, gradient (1/G) Σ_i s_g w_i A_i ∇log π_θ(o_i); no clip.
    Per token l_{i,t} = −A_{i,t} ω_{i,t}, ω_{i,t} = exp(logp_t − sg(logp_t) + sg(log w_i +
    log s_g)): value ω_i, gradient ω_i ∇logp_t. The mass is computed in log space
    (logsumexp). G_g counts the rows of group g in this call that have a
    token in the loss mask (a GRPODropout selection may have dropped some; a row masked out
    by ``loss.mask_truncated`` is not part of the estimator) — so a group must never be
    split across micro-batches (the objective checks; ``micro_batch_size`` a multiple of
    ``rollout.num_generations`` keeps groups whole). The cap is inactive (ω = w, plain
    trajectory IS) when w̄_g ≤ 1 + ε; as G grows w̄ → E_μ[w] = 1 and it switches off.
    On-policy (old = sg(logp)) ω = 1 and the loss equals ``ppo_clip`` at ratio 1, i.e. GRPO.

    **INFERRED** (https://arxiv.org/abs/2610.01896, confidence ABSTRACT): the paper's abstract is
    verified, the estimator is our formalisation of it (a third-party
    ``group_mass_cap`` uses exactly ω_i = r_i·min(1, C/Σ_j r_j)); mass vs mean and whether
    the cap acts on token ratios are unverified. Default ε = 0.2, as for ``tic_grpo`` (the
    spec's range is [0.2, 1]; one threshold 1 + ε for both keeps the comparison fair).

    ``ratio`` is the uncapped w_i; ``clipped`` is 0 (nothing is clipped). ``extra``, each
    logged as its token mean: ``gmc/cap_active`` (1 on tokens of groups with w̄ > 1 + ε),
    ``gmc/scale`` (s_g) and ``gmc/ess`` ((Σω)²/(G Σω²) of the row's group).
    """
    if group_ids is None:
        raise ValueError("gmc_grpo caps each prompt group's importance mass and needs group_ids [B]; "
                         "the training objective passes them, a direct call must too")
    if epsilon < 0:
        raise ValueError(f"epsilon must be >= 0 (the mass cap is G(1 + epsilon)), got {epsilon}")
    valid, logp, old, adv = _prepare(logprobs, old_logprobs, advantages, response_mask)
    if group_ids.shape != (logp.shape[0],):
        raise ValueError(f"group_ids must be [B] = [{logp.shape[0]}], got {tuple(group_ids.shape)}")
    log_w = trajectory_log_ratio(logp, old, valid)
    cap = group_mass_cap(log_w, valid.any(-1), group_ids.to(logp.device), float(epsilon))
    weight = _token_weight(logp, log_w + cap["log_scale"])
    zero = torch.zeros_like(weight)

    def per_token(row: Tensor) -> Tensor:  # a row's value on each of its valid tokens
        return torch.where(valid, row.to(weight.dtype).unsqueeze(-1).expand_as(weight), zero)

    return PolicyLossOutput(
        loss=torch.where(valid, -adv * weight, zero),
        clipped=zero,
        ratio=per_token(log_w.exp()),
        extra={"gmc/cap_active": per_token(cap["active"]), "gmc/scale": per_token(cap["log_scale"].exp()),
               "gmc/ess": per_token(cap["ess"])},
    )
