"""The one learner backend: any transformers causal LM.

Sampling is our own batched loop over ``model(...)`` with the KV cache rather
than ``model.generate``: it runs each distinct prompt once (one prefill per
group, cache expanded to G), stops as soon as every sequence has ended, and
returns the sampling log-probs that asynchronous/IS-corrected training needs.
The loop (``reasonrl.policy.sampling``) drops finished rows from the decode batch and
takes a ``refresh`` hook for in-flight weight updates; ``weights``/``set_weights`` move the
trainable state as plain tensors and ``sampling_copy`` makes a (bfloat16) sampler twin.
Log-prob passes compute LM-head logits only at completion positions.
"""

from __future__ import annotations

import copy
import math
from contextlib import nullcontext
from dataclasses import fields, replace
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers.utils import logging as hf_logging

from reasonrl.algos.masked import group_first_rows, group_inverse
from reasonrl.policy.prefix import (MIN_SHARED_PREFIX, cache_kw, completion_lengths, fork_cache, length_buckets as length_buckets_of,
                                    prompt_pass)
from reasonrl.policy.sampling import Samples, cut_at_stop, position_ids_from_mask, sample_completions
from reasonrl.policy.attention import packed_unsupported, use_sdpa_gqa
from reasonrl.policy.fused_decode import FUSED_INT8, is_fused, require_int8
from reasonrl.policy.packed import PACKED_KWARG, pack

__all__ = ["HFPolicy", "Samples", "cut_at_stop", "position_ids_from_mask", "token_logprobs_and_entropy"]

# Weight loading/saving bars would interleave with our own progress output.
hf_logging.disable_progress_bar()


def token_logprobs_and_entropy(logits: Tensor, tokens: Tensor, temperature: float, with_entropy: bool):
    """log p(token) and entropy of the temperature-scaled distribution, in float32."""
    logits = logits.float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    logp_all = F.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
    return logp, entropy


def to_cpu(samples: Samples) -> Samples:
    """``samples`` with every tensor on the CPU (the same object when they are there already)."""
    moved = {f.name: v.cpu() for f in fields(samples)
             if isinstance(v := getattr(samples, f.name), Tensor) and v.device.type != "cpu"}
    return replace(samples, **moved) if moved else samples


class HFPolicy:
    """A transformers ``AutoModelForCausalLM`` plus its tokenizer."""

    def __init__(self, model, tokenizer, device: str | torch.device = "cpu") -> None:
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "left"
        self.model = model.to(device)
        use_sdpa_gqa(self.model)  # grouped key/value heads inside the CPU kernel (reasonrl.policy.attention)
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.chat_template = False  # wrap prompts as a user turn of the tokenizer's chat template
        # train.precision bf16: every forward of this policy's model under torch.autocast (fp32
        # weights, gradients and optimiser; bf16 matmuls). None: the weights' own dtype.
        self.autocast: torch.dtype | None = None
        self.decoder = "hf"  # the sampling loop's decode step: "hf" (any model) or "fused" (Llama; fused_decode)
        # What one more training forward costs, in completion tokens, when rows are split into
        # length buckets (None: estimated from the model's size, see _bucket_overhead).
        self.bucket_overhead: int | None = None
        # The fewest common leading prompt tokens worth a forward of their own, in training and in
        # the sampler's prefill (reasonrl.policy.prefix).
        self.min_shared_prefix = MIN_SHARED_PREFIX

    def to(self, device: str | torch.device) -> "HFPolicy":
        """Move the model to ``device`` (in place; the policy's inputs follow, see :meth:`on_device`)."""
        self.device = torch.device(device)
        self.model.to(self.device)
        return self

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
        refresh: Callable[[], int] | None = None,
        compact: bool = True,
        interrupt: Callable[[], bool] | None = None,
    ) -> Samples:
        """Sample ``num_generations`` completions per prompt (temperature 0 = greedy).

        A completion ends at EOS, at the first occurrence of any ``stop`` string (the
        text is cut before it; its tokens stay in the completion, since the model did
        sample them), or at ``max_new_tokens`` (then it is marked truncated).

        ``refresh`` (partial rollouts): called once before the prefill and once before every
        decode forward after it, i.e. between tokens; it may load newer weights into this
        policy's model in place (e.g. with :meth:`set_weights`) and returns the policy version
        now loaded. ``Samples.token_versions`` then records, per token, the version whose
        logits sampled it, and ``sample_logprobs`` stay the log-probs under those weights. The
        KV cache computed under older weights is kept, not recomputed (as PipelineRL's
        in-flight updates do): a token sampled after an update sees the earlier positions
        through keys/values of the weights that were loaded when those positions were fed.

        ``interrupt`` (partial rollouts whose prefixes are checked): called at the same points
        after the prefill; when it returns True sampling stops there, and ``Samples.running``
        marks the rows it left running (their tokens so far, marked truncated).

        ``compact``: rows that have ended leave the decode batch (their KV cache, mask and
        positions are dropped). It changes nothing that is sampled, only what it costs.

        ``self.decoder`` (``rollout.decoder``) chooses the decode step: ``"hf"``, transformers'
        forward, or ``"fused"``, the fused Llama step with inverse-CDF draws
        (``reasonrl.policy.fused_decode``; faster on CPU, other random stream).
        """
        was_training = self.model.training
        self.model.eval()
        ids, mask = self.encode_prompts(prompts)
        try:
            with self.compute():
                samples = sample_completions(self.model, self.tokenizer, ids, mask, num_generations,
                                             max_new_tokens, temperature, generator, stop, refresh=refresh,
                                             compact=compact, decoder=self.decoder, interrupt=interrupt,
                                             min_prefix=self.min_shared_prefix)
        finally:
            self.model.train(was_training)
        return to_cpu(samples)  # batches live on the CPU between stages (reasonrl.devices)

    @torch.no_grad()
    def sample_ids(self, ids: Tensor, mask: Tensor, max_new_tokens: int, temperature: float = 1.0,
                   generator: torch.Generator | None = None, stop: list[str] | None = None,
                   refresh: Callable[[], int] | None = None) -> Samples:
        """One completion for each left-padded row of token ids ``ids``/``mask``: a context that
        is ids already, never text (an episode's next turn). Ending rules and ``refresh`` as in
        :meth:`sample`."""
        was_training = self.model.training
        self.model.eval()
        try:
            with self.compute():
                samples = sample_completions(self.model, self.tokenizer, *self.on_device(ids, mask), 1, max_new_tokens,
                                             temperature, generator, stop, refresh=refresh, decoder=self.decoder,
                                             min_prefix=self.min_shared_prefix)
        finally:
            self.model.train(was_training)
        return to_cpu(samples)

    def sampling_bytes(self, rows: int, length: int) -> int:
        """About how much memory sampling ``rows`` sequences of ``length`` tokens takes: the KV
        cache (2 · layers · kv_heads · head_dim per token) and a few float32 copies of the
        next-token logits per row. An estimate, to refuse absurd budgets before they start (the
        fused decoder's packed copy of the weights, one model's size, is not counted)."""
        cfg = self.model.config
        layers = getattr(cfg, "num_hidden_layers", 1)
        heads = getattr(cfg, "num_attention_heads", 1)
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        # The fused decoder keeps its cache in float32 whatever the model's dtype.
        width = 4 if is_fused(self.decoder) else next(self.model.parameters()).element_size()
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
        input_ids, attention_mask = self.on_device(input_ids, attention_mask)
        logits = self._tail_logits(input_ids, attention_mask, completion_len)
        return token_logprobs_and_entropy(logits, input_ids[:, -completion_len:], temperature, with_entropy)

    def compute(self):
        """The context every forward of the model runs in: bf16 autocast with ``train.precision:
        bf16`` (log-probs are taken from the logits in float32 all the same), else nothing."""
        if self.autocast is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast)

    def on_device(self, *tensors: Tensor) -> tuple[Tensor, ...]:
        """The inputs on this policy's device (the same tensors when they are there already): every
        forward of a model goes through here, so callers hand over CPU batches."""
        return tuple(t if t is None or t.device == self.device else t.to(self.device) for t in tensors)

    def recomputes_activations(self) -> bool:
        """Whether a training forward runs with gradient checkpointing (``train.gradient_checkpointing``),
        which transformers runs without a KV cache."""
        # transformers 5.20 renamed the flag (the old name warns); 5.17 (the GPU machine's) has only the old one.
        name = "is_activation_checkpointing" if hasattr(self.model, "is_activation_checkpointing") \
            else "is_gradient_checkpointing"
        return bool(getattr(self.model, name, False)) and self.model.training

    def _tail_logits(self, input_ids: Tensor, attention_mask: Tensor, length: int) -> Tensor:
        """Logits of the ``length`` positions that predict the last ``length`` tokens."""
        with self.compute():
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
        as in sampling, after the prompts' common prefix, run once (``reasonrl.policy.prefix``);
        gradients flow back through the shared computation, so the result equals the row-by-row
        pass (the "Prefix Grouper" idea) at a fraction of the prompt cost.
        """
        prompt_ids, prompt_mask, completion_ids, completion_mask = self.on_device(
            prompt_ids, prompt_mask, completion_ids, completion_mask)
        if self._shares_prompts(group_ids):
            everyone = torch.arange(len(completion_ids), device=completion_ids.device)
            (_, logits), = self._completion_blocks(prompt_ids, prompt_mask, completion_ids, completion_mask,
                                                   group_ids, [everyone], completion_ids.shape[1])
            return logits
        return self._row_logits(prompt_ids, prompt_mask, completion_ids, completion_mask)

    def completion_logprobs(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        completion_ids: Tensor,
        completion_mask: Tensor,
        group_ids: Tensor | None = None,
        temperature: float = 1.0,
        with_entropy: bool = False,
        length_buckets: int = 1,
    ) -> tuple[Tensor, Tensor | None]:
        """Log-probs (and entropies) of the completion tokens, with gradients (see
        :meth:`completion_logits` for the shared-prompt path).

        ``length_buckets`` > 1 (``train.length_buckets``, with ``group_ids``): the rows run in
        up to that many forwards of similar completion length, each padded only to its own
        longest row (``reasonrl.policy.prefix.length_buckets``); positions after that longest row
        are then not computed and read 0 (they are all after the row's last attended token).
        ``length_buckets`` 0: one packed forward without padding (``reasonrl.policy.packed``);
        every position after a row's last attended token reads 0. A model whose attention cannot
        run it (:func:`reasonrl.policy.attention.packed_unsupported`) takes one padded forward."""
        prompt_ids, prompt_mask, completion_ids, completion_mask = self.on_device(
            prompt_ids, prompt_mask, completion_ids, completion_mask)
        if not self._shares_prompts(group_ids):
            logits = self._row_logits(prompt_ids, prompt_mask, completion_ids, completion_mask)
            return token_logprobs_and_entropy(logits, completion_ids, temperature, with_entropy)
        if length_buckets == 0 and packed_unsupported(self.model) is None:
            return self._packed_logprobs(prompt_ids, prompt_mask, completion_ids, completion_mask, group_ids,
                                         temperature, with_entropy)
        n, t = completion_ids.shape
        buckets = []
        if length_buckets > 1:
            # Every row keeps >= 1 position, so a batch of empty rows still has a graph.
            buckets = length_buckets_of(completion_lengths(completion_mask).clamp(min=1), length_buckets,
                                        self._bucket_overhead())
        # One bucket: the rows in their own order, full width, as with length_buckets 1 (the same
        # numbers to the bit).
        width = None if len(buckets) > 1 else t
        if width is not None:
            buckets = [torch.arange(n, device=completion_ids.device)]
        blocks = self._completion_blocks(prompt_ids, prompt_mask, completion_ids, completion_mask, group_ids,
                                         buckets, width)
        if len(blocks) == 1 and width == t:
            return token_logprobs_and_entropy(blocks[0][1], completion_ids, temperature, with_entropy)
        logp = completion_ids.new_zeros((n, t), dtype=torch.float32)
        entropy = logp.clone() if with_entropy else None
        for rows, logits in blocks:
            lp, ent = token_logprobs_and_entropy(logits, completion_ids[rows, :logits.shape[1]], temperature,
                                                 with_entropy)
            pad = t - lp.shape[1]
            logp = logp.index_put((rows,), F.pad(lp, (0, pad)))
            if with_entropy:
                entropy = entropy.index_put((rows,), F.pad(ent, (0, pad)))
        return logp, entropy

    def _packed_logprobs(self, prompt_ids, prompt_mask, completion_ids, completion_mask, group_ids, temperature: float,
                         with_entropy: bool) -> tuple[Tensor, Tensor | None]:
        """``completion_logprobs`` through one packed forward (``reasonrl.policy.packed``)."""
        inverse, num_groups = group_inverse(group_ids.to(completion_ids.device))
        first = group_first_rows(inverse, num_groups)
        layout = pack(prompt_ids[first], prompt_mask[first], completion_ids, completion_mask, inverse,
                      self.min_shared_prefix)
        with self.compute():
            # A prepared 4-D mask goes to the attention function as it is, so transformers builds
            # no [L, L] mask of its own (nor its packed-sequence mask from the positions); the
            # layout says who attends to whom.
            prepared = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=layout.ids.device)
            out = self.model(input_ids=layout.ids, position_ids=layout.positions, attention_mask=prepared,
                             use_cache=False, logits_to_keep=layout.keep, **{PACKED_KWARG: layout})
        logits = out.logits[0].index_select(0, layout.predict)
        lp, ent = token_logprobs_and_entropy(logits, layout.targets, temperature, with_entropy)
        n, t = completion_ids.shape
        flat = lp.new_zeros(n * t)
        logp = flat.index_copy(0, layout.dest, lp).view(n, t)
        entropy = flat.index_copy(0, layout.dest, ent).view(n, t) if with_entropy else None
        return logp, entropy

    def _shares_prompts(self, group_ids: Tensor | None) -> bool:
        """Whether the shared-prompt path runs: some group has two rows here, and the model keeps a
        KV cache (under gradient checkpointing transformers drops it). Otherwise row by row, the
        same numbers (see completion_logits)."""
        if group_ids is None or self.recomputes_activations():
            return False
        return group_inverse(group_ids)[1] < len(group_ids)

    def _row_logits(self, prompt_ids, prompt_mask, completion_ids, completion_mask) -> Tensor:
        """Each row's prompt and completion as one sequence: the reference the shared paths equal."""
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
        return self._tail_logits(input_ids, attention, completion_ids.shape[1])

    def _bucket_overhead(self) -> int:
        """One more forward call's cost in completion tokens: a fixed ~1.5 ms per decoder layer for
        the call (forward and backward) against ~6 FLOPs per parameter per token at ~1e11 FLOP/s
        (2 CPU cores). SmolLM2-135M: ~6 tokens; the embedded 0.66M model: ~150 (4 layers), so its
        quickstart batch (completions of 20-28 tokens) splits in one or two."""
        if self.bucket_overhead is not None:
            return self.bucket_overhead
        layers = getattr(self.model.config, "num_hidden_layers", 1)
        params = sum(p.numel() for p in self.model.parameters())
        return max(1, math.ceil(layers * 1.5e-3 / (6 * params / 1e11)))

    def _completion_blocks(self, prompt_ids, prompt_mask, completion_ids, completion_mask, group_ids,
                           buckets: list[Tensor], width: int | None) -> list[tuple[Tensor, Tensor]]:
        """``(rows, logits [len(rows), w, V])`` for each bucket of rows: ``w`` is ``width``, or the
        bucket's longest completion when ``width`` is None. One prompt pass serves every bucket."""
        inverse, num_groups = group_inverse(group_ids.to(completion_ids.device))
        first = group_first_rows(inverse, num_groups)
        lengths = completion_lengths(completion_mask).clamp(min=1) if width is None else None
        blocks = []
        with self.compute():
            last_logits, cache, layout, last_pos = prompt_pass(self.model, prompt_ids[first], prompt_mask[first],
                                                               self.min_shared_prefix)
            for rows in buckets:
                w = width if width is not None else int(lengths[rows].max())
                prompts = inverse[rows]
                # The prompt's last position predicts the first completion token.
                head = last_logits[prompts].unsqueeze(1)
                if w == 1:
                    blocks.append((rows, head))
                    continue
                mask = torch.cat([layout[prompts], completion_mask[rows, :w].to(layout.dtype)], dim=1)
                pos = last_pos[prompts].unsqueeze(1) + 1 + torch.arange(w, device=last_pos.device)
                rest = self.model(input_ids=completion_ids[rows, :w], attention_mask=mask, position_ids=pos,
                                  **cache_kw(fork_cache(cache, prompts)), use_cache=True, logits_to_keep=w)
                blocks.append((rows, torch.cat([head, rest.logits[:, :-1]], dim=1)))
        return blocks

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

    def _live_state(self) -> dict[str, Tensor]:
        """The trainable state as the model's own tensors (not copies): the adapter weights of a
        PEFT model, else the full state dict with each tied tensor under its first name only."""
        from reasonrl.policy.lora import is_peft

        state = self.model.state_dict(keep_vars=True)
        if is_peft(self.model):
            from peft import get_peft_model_state_dict

            return get_peft_model_state_dict(self.model, state_dict=state)
        seen: set[int] = set()
        live = {}
        for name, tensor in state.items():
            if id(tensor) not in seen:
                seen.add(id(tensor))
                live[name] = tensor
        return live

    def weights(self) -> dict[str, Tensor]:
        """Detached CPU copies of the trainable state (see :meth:`set_weights`): plain tensors
        that another process's sampler (or an inference engine) can load."""
        return {name: t.detach().to("cpu", copy=True) for name, t in self._live_state().items()}

    @torch.no_grad()
    def set_weights(self, state: dict[str, Tensor]) -> None:
        """Copy ``state`` (as :meth:`weights` returns it) into the model in place, cast to the
        model's dtype and device; exact for the same dtype. Every key must match."""
        live = self._live_state()
        missing, unexpected = sorted(set(live) - set(state)), sorted(set(state) - set(live))
        if missing or unexpected:
            raise ValueError(f"weights do not fit the model: missing {missing[:5]}{' ...' if len(missing) > 5 else ''} "
                             f"({len(missing)}), unexpected {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''} "
                             f"({len(unexpected)})")
        wrong = [(k, tuple(state[k].shape), tuple(t.shape)) for k, t in live.items() if state[k].shape != t.shape]
        if wrong:
            raise ValueError(f"weights do not fit the model: shape of {wrong[0][0]} is {wrong[0][1]}, "
                             f"the model's is {wrong[0][2]} ({len(wrong)} tensors differ)")
        for name, tensor in live.items():
            tensor.copy_(state[name])

    def sampling_copy(self, dtype: str | torch.dtype | None = None) -> HFPolicy:
        """A separate policy for sampling beside this (learner) one: a deep copy of the model,
        optionally cast to ``dtype`` (e.g. ``"bfloat16"``), in eval mode (sampling runs under no_grad),
        sharing this policy's tokenizer object. Keep it current with
        ``copy.set_weights(learner.weights())``.

        ``"int8"``: the copy keeps the learner's dtype (its prefill is transformers' forward) and
        decodes with the fused step over int8 weights, requantised from its current weights at
        every sampling call (``fused_decode._pack_int8``); it needs ``decoder`` ``fused``."""
        int8 = dtype == "int8"
        if int8:
            if self.decoder != "fused":
                raise ValueError(f"an int8 sampling copy decodes with the fused step; this policy's decoder is "
                                 f"{self.decoder!r}")
            require_int8(self.model)
            dtype = None
        if isinstance(dtype, str):
            if dtype not in ("float32", "bfloat16", "float16"):
                raise ValueError(f"dtype must be float32, bfloat16, float16 or int8, got {dtype!r}")
            dtype = getattr(torch, dtype)
        model = copy.deepcopy(self.model)
        if dtype is not None:
            model = model.to(dtype)
        # The parameters keep the learner's requires_grad: with requires_grad off, torch's CPU
        # linear takes another kernel whose results differ in the last bits (3.6e-7 measured on
        # the tiny model), and an async run at staleness 0 would no longer equal the sync run.
        model.eval()
        twin = HFPolicy(model, self.tokenizer, self.device)
        twin.chat_template = self.chat_template
        twin.decoder = FUSED_INT8 if int8 else self.decoder
        twin.bucket_overhead, twin.min_shared_prefix = self.bucket_overhead, self.min_shared_prefix
        twin.autocast = None if dtype is not None else self.autocast  # a cast copy computes in its own dtype
        return twin

    def parameters(self):
        return (p for p in self.model.parameters() if p.requires_grad)
