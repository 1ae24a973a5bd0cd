"""RollVerify's prefix checks (``rollout.prefix_check: {name: rollverify_*}``): which part of a
stale prefix a partial rollout keeps at the weight switch (``reasonrl.rollout.partial``, whose
``PrefixDecision`` they return); the maths is in ``maths``.

- ``rollverify_sequence``: discard a prefix whose OPS > τ_seq, keep the rest;
- ``rollverify_token``: speculative acceptance min(1, π/μ), cut at the first rejection t* and
  draw y_{t*} from norm(max(0, π − μ)); the resumed rollout is then distributed as π;
- ``rollverify_deterministic``: cut at the first |d_t| > τ_tok (π resamples the cut token).

Prefixes they keep are treated as on-policy (the spec's ρ ≈ 1).
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional

import torch
from torch import Tensor

from reasonrl.algos.prefix_shift import ops
from reasonrl.methods.rollverify.maths import TAU_SEQ, TAU_TOK, speculative_verify, truncate_deterministic, verify_sequences
from reasonrl.params import Range
from reasonrl.registry import PREFIX_CHECKS
from reasonrl.rollout.partial import PrefixDecision

__all__ = ["rollverify_sequence", "rollverify_token", "rollverify_deterministic"]


@PREFIX_CHECKS.register("rollverify_sequence")
def rollverify_sequence(current_logprobs: Tensor, behaviour_logprobs: Tensor, prefix_mask: Tensor,
                        tau_seq: Annotated[float, Range(ge=0)] = TAU_SEQ,
                        form: Literal["mean_abs", "k3", "max_abs"] = "mean_abs") -> PrefixDecision:
    """Keep a prefix whole if its OPS (``form``) ≤ τ_seq, else regenerate it from the prompt."""
    ok = verify_sequences(ops(current_logprobs, behaviour_logprobs, prefix_mask)[form], tau_seq)
    return PrefixDecision(kept=torch.where(ok, prefix_mask.long().sum(-1), 0), on_policy=True, sequence_keep=ok)


@PREFIX_CHECKS.register("rollverify_token")
def rollverify_token(current_probs: Tensor, behaviour_probs: Tensor, prefix_tokens: Tensor, prefix_mask: Tensor,
                     generator: Optional[torch.Generator] = None) -> PrefixDecision:
    """Speculative acceptance token by token; at the first rejection t* the token is drawn from
    the residual norm(max(0, π − μ)), so the resumed rollout is distributed exactly as π."""
    kept, replacement = speculative_verify(current_probs, behaviour_probs, prefix_tokens, prefix_mask, generator)
    return PrefixDecision(kept=kept, replacement=replacement, on_policy=True)


@PREFIX_CHECKS.register("rollverify_deterministic")
def rollverify_deterministic(current_logprobs: Tensor, behaviour_logprobs: Tensor, prefix_mask: Tensor,
                             tau_tok: Annotated[float, Range(ge=0)] = TAU_TOK) -> PrefixDecision:
    """Cut at the first |d_t| > τ_tok; π's continuation resamples the token at the cut."""
    return PrefixDecision(kept=truncate_deterministic(current_logprobs, behaviour_logprobs, prefix_mask, tau_tok),
                          on_policy=True)


# A check comparing the two sampling distributions has none to compare under greedy decoding.
for _fn in (rollverify_sequence, rollverify_token, rollverify_deterministic):
    _fn.compares_policies = True
