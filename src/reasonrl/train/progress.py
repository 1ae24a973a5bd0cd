"""A one-line progress display on stderr (tqdm when the terminal is interactive)."""

from __future__ import annotations

import sys
import time
from typing import Any

SHOWN = (("reward/mean", "reward"), ("reward/exact_answer", "acc"), ("entropy", "ent"), ("kl", "kl"))


class Progress:
    def __init__(self, total: int, initial: int = 0, enabled: bool = True, every: int = 10) -> None:
        self.total, self.step, self.enabled, self.every = total, initial, enabled, every
        self.start = time.perf_counter()
        self._bar = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, desc="train", dynamic_ncols=True)

    def update(self, metrics: dict[str, Any]) -> None:
        self.step += 1
        if not self.enabled:
            return
        shown = {short: metrics[key] for key, short in SHOWN if isinstance(metrics.get(key), (int, float))}
        if self._bar is not None:
            self._bar.set_postfix({k: f"{v:.3f}" for k, v in shown.items()}, refresh=False)
            self._bar.update(1)
        elif self.step % self.every == 0 or self.step == self.total:
            elapsed = time.perf_counter() - self.start
            text = "  ".join(f"{k} {v:.3f}" for k, v in shown.items())
            print(f"step {self.step}/{self.total}  {text}  ({elapsed:.0f}s)", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
