"""Decoders for the sampling loop: transformers' own forward, or a fused Llama decode step.

The sampling loop (``reasonrl.policy.sampling``) talks to a decoder through four calls:
``prefill`` (the prompts, once per distinct prompt, their common prefix once,
``reasonrl.policy.prefix.prompt_pass``; expanded to G rows; it returns the attention mask of the
cache's layout and each prompt's last position, which the decode steps continue), ``step`` (one new
token per live row), ``select`` (keep some rows: compaction) and ``reload`` (the model's
weights changed in place, e.g. a partial rollout's in-flight update).

``HFDecoder`` runs transformers' model with its KV cache: any causal LM. For a plain Llama-family
model on CPU its decode step calls the model's own modules itself (``direct_step_unsupported``):
the same operations on the same tensors as ``model(...)``, so the same logits to the bit, without
transformers' per-call work around a one-token forward.

``FusedLlamaDecoder`` (``rollout.decoder: fused``) runs the decode step of a Llama-family
model itself, because on a CPU at batch 8 transformers' step spends more time around the
matrix products than in them (measured on SmolLM2-135M, 2 threads: 112 ms a step in fp32,
of which the products over the weights are ~60 ms). What it changes:

* **Fused, packed weights**: q/k/v are one ``[(H + 2K)·d, D]`` matrix and gate/up one
  ``[2I, D]``, so a layer is 4 products instead of 7 (each CPU product call has a fixed cost,
  ~35 µs in bf16), and every matrix is reordered once into oneDNN's blocked layout (``_pack``):
  at batch 8 the products over transformers' plain ``[out, in]`` weights are far from the
  memory bound, and the blocked layout is what makes them 1.1–2.7× faster. They are copies
  (about one model's size), packed from the model at every ``prefill`` and ``reload``, so the
  model's parameters stay untouched (checkpoints, the learner, safetensors see no views);
  packing SmolLM2 takes ~0.1 s, once per sampling call. A LoRA model's adapters are merged
  into the copies (W + B·A·scaling), so the decode step costs what the plain model's does.
* **A preallocated KV cache** in float32, keys stored transposed (``[rows·K, d, T]``): no
  ``torch.cat`` per step, and the query-key product over the first ``t`` positions is a
  strided view, not a copy (38 µs against 70 µs for the untransposed layout per layer).
* **The prompt's keys and values once per prompt**, not once per row: the G rows of a group
  share their prompt's cache, and each step reads it once for all G (their queries side by
  side in one product), then each row's own generated positions; one softmax over both parts.
  At G = 4 with SmolLM2's 261-token few-shot prompts the attention read ~3.5 MB a layer a step
  from a cache expanded to every row, which ran near the memory bandwidth; this reads ~1 MB
  (a sampling call 1.79 → 1.64 s, median of 10, ``benchmarks/vs_trl.py``'s batch), and the
  prompt's cache takes 1/G of the memory.
* Attention, normalisation and the residual stream follow transformers' Llama exactly in
  formula (RMSNorm in float32, rotary embeddings from the model's own ``rotary_emb``, GQA
  query head ``h`` reading key head ``h // (H/K)``); the results differ from transformers'
  decode only in float rounding (products in another order), which the behaviour log-probs
  record like any sampler/learner mismatch.

The prefill is transformers' own forward (``prompt_pass``); its cache is copied into the preallocated one.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.modules.module import _global_forward_hooks, _global_forward_pre_hooks
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from reasonrl.params import ConfigError
from reasonrl.policy.attention import SDPA_GQA
from reasonrl.policy.lora import base_model, other_adapters
from reasonrl.policy.prefix import MIN_SHARED_PREFIX, cache_kw, cache_of, prompt_pass

__all__ = ["HFDecoder", "FusedLlamaDecoder", "make_decoder", "fused_unsupported", "require_fused", "is_fused",
           "FUSED_INT8", "direct_step_unsupported"]

# The decode step of a sampling copy made with ``rollout.dtype: int8`` (``HFPolicy.sampling_copy``):
# the fused step over int8 weights. Not a ``rollout.decoder`` value; a policy's ``decoder`` holds it.
FUSED_INT8 = "fused_int8"


def is_fused(name: str) -> bool:
    """Whether decoder ``name`` is the fused step (which draws by inverse CDF and keeps a float32 cache)."""
    return name in ("fused", FUSED_INT8)


class HFDecoder:
    """transformers' forward and ``DynamicCache``: works for every causal LM.

    Where ``direct_step_unsupported(model)`` is None (``direct=None``: decide by it) the decode step
    is ``_direct_step``: the model's own modules called in the order ``LlamaForCausalLM.forward``
    calls them, over the same cache, with the attention mask transformers builds for one new token
    (none without padding, else the 2-D mask as ``[n, 1, 1, T]`` booleans). The logits are those
    of ``model(...)`` to the bit (``tests/test_fused_decode.py``), so samples and tables do not move.
    What it leaves out is transformers' work around the operations, which at the embedded model's
    size costs about as much as they do: rebuilding the 4-D mask from the 2-D one each step, the
    decorators' keyword and output handling, the output classes. Quickstart sampling (128 rows, 4
    layers of width 128, 2 threads): 11–15% less sampling time (docs/scaling.md)."""

    def __init__(self, model, min_prefix: int = MIN_SHARED_PREFIX, direct: bool | None = None) -> None:
        self.model = model
        self.cache = None
        self.min_prefix = min_prefix  # the prompts' common prefix runs once from this many tokens on
        self.direct = direct_step_unsupported(model) is None if direct is None else direct
        # The Llama modules the direct step calls (a PEFT model's LoRA layers sit inside them).
        self.llama = base_model(model)

    def prefill(self, ids: Tensor, mask: Tensor, g: int, max_new_tokens: int) -> tuple[Tensor, Tensor, Tensor]:
        last, self.cache, layout, last_pos = prompt_pass(self.model, ids, mask, self.min_prefix)
        # One prefill per distinct prompt; the G samples share it through the expanded cache.
        self.cache.batch_repeat_interleave(g)
        return last.repeat_interleave(g, dim=0), layout, last_pos

    def step(self, tok: Tensor, mask: Tensor, pos: Tensor) -> Tensor:
        if self.direct:
            return self._direct_step(tok, mask, pos)
        out = self.model(input_ids=tok.unsqueeze(-1), attention_mask=mask, position_ids=pos,
                         **cache_kw(self.cache), use_cache=True)
        self.cache = cache_of(out)
        return out.logits[:, -1]

    def _direct_step(self, tok: Tensor, mask: Tensor, pos: Tensor) -> Tensor:
        """``model(input_ids=tok[:, None], attention_mask=mask, position_ids=pos, cache=...).logits[:, -1]``
        of a ``LlamaForCausalLM``, module by module (transformers' ``LlamaModel``,
        ``LlamaDecoderLayer``, ``LlamaAttention`` forwards, in their order and shapes)."""
        body = self.llama.model
        x = body.embed_tokens(tok.unsqueeze(-1))  # [n, 1, D]
        cos, sin = body.rotary_emb(x, pos)
        att_mask = None if bool(mask.all()) else mask.bool()[:, None, None, :]
        attend = ALL_ATTENTION_FUNCTIONS.get_interface(self.llama.config._attn_implementation, None)
        n = x.shape[0]
        for layer, kv in zip(body.layers[: self.llama.config.num_hidden_layers], self.cache.layers):
            a = layer.self_attn
            h = layer.input_layernorm(x)
            shape = (n, 1, -1, a.head_dim)
            q = a.q_proj(h).view(shape).transpose(1, 2)
            k = a.k_proj(h).view(shape).transpose(1, 2)
            v = a.v_proj(h).view(shape).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            k, v = kv.update(k, v)  # transformers' DynamicLayer: the cache grows by one position
            out, _ = attend(a, q, k, v, att_mask, dropout=a.attention_dropout if a.training else 0.0,
                            scaling=a.scaling)
            x = x + a.o_proj(out.reshape(n, 1, -1).contiguous())
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.llama.lm_head(body.norm(x))[:, -1]

    def select(self, keep: Tensor) -> None:
        self.cache.batch_select_indices(keep)

    def reload(self) -> None:
        pass  # the forward reads the parameters themselves


# The attention functions whose one-token mask ``HFDecoder._direct_step`` builds as transformers does.
_DIRECT_ATTENTION = ("sdpa", SDPA_GQA)
# The modules whose forwards the direct step stands in for: a hook on one would not run.
_DIRECT_BYPASSED = ("LlamaForCausalLM", "LlamaModel", "LlamaDecoderLayer", "LlamaAttention")


def direct_step_unsupported(model) -> str | None:
    """Why ``HFDecoder`` must run ``model(...)`` for a decode step rather than its direct step
    (None when it need not): the direct step reproduces transformers' Llama forward with
    ``sdpa`` attention on CPU, where its bit-equality is tested, and nothing else."""
    llama = base_model(model)
    cfg = getattr(llama, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) != "llama" or type(llama).__name__ != "LlamaForCausalLM":
        return "not a transformers LlamaForCausalLM"
    if getattr(cfg, "_attn_implementation", None) not in _DIRECT_ATTENTION:
        return f"attention {cfg._attn_implementation!r} (the direct step builds sdpa's mask)"
    if other_adapters(model):
        return "a PEFT adapter other than LoRA (prompt or prefix tuning act outside the modules it calls)"
    if next(llama.parameters()).device.type != "cpu":
        return "not on CPU"
    hooked = [type(m).__name__ for m in llama.modules() if type(m).__name__ in _DIRECT_BYPASSED
              and (m._forward_hooks or m._forward_pre_hooks)]
    if hooked or _global_forward_hooks or _global_forward_pre_hooks:
        return f"forward hooks on {', '.join(sorted(set(hooked))) or 'every module'}"
    return None


def fused_unsupported(model) -> str | None:
    """Why ``FusedLlamaDecoder`` cannot run ``model`` (None when it can). A PEFT model runs when
    its adapters are plain LoRA on linear layers: their delta is added into the packed copies."""
    if hasattr(model, "peft_config"):
        for name, module in model.named_modules():
            if getattr(module, "lora_embedding_A", None):
                return f"LoRA on an embedding ({name}) is not supported (only LoRA on linear layers)"
            if any(getattr(module, "use_dora", {}).values()):
                return f"DoRA ({name}) is not supported (its magnitude vector is not a weight delta)"
            if hasattr(module, "lora_A") and not isinstance(getattr(module, "base_layer", None), torch.nn.Linear):
                return f"LoRA on {type(getattr(module, 'base_layer', module)).__name__} ({name}) is not supported"
    cfg = model.config
    if cfg.model_type != "llama":
        return f"only Llama-family models (model_type 'llama') are supported, this one is {cfg.model_type!r}"
    for key, want in (("attention_bias", False), ("mlp_bias", False), ("hidden_act", "silu"), ("pretraining_tp", 1)):
        if getattr(cfg, key, want) != want:
            return f"config.{key} is {getattr(cfg, key)!r}, the fused decoder needs {want!r}"
    return None


def require_fused(model) -> None:
    """Raise a ``ConfigError`` (the CLI exits 2) naming why ``model`` cannot use the fused decoder."""
    why = fused_unsupported(model)
    if why:
        raise ConfigError(f"rollout.decoder is 'fused' but {why}; use rollout.decoder: hf")


class FusedLlamaDecoder:
    """The Llama decode step over fused weights and a preallocated float32 KV cache."""

    def __init__(self, model, min_prefix: int = MIN_SHARED_PREFIX, int8: bool = False) -> None:
        require_fused(model)
        if int8:
            require_int8(model)
        self.int8 = int8
        cfg = model.config
        self.model = model  # the prefill's forward: through the adapters of a PEFT model
        # The Llama modules the step reads (a PEFT model wraps them; its layers are still there).
        self.llama = base_model(model)
        self.min_prefix = min_prefix
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.inter = cfg.intermediate_size
        self.eps = cfg.rms_norm_eps
        self.scale = self.llama.model.layers[0].self_attn.scaling
        self.packed: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []  # per layer: qkv, o, gate_up, down

    def reload(self) -> None:
        """Pack the model's current weights (copies: the model's own tensors are not touched),
        LoRA adapters merged in."""
        w, pack = _effective_weight, _pack_int8 if self.int8 else _pack
        with torch.no_grad():
            self.packed = []
            for layer in self.llama.model.layers:
                a, m = layer.self_attn, layer.mlp
                self.packed.append((
                    pack(torch.cat([w(a.q_proj), w(a.k_proj), w(a.v_proj)])), pack(w(a.o_proj)),
                    pack(torch.cat([w(m.gate_proj), w(m.up_proj)])), pack(w(m.down_proj))))
            self.head = pack(w(self.llama.lm_head))

    def prefill(self, ids: Tensor, mask: Tensor, g: int, max_new_tokens: int) -> tuple[Tensor, Tensor, Tensor]:
        self.reload()
        last, cache, mask, last_pos = prompt_pass(self.model, ids, mask, self.min_prefix)
        m, p = ids.shape[0], mask.shape[1]
        n, k, d = m * g, self.kv_heads, self.head_dim
        self.prompts, self.g, self.gen_len, self.cur = m, g, max_new_tokens, 0
        # The prompts' keys and values once per prompt (their G rows share them), keys transposed;
        # the generated tokens' per row. [prompts·K, d, P] / [prompts·K, P, d]; rotary applied.
        self.prompt_keys = [layer.keys.float().transpose(-1, -2).reshape(m * k, d, p) for layer in cache.layers]
        self.prompt_values = [layer.values.float().reshape(m * k, p, d) for layer in cache.layers]
        self.keys = [torch.zeros(n, k, d, max_new_tokens) for _ in cache.layers]
        self.values = [torch.zeros(n, k, max_new_tokens, d) for _ in cache.layers]
        self.rows = torch.arange(n)  # the decode batch's rows, as rows of the prefill's n (compaction drops some)
        # Additive attention bias per row over [prompt | generated]: 0 where a position may be
        # attended, -inf elsewhere (left padding, the prefix's hole, positions not yet written).
        self.bias = torch.full((n, 1, p + max_new_tokens), float("-inf"))
        self.bias[:, 0, :p].masked_fill_(mask.repeat_interleave(g, dim=0).bool(), 0.0)
        return last.repeat_interleave(g, dim=0), mask, last_pos

    def select(self, keep: Tensor) -> None:
        self.keys = [kt[keep] for kt in self.keys]
        self.values = [v[keep] for v in self.values]
        self.bias = self.bias[keep]
        self.rows = self.rows[keep]

    def _by_prompt(self, x: Tensor) -> Tensor:
        """``[live, H, X]`` per row -> ``[prompts·K, G·(H/K), X]``: each prompt's G rows' queries
        of key head ``j`` side by side, so one product reads that prompt's shared keys once. Rows
        that left the batch (compaction) are zeros here and dropped by ``_by_row``."""
        m, g, k = self.prompts, self.g, self.kv_heads
        n, h, width = m * g, x.shape[1], x.shape[2]
        if len(self.rows) < n:
            x = x.new_zeros(n, h, width).index_copy_(0, self.rows, x)
        return x.view(m, g, k, h // k, width).transpose(1, 2).reshape(m * k, g * h // k, width)

    def _by_row(self, x: Tensor) -> Tensor:
        """The inverse of ``_by_prompt``: ``[prompts·K, G·(H/K), X]`` -> ``[live, H, X]``."""
        m, g, k = self.prompts, self.g, self.kv_heads
        width = x.shape[-1]
        x = x.view(m, k, g, -1, width).transpose(1, 2).reshape(m * g, -1, width)
        return x if len(self.rows) == m * g else x.index_select(0, self.rows)

    def _norm(self, x: Tensor, weight: Tensor) -> Tensor:
        return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)

    def step(self, tok: Tensor, mask: Tensor, pos: Tensor) -> Tensor:
        """Logits ``[n, V]`` for one new token per row (``tok [n]`` at positions ``pos [n, 1]``);
        ``mask`` is not needed (the bias holds it).

        Attention in two parts under one softmax: the prompt's positions, read once per prompt for
        its G rows (``_by_prompt``), and each row's generated positions; the probabilities times
        the values likewise, the two sums added. The same attention as one product over a cache
        expanded to every row, up to float rounding, while reading the prompt's keys and values
        1/G as often (at G = 4 and a 261-token prompt, ~35% less attention time a step)."""
        body = self.llama.model
        n, h, k, d, t = tok.shape[0], self.heads, self.kv_heads, self.head_dim, self.cur
        g, p = h // k, self.bias.shape[-1] - self.gen_len
        x = F.embedding(tok, body.embed_tokens.weight)  # [n, D]
        cos, sin = body.rotary_emb(x.unsqueeze(1), pos.view(n, 1))
        cos, sin = cos.view(n, 1, d), sin.view(n, 1, d)
        self.bias[:, 0, p + t] = 0.0
        bias = self.bias[:, :, : p + t + 1]
        for i, layer in enumerate(body.layers):
            qkv_w, o_w, gu_w, down_w = self.packed[i]
            qkv = _linear(self._norm(x, layer.input_layernorm.weight), qkv_w)
            # Queries and keys rotate in one pass (elementwise: the numbers of two passes, half the calls).
            qk = _rotate(qkv[:, : (h + k) * d].view(n, h + k, d), cos, sin)
            q = qk[:, :h].float()
            self.keys[i][..., t] = qk[:, h:]
            self.values[i][:, :, t] = qkv[:, (h + k) * d:].view(n, k, d)
            prompt = self._by_row(torch.bmm(self._by_prompt(q), self.prompt_keys[i]))  # [n, H, P]
            own = torch.bmm(q.reshape(n * k, g, d), self.keys[i].view(n * k, d, self.gen_len)[..., : t + 1])
            probs = torch.softmax(torch.cat([prompt, own.view(n, h, t + 1)], -1).mul_(self.scale).add_(bias), dim=-1)
            att = self._by_row(torch.bmm(self._by_prompt(probs[..., :p]), self.prompt_values[i]))  # [n, H, d]
            # Out of place: under the learner's autocast (a bf16-trained policy sampling itself)
            # the products return bf16 and an in-place sum into them would be refused.
            att = torch.baddbmm(att.reshape(n * k, g, d), probs[..., p:].reshape(n * k, g, t + 1),
                                self.values[i].view(n * k, self.gen_len, d)[:, : t + 1])
            x = x + _linear(att.view(n, h * d).to(x.dtype), o_w)
            gate_up = _linear(self._norm(x, layer.post_attention_layernorm.weight), gu_w)
            x = x + _linear(F.silu(gate_up[:, : self.inter]).mul_(gate_up[:, self.inter:]), down_w)
        self.cur = t + 1
        return _linear(self._norm(x, body.norm.weight), self.head)


def _effective_weight(linear) -> Tensor:
    """The ``[out, in]`` weight ``linear`` applies: its own, or for a PEFT LoRA layer the base
    weight plus each active adapter's delta (PEFT's ``get_delta_weight``: B·A·scaling), which
    is what the layer computes as x·Wᵀ + scaling·(x·Aᵀ)·Bᵀ, up to float rounding (the product
    in another order). A merged layer already holds its delta; a disabled one applies none."""
    base = getattr(linear, "base_layer", None)
    if base is None:
        return linear.weight
    weight = base.weight
    if linear.merged or linear.disable_adapters:
        return weight
    for name in linear.active_adapters:
        if name in linear.lora_A:
            weight = weight + linear.get_delta_weight(name).to(weight.dtype)
    return weight


def _pack(weight: Tensor) -> Tensor:
    """A copy of ``weight`` ``[out, in]`` in oneDNN's blocked layout where torch has it (the
    layout inductor's CPU freezing uses): products at batch 8 over it ran 1.1–1.4× (bf16) and
    1.1–2.7× (fp32) faster than ``F.linear`` over the plain weight on this CPU, the same
    results in bf16. Without oneDNN (or should the private op go away), the plain copy."""
    weight = weight.detach()
    if weight.device.type == "cpu" and weight.dtype in (torch.float32, torch.bfloat16) \
            and torch.backends.mkldnn.is_available():
        try:
            return torch.ops.mkldnn._reorder_linear_weight(weight, 8)
        except (RuntimeError, AttributeError):
            pass
    return weight.clone()


def require_int8(model) -> None:
    """Raise a ``ConfigError`` naming why the int8 decode step cannot run ``model`` here."""
    device = next(model.parameters()).device
    if device.type != "cpu":
        raise ConfigError(f"rollout.dtype: int8 runs torch's CPU int8 kernels (fbgemm), the model is on {device}; "
                          "on a GPU sample in bfloat16 (rollout.dtype: bfloat16)")
    engines = torch.backends.quantized.supported_engines
    if not {"fbgemm", "x86"} & set(engines):
        raise ConfigError(f"rollout.dtype: int8 needs torch's fbgemm/x86 int8 kernels, which this torch build lacks "
                          f"(quantized engines: {engines}); use rollout.dtype: bfloat16")


@functools.cache
def int8_weight_levels() -> int:
    """The largest int8 weight magnitude the decode step uses on this CPU: 127 where fbgemm's
    products run on AVX512-VNNI (32-bit sums), 63 elsewhere. Without VNNI fbgemm multiplies
    unsigned 8-bit activations by signed 8-bit weights with ``vpmaddubsw``, whose pairwise sums
    saturate at 16 bits: 2 x 255 x 127 overflows, 2 x 255 x 63 does not. On the embedded model
    on an AVX2-only EPYC, 127 levels gave a next-token k1 KL of 0.74 at most (0.031 on average)
    against the float step; 63 levels 0.072 (0.0028), 7-bit activations instead 0.19 (0.012)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        flags = []
    return 127 if "avx512_vnni" in flags else 63


def _pack_int8(weight: Tensor):
    """``weight`` ``[out, in]`` as symmetric int8 with one scale per output row (round to nearest,
    scale = max|w_row| / :func:`int8_weight_levels`), prepacked for fbgemm's dynamic int8 product,
    which quantises each input to 8 bits per call (one scale per call) and accumulates in int32.
    At batch 8 the products read a quarter of float32's bytes (SmolLM2 on an AVX512 CPU: a decode
    step 2.3× faster; quantising and packing the whole model takes ~0.5 s a sampling call). Another
    sampler than the learner: k3 KL 4.5e-2 per token on SmolLM2's batch-8 samples there
    (``benchmarks/sampler_levers.py``; a bf16 copy: 1.5e-3), recorded in the behaviour log-probs
    for ``off_policy`` to correct. Full-range activations (``reduce_range`` off): the 7-bit range
    fbgemm offers against overflow tripled the KL on the AVX512 CPU and on AVX2 does worse than
    7-bit weights (above)."""
    w = weight.detach().float()
    scale = (w.abs().amax(1).clamp_min(1e-12) / int8_weight_levels()).double()
    q = torch.quantize_per_channel(w, scale, torch.zeros(len(scale), dtype=torch.long), 0, torch.qint8)
    return torch.ops.quantized.linear_prepack(q, None)


def _linear(x: Tensor, weight) -> Tensor:
    if isinstance(weight, torch.ScriptObject):  # int8, prepacked (_pack_int8)
        return torch.ops.quantized.linear_dynamic(x.float().contiguous(), weight, False).to(x.dtype)
    if weight.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")
    return F.linear(x, weight)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding, transformers' convention: x·cos + rotate_half(x)·sin."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def make_decoder(model, name: str, min_prefix: int = MIN_SHARED_PREFIX):
    if name == "hf":
        return HFDecoder(model, min_prefix)
    if is_fused(name):
        return FusedLlamaDecoder(model, min_prefix, int8=name == FUSED_INT8)
    raise ValueError(f"unknown decoder {name!r}: expected 'hf', 'fused' or '{FUSED_INT8}'")
