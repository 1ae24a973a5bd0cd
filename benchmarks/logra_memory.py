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

    .venv/bin/python benchmarks/logra_memory.py --model tiny --rank 32 --repeats 3
    .venv/bin/python benchmarks/logra_memory.py --model smollm2-135m --rank 64 --rows 16 --length 64 --micro 16 --repeats 3

Every arm sees the same model, the same batch (fixed seed) and the same micro-batching. With
``--repeats R`` each arm is measured R times, each in a fresh process, the arms interleaved
(repeat i runs them in a rotated order, so a slow drift of the machine does not fall on one arm);
the table gives each arm's **median** (and min–max) and the change of the medians against AdamW
and against LoRA. A single RSS peak moves by a few percent with the allocator; the median of ≥ 3
is what to quote.

Prints a table and writes JSON (``--out``: every measurement and the medians).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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


def summarise(results: list[dict], arms: list[str]) -> dict[str, dict]:
    """Per arm: its peaks, their median, min and max, and the change of its median against the
    median of AdamW and of LoRA (when measured), in percent."""
    out = {}
    for arm in arms:
        peaks = [r["peak_mib"] for r in results if r["arm"] == arm]
        out[arm] = {"peaks_mib": peaks, "median_mib": statistics.median(peaks), "min_mib": min(peaks),
                    "max_mib": max(peaks), "trainable_params": next(r["trainable_params"] for r in results if r["arm"] == arm)}
    for arm, row in out.items():
        for ref in ("adamw", "lora"):
            if ref in out and ref != arm:
                row[f"vs_{ref}_pct"] = round(100 * (row["median_mib"] / out[ref]["median_mib"] - 1), 1)
    return out


def table(summary: dict[str, dict], a: argparse.Namespace) -> str:
    lines = [f"{a.model}, rank {a.rank}, {a.rows}x{a.length} tokens, micro-batch {a.micro}, {a.steps} steps, "
             f"median of {a.repeats}",
             f"{'arm':8} {'median MiB':>11} {'min-max':>15} {'vs adamw':>9} {'vs lora':>8} {'trainable':>12}"]
    for arm, x in summary.items():
        rel = {ref: f"{x[f'vs_{ref}_pct']:+.1f}%" if f"vs_{ref}_pct" in x else "-" for ref in ("adamw", "lora")}
        lines.append(f"{arm:8} {x['median_mib']:>11.1f} {x['min_mib']:>7.1f}-{x['max_mib']:<7.1f} {rel['adamw']:>9} "
                     f"{rel['lora']:>8} {x['trainable_params']:>12}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny", help="tiny, or a model path/alias (smollm2-135m)")
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--length", type=int, default=32)
    ap.add_argument("--micro", type=int, default=64)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--repeats", type=int, default=3, help="measurements per arm, each in a fresh process (median)")
    ap.add_argument("--out", default="")
    ap.add_argument("--one", default="", help=argparse.SUPPRESS)  # internal: run one arm in this process
    a = ap.parse_args(argv)
    if a.one:
        print(json.dumps(run_arm(a.one, a.model, a.rank, a.rows, a.length, a.micro, a.steps)))
        return 0
    if a.repeats < 1:
        ap.error("--repeats must be >= 1")
    arms = a.arms.split(",")
    results = []
    for repeat in range(a.repeats):
        for arm in arms[repeat % len(arms):] + arms[:repeat % len(arms)]:
            cmd = [sys.executable, __file__, "--one", arm, "--model", a.model, "--rank", str(a.rank),
                   "--rows", str(a.rows), "--length", str(a.length), "--micro", str(a.micro), "--steps", str(a.steps)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            results.append({**json.loads(out.stdout.strip().splitlines()[-1]), "repeat": repeat})
            print(f"  repeat {repeat + 1}/{a.repeats} {arm}: {results[-1]['peak_mib']} MiB", file=sys.stderr, flush=True)
    summary = summarise(results, arms)
    print(table(summary, a))
    if a.out:
        Path(a.out).write_text(json.dumps({"settings": {k: v for k, v in vars(a).items() if k not in ("out", "one")},
                                           "summary": summary, "measurements": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
