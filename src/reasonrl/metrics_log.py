"""Metric sinks: ``metrics.jsonl`` (always) and the trackers named in ``log.report_to``."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, Callable


class MetricsWriter:
    """Appends one JSON object per step to ``metrics.jsonl``; on resume it first drops
    rows logged after the checkpoint, so the file matches an uninterrupted run."""

    def __init__(self, run_dir: Path, resume_step: int | None = None, trackers: list | None = None) -> None:
        self.path = run_dir / "metrics.jsonl"
        if resume_step is not None and self.path.exists():
            kept = [line for line in self.path.read_text().splitlines() if _logged_before(line, resume_step)]
            self.path.write_text("".join(line + "\n" for line in kept))
        self._file = open(self.path, "a", buffering=1)
        self._trackers = trackers or []

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, **{k: finite_or_none(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(row) + "\n")
        scalars = {k: float(v) for k, v in row.items()
                   if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}
        for tracker in list(self._trackers):
            try:
                tracker.log(step, scalars)
            except Exception as exc:  # noqa: BLE001 — a tracker outage must not kill the run
                self._trackers.remove(tracker)
                print(f"warning: {type(tracker).__name__} failed ({type(exc).__name__}: {exc}); it receives "
                      "no more metrics in this run (metrics.jsonl is complete)", file=sys.stderr)

    def close(self) -> None:
        self._file.close()
        for tracker in self._trackers:
            tracker.close()


def _logged_before(line: str, checkpoint_step: int) -> bool:
    """Was this row written before the checkpoint was taken? The training row of the
    checkpoint's step was; a final-evaluation row at the same step was not."""
    try:
        row = json.loads(line)
        step = int(row["step"])
    except (ValueError, KeyError, TypeError):
        return False  # a line cut short by a crash
    return step < checkpoint_step or (step == checkpoint_step and "reward/mean" in row)


def finite_or_none(value: Any) -> Any:
    """NaN/inf become None: JSON has no NaN, and a missing value is what they mean."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_metrics(run_dir: Path, on_malformed: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
    """Rows of ``metrics.jsonl``. A malformed line (a run stopped mid-write) is skipped and its
    line number passed to ``on_malformed``; by default a warning is printed."""
    rows = []
    path = Path(run_dir) / "metrics.jsonl"
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if on_malformed is not None:
                on_malformed(number)
            else:
                print(f"warning: skipping a malformed line in {path}", file=sys.stderr)
    return rows
