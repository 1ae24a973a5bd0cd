"""Build the policy a recipe names."""

from __future__ import annotations

from reasonrl.config import ModelConfig
from reasonrl.policy.hf import HFPolicy


def build_policy(cfg: ModelConfig, log=None) -> HFPolicy:
    if cfg.backend == "tiny":
        from reasonrl.policy.tiny import TinySpec, load_tiny_policy

        return load_tiny_policy(TinySpec(**cfg.tiny), log=log)
    from reasonrl.policy.tiny import load_hf_policy

    return load_hf_policy(cfg.path)
