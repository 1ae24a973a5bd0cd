"""Control for the quickstart: spend the GRPO budget on more supervised training instead.

Continues the warm-up (cross-entropy on the same kind of worked solutions, 70% of the
bracketed ones careless) from the embedded model for ``--seconds`` of wall time at the
GRPO learning rate, then reports held-out greedy accuracy per form.

    .venv/bin/python benchmarks/sft_control.py [--seconds 150] [--lr 2e-4]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import torch

from reasonrl.evaluate.accuracy import greedy_accuracy
from reasonrl.policy.tiny import TinySpec, load_tiny_policy, warm_up
from reasonrl.tasks.arithmetic import ArithmeticTask


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=150.0)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    spec = TinySpec()
    policy = load_tiny_policy(spec)
    task = ArithmeticTask()
    problems = task.eval_problems(200)
    before = greedy_accuracy(policy, problems, 32)
    # Calibrate steps to the time budget with a short timed run of the same loop.
    start = time.perf_counter()
    warm_up(policy, task, replace(spec, warmup_steps=20, warmup_lr=args.lr, seed=101), log=lambda m: None)
    per_step = (time.perf_counter() - start) / 20
    steps = max(1, int(args.seconds / per_step) - 20)
    warm_up(policy, task, replace(spec, warmup_steps=steps, warmup_lr=args.lr, seed=102), log=lambda m: None)
    after = greedy_accuracy(policy, problems, 32)
    print(json.dumps({"sft_steps": steps + 20, "seconds": round(time.perf_counter() - start, 1),
                      "before": before, "after": after}, indent=1))


if __name__ == "__main__":
    main()
