"""Build the policy a recipe names (``build_policy``), or the one ``reasonrl eval --model`` names (``load_for_eval``)."""

from __future__ import annotations

from pathlib import Path

import torch

from reasonrl.devices import resolve_device
from reasonrl.params import ConfigError
from reasonrl.policy.fused_decode import require_fused
from reasonrl.policy.hf import HFPolicy
from reasonrl.policy.loading import load_hf_policy, model_folder
from reasonrl.policy.lora import apply_lora
from reasonrl.policy.tiny import TinySpec, load_tiny_policy
from reasonrl.sections import ModelConfig


def build_policy(cfg: ModelConfig, log=None, trainable: bool = True, decoder: str = "hf",
                 gradient_checkpointing: bool = False, precision: str = "fp32") -> HFPolicy:
    """The policy (``trainable``: with its LoRA adapters, when configured) or a frozen copy, on
    the run's device (``model.device``, :func:`reasonrl.devices.resolve_device`); ``decoder`` is
    its sampling decode step (``rollout.decoder``); ``gradient_checkpointing``: its training
    forward recomputes activations (``train.gradient_checkpointing``); ``precision``
    (``train.precision``): ``bf16`` runs every forward under bf16 autocast over the fp32 weights."""
    device = resolve_device(cfg.device)
    if cfg.backend == "tiny":
        policy = load_tiny_policy(TinySpec(**cfg.tiny), log=log)
    else:
        policy = load_hf_policy(cfg.path, gguf_file=cfg.gguf_file, dtype=cfg.dtype, cache_dir=cfg.cache_dir, log=log)
    policy.chat_template = cfg.chat_template
    if cfg.chat_template and not getattr(policy.tokenizer, "chat_template", None):
        raise ConfigError(f"model.chat_template is true but the tokenizer of {cfg.path or 'the tiny model'} has none")
    policy.to(device)
    if not trainable:
        policy.model.requires_grad_(False)
    elif cfg.lora is not None:
        policy.model = apply_lora(policy.model, cfg.lora)
    if trainable and gradient_checkpointing:
        # Non-reentrant: the variant torch recommends, which also works with frozen inputs (LoRA).
        policy.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if precision == "bf16":
        policy.autocast = torch.bfloat16
        if device.type == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported() and log is not None:
            log("warning: train.precision: bf16 on a CPU without bf16 matrix units (no AVX512-BF16 or AMX): "
                "its bf16 matmuls run 7-30x slower than fp32 here (benchmarks/precision.py); fp32 is faster")
    if decoder == "fused":  # refused now, before the run folder exists, not at the first sample
        require_fused(policy.model)
    policy.decoder = decoder
    return policy


def load_for_eval(model: str, log=None) -> HFPolicy:
    """What ``reasonrl eval --model`` accepts: ``tiny`` (the embedded model), a run folder
    (its ``final_model``), a checkpoint folder, a LoRA adapter folder (loaded onto its base),
    or anything ``load_hf_policy`` loads."""
    if model == "tiny":
        return load_tiny_policy(log=log)
    path = model_folder(Path(model))
    adapter = path / "adapter_config.json"
    if adapter.is_file():
        import json

        from peft import PeftModel

        base = load_hf_policy(json.loads(adapter.read_text())["base_model_name_or_path"], log=log)
        base.model = PeftModel.from_pretrained(base.model, str(path))
        return base
    return load_hf_policy(str(path) if path.exists() else model, log=log)
