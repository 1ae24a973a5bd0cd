"""The batched KV-cache decode loop behind ``HFPolicy.sample``.

One prefill per distinct prompt (the cache is expanded to its G rows), then one decode
forward per new token over the rows still running, through a decoder
(``reasonrl.policy.fused_decode``: transformers' forward, or the fused Llama step). Levers:

* **Compaction.** A row that has ended (EOS, stop string) leaves the decode batch: its rows of
  the KV cache, attention mask and positions are dropped, so a long tail stops paying for
  finished rows. What is sampled does not change: the generator is consumed exactly as
  without compaction (every draw consumes the random numbers of all ``n`` rows, the live
  rows' in their original places), and per-row bookkeeping is kept by original row index.
* **Partial rollouts.** A ``refresh`` callback, called before the prefill and before every
  decode forward, may load newer weights in place (PipelineRL-style in-flight updates) and
  returns the version now loaded; each token records the version whose logits sampled it.
  An ``interrupt`` callback, called at the same points after the prefill, instead ends the
  loop when it returns True (newer weights are waiting and the caller checks the prefixes
  before continuing: ``reasonrl.rollout.partial``); ``Samples.running`` names the rows it left
  running.
* **The draw.** ``multinomial`` is ``torch.multinomial`` (exponential noise over the whole
  ``[n, V]`` matrix: ~11 ms a step for SmolLM2's 49k vocabulary at n = 8 on this CPU);
  ``inverse_cdf`` draws one uniform per row and finds it in the row's cumulative
  distribution (float64), the same distribution for ~0.5 ms. The fused decoder uses the
  latter; the ``hf`` decoder keeps the former, so its sampled tokens stay those of earlier
  releases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass
class Samples:
    """``num_prompts * G`` completions, row ``i`` answering prompt ``i // G``."""

    prompt_ids: Tensor  # [N, P] left-padded
    prompt_mask: Tensor  # [N, P]
    completion_ids: Tensor  # [N, T] right-padded; includes the EOS token when produced
    completion_mask: Tensor  # [N, T]
    sample_logprobs: Tensor  # [N, T] log-probs under the sampling distribution (of the weights that sampled each token)
    truncated: Tensor  # [N] bool: hit max_new_tokens without EOS
    texts: list[str]
    # [N, T] long: the policy version whose logits sampled each token (0 outside the completion
    # mask); None when sampling had no ``refresh`` callback.
    token_versions: Tensor | None = None
    # [N] bool: the rows an ``interrupt`` left running (marked truncated; None: not interrupted).
    running: Tensor | None = None
    # Multi-turn episodes (``reasonrl.rollout.episodes``): [N, T] 1 on the model's tokens, 0 on
    # the environment's (attended, not trained on); [N] the environment's per-turn rewards summed.
    loss_mask: Tensor | None = None
    env_rewards: Tensor | None = None
    # [N, T] long: the environment channel of each token (k + 1 for ``Environment.channels[k]``; 0 else).
    env_channels: Tensor | None = None


def cut_at_stop(text: str, stop: list[str]) -> str:
    cuts = [text.find(s) for s in stop if s in text]
    return text[: min(cuts)] if cuts else text


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def right_pad(rows: list[Tensor], pad: float = 0) -> tuple[Tensor, Tensor]:
    """Per-token rows of different lengths as a right-padded ``[R, W]`` batch (W ≥ 1, the rows'
    dtype, ``pad`` after each row) and its mask: how completions are laid out."""
    width = max(1, max(len(r) for r in rows))
    out = torch.full((len(rows), width), pad, dtype=rows[0].dtype, device=rows[0].device)
    mask = torch.zeros((len(rows), width), dtype=torch.long, device=rows[0].device)
    for i, r in enumerate(rows):
        out[i, :len(r)], mask[i, :len(r)] = r, 1
    return out, mask


def left_pad(rows: list[Tensor], pad: int) -> tuple[Tensor, Tensor]:
    """Token rows of different lengths as a left-padded ``[R, W]`` batch and its mask (how the
    sampler takes prompts, so a prompt + prefix row continues where it ends)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long, device=rows[0].device)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - len(r):], mask[i, width - len(r):] = r, 1
    return ids, mask


@torch.no_grad()
def sample_completions(
    model,
    tokenizer,
    ids: Tensor,
    mask: Tensor,
    num_generations: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    stop: list[str] | None = None,
    refresh: Callable[[], int] | None = None,
    compact: bool = True,
    decoder: str = "hf",
    interrupt: Callable[[], bool] | None = None,
    min_prefix: int | None = None,
) -> Samples:
    """Sample ``num_generations`` completions for each prompt row of ``ids``/``mask`` (left-padded).

    See ``HFPolicy.sample`` for the ending rules, ``refresh``, ``interrupt``, ``compact`` and
    ``decoder``; ``min_prefix``: the fewest common leading tokens the prefill runs once
    (``reasonrl.policy.prefix``; None: its default)."""
    from reasonrl.policy.fused_decode import is_fused, make_decoder

    eos, pad, device = tokenizer.eos_token_id, tokenizer.pad_token_id, ids.device
    prompt_ids, prompt_mask = ids, mask
    dec = make_decoder(model, decoder) if min_prefix is None else make_decoder(model, decoder, min_prefix)
    draw = _draw_inverse_cdf if is_fused(decoder) else _draw_multinomial
    version = int(refresh()) if refresh is not None else 0
    g = num_generations
    # The decode steps continue the prefill's layout (its mask; each prompt's last position).
    logits, mask, last_pos = dec.prefill(ids, mask, g, max_new_tokens)
    mask = mask.repeat_interleave(g, dim=0)
    next_pos = last_pos.unsqueeze(1).repeat_interleave(g, dim=0) + 1
    n = mask.shape[0]
    # Per-row bookkeeping, indexed by original row; ``live`` holds the original indices of the
    # rows in the decode batch (all of them without compaction, finished ones included).
    live = torch.arange(n, device=device)
    done = torch.zeros(n, dtype=torch.bool, device=device)
    stopped = torch.zeros_like(done)
    ended_at_eos = torch.zeros_like(done)
    # Each row's length is counted while it runs, never inferred from the tokens afterwards:
    # where pad == EOS (SmolLM2) the padding after a stop string would read as a first EOS.
    lengths = torch.zeros(n, dtype=torch.long, device=device)
    tokens = torch.full((n, max_new_tokens), pad, dtype=torch.long, device=device)
    logps = torch.zeros(n, max_new_tokens, device=device)
    versions = torch.zeros(n, max_new_tokens, dtype=torch.long, device=device)
    # A stop string spans at most this many tokens (each token decodes to >= 1 character).
    stop_window = max((len(s) for s in stop), default=0) + 1 if stop else 0
    scratch: dict[str, Tensor] = {}  # the draw's full-batch buffers, kept across steps
    steps, interrupted = 0, False
    for step in range(max_new_tokens):
        steps = step + 1
        logits_f = logits.float()
        if temperature > 0:
            logp_all = F.log_softmax(logits_f / temperature, dim=-1)
            tok = draw(logp_all.exp(), live, n, generator, scratch)
        else:
            logp_all = F.log_softmax(logits_f, dim=-1)
            tok = logp_all.argmax(-1)
        lp = logp_all.gather(-1, tok.unsqueeze(-1)).squeeze(-1)
        run = ~done[live]  # rows of the batch that sample this step
        rows = live[run]
        tokens[rows, step] = tok[run]
        logps[rows, step] = lp[run]
        versions[rows, step] = version
        lengths[rows] += 1
        hit_eos = torch.zeros_like(done)
        hit_eos[rows] = tok[run] == eos
        ended_at_eos |= hit_eos
        done |= hit_eos
        if stop_window:
            hit = _stop_hits(tokenizer, tokens[:, max(0, step + 1 - stop_window): step + 1], done, stop)
            stopped |= hit
            done |= hit
        if bool(done.all()) or step == max_new_tokens - 1:
            break
        # The next input: each row's token of this step (padding for rows that had ended before it).
        tok = tokens[live, step]
        if compact and bool(done[live].any()):
            keep = torch.nonzero(~done[live]).squeeze(-1)
            dec.select(keep)
            live, mask, next_pos, tok = live[keep], mask[keep], next_pos[keep], tok[keep]
        if interrupt is not None and interrupt():
            interrupted = True
            break
        if refresh is not None:
            new_version = int(refresh())
            if new_version != version:
                dec.reload()
            version = new_version
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
        logits = dec.step(tok, mask, next_pos)
        next_pos = next_pos + 1

    # A completion is every token sampled while its row ran: up to and including the
    # EOS, or the last token of a stop string, or the whole budget.
    completion_mask = (torch.arange(steps, device=device) < lengths.unsqueeze(-1)).long()
    completion = torch.where(completion_mask.bool(), tokens[:, :steps], torch.full_like(tokens[:, :steps], pad))
    texts = tokenizer.batch_decode(completion, skip_special_tokens=True)
    if stop:
        texts = [cut_at_stop(t, stop) for t in texts]
    return Samples(
        prompt_ids=prompt_ids.repeat_interleave(g, dim=0),
        prompt_mask=prompt_mask.repeat_interleave(g, dim=0),
        completion_ids=completion,
        completion_mask=completion_mask,
        sample_logprobs=logps[:, :steps] * completion_mask,
        truncated=~ended_at_eos & ~stopped,
        texts=texts,
        token_versions=versions[:, :steps] * completion_mask if refresh is not None else None,
        running=~done if interrupted else None,
    )


def _draw_multinomial(probs: Tensor, live: Tensor, n: int, generator, scratch: dict) -> Tensor:
    """``torch.multinomial``, one token per live row. Once the batch is compacted, the draw
    still runs over a full ``[n, V]`` matrix (finished rows holding the uniform distribution),
    each live row in its own place: the exponential noise multinomial uses is consumed per
    element, so the live rows get exactly the tokens of the uncompacted batch."""
    if generator is not None and generator.device != probs.device:
        # The run's one random stream is a CPU generator (reasonrl.devices): a GPU run draws from
        # a CPU copy of the probabilities, so it draws what a CPU run would (rows × vocab floats
        # a token; on GPUs the inference engine is the fast path).
        return _draw_multinomial(probs.cpu(), live.cpu(), n, generator, scratch.setdefault("cpu", {})).to(probs.device)
    if len(live) == n:
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    full = scratch.get("probs")
    if full is None:
        full = scratch["probs"] = torch.full((n, probs.shape[-1]), 1.0 / probs.shape[-1], device=probs.device)
    full.index_copy_(0, live, probs)
    return torch.multinomial(full, 1, generator=generator).squeeze(-1)[live]


def _draw_inverse_cdf(probs: Tensor, live: Tensor, n: int, generator, scratch: dict) -> Tensor:
    """Inverse-CDF sampling: token = the first i with F(i) > u·F(V−1), F the row's cumulative
    sum (float64) and u ~ U[0, 1), one per row. A token of probability 0 is never drawn (its
    F equals its predecessor's). ``n`` uniforms are drawn every step and the live rows take
    theirs, so compaction leaves the tokens unchanged."""
    # From the run's CPU stream when the model is on a GPU (see _draw_multinomial).
    u = torch.rand(n, 1, generator=generator, dtype=torch.float64,
                   device=generator.device if generator is not None else probs.device).to(probs.device)[live]
    cdf = probs.double().cumsum(-1)
    tok = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1)
    return tok.clamp_(max=probs.shape[-1] - 1)


def _stop_hits(tokenizer, recent: Tensor, done: Tensor, stop: list[str]) -> Tensor:
    """Rows still running whose recent tokens (``[n, window]``) contain a stop string."""
    running = torch.nonzero(~done).squeeze(-1).tolist()
    hits = torch.zeros_like(done)
    if not running:
        return hits
    for row, text in zip(running, tokenizer.batch_decode(recent[running], skip_special_tokens=True)):
        if any(s in text for s in stop):
            hits[row] = True
    return hits
