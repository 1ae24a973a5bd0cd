"""reasonrl: RL post-training of language models for reasoning (GRPO and its family)."""

__version__ = "0.1.0"
