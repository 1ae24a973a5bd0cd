"""Per-token KL estimators (``KL_ESTIMATORS``) and KL-in-reward shaping.

Estimators follow Schulman (2020), "Approximating KL divergence", for
KL(π_θ ‖ π_ref) on samples drawn from π_θ, with signature
``fn(logprobs[B,T], ref_logprobs[B,T]) -> Tensor[B,T]``. They do not mask:
multiply (or ``aggregate``) with the response mask afterwards.
"""

from __future__ import annotations

import torch
from torch import Tensor

from reasonrl.algos.masked import as_float
from reasonrl.registry import KL_ESTIMATORS

__all__ = ["kl_k1", "kl_k2", "kl_k3", "apply_kl_to_rewards"]

# verl low_var_kl bounds: the log-ratio before exp(), the estimate after.
_K3_LOG_RATIO_CLAMP = 20.0
_K3_VALUE_CLAMP = 10.0


@KL_ESTIMATORS.register("k1")
def kl_k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k1 = logp − ref (unbiased, high variance, can be negative). verl ``kl_penalty`` "kl"/"k1"."""
    return as_float(logprobs) - as_float(ref_logprobs)


@KL_ESTIMATORS.register("k2")
def kl_k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k2 = ½ (logp − ref)² (biased, low variance). verl ``kl_penalty`` "mse"/"k2"."""
    return 0.5 * (as_float(logprobs) - as_float(ref_logprobs)).square()


@KL_ESTIMATORS.register("k3")
def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k3 = exp(ref − logp) − (ref − logp) − 1 (unbiased, ≥ 0, low variance).

    As verl ``kl_penalty`` "low_var_kl"/"k3": ref − logp is clamped to ±20 before
    exp() and the result is clamped to [−10, 10] (so its gradient is zero beyond
    10). TRL's GRPO β-term uses the same formula without clamps.
    """
    log_ratio = (as_float(ref_logprobs) - as_float(logprobs)).clamp(-_K3_LOG_RATIO_CLAMP, _K3_LOG_RATIO_CLAMP)
    kl = torch.exp(log_ratio) - log_ratio - 1.0
    return kl.clamp(-_K3_VALUE_CLAMP, _K3_VALUE_CLAMP)


def apply_kl_to_rewards(token_rewards: Tensor, kl: Tensor, response_mask: Tensor, coef: float) -> Tensor:
    """r'_{t} = r_t − coef·KL_t·m_t: the KL penalty folded into per-token rewards.

    Equals verl ``apply_kl_penalty`` with ``use_kl_in_reward`` at a fixed
    coefficient (the adaptive controller lives with the caller). The KL is
    detached: in-reward KL shapes the return and must not be differentiated.
    """
    penalty = torch.where(response_mask.bool(), coef * as_float(kl.detach()), 0.0)
    return as_float(token_rewards) - penalty
