"""GRPODropout's advantage: GRPO on the kept rows, recentred under the policy.

:func:`weighted_recenter` (the π-weighted recentring modes) and
:func:`grpo_dropout_advantages` (GRPO recomputed per kept group, recentred, broadcast
to tokens). Pure tensor math: the registered ``grpo_dropout`` advantage estimator is
in :mod:`reasonrl.methods.grpo_dropout.stages`, which re-exports everything here.
"""

from __future__ import annotations

import torch
from torch import Tensor

from reasonrl.algos.advantages import sequence_scores
from reasonrl.methods.grpo_dropout.stats import CENTER_MODES, check_choice, sequence_grpo_advantages
from reasonrl.algos.masked import as_float, group_inverse, group_sum

__all__ = ["grpo_dropout_advantages", "weighted_recenter"]


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
    check_choice("center", mode, CENTER_MODES)
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
    check_choice("center", center, CENTER_MODES)
    if token_rewards.dim() != 2 or token_rewards.shape != response_mask.shape:
        raise ValueError("token_rewards and response_mask must both be [B,T]; got "
                         f"{tuple(token_rewards.shape)} and {tuple(response_mask.shape)}")
    seq_adv = sequence_grpo_advantages(sequence_scores(token_rewards, response_mask), group_ids, eps)
    final = weighted_recenter(seq_adv, seq_logprob, group_ids, center, eps)
    return torch.where(response_mask.bool(), final.unsqueeze(-1), 0.0)
