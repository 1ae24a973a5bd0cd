"""Token-level (process) rewards: from per-character rewards of a completion's text to
per-token rewards aligned with the batch's completion block.

A token reward function, registered in ``TOKEN_REWARDS``, is called once per completion::

    fn(completion: str, problem: Problem, **params) -> list[float]   # one value per character

Working in characters keeps such functions independent of the tokenizer; this module
maps them onto whatever tokens the policy sampled. A token's reward is the mean over
the characters it decodes to; tokens that decode to nothing (EOS, or text after a stop
string) get 0.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from reasonrl.batch import RolloutBatch


def token_char_spans(tokenizer, ids: list[int]) -> list[tuple[int, int]]:
    """[start, end) character span of each token in the decoded text.

    Decoding token by token is exact when the pieces concatenate to the whole (character
    and most SentencePiece tokenizers); otherwise prefix decoding is used, which is exact
    for any tokenizer whose decoding is prefix-stable.
    """
    pieces = [tokenizer.decode([t], skip_special_tokens=True) for t in ids]
    whole = tokenizer.decode(ids, skip_special_tokens=True)
    if "".join(pieces) != whole:
        ends = [len(tokenizer.decode(ids[:k + 1], skip_special_tokens=True)) for k in range(len(ids))]
    else:
        ends = []
        total = 0
        for piece in pieces:
            total += len(piece)
            ends.append(total)
    starts = [0, *ends[:-1]]
    return [(s, max(s, e)) for s, e in zip(starts, ends)]


def chars_to_tokens(char_rewards: list[float], spans: list[tuple[int, int]]) -> list[float]:
    """Mean of the character rewards inside each token's span (0 for empty spans or
    characters beyond the scored text)."""
    out = []
    for start, end in spans:
        values = char_rewards[start:end]
        out.append(sum(values) / len(values) if values else 0.0)
    return out


def dense_token_rewards(tokenizer, batch: RolloutBatch, fn: Callable[..., list[float]],
                        params: dict[str, Any]) -> Tensor:
    """[N, T] token rewards of every row from a per-character token reward function."""
    dense = torch.zeros(batch.completion_ids.shape, dtype=torch.float32)
    lengths = batch.completion_mask.sum(-1).tolist()
    for i, (text, problem) in enumerate(zip(batch.meta["completion"], batch.meta["problem"])):
        char_rewards = fn(text, problem, **params)
        if len(char_rewards) != len(text):
            raise ValueError(f"token reward returned {len(char_rewards)} values for a completion of "
                             f"{len(text)} characters (expected one per character)")
        ids = batch.completion_ids[i, :int(lengths[i])].tolist()
        rewards = chars_to_tokens(list(map(float, char_rewards)), token_char_spans(tokenizer, ids))
        dense[i, :len(rewards)] = torch.tensor(rewards, dtype=torch.float32)
    return dense * batch.response_mask  # an environment's tokens earn nothing
