"""The one learner backend: any transformers causal LM.

Sampling is our own batched loop over ``model(...)`` with the KV cache rather
than ``model.generate``: it runs each distinct prompt once (one prefill per
group, cache expanded to G), stops as soon as every sequence has ended, and
returns the sampling log-probs that asynchronous/IS-corrected training needs.
Log-prob passes compute LM-head logits only at completion positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers.utils import logging as hf_logging

# Weight loading/saving bars would interleave with our own progress output.
hf_logging.disable_progress_bar()


@dataclass
class Samples:
    """``num_prompts * G`` completions, row ``i`` answering prompt ``i // G``."""

    prompt_ids: Tensor  # [N, P] left-padded
    prompt_mask: Tensor  # [N, P]
    completion_ids: Tensor  # [N, T] right-padded; includes the EOS token when produced
    completion_mask: Tensor  # [N, T]
    sample_logprobs: Tensor  # [N, T] log-probs under the sampling distribution
    truncated: Tensor  # [N] bool: hit max_new_tokens without EOS
    texts: list[str]


def cut_at_stop(text: str, stop: list[str]) -> str:
    cuts = [text.find(s) for s in stop if s in text]
    return text[: min(cuts)] if cuts else text


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def token_logprobs_and_entropy(logits: Tensor, tokens: Tensor, temperature: float, with_entropy: bool):
    """log p(token) and entropy of the temperature-scaled distribution, in float32."""
    logits = logits.float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    logp_all = F.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
    return logp, entropy


class HFPolicy:
    """A transformers ``AutoModelForCausalLM`` plus its tokenizer."""

    def __init__(self, model, tokenizer, device: str | torch.device = "cpu") -> None:
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "left"
        self.model = model.to(device)
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.chat_template = False  # wrap prompts as a user turn of the tokenizer's chat template

    # -- sampling ---------------------------------------------------------
    def encode_prompts(self, prompts: list[str]) -> tuple[Tensor, Tensor]:
        if any(not p for p in prompts):
            raise ValueError("empty prompt in batch: every problem needs a non-empty prompt")
        if self.chat_template:
            prompts = [self.tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                          add_generation_prompt=True) for p in prompts]
            # The template already holds the special tokens it wants.
            enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        else:
            enc = self.tokenizer(prompts, return_tensors="pt", padding=True)
        return enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)

    @torch.no_grad()
    def sample(
        self,
        prompts: list[str],
        num_generations: int,
        max_new_tokens: int,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
        stop: list[str] | None = None,
    ) -> Samples:
        """Sample ``num_generations`` completions per prompt (temperature 0 = greedy).

        A completion ends at EOS, at the first occurrence of any ``stop`` string (the
        text is cut before it; its tokens stay in the completion, since the model did
        sample them), or at ``max_new_tokens`` (then it is marked truncated).
        """
        model, eos, pad = self.model, self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        was_training = model.training
        model.eval()
        ids, mask = self.encode_prompts(prompts)
        pos = position_ids_from_mask(mask)
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
        cache, logits = out.cache, out.logits[:, -1]
        # One prefill per distinct prompt; the G samples share it through the expanded cache.
        g = num_generations
        cache.batch_repeat_interleave(g)
        logits = logits.repeat_interleave(g, dim=0)
        mask = mask.repeat_interleave(g, dim=0)
        next_pos = pos[:, -1:].repeat_interleave(g, dim=0) + 1
        n = mask.shape[0]
        done = torch.zeros(n, dtype=torch.bool, device=self.device)
        stopped = torch.zeros_like(done)
        ended_at_eos = torch.zeros_like(done)
        # Each row's length is counted while it runs, never inferred from the tokens afterwards:
        # where pad == EOS (SmolLM2) the padding after a stop string would read as a first EOS.
        lengths = torch.zeros(n, dtype=torch.long, device=self.device)
        # A stop string spans at most this many tokens (each token decodes to >= 1 character).
        stop_window = max((len(s) for s in stop), default=0) + 1 if stop else 0
        tokens, logps = [], []
        for step in range(max_new_tokens):
            logits_f = logits.float()
            if temperature > 0:
                logp_all = F.log_softmax(logits_f / temperature, dim=-1)
                tok = torch.multinomial(logp_all.exp(), 1, generator=generator).squeeze(-1)
            else:
                logp_all = F.log_softmax(logits_f, dim=-1)
                tok = logp_all.argmax(-1)
            lp = logp_all.gather(-1, tok.unsqueeze(-1)).squeeze(-1)
            tok = torch.where(done, torch.full_like(tok, pad), tok)
            tokens.append(tok)
            logps.append(torch.where(done, torch.zeros_like(lp), lp))
            lengths += (~done).long()
            hit_eos = ~done & (tok == eos)
            ended_at_eos |= hit_eos
            done = done | hit_eos
            if stop_window:
                hit = self._stop_hits(tokens, done, stop, stop_window)
                stopped |= hit
                done |= hit
            if bool(done.all()) or step == max_new_tokens - 1:
                break
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
            out = model(input_ids=tok.unsqueeze(-1), attention_mask=mask, position_ids=next_pos,
                        cache=cache, use_cache=True)
            cache, logits = out.cache, out.logits[:, -1]
            next_pos = next_pos + 1
        model.train(was_training)

        completion = torch.stack(tokens, dim=1)
        # A completion is every token sampled while its row ran: up to and including the
        # EOS, or the last token of a stop string, or the whole budget.
        completion_mask = (torch.arange(completion.shape[1], device=self.device) < lengths.unsqueeze(-1)).long()
        completion = torch.where(completion_mask.bool(), completion, torch.full_like(completion, pad))
        texts = self.tokenizer.batch_decode(completion, skip_special_tokens=True)
        if stop:
            texts = [cut_at_stop(t, stop) for t in texts]
        prompt_ids, prompt_mask = self.encode_prompts(prompts)
        return Samples(
            prompt_ids=prompt_ids.repeat_interleave(g, dim=0),
            prompt_mask=prompt_mask.repeat_interleave(g, dim=0),
            completion_ids=completion,
            completion_mask=completion_mask,
            sample_logprobs=torch.stack(logps, dim=1) * completion_mask,
            truncated=~ended_at_eos & ~stopped,
            texts=texts,
        )

    def _stop_hits(self, tokens: list[Tensor], done: Tensor, stop: list[str], window: int) -> Tensor:
        """Rows still running whose recent text contains a stop string."""
        running = torch.nonzero(~done).squeeze(-1).tolist()
        hits = torch.zeros_like(done)
        if not running:
            return hits
        recent = torch.stack(tokens[-window:], dim=1)[running]
        for row, text in zip(running, self.tokenizer.batch_decode(recent, skip_special_tokens=True)):
            if any(s in text for s in stop):
                hits[row] = True
        return hits

    def sampling_bytes(self, rows: int, length: int) -> int:
        """About how much memory sampling ``rows`` sequences of ``length`` tokens takes: the KV
        cache (2 · layers · kv_heads · head_dim per token) and a few float32 copies of the
        next-token logits per row. An estimate, to refuse absurd budgets before they start."""
        cfg = self.model.config
        layers = getattr(cfg, "num_hidden_layers", 1)
        heads = getattr(cfg, "num_attention_heads", 1)
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        width = next(self.model.parameters()).element_size()
        kv = 2 * layers * kv_heads * head_dim * width * length
        logits = 3 * 4 * cfg.vocab_size
        return rows * (kv + logits)

    # -- scoring ----------------------------------------------------------
    def token_logprobs(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        completion_len: int,
        temperature: float = 1.0,
        with_entropy: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Log-probs (and entropies) of the last ``completion_len`` tokens, with gradients.

        Only the ``completion_len`` positions that predict completion tokens go
        through the LM head (``logits_to_keep``), never the prompt.
        """
        logits = self._tail_logits(input_ids, attention_mask, completion_len)
        return token_logprobs_and_entropy(logits, input_ids[:, -completion_len:], temperature, with_entropy)

    def _tail_logits(self, input_ids: Tensor, attention_mask: Tensor, length: int) -> Tensor:
        """Logits of the ``length`` positions that predict the last ``length`` tokens."""
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids_from_mask(attention_mask), use_cache=False,
                         logits_to_keep=length + 1)
        return out.logits[:, :-1]

    def completion_logits(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        completion_ids: Tensor,
        completion_mask: Tensor,
        group_ids: Tensor | None = None,
    ) -> Tensor:
        """Next-token logits ``[N, T, V]`` at the positions that predict the completion tokens.

        With ``group_ids`` (rows of one group share their prompt), each distinct prompt
        runs through the model once and its KV cache is expanded to the group's rows,
        as in sampling; gradients flow back through the shared prompt computation, so
        the result equals the row-by-row pass (the "Prefix Grouper" idea) at a fraction
        of the prompt cost: G× fewer prompt tokens.
        """
        t = completion_ids.shape[1]
        if group_ids is not None:
            unique, inverse = torch.unique(group_ids, return_inverse=True)
            if len(unique) < len(group_ids):
                rows = torch.arange(len(group_ids), device=group_ids.device)
                first = torch.full((len(unique),), len(group_ids), device=group_ids.device, dtype=torch.long)
                first = first.scatter_reduce(0, inverse, rows, reduce="amin")
                p_ids, p_mask = prompt_ids[first], prompt_mask[first]
                pos = position_ids_from_mask(p_mask)
                out = self.model(input_ids=p_ids, attention_mask=p_mask, position_ids=pos, use_cache=True,
                                 logits_to_keep=1)
                cache = out.cache
                cache.batch_select_indices(inverse)  # differentiable expansion to every row
                mask = torch.cat([p_mask[inverse], completion_mask.to(p_mask.dtype)], dim=1)
                c_pos = pos[inverse, -1:] + 1 + torch.arange(t, device=pos.device)
                rest = self.model(input_ids=completion_ids, attention_mask=mask, position_ids=c_pos, cache=cache,
                                  use_cache=True, logits_to_keep=t)
                # The prompt's last position predicts the first completion token.
                return torch.cat([out.logits[inverse, -1:], rest.logits[:, :-1]], dim=1)
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
        return self._tail_logits(input_ids, attention, t)

    def completion_logprobs(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        completion_ids: Tensor,
        completion_mask: Tensor,
        group_ids: Tensor | None = None,
        temperature: float = 1.0,
        with_entropy: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Log-probs (and entropies) of the completion tokens, with gradients (see
        :meth:`completion_logits` for the shared-prompt path)."""
        logits = self.completion_logits(prompt_ids, prompt_mask, completion_ids, completion_mask, group_ids)
        return token_logprobs_and_entropy(logits, completion_ids, temperature, with_entropy)

    # -- weights ----------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """A standard Hugging Face folder: the full model, or only the adapters with LoRA."""
        self.model.save_pretrained(path, safe_serialization=True)
        self.tokenizer.save_pretrained(path)

    def load_weights(self, path: str | Path) -> None:
        """Load weights written by ``save`` into this (identically built) policy, exactly."""
        from safetensors.torch import load_file

        from reasonrl.policy.lora import is_peft, load_adapter_state

        files = sorted(Path(path).glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no .safetensors weights in {path}")
        state = {k: v for f in files for k, v in load_file(str(f)).items()}
        if is_peft(self.model):
            load_adapter_state(self.model, state)
            return
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        tied = {k for k in missing if "lm_head" in k and getattr(self.model.config, "tie_word_embeddings", False)}
        if unexpected or set(missing) - tied:
            raise ValueError(f"weights in {path} do not fit the model: missing {sorted(set(missing) - tied)[:5]}, "
                             f"unexpected {unexpected[:5]}")

    def parameters(self):
        return (p for p in self.model.parameters() if p.requires_grad)
