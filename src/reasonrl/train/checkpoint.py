"""Atomic checkpoints holding everything an exact resume needs.

A checkpoint is a folder ``checkpoints/step_XXXXXX`` holding ``model/``, a
standard Hugging Face folder (safetensors; only the adapters with LoRA), and
``state.pt``: optimiser and scheduler state, every RNG state (Python, NumPy,
torch, the sampling generator), the step and policy version, and the base
evaluation. It is written to a temporary folder and renamed into place,
so a crash mid-write never leaves a checkpoint that looks complete.

A state file never runs code when loaded: :func:`load_state` reads it with
``torch.load(weights_only=True)``, which rebuilds tensors and plain data only
(a pickle can otherwise call any function, so a crafted ``state.pt`` in a run
folder would run it on ``--resume``). Every state saved must therefore be
tensors, torch dtypes/devices/sizes and plain ``dict``/``list``/``tuple``/``set``/
``int``/``float``/``complex``/``str``/``bytes``/``bool``/``None``; :func:`save_state`
checks that before writing, so a component whose state breaks the rule (a NumPy
array or scalar, a dataclass) fails at its first save, naming the key, not at a
later resume. The federated client's and server's state files use the same pair.
"""

from __future__ import annotations

import errno
import pickle
import random
import re
import shutil
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from reasonrl.fsutil import CheckpointWriteError, atomic_directory, atomic_torch_save
from reasonrl.params import ConfigError
from reasonrl.policy.loading import FINAL_MODEL

STATE_FILE = "state.pt"


def rng_state(generator: torch.Generator) -> dict[str, Any]:
    """Every random stream, as plain data and tensors (NumPy's key array becomes a list of ints)."""
    numpy = np.random.get_state(legacy=False)
    numpy["state"] = {"key": numpy["state"]["key"].tolist(), "pos": int(numpy["state"]["pos"])}
    return {
        "python": random.getstate(),
        "numpy": {**numpy, "has_gauss": int(numpy["has_gauss"]), "gauss": float(numpy["gauss"])},
        "torch": torch.get_rng_state(),
        "sampler": generator.get_state(),
    }


def restore_rng(state: dict[str, Any], generator: torch.Generator) -> None:
    random.setstate(state["python"])
    numpy = state["numpy"]
    np.random.set_state({**numpy, "state": {**numpy["state"], "key": np.array(numpy["state"]["key"], np.uint32)}})
    torch.set_rng_state(state["torch"])
    generator.set_state(state["sampler"])


MODEL_DIR = "model"


def _write_failure(exc: BaseException) -> str | None:
    """Why ``exc`` is a failed write, in words, or None when it is something else (a bug).
    Safetensors and torch.save do not raise OSError: they wrap the OS's error in their own
    exception, so the OS's words are looked for in the text."""
    if isinstance(exc, OSError):
        return "no space left on device" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
    text = str(exc)
    if "No space left on device" in text:
        return "no space left on device"
    if type(exc).__name__ == "SafetensorError" and "I/O error" in text:
        return text.split("I/O error:", 1)[1].strip()
    if "PytorchStreamWriter failed" in text or "file write failed" in text:
        return "the state file could not be written (disk full?)"
    return None


@contextmanager
def _named_write_failure(what: str, folder: Path, run_dir: Path) -> Iterator[None]:
    """Turn a failed write of ``what`` inside the block into a :class:`CheckpointWriteError`: one
    line with the reason, the free space and how to go on from the last complete checkpoint. Any
    other error passes through (a bug keeps its traceback)."""
    try:
        yield
    except Exception as exc:
        reason = _write_failure(exc)
        if reason is None:
            raise
        free = shutil.disk_usage(folder).free / 2**20
        last = list_checkpoints(run_dir)
        after = (f"the last complete checkpoint, {last[-1].name}, is intact: free space, then "
                 f"`reasonrl train --resume {run_dir}`" if last else "no earlier checkpoint exists")
        raise CheckpointWriteError(f"could not write {what} in {folder}: {reason} ({free:.0f} MiB free); {after}") from exc


def save_checkpoint(run_dir: Path, step: int, policy, state: dict[str, Any], keep: int, learner=None) -> Path:
    """Write ``checkpoints/step_<step>`` atomically: the policy's weights, ``state`` and what
    the ``learner`` keeps apart from it (a sharded learner's ``learner/`` folder, written by
    every rank into the same temporary folder before it is renamed into place).

    A write that fails (a full disk) raises :class:`CheckpointWriteError`, which the CLI reports in
    one line with the free space and the resume command, instead of a writer library's traceback."""
    final = run_dir / "checkpoints" / f"step_{step:06d}"
    with _named_write_failure(f"the checkpoint of step {step}", final.parent, run_dir), \
            atomic_directory(final, overwrite=True) as tmp:
        policy.save(tmp / MODEL_DIR)
        if learner is not None:
            learner.save(tmp)
        save_state(tmp / STATE_FILE, state)
    for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def save_final_model(run_dir: Path, policy, merged: Callable[[Path], None] | None = None) -> Path:
    """Write ``final_model/`` atomically (a folder that exists is complete), with ``merged(path)``
    writing what goes inside it (LoRA's ``merged/``). A failed write is reported as a checkpoint's
    is: the last checkpoint holds the same weights, and ``--resume`` writes the folder again."""
    final = run_dir / FINAL_MODEL
    with _named_write_failure(FINAL_MODEL, run_dir, run_dir), atomic_directory(final, overwrite=True) as tmp:
        policy.save(tmp)
        if merged is not None:
            merged(tmp / "merged")
    return final


def list_checkpoints(run_dir: Path) -> list[Path]:
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.name.startswith("step_") and (p / STATE_FILE).is_file())


def load_latest(run_dir: Path, policy) -> tuple[dict[str, Any], Path]:
    """Load the newest checkpoint's weights into ``policy``; return the rest of its state and
    its folder (where a learner finds what it saved apart, see :func:`save_checkpoint`)."""
    found = list_checkpoints(run_dir)
    if not found:
        raise FileNotFoundError(f"no checkpoint in {run_dir}/checkpoints to resume from")
    state = load_state(found[-1] / STATE_FILE)  # before the weights: a refused file changes nothing
    policy.load_weights(found[-1] / MODEL_DIR)
    return state, found[-1]


# What torch.load(weights_only=True) rebuilds besides tensors (torch's own allow-list, less its
# rarely used types); exact types, since a subclass (numpy.float64 is a float) pickles as itself.
_PLAIN = (dict, OrderedDict, Counter, list, tuple, set, int, float, complex, str, bytes, bool, type(None),
          torch.Size, torch.dtype, torch.device)


def _check_plain(obj: Any, where: str) -> None:
    if isinstance(obj, torch.Tensor):
        return
    if type(obj) not in _PLAIN:
        raise TypeError(f"{where} is a {type(obj).__module__}.{type(obj).__qualname__}: a saved state holds only "
                        "tensors and plain dict/list/tuple/int/float/str/bool/None (it is loaded with "
                        "torch.load(weights_only=True)); convert it in the component's state_dict")
    if isinstance(obj, dict):
        for key, value in obj.items():
            _check_plain(key, f"{where} key {key!r}")
            _check_plain(value, f"{where}[{key!r}]")
    elif isinstance(obj, (list, tuple, set)):
        for i, value in enumerate(obj):
            _check_plain(value, f"{where}[{i}]")


def save_state(path: Path, state: Any) -> None:
    """Write ``state`` to ``path`` atomically, after checking that :func:`load_state` will read it
    (tensors and plain data only; a ``TypeError`` naming the key otherwise, nothing written)."""
    _check_plain(state, "state")
    atomic_torch_save(path, state)


def load_state(path: Path) -> Any:
    """Read a state file written by :func:`save_state` without running any code from it
    (``torch.load(weights_only=True)``). A file holding anything else (a crafted pickle, a
    foreign file, a state saved by reasonrl before this check, which held NumPy arrays) is
    refused: :class:`~reasonrl.params.ConfigError` naming the file (the CLI exits 2)."""
    try:
        return torch.load(path, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, KeyError, ValueError) as exc:
        text = str(exc)
        if called := re.search(r"GLOBAL ([\w.]+)", text):  # what the pickle would have called
            raise ConfigError(f"{path}: refusing to load: it holds objects other than tensors and plain data "
                              f"({called[1]}): a crafted or foreign file, or a state saved by a reasonrl older "
                              "than this check (NumPy arrays); nothing in it was run") from None
        lines = [ln.strip() for ln in text.split("WeightsUnpickler error:")[-1].splitlines() if ln.strip()]
        reason = re.split(r"(?<=\.) ", lines[0])[0] if lines else type(exc).__name__
        raise ConfigError(f"{path}: not a readable state file (truncated, corrupt or foreign?): {reason}") from None
