"""Regenerate the pinned regression runs (tests/test_pinned_runs.py).

Run from the repository root: ``.venv/bin/python tests/data/pinned/make_pins.py [--models]``.
``--models`` also rebuilds the two starting models (student, teacher); without it the
shipped ones are used, so only the expected metrics and final weights are rewritten.
Regenerate only for a change that is meant to alter training numbers, and say so in
the commit message: the point of the pins is that a refactor does not.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # tests/, for helpers


def build_models() -> None:
    from helpers import MINI_TINY
    from reasonrl.policy.tiny import TinySpec, load_tiny_policy

    with tempfile.TemporaryDirectory() as cache:
        common = {"warmup_steps": 800, "warmup_lr": 1e-2, "max_operand": 4}
        for name, extra in (("student", common), ("teacher", {**common, "careless_fraction": 0.0})):
            policy = load_tiny_policy(TinySpec(**{**MINI_TINY, **extra}), cache_dir=cache, log=lambda m: None)
            shutil.rmtree(HERE / name, ignore_errors=True)
            policy.save(HERE / name)


def main() -> None:
    if "--models" in sys.argv or not (HERE / "student").is_dir():
        build_models()
    from pinned import PIN_RUNS, run_pinned

    expected = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in PIN_RUNS:
            rows, weights = run_pinned(name, Path(tmp) / name)
            expected[name] = rows
            from safetensors.torch import save_file

            save_file(weights, str(HERE / f"{name}_final.safetensors"))
    (HERE / "expected_metrics.json").write_text(json.dumps(expected, indent=1, sort_keys=True))
    print(f"wrote pins for {', '.join(PIN_RUNS)} to {HERE}")


if __name__ == "__main__":
    main()
