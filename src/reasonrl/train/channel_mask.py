"""The no-gradient forward with one observation channel hidden, shared by the methods that
compare the policy with and without an environment's observations: ``necessity_reward``
(``methods.necessity``) and ``advice_gain`` (``methods.advice_gain``).

An episode's environment tokens carry their channel in ``batch.aux["env_channel"]`` (k + 1 for
``Environment.channels[k]``, 0 elsewhere; written by the episode sampler). Hiding channel X masks
the *attention keys* of its tokens: no position attends to them, and every other token keeps the
position id it had when sampled (position ids come from the unmasked mask). For every prediction
made at a position that is not hidden itself, that is the same as deleting the tokens from the
sequence with every other position id kept (``tests/test_evidence.py`` checks it token by token).
A prediction made *at* a hidden position still reads that token's own input embedding through
the residual stream: a caller that needs the deletion exactly there drops those tokens and passes
the kept positions (``position_ids``), as ``advice_gain`` does for a transcript that ends in one.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Optional

import torch
from torch import Tensor

from reasonrl.registry import ENVIRONMENTS

__all__ = ["env_channels", "eval_mode", "masked_logprobs", "reward_gate"]


def env_channels(recipe: Any) -> tuple[str, ...]:
    """The channel names of the recipe's environment (() without one)."""
    if recipe.env is None:
        return ()
    return tuple(getattr(ENVIRONMENTS.get(recipe.env.name), "channels", ()) or ())


def reward_gate(batch, reward: str, who: str, role: str) -> Tensor:
    """c = 1[score > 0.5] per row [B] (bool) of the recipe reward ``reward``'s unweighted scores
    (``batch.meta["reward/<name>"]``): the correctness gate of these methods. A batch without
    those scores is a ValueError naming the method ``who`` and the gate's ``role``."""
    key = f"reward/{reward}"
    if key not in batch.meta:
        raise ValueError(f"{who}: the batch has no scores of the {role} '{reward}' (batch.meta['{key}']); "
                         f"name a reward of the recipe")
    return torch.tensor([float(v) > 0.5 for v in batch.meta[key]], device=batch.rewards.device)


@contextmanager
def eval_mode(model) -> Iterator[None]:
    """The model in eval mode inside the block, its previous mode restored after (even on error)."""
    was = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was)


def masked_logprobs(model, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                    completion_mask: Tensor, temperature: float, hidden: Optional[Tensor] = None,
                    position_ids: Optional[Tensor] = None) -> Tensor:
    """Log-probs ``[b,T]`` (float32, at ``temperature``) of the completion tokens, each given
    everything before it, with the attention keys of the positions in ``hidden`` masked.

    ``prompt_*`` ``[b,P]`` left-padded, ``completion_*`` ``[b,T]`` right-padded (a RolloutBatch's
    layout); ``hidden``: bool ``[b,P+T]`` over the joined sequence (None: nothing hidden);
    ``position_ids`` ``[b,P+T]`` (None: from the unmasked mask, so hiding never moves a token).
    Logits are computed at the completion positions only. Run it under ``torch.no_grad()`` for a
    reward; it does not detach by itself."""
    from reasonrl.policy.hf import position_ids_from_mask, token_logprobs_and_entropy

    seen = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
    keys = seen if hidden is None else seen * (~hidden.bool()).to(seen.dtype)
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    t = completion_ids.shape[1]
    out = model(input_ids=ids, attention_mask=keys,
                position_ids=position_ids_from_mask(seen) if position_ids is None else position_ids,
                use_cache=False, logits_to_keep=t + 1)
    return token_logprobs_and_entropy(out.logits[:, :-1], completion_ids, temperature, False)[0]
