"""Rebuild the embedded tiny model's shipped weights: ``python -m reasonrl.embedded
--rebuild-embedded`` (``make embedded``), after a change to the default ``TinySpec`` or to
``WARMUP_VERSION``.

An entry point (like the CLI): it measures the build on the arithmetic task with the evaluator's
greedy accuracy, which the policy layer (``reasonrl.policy.tiny``, where the model is defined,
built and loaded) must not import.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from reasonrl.evaluate.accuracy import greedy_accuracy
from reasonrl.fsutil import atomic_directory
from reasonrl.policy.hf import HFPolicy
from reasonrl.policy.loading import load_hf_policy
from reasonrl.policy.tiny import (
    EMBEDDED_DIR, EVAL_MAX_NEW_TOKENS, EVAL_PROBLEMS, SPEC_FILE, WARMUP_VERSION, TinySpec, build_tiny_policy,
)
from reasonrl.tasks.arithmetic import ArithmeticTask

__all__ = ["heldout_accuracy", "rebuild_embedded", "main"]


def heldout_accuracy(policy: HFPolicy) -> float:
    """Greedy accuracy on the arithmetic task's held-out problems (what the quickstart starts from)."""
    return greedy_accuracy(policy, ArithmeticTask().eval_problems(EVAL_PROBLEMS), EVAL_MAX_NEW_TOKENS)["accuracy"]


def rebuild_embedded(folder: Path = EMBEDDED_DIR, log=print) -> tuple[float | None, float]:
    """Build ``TinySpec()`` from scratch and replace the shipped weights in ``folder`` (atomically).
    Returns the held-out greedy accuracy of the weights shipped before (None if none) and of the new build."""
    spec = TinySpec()
    old = heldout_accuracy(load_hf_policy(folder)) if (folder / "config.json").is_file() else None
    log(f"building TinySpec() (key {spec.key()}, warm-up version {WARMUP_VERSION})")
    policy = build_tiny_policy(spec, log=log)
    with atomic_directory(folder, overwrite=True) as tmp:
        policy.save(tmp)
        new = heldout_accuracy(load_hf_policy(tmp))  # measured on the files as shipped
        meta = {"key": spec.key(), "warmup_version": WARMUP_VERSION, "spec": asdict(spec),
                "heldout_greedy_accuracy": new, "torch": torch.__version__,
                "built": time.strftime("%Y-%m-%d")}
        (tmp / SPEC_FILE).write_text(json.dumps(meta, indent=1) + "\n")
        # Readable by everyone, like the rest of the package (mkdtemp and safetensors create 0700/0600).
        tmp.chmod(0o755)
        for file in tmp.iterdir():
            file.chmod(0o644)
    return old, new


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reasonrl.embedded", description=(
        "The embedded tiny model. --rebuild-embedded builds the default spec (TinySpec()) from scratch and "
        "replaces the weights shipped in the package (run it after changing the spec or WARMUP_VERSION)."))
    parser.add_argument("--rebuild-embedded", action="store_true",
                        help=f"rebuild the shipped weights in {EMBEDDED_DIR} (about a minute on 2 cores)")
    args = parser.parse_args(argv)
    if not args.rebuild_embedded:
        parser.print_help()
        return 2
    old, new = rebuild_embedded()
    shipped = "none" if old is None else f"{old:.3f}"
    print(f"held-out greedy accuracy ({EVAL_PROBLEMS} problems): new build {new:.3f}, previously shipped {shipped}")
    print(f"wrote {EMBEDDED_DIR} (key {TinySpec().key()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
