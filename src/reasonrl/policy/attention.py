"""The attention function of reasonrl's transformers models: transformers' ``sdpa``, with
grouped-query attention done inside torch's kernel where transformers would copy the heads.

With an attention mask, transformers' ``sdpa`` path repeats each key/value head
``num_key_value_groups`` times before the kernel (``repeat_kv``: a copy forward, a sum over the
copies backward), because CUDA's fast kernels cannot take a mask together with ``enable_gqa``.
torch's CPU kernel can, and a masked forward with several query tokens is what every training
forward of a shared-prompt batch is (the prompt's suffixes and the completions attend through a
mask to a cached prefix). For those calls on CPU, ``sdpa_gqa`` hands the kernel the key/value
heads as they are (``enable_gqa=True``: query head ``h`` reads key/value head ``h // groups``);
the output is the same, and the key/value gradients sum the groups inside the kernel in float32
instead of over bf16 copies. Every other call (GPU, no mask, one query token, a position bias,
a model without grouped heads, e.g. the embedded one) is transformers' own ``sdpa`` unchanged.
SmolLM2-135M (9 query heads over 3 key/value heads), bf16, 2 threads: see
``benchmarks/learner_levers.py`` and docs/scaling.md ("A SmolLM2 step").
"""

from __future__ import annotations

import torch.nn.functional as F
from transformers import AttentionInterface, LlamaForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from reasonrl.policy.lora import base_model, other_adapters
from reasonrl.policy.packed import PACKED_KWARG, packed_attention

__all__ = ["SDPA_GQA", "sdpa_gqa", "use_sdpa_gqa", "packed_unsupported"]

SDPA_GQA = "reasonrl_sdpa"


def sdpa_gqa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
             is_causal: bool | None = None, **kwargs):
    """transformers' attention-function signature: ``query [B, H, Q, d]``, ``key``/``value``
    ``[B, K, T, d]``, returns ``([B, Q, H, d], None)``."""
    layout = kwargs.get(PACKED_KWARG)
    if layout is not None:  # a packed training forward (reasonrl.policy.packed): attention per segment
        return packed_attention(query, key, value, layout, dropout, scaling), None
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1 and attention_mask is not None and query.device.type == "cpu" and query.shape[2] > 1 \
            and kwargs.get("position_bias") is None and kwargs.get("softcap") is None \
            and not kwargs.get("output_attentions", False):
        # With a mask transformers' own path computes is_causal = False: the mask says it all.
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                             scale=scaling, enable_gqa=True)
        return out.transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=is_causal, **kwargs)


AttentionInterface.register(SDPA_GQA, sdpa_gqa)
AttentionMaskInterface.register(SDPA_GQA, sdpa_mask)  # the same masks transformers builds for sdpa


def use_sdpa_gqa(model) -> None:
    """Switch a model that runs transformers' ``sdpa`` to ``sdpa_gqa``; any other attention
    implementation (eager, flash, flex) is left as it is."""
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(SDPA_GQA)


def packed_unsupported(model) -> str | None:
    """Why ``model`` cannot run a packed training forward (``reasonrl.policy.packed``), or None.
    Its equality with the padded forward is tested on transformers' Llama with ``sdpa_gqa``, the
    attention function that reads the packed layout; other families may add what the per-segment
    attention does not apply (sliding windows, soft-capping), so they are refused, as are eager,
    flash and flex attention and PEFT adapters other than LoRA."""
    llama = base_model(model)
    config = getattr(llama, "config", None)
    if config is None or not isinstance(llama, LlamaForCausalLM):  # FSDP2 subclasses the model's class
        return f"it is a {type(llama).__name__}, not a transformers LlamaForCausalLM"
    if config._attn_implementation != SDPA_GQA:
        return f"its attention implementation is {config._attn_implementation!r}, not transformers' sdpa"
    if other_adapters(model):
        return "it carries a PEFT adapter other than LoRA"
    return None
