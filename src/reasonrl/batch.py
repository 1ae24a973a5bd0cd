"""``RolloutBatch``: the one type that moves between the stages of the data flow.

Row ``i`` is one completion of one prompt. Prompts are left-padded and
completions right-padded, kept as two blocks so that batches of different
widths can be concatenated; ``input_ids``/``attention_mask`` join them.
Per-token tensors (``*_logprobs``, ``token_rewards``, ``advantages``) are
aligned with the completion block, ``[N, T]``.

Two masks over the completion block: ``completion_mask`` says which tokens exist (they are
attended), ``loss_mask`` (optional) which of them the model is trained on. Tokens written by
an environment (a tool's output in a multi-turn episode) are attended but not trained on;
``response_mask`` is the product, and every loss, advantage and reward placement uses it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Iterator

import torch
from torch import Tensor

_LEFT_PADDED = {"prompt_ids", "prompt_mask"}


@dataclass
class RolloutBatch:
    prompt_ids: Tensor  # [N, P] left-padded
    prompt_mask: Tensor  # [N, P]
    completion_ids: Tensor  # [N, T] right-padded
    completion_mask: Tensor  # [N, T] 1 on tokens that exist and are attended (may be zeroed by masking stages)
    group_ids: Tensor  # [N] long: rows with the same id answer the same prompt
    rewards: Tensor  # [N] float: the scalar reward of each completion
    truncated: Tensor  # [N] bool: no EOS within the token budget
    policy_version: int = 0  # the optimiser step whose weights sampled this batch
    old_logprobs: Tensor | None = None  # [N, T]
    ref_logprobs: Tensor | None = None  # [N, T]
    sample_logprobs: Tensor | None = None  # [N, T] behaviour log-probs: under the weights that sampled each token
    # [N, T] long: the policy version whose weights sampled each token (partial rollouts span
    # several); None: every token was sampled at ``policy_version``.
    token_versions: Tensor | None = None
    # [N, T] detached off-policy correction weights (``off_policy`` in the recipe) that multiply
    # the per-token policy loss; None: no correction.
    is_weights: Tensor | None = None
    # [N, T] detached behaviour ratio ρ = π_prox/μ that correction computed its weights from
    # (the row's ratio on every token at sequence levels); None: no correction.
    behaviour_ratio: Tensor | None = None
    token_rewards: Tensor | None = None  # [N, T]
    # Process supervision: rewards of individual tokens from a token-level reward function
    # (``token_reward`` in the recipe); ``token_rewards`` keeps the outcome on the last token.
    dense_rewards: Tensor | None = None  # [N, T]
    advantages: Tensor | None = None  # [N, T]
    # [N, T] 1 on the completion tokens the model is trained on; None: all of them.
    loss_mask: Tensor | None = None
    # Per-row metadata: prompt, completion, answer, task name, per-reward scores, ...
    meta: dict[str, list[Any]] = field(default_factory=dict)
    # Method-specific per-row tensors ([N, ...]; [N, T] ones aligned with the completion block),
    # e.g. a teacher's token probabilities; selected, split and concatenated with the batch.
    aux: dict[str, Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = self.prompt_ids.shape[0]
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Tensor) and value.shape[0] != n:
                raise ValueError(f"RolloutBatch.{f.name} has {value.shape[0]} rows, expected {n}")
        for key, values in self.meta.items():
            if len(values) != n:
                raise ValueError(f"RolloutBatch.meta['{key}'] has {len(values)} rows, expected {n}")
        for key, value in self.aux.items():
            if value.shape[0] != n:
                raise ValueError(f"RolloutBatch.aux['{key}'] has {value.shape[0]} rows, expected {n}")

    def __len__(self) -> int:
        return self.prompt_ids.shape[0]

    @property
    def input_ids(self) -> Tensor:
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> Tensor:
        # A row whose completion_mask a masking stage zeroed attends to its prompt only; its
        # log-probs are then meaningless, but they are masked out of every loss and metric.
        return torch.cat([self.prompt_mask, self.completion_mask.to(self.prompt_mask.dtype)], dim=1)

    @property
    def response_mask(self) -> Tensor:
        """The tokens that are trained on: attended (``completion_mask``) and not excluded by
        ``loss_mask`` (verl's agent-loop ``response_mask``). Same dtype as ``completion_mask``."""
        if self.loss_mask is None:
            return self.completion_mask
        return self.completion_mask * self.loss_mask.to(self.completion_mask.dtype)

    @property
    def completion_len(self) -> int:
        return self.completion_ids.shape[1]

    def _tensor_fields(self) -> Iterator[tuple[str, Tensor]]:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Tensor):
                yield f.name, value

    def select(self, indices: Tensor | list[int]) -> "RolloutBatch":
        idx = torch.as_tensor(indices, dtype=torch.long)
        tensors = {name: value[idx.to(value.device)] for name, value in self._tensor_fields()}
        meta = {k: [v[i] for i in idx.tolist()] for k, v in self.meta.items()}
        aux = {k: v[idx.to(v.device)] for k, v in self.aux.items()}
        return replace(self, **tensors, meta=meta, aux=aux)

    def split(self, size: int) -> list["RolloutBatch"]:
        if size < 1:
            raise ValueError(f"micro-batch size must be >= 1, got {size}")
        return [self.select(list(range(i, min(i + size, len(self))))) for i in range(0, len(self), size)]

    def to(self, device: str | torch.device) -> "RolloutBatch":
        return replace(self, **{name: value.to(device) for name, value in self._tensor_fields()},
                       aux={k: v.to(device) for k, v in self.aux.items()})

    @staticmethod
    def concat(batches: list["RolloutBatch"], pad_id: int = 0) -> "RolloutBatch":
        if not batches:
            raise ValueError("RolloutBatch.concat needs at least one batch")
        first = batches[0]
        merged: dict[str, Any] = {}
        for f in fields(first):
            values = [getattr(b, f.name) for b in batches]
            if isinstance(values[0], Tensor):
                if any(v is None for v in values):
                    raise ValueError(f"cannot concat: '{f.name}' is missing in some batches")
                merged[f.name] = _cat_padded(values, left=f.name in _LEFT_PADDED,
                                             pad=pad_id if f.name.endswith("_ids") else 0)
            elif f.name == "meta":
                keys = set(values[0])
                if any(set(v) != keys for v in values):
                    raise ValueError("cannot concat batches with different metadata keys")
                merged["meta"] = {k: [x for v in values for x in v[k]] for k in values[0]}
            elif f.name == "aux":
                keys = set(values[0])
                if any(set(v) != keys for v in values):
                    raise ValueError("cannot concat batches with different aux keys")
                merged["aux"] = {k: _cat_padded([v[k] for v in values], left=False, pad=0) for k in values[0]}
            elif f.name == "policy_version":
                merged[f.name] = min(values)  # the stalest data decides how off-policy the batch is
            else:
                merged[f.name] = values[0]
        return RolloutBatch(**merged)


def _cat_padded(tensors: list[Tensor], left: bool, pad: int) -> Tensor:
    if tensors[0].dim() == 1:
        return torch.cat(tensors)
    width = max(t.shape[1] for t in tensors)
    padded = []
    for t in tensors:
        extra = width - t.shape[1]
        if extra:
            filler = torch.full((t.shape[0], extra), pad, dtype=t.dtype, device=t.device)
            t = torch.cat([filler, t] if left else [t, filler], dim=1)
        padded.append(t)
    return torch.cat(padded)
