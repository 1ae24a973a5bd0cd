"""Language drift of the chain of thought: its perplexity under a frozen reference model, and
how well a reader model answers from another model's truncated chain of thought.

Source: arXiv 2610.02015, "On Language Drift during RLVR Post-Training" (Sullivan & Koller;
https://arxiv.org/abs/2610.02015).
The paper measures CoT readability; these two proxies are INFERRED from its summary:

- **Reference perplexity** of a completion's reasoning span z (its tokens before the answer
  marker, ``####`` by default) given the prompt x, under a frozen reference model p_ref (by
  default the run's initial weights):

      D(z) = −(1/|z|) Σ_t log p_ref(z_t | x, z_<t),      PPL(z) = exp D(z)

  The spec writes p_ref(z_t | z_<t); the prompt is kept as context here because the reasoning
  is read as an answer to that question (a reader sees the question too). Over a set of
  completions the summary is the mean of D over the non-empty spans, and ``ppl`` = exp(mean D)
  (the geometric mean of the per-completion perplexities: one outlier does not dominate it).

- **Cross-model readability**: writer A's completion of a held-out problem, its reasoning cut
  after a fraction f of its characters (characters, not tokens, so a reader with another
  tokenizer reads the same prefix), is appended to the prompt; reader B continues it greedily
  and the prefix + continuation is scored. acc(B | CoT_A, f) against acc(B | CoT_B, f) is the
  mutual-readability comparison; f = 0 is B's own accuracy, f = 1 asks B only for the answer.

The reasoning span is found in the sampled token ids, never by re-tokenising the text: the
longest token prefix whose decoded text ends at or before the marker (a token that straddles
the marker is not reasoning), less trailing special tokens. A completion without a marker is
all reasoning.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
from torch import Tensor

from reasonrl.evaluate.metrics import bootstrap_ci

if TYPE_CHECKING:  # imported lazily: the method registry imports this module, and tasks import methods
    from reasonrl.problem import Problem

__all__ = ["ANSWER_MARK", "drift_summary", "readability", "reasoning_lengths", "reasoning_nll",
           "span_mask", "span_nll", "text_reasoning_nll", "truncate_reasoning"]

ANSWER_MARK = "####"


def _reasoning_length(tokenizer: Any, ids: list[int], marker: str) -> int:
    text = tokenizer.decode(ids, skip_special_tokens=True)
    end = text.find(marker)
    end = len(text) if end < 0 else end

    def decoded(k: int) -> int:
        return len(tokenizer.decode(ids[:k], skip_special_tokens=True))

    lo, hi = 0, len(ids)  # the largest k with decoded(k) <= end (decoded length grows with k)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if decoded(mid) <= end:
            lo = mid
        else:
            hi = mid - 1
    special = set(tokenizer.all_special_ids)
    while lo > 0 and ids[lo - 1] in special:  # an EOS or padding is not reasoning
        lo -= 1
    return lo


def reasoning_lengths(tokenizer: Any, completion_ids: Tensor, completion_mask: Tensor,
                      marker: str = ANSWER_MARK) -> Tensor:
    """[N] long: how many leading completion tokens of each row form its reasoning span."""
    if not marker:
        raise ValueError("the answer marker must be a non-empty string")
    # Up to the last attended token, in place: positions must stay aligned with the mask (a
    # masking stage may have zeroed tokens inside a row; span_mask drops those again).
    ends = [int(m.nonzero().max()) + 1 if bool(m.any()) else 0 for m in completion_mask.cpu()]
    rows = [ids[:end].tolist() for ids, end in zip(completion_ids.cpu(), ends)]
    return torch.tensor([_reasoning_length(tokenizer, r, marker) for r in rows], dtype=torch.long)


def span_mask(completion_mask: Tensor, lengths: Tensor) -> Tensor:
    """[N, T] float: 1 on the first ``lengths[i]`` tokens of row i (completions are right-padded)."""
    positions = torch.arange(completion_mask.shape[1], device=completion_mask.device)
    return ((positions[None, :] < lengths.to(completion_mask.device)[:, None]) & completion_mask.bool()).float()


def span_nll(token_logprobs: Tensor, mask: Tensor) -> Tensor:
    """[N]: D(z) = −Σ_t m_t log p_t / Σ_t m_t per row; NaN for a row with an empty span."""
    count = mask.sum(-1)
    total = -(token_logprobs.float() * mask).sum(-1)
    return torch.where(count > 0, total / count.clamp(min=1), torch.full_like(total, math.nan))


@torch.no_grad()
def reasoning_nll(reference: Any, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                  completion_mask: Tensor, marker: str = ANSWER_MARK, micro_batch_size: int = 64,
                  group_ids: Tensor | None = None, counted: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(D per row [N] (NaN where the span is empty), span lengths [N]) under ``reference`` (an
    ``HFPolicy`` that reads these token ids), at temperature 1, without gradients. ``counted``
    ([N, T], optional): only these tokens of the span enter D (an episode's own tokens)."""
    lengths = reasoning_lengths(reference.tokenizer, completion_ids, completion_mask, marker)
    mask = span_mask(completion_mask, lengths)
    if counted is not None:
        mask = mask * counted.to(mask.device).float()
    device = reference.device
    out = []
    for s in range(0, len(completion_ids), micro_batch_size):
        part = slice(s, s + micro_batch_size)
        groups = group_ids[part].to(device) if group_ids is not None else None
        logp, _ = reference.completion_logprobs(prompt_ids[part].to(device), prompt_mask[part].to(device),
                                                completion_ids[part].to(device), completion_mask[part].to(device),
                                                groups, temperature=1.0)
        out.append(span_nll(logp.cpu(), mask[part].cpu()))
    return torch.cat(out), lengths


def text_reasoning_nll(reference: Any, prompts: Sequence[str], completions: Sequence[str],
                       marker: str = ANSWER_MARK, micro_batch_size: int = 64) -> tuple[Tensor, Tensor]:
    """:func:`reasoning_nll` of completions given as text (another model's, in evaluation),
    tokenised by the reference's tokenizer, without special tokens."""
    if len(prompts) != len(completions) or not prompts:
        raise ValueError(f"need as many prompts as completions (and some): {len(prompts)} vs {len(completions)}")
    tok = reference.tokenizer
    prompt_ids, prompt_mask = reference.encode_prompts(list(prompts))
    rows = [tok(c, add_special_tokens=False)["input_ids"] for c in completions]
    width = max(1, max(len(r) for r in rows))
    ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)], mask[i, :len(r)] = torch.tensor(r, dtype=torch.long), 1
    return reasoning_nll(reference, prompt_ids, prompt_mask, ids.to(prompt_ids.device), mask.to(prompt_ids.device),
                         marker, micro_batch_size)


def drift_summary(nll: Tensor, lengths: Tensor) -> dict[str, float]:
    """``ref_nll`` (mean D over non-empty spans), ``ref_ppl`` = exp(ref_nll), ``reasoning_tokens``
    (mean span length over all rows) and ``empty_spans`` (fraction of rows without reasoning)."""
    kept = nll[~torch.isnan(nll)]
    mean = float(kept.mean()) if len(kept) else math.nan
    return {"ref_nll": mean, "ref_ppl": math.exp(mean) if len(kept) else math.nan,
            "reasoning_tokens": float(lengths.float().mean()) if len(lengths) else math.nan,
            "empty_spans": float(torch.isnan(nll).float().mean()) if len(nll) else math.nan}


def truncate_reasoning(text: str, fraction: float, marker: str = ANSWER_MARK) -> str:
    """The first ⌊f·L⌋ characters of the reasoning (the text before ``marker``, or all of it)."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    end = text.find(marker)
    reasoning = text if end < 0 else text[:end]
    return reasoning[:math.floor(fraction * len(reasoning))]


def readability(reader: Any, problems: Sequence["Problem"], writer_texts: Sequence[str], fraction: float, *,
                is_correct: Callable[[str, "Problem"], bool], max_new_tokens: int, stop: list[str] | None = None,
                batch_size: int = 128, marker: str = ANSWER_MARK,
                writer_correct: Sequence[bool] | None = None) -> dict[str, Any]:
    """The reader's greedy accuracy from the writer's reasoning truncated at ``fraction``: prompt
    + prefix in, prefix + continuation scored. Returns ``accuracy`` with its 95% bootstrap
    interval over problems, ``accuracy_writer_correct`` (on the problems the writer got right,
    where a wrong prefix cannot be the reason; None if there are none) and per-problem rows."""
    if len(problems) != len(writer_texts) or not problems:
        raise ValueError(f"need one writer completion per problem (and some problems): "
                         f"{len(problems)} problems, {len(writer_texts)} completions")
    prefixes = [truncate_reasoning(t, fraction, marker) for t in writer_texts]
    continuations: list[str] = []
    for s in range(0, len(problems), batch_size):
        chunk = range(s, min(s + batch_size, len(problems)))
        continuations += reader.sample([problems[i].prompt + prefixes[i] for i in chunk], 1, max_new_tokens,
                                       0.0, stop=stop).texts
    correct = [bool(is_correct(pre + cont, p)) for pre, cont, p in zip(prefixes, continuations, problems)]
    values = [float(c) for c in correct]
    result: dict[str, Any] = {"fraction": fraction, "accuracy": sum(values) / len(values),
                              "ci": list(bootstrap_ci(values)), "accuracy_writer_correct": None,
                              "per_problem": [{"prefix": pre, "continuation": cont, "correct": ok}
                                              for pre, cont, ok in zip(prefixes, continuations, correct)]}
    if writer_correct is not None:
        kept = [c for c, w in zip(correct, writer_correct) if w]
        result["accuracy_writer_correct"] = sum(kept) / len(kept) if kept else None
        result["writer_correct"] = len(kept)
    return result
