"""Peak training memory of GRPO steps: LoGRA vs AdamW (full) vs LoRA of the same rank.

What is measured: each arm runs in a fresh Python process (CPU). The process builds the model, a
fixed batch (the task's prompts, random completion tokens of ``--length``, random advantages) and
the learner, then resets the kernel's peak-RSS counter (``echo 5 > /proc/self/clear_refs`` resets
VmHWM) and runs ``--steps`` optimiser steps of the GRPO objective (the Trainer's
``micro_batch_loss``, one mini-batch, micro-batches of ``--micro``). The number reported is the
peak resident memory during those steps minus the resident memory just before them: activations
kept for backward, gradients, optimiser state and LoGRA's sketches/probe, not the model's own
weights (the same in every arm) nor the load-time transients. ``--steps 2`` includes AdamW's
state, which is allocated at its first step. Linux only (``/proc``).

    .venv/bin/python benchmarks/logra_memory.py --model tiny --rank 32
    .venv/bin/python benchmarks/logra_memory.py --model smollm2-135m --rank 64 --rows 16 --length 64

Prints a table and writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ARMS = ("adamw", "lora", "logra")


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def run_arm(arm: str, model: str, rank: int, rows: int, length: int, micro: int, steps: int) -> dict:
    import torch

    from reasonrl.batch import RolloutBatch
    from reasonrl.config import recipe_from_dict
    from reasonrl.policy.factory import build_policy
    from reasonrl.tasks.base import build_task
    from reasonrl.train.objective import micro_batch_loss, totals
    from reasonrl.train.optim import build_learner

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    m = {"backend": "tiny"} if model == "tiny" else {"backend": "hf", "path": model}
    if arm == "lora":
        m["lora"] = {"r": rank, "alpha": 2 * rank}
    optim = {"name": "logra", "params": {"rank": rank}} if arm == "logra" else {"lr": 1e-5}
    r = recipe_from_dict({"model": m, "optim": optim, "rollout": {"max_new_tokens": length}, "log": {"progress": False}},
                         "benchmark")
    policy = build_policy(r.model, log=lambda s: None)
    task = build_task(r)
    prompts = [p.prompt for p in task.train_problems(0, rows, 1)][:rows]
    prompts = (prompts * rows)[:rows]
    g = torch.Generator().manual_seed(0)
    prompt_ids, prompt_mask = policy.encode_prompts(prompts)
    vocab = policy.model.config.vocab_size
    batch = RolloutBatch(prompt_ids=prompt_ids, prompt_mask=prompt_mask,
                         completion_ids=torch.randint(3, vocab, (rows, length), generator=g),
                         completion_mask=torch.ones(rows, length, dtype=torch.long),
                         group_ids=torch.arange(rows) // 8, rewards=torch.zeros(rows),
                         truncated=torch.zeros(rows, dtype=torch.bool))
    batch.advantages = torch.randn(rows, 1, generator=g).expand(rows, length).clone()
    batch.sample_logprobs = torch.full((rows, length), -3.0)
    learner = build_learner(policy, r)

    def loss_fn(micro_b, mini, _p, _j):
        return micro_batch_loss(policy, micro_b, r.loss, totals(mini, r.loss, length), 1.0, True, [], mini)

    before = _rss_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM: the peak from here on
    for _ in range(steps):
        learner.optimise(batch, loss_fn, micro_batch_size=micro)
    peak = _rss_kib("VmHWM")
    trainable = sum(p.numel() for p in policy.model.parameters() if p.requires_grad)
    return {"arm": arm, "model": model, "rank": rank, "rows": rows, "length": length, "steps": steps,
            "peak_mib": round((peak - before) / 1024, 1), "rss_before_mib": round(before / 1024, 1),
            "trainable_params": trainable}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny", help="tiny, or a model path/alias (smollm2-135m)")
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--length", type=int, default=32)
    ap.add_argument("--micro", type=int, default=64)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--out", default="")
    ap.add_argument("--one", default="", help=argparse.SUPPRESS)  # internal: run one arm in this process
    a = ap.parse_args(argv)
    if a.one:
        print(json.dumps(run_arm(a.one, a.model, a.rank, a.rows, a.length, a.micro, a.steps)))
        return 0
    results = []
    for arm in a.arms.split(","):
        cmd = [sys.executable, __file__, "--one", arm, "--model", a.model, "--rank", str(a.rank), "--rows", str(a.rows),
               "--length", str(a.length), "--micro", str(a.micro), "--steps", str(a.steps)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = next((x["peak_mib"] for x in results if x["arm"] == "adamw"), None)
    print(f"{'arm':8} {'peak MiB':>10} {'vs adamw':>9} {'trainable':>12}   ({a.model}, rank {a.rank}, "
          f"{a.rows}x{a.length} tokens, {a.steps} steps)")
    for x in results:
        rel = f"{100 * (x['peak_mib'] / base - 1):+.1f}%" if base else "-"
        print(f"{x['arm']:8} {x['peak_mib']:>10} {rel:>9} {x['trainable_params']:>12}")
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
