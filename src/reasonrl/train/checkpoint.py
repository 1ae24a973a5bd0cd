"""Atomic checkpoints holding everything an exact resume needs.

A checkpoint is a folder ``checkpoints/step_XXXXXX`` holding ``model/``, a
standard Hugging Face folder (safetensors; only the adapters with LoRA), and
``state.pt``: optimiser and scheduler state, every RNG state (Python, NumPy,
torch, the sampling generator), the step and policy version, and the base
evaluation. It is written to a temporary folder and renamed into place,
so a crash mid-write never leaves a checkpoint that looks complete.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from reasonrl.fsutil import atomic_directory

STATE_FILE = "state.pt"


def rng_state(generator: torch.Generator) -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "sampler": generator.get_state(),
    }


def restore_rng(state: dict[str, Any], generator: torch.Generator) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    generator.set_state(state["sampler"])


MODEL_DIR = "model"


def save_checkpoint(run_dir: Path, step: int, policy, state: dict[str, Any], keep: int) -> Path:
    final = run_dir / "checkpoints" / f"step_{step:06d}"
    with atomic_directory(final, overwrite=True) as tmp:
        policy.save(tmp / MODEL_DIR)
        torch.save(state, tmp / STATE_FILE)
    for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(run_dir: Path) -> list[Path]:
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.name.startswith("step_") and (p / STATE_FILE).is_file())


def load_latest(run_dir: Path, policy) -> dict[str, Any]:
    """Load the newest checkpoint's weights into ``policy``; return the rest of its state."""
    found = list_checkpoints(run_dir)
    if not found:
        raise FileNotFoundError(f"no checkpoint in {run_dir}/checkpoints to resume from")
    policy.load_weights(found[-1] / MODEL_DIR)
    return torch.load(found[-1] / STATE_FILE, weights_only=False)
