"""Crash-safe file-system writes: nothing half-written ever looks complete."""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, read-only or unwritable folder). The partial
    folder is gone and the last complete checkpoint is intact; the message says how to resume.
    Here, not beside the checkpoint code, so that the CLI catches it without importing torch."""


@contextmanager
def atomic_directory(target: Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary folder beside ``target``; on success rename it to ``target``.

    With ``overwrite=False`` an existing ``target`` wins (a concurrent builder of the
    same cache entry finished first; both are identical) and the new copy is dropped.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if overwrite and target.exists():
        shutil.rmtree(target)
    try:
        os.replace(tmp, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def atomic_torch_save(path: Path, obj: object) -> None:
    """``torch.save`` that a crash cannot leave half-written: the old file or the new one."""
    import torch

    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)
