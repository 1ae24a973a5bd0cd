"""Supervised fine-tuning on (prompt, response) pairs through the policy's ``Learner``.

The loss of one optimiser step over a mini-batch B of examples is the token-mean
cross-entropy of the response tokens only (the prompt is context, never a target):

    L(B) = − Σ_{i∈B} Σ_t m_{i,t} log π_θ(y_{i,t} | x_i, y_{i,<t}) / Σ_{i∈B} Σ_t m_{i,t}

Each micro-batch contributes its sum divided by the mini-batch's token total, so the
accumulated gradient does not depend on the micro-batch split (the convention of the policy
update, ``reasonrl.train.objective``). Log-probs are at temperature 1, in float32.

Used by ExpDis's distillation step (``reasonrl.methods.expdis.loop``); any loop that needs SFT on
its own samples can call :func:`sft`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from reasonrl.batch import RolloutBatch
from reasonrl.sections import OptimConfig
from reasonrl.train.optim import Learner

__all__ = ["SFTExample", "examples_batch", "response_nll", "sft"]


@dataclass(frozen=True)
class SFTExample:
    prompt: str
    completion_ids: tuple[int, ...]
    """The response's token ids, as sampled (EOS included where the sample ended with it)."""


def examples_batch(policy: Any, examples: Sequence[SFTExample]) -> RolloutBatch:
    """A ``RolloutBatch`` of the examples: prompts encoded as the sampler encodes them
    (left-padded), responses right-padded with their mask; each row its own group."""
    if not examples:
        raise ValueError("sft: no examples")
    if any(not e.completion_ids for e in examples):
        raise ValueError("sft: every example needs at least one response token")
    prompt_ids, prompt_mask = policy.encode_prompts([e.prompt for e in examples])
    width = max(len(e.completion_ids) for e in examples)
    pad = policy.tokenizer.pad_token_id
    ids = torch.full((len(examples), width), pad, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for i, e in enumerate(examples):
        ids[i, :len(e.completion_ids)] = torch.tensor(e.completion_ids, dtype=torch.long)
        mask[i, :len(e.completion_ids)] = 1
    n = len(examples)
    return RolloutBatch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=ids.to(prompt_ids.device),
                        completion_mask=mask.to(prompt_ids.device), group_ids=torch.arange(n),
                        rewards=torch.zeros(n), truncated=torch.zeros(n, dtype=torch.bool))


def _token_logprobs(policy: Any, batch: RolloutBatch) -> torch.Tensor:
    logp, _ = policy.completion_logprobs(batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                         batch.completion_mask, None, temperature=1.0)
    return logp


@torch.no_grad()
def response_nll(policy: Any, examples: Sequence[SFTExample], micro_batch_size: int = 64) -> float:
    """Token-mean negative log-likelihood of the responses under ``policy``."""
    batch = examples_batch(policy, examples)
    total, tokens = 0.0, 0
    for micro in batch.split(micro_batch_size):
        mask = micro.completion_mask.float()
        total += float(-(_token_logprobs(policy, micro) * mask).sum())
        tokens += int(mask.sum())
    return total / max(tokens, 1)


def sft(policy: Any, examples: Sequence[SFTExample], optim: OptimConfig, *, epochs: int = 1,
        batch_size: int = 32, micro_batch_size: int = 16, seed: int = 0,
        log: Callable[[str], None] | None = None) -> dict[str, float]:
    """Fine-tune ``policy`` in place on ``examples``: ``epochs`` passes, each over a fresh
    permutation (a generator seeded with ``seed``), one optimiser step per ``batch_size``
    examples, gradient accumulation over ``micro_batch_size`` rows. ``optim`` is a recipe's
    ``optim:`` section; its schedule runs over the SFT's optimiser steps.

    Returns ``sft/loss_first`` and ``sft/loss_last`` (the mean loss of the first and last
    epoch, before each step), ``sft/steps`` and ``sft/examples``."""
    if epochs < 1 or batch_size < 1 or micro_batch_size < 1:
        raise ValueError(f"sft: epochs, batch_size and micro_batch_size must be >= 1, got "
                         f"{epochs}, {batch_size}, {micro_batch_size}")
    batch = examples_batch(policy, examples)
    per_epoch = math.ceil(len(batch) / batch_size)
    total_steps = epochs * per_epoch
    optim = dataclasses.replace(optim, warmup_steps=min(optim.warmup_steps, max(0, total_steps - 1)))
    learner = Learner(policy.parameters(), optim, total_steps)
    generator = torch.Generator().manual_seed(seed)

    def loss_fn(micro: RolloutBatch, mini: RolloutBatch, _pass: int, _j: int):
        tokens = max(1, int(mini.completion_mask.sum()))
        mask = micro.completion_mask.float()
        nll = -(_token_logprobs(policy, micro) * mask).sum()
        return nll / tokens, {"nll_sum": float(nll.detach()), "tokens": float(mask.sum())}

    epoch_loss = []
    policy.model.eval()  # as in the policy update: no dropout, the same forward as sampling
    for epoch in range(epochs):
        order = torch.randperm(len(batch), generator=generator)
        shuffled = batch.select(order)
        nll, tokens = 0.0, 0.0
        for mini in shuffled.split(batch_size):
            sums, _ = learner.optimise(mini, loss_fn, micro_batch_size=micro_batch_size)
            learner.end_step()
            nll += sums["nll_sum"]
            tokens += sums["tokens"]
        epoch_loss.append(nll / max(tokens, 1.0))
        if log:
            log(f"sft epoch {epoch + 1}/{epochs}: loss {epoch_loss[-1]:.4f} on {len(batch)} examples")
    return {"sft/loss_first": epoch_loss[0], "sft/loss_last": epoch_loss[-1], "sft/steps": float(total_steps),
            "sft/examples": float(len(batch))}
