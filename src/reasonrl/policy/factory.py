"""Build the policy a recipe names."""

from __future__ import annotations

from reasonrl.config import ModelConfig
from reasonrl.policy.hf import HFPolicy


def build_policy(cfg: ModelConfig, log=None, trainable: bool = True, decoder: str = "hf") -> HFPolicy:
    """The policy (``trainable``: with its LoRA adapters, when configured) or a frozen copy;
    ``decoder`` is its sampling decode step (``rollout.decoder``)."""
    if cfg.backend == "tiny":
        from reasonrl.policy.tiny import TinySpec, load_tiny_policy

        policy = load_tiny_policy(TinySpec(**cfg.tiny), log=log)
    else:
        from reasonrl.policy.loading import load_hf_policy

        policy = load_hf_policy(cfg.path, gguf_file=cfg.gguf_file, dtype=cfg.dtype, cache_dir=cfg.cache_dir, log=log)
    policy.chat_template = cfg.chat_template
    if cfg.chat_template and not getattr(policy.tokenizer, "chat_template", None):
        from reasonrl.config import ConfigError

        raise ConfigError(f"model.chat_template is true but the tokenizer of {cfg.path or 'the tiny model'} has none")
    if not trainable:
        policy.model.requires_grad_(False)
    elif cfg.lora is not None:
        from reasonrl.policy.lora import apply_lora

        policy.model = apply_lora(policy.model, cfg.lora)
    if decoder == "fused":  # refused now, before the run folder exists, not at the first sample
        from reasonrl.policy.fused_decode import require_fused

        require_fused(policy.model)
    policy.decoder = decoder
    return policy
