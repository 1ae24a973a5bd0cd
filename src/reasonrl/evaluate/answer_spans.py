"""Where a completion's answer is, and how confident the model was in its reasoning and in its
answer: the spans and the geometric-mean token probabilities c_r and c_a.

A completion is split into reasoning Z and answer Y (:func:`split_spans`: the task's own
``answer_spans``, else ``\\boxed{}``, else the number after ``####``; ``<think>`` tags bound the
reasoning), and

    c_r = exp((1/|Z|) Σ_{t∈Z} log π(z_t|·))      c_a = exp((1/|Y|) Σ_{t∈Y} log π(y_t|·))

The evaluation's ``calibration/answer/*`` family reads c_a (:func:`answer_confidences`); RL-ARC
(``reasonrl.methods.rl_arc``) rewards with both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from reasonrl.algos.masked import mask_count, masked_sum
from reasonrl.rewards.reasoning_gym import TAG_RE  # the answer tags, as the reasoning_gym reward reads them
from reasonrl.rewards.token_level import token_char_spans  # tokens → characters, as token rewards map them

__all__ = ["Spans", "split_spans", "token_span_masks", "span_confidence", "span_confidences", "answer_confidences"]

_BOXED = re.compile(r"\\boxed\s*\{")
_MARK = "####"
_AFTER_MARK = re.compile(r"\s*(-?[\d,]*\.?\d+)")  # the number after ``####`` (rewards.basic.ANSWER_RE's)
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_ANSWER_OPEN = "<answer>"


@dataclass(frozen=True)
class Spans:
    """Character spans ``[start, end)`` of a completion's reasoning and answer; ``answer`` is
    None when no answer could be located (the caller's fallback applies)."""

    reasoning: tuple[int, int]
    answer: Optional[tuple[int, int]]


def _boxed_content(text: str) -> Optional[tuple[int, int]]:
    """The span of the content of the last complete ``\\boxed{...}`` (balanced braces)."""
    found = list(_BOXED.finditer(text))
    if not found:
        return None
    start = found[-1].end()
    depth = 1
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return (start, i) if i > start else None
    return None  # unclosed: no answer was written


def _marked_answer(text: str, mark_at: int) -> Optional[tuple[int, int]]:
    """The number after the ``####`` at ``mark_at``, else the rest of the line after it."""
    after = mark_at + len(_MARK)
    number = _AFTER_MARK.match(text, after)
    if number:
        return number.span(1)
    end = text.find("\n", after)
    end = len(text) if end < 0 else end
    rest = text[after:end]
    stripped = rest.strip()
    if not stripped:
        return None
    start = after + rest.index(stripped)
    return (start, start + len(stripped))


def _tagged_answer(text: str) -> Optional[tuple[int, int]]:
    """The stripped content of the last complete ``<answer>...</answer>`` (None: empty)."""
    found = list(TAG_RE.finditer(text))
    if not found:
        return None
    start, end = found[-1].span(1)
    content = text[start:end]
    if not content.strip():
        return None
    start += len(content) - len(content.lstrip())
    return (start, start + len(content.strip()))


def split_spans(text: str, task: Any = None) -> Spans:
    """Reasoning and answer spans of ``text``, first rule that applies:

    1. the task's own ``answer_spans(text) -> Spans`` (a task with another answer format);
    2. the stripped content of the last complete ``<answer>...</answer>`` (reasoning-gym's and
       R1-style prompts' convention): the answer; reasoning = the text before ``<answer>`` (the
       tags are neither, as the marker below);
    3. the content of the last ``\\boxed{...}``: the answer; reasoning = the text before ``\\boxed``;
    4. the number after the last ``####`` (the embedded arithmetic task, GSM8K): the answer;
       reasoning = the text before ``####`` (the marker itself is neither: it is near-certain
       and would inflate whichever span held it);
    5. no answer: ``Spans((0, len(text)), None)``.

    With a ``</think>`` before the answer, the reasoning is the think block's content only
    (the spec's Z). Answers are the last ones, as ``rewards.basic.extract_answer`` reads them.
    """
    own = getattr(task, "answer_spans", None)
    if callable(own):
        return own(text)
    answer, reasoning_end = _tagged_answer(text), None
    if answer is not None:
        reasoning_end = text.rfind(_ANSWER_OPEN, 0, answer[0])
    else:
        answer = _boxed_content(text)
        if answer is not None:
            reasoning_end = text.rfind("\\boxed", 0, answer[0])
    if answer is None:
        mark = text.rfind(_MARK)
        if mark >= 0:
            answer, reasoning_end = _marked_answer(text, mark), mark
    if answer is None:
        return Spans((0, len(text)), None)
    close = text.rfind(_THINK_CLOSE, 0, reasoning_end)
    if close >= 0:
        opened = text.rfind(_THINK_OPEN, 0, close)
        return Spans((opened + len(_THINK_OPEN) if opened >= 0 else 0, close), answer)
    return Spans((0, reasoning_end), answer)


def token_span_masks(token_spans: Sequence[tuple[int, int]], spans: Spans, width: int) -> tuple[Tensor, Tensor]:
    """Boolean masks ``[width]`` of the tokens of each span, from each token's character span
    (``rewards.token_level.token_char_spans``): a token is an answer token if it overlaps the
    answer span, a reasoning token if it overlaps the reasoning span and is not an answer
    token (a BPE token straddling the boundary goes to the answer). Tokens that decode to
    nothing (EOS) are in neither."""
    reasoning = torch.zeros(width, dtype=torch.bool)
    answer = torch.zeros(width, dtype=torch.bool)
    for t, (s, e) in enumerate(token_spans[:width]):
        if e <= s:
            continue
        if spans.answer is not None and s < spans.answer[1] and e > spans.answer[0]:
            answer[t] = True
        elif s < spans.reasoning[1] and e > spans.reasoning[0]:
            reasoning[t] = True
    return reasoning, answer


def span_confidence(logprobs: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """c = exp(mean of ``logprobs`` over ``mask``) per row (the geometric-mean token probability)
    and whether the row's span is non-empty; rows with an empty span get c = 0 (the caller
    decides their fallback). Computed in float32 without gradient: a confidence inside a reward
    is a constant (spec: "confidences are detached")."""
    with torch.no_grad():
        count = mask_count(mask, dim=-1)
        mean = masked_sum(logprobs.detach(), mask, dim=-1) / count.clamp(min=1.0)
        has = count > 0
        return torch.where(has, mean.exp(), torch.zeros_like(mean)).clamp(0.0, 1.0), has


def span_confidences(tokenizer: Any, completion_ids: Tensor, completion_mask: Tensor, logprobs: Tensor,
                     task: Any = None, live: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(c_a, has answer, c_r, has reasoning) per row ``[N]`` from the sampled tokens and their
    log-probs: each row's tokens are decoded, split (:func:`split_spans`, with ``task``) and mapped
    back to tokens; only ``live`` tokens count (default ``completion_mask``; a batch passes its
    ``response_mask`` so that an environment's tokens never do). The method and the evaluation's
    answer-confidence family share this one reading of the spans."""
    width = completion_ids.shape[1]
    reasoning = torch.zeros(completion_ids.shape, dtype=torch.bool)
    answer = torch.zeros_like(reasoning)
    for i, n in enumerate(completion_mask.sum(-1).tolist()):
        ids = completion_ids[i, :int(n)].tolist()
        text = tokenizer.decode(ids, skip_special_tokens=True)
        reasoning[i], answer[i] = token_span_masks(token_char_spans(tokenizer, ids), split_spans(text, task), width)
    live = (completion_mask if live is None else live).bool().cpu()
    logprobs = logprobs.cpu()
    c_a, has_a = span_confidence(logprobs, answer & live)
    c_r, has_r = span_confidence(logprobs, reasoning & live)
    return c_a, has_a, c_r, has_r


def answer_confidences(tokenizer: Any, completion_ids: Tensor, completion_mask: Tensor, logprobs: Tensor,
                       task: Any = None) -> list[Optional[float]]:
    """c_a of every row (rounded to 6 places), None where no answer was found: the
    evaluation's ``answer`` confidence (``evaluate.sampling_eval``)."""
    c_a, has_a, _, _ = span_confidences(tokenizer, completion_ids, completion_mask, logprobs, task)
    return [round(c, 6) if h else None for c, h in zip(c_a.tolist(), has_a.tolist())]
