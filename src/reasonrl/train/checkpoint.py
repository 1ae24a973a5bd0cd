"""Atomic checkpoints holding everything an exact resume needs.

A checkpoint is a folder ``checkpoints/step_XXXXXX`` with ``state.pt``:
weights, optimiser and scheduler state, every RNG state (Python, NumPy,
torch, the sampling generator), the step and policy version, and the
base evaluation. It is written to a temporary folder and renamed into place,
so a crash mid-write never leaves a checkpoint that looks complete.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

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


def save_checkpoint(run_dir: Path, step: int, state: dict[str, Any], keep: int) -> Path:
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    torch.save(state, tmp / STATE_FILE)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(run_dir: Path) -> list[Path]:
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.name.startswith("step_") and (p / STATE_FILE).is_file())


def load_latest(run_dir: Path) -> dict[str, Any]:
    found = list_checkpoints(run_dir)
    if not found:
        raise FileNotFoundError(f"no checkpoint in {run_dir}/checkpoints to resume from")
    return torch.load(found[-1] / STATE_FILE, weights_only=False)
