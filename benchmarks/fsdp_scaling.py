"""1 vs N learner ranks on one machine: training tokens/s and peak memory per rank (issue 30, item 4).

Runs the same recipe (default: ``recipes/smollm2_arithmetic.yaml``, SmolLM2-135M full fine-tuning)
for a few steps as one process and as ``--nproc`` ranks (``reasonrl train --nproc N``: FSDP2 over
gloo on CPUs), arms interleaved over ``--repeats``, and reports per arm the median training tokens/s
(``perf/train_tokens_per_s``: forward + backward + optimiser of the learner, steps after the first),
the median step time, and the peak resident memory of each rank (VmHWM of each rank's process,
read from /proc while it runs), plus the learner state each rank holds by construction (weights,
gradients and AdamW's two moments of its shard, fp32). The ratio N ranks / 1 process comes from the
same run, so machine noise hits both arms.

    .venv/bin/python benchmarks/fsdp_scaling.py [--recipe R] [--nproc 2] [--steps 4] [--repeats 2]

The last line is machine-readable: ``fsdp_scaling {json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def peak_rss_by_rank(proc: subprocess.Popen, peaks: dict[str, int], nproc: int) -> None:
    """Poll the processes of a run until it ends: each rank's VmHWM (kB), keyed by its RANK
    (``single``: the one process; ``launcher``: the `reasonrl train --nproc N` that starts torchrun)."""
    while proc.poll() is None:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                if b"reasonrl.cli" not in cmd or b"torch.distributed.run" in cmd:
                    continue
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            rank = next((e.split(b"=")[1].decode() for e in env if e.startswith(b"RANK=")),
                        "launcher" if nproc > 1 else "single")
            hwm = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM"))
            peaks[rank] = max(peaks.get(rank, 0), hwm)
        time.sleep(0.2)


def run_arm(recipe: str, nproc: int, steps: int, out: Path) -> dict:
    cmd = [sys.executable, "-m", "reasonrl.cli", "train", recipe, "-o", str(out), "--nproc", str(nproc),
           "--set", f"train.steps={steps}", "--set", f"train.checkpoint_every={steps}", "--set", "eval.size=0",
           "--set", "log.progress=false", "--set", "log.plots=false"]
    # Each rank gets an equal share of the cores (torchrun would give each one thread otherwise).
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // nproc))}
    peaks: dict[str, int] = {}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    watcher = threading.Thread(target=peak_rss_by_rank, args=(proc, peaks, nproc), daemon=True)
    watcher.start()
    _, err = proc.communicate()
    watcher.join()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{err[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "perf/train_tokens_per_s" in r][1:]  # the first step warms up
    return {"train_tokens_per_s": statistics.median(r["perf/train_tokens_per_s"] for r in rows),
            "step_s": statistics.median(r["perf/step_s"] for r in rows),
            "peak_rss_mb": {k: round(v / 1024) for k, v in sorted(peaks.items())}}


def learner_state_mb(recipe: str, nproc: int) -> float:
    """MiB of fp32 weights + gradients + AdamW moments in one rank's shard (4 copies of numel/N)."""
    from reasonrl.config import load_recipe
    from reasonrl.policy.factory import build_policy

    policy = build_policy(load_recipe(recipe).model)
    numel = sum(p.numel() for p in policy.parameters())
    return round(4 * 4 * numel / nproc / 2**20, 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", default=str(ROOT / "recipes" / "smollm2_arithmetic.yaml"))
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    arms: dict[int, list[dict]] = {1: [], args.nproc: []}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for n in (1, args.nproc) if rep % 2 == 0 else (args.nproc, 1):
                result = run_arm(args.recipe, n, args.steps, Path(tmp) / f"n{n}-{rep}")
                arms[n].append(result)
                print(f"nproc={n} repeat {rep}: {result}", flush=True)
    summary = {"recipe": Path(args.recipe).name, "steps": args.steps, "repeats": args.repeats}
    for n, results in arms.items():
        summary[f"nproc{n}"] = {
            "train_tokens_per_s": round(statistics.median(r["train_tokens_per_s"] for r in results), 1),
            "step_s": round(statistics.median(r["step_s"] for r in results), 2),
            "peak_rss_mb": {k: max(r["peak_rss_mb"].get(k, 0) for r in results) for k in results[0]["peak_rss_mb"]},
            "learner_state_mb_per_rank": learner_state_mb(args.recipe, n),
        }
    summary["tokens_per_s_ratio"] = round(summary[f"nproc{args.nproc}"]["train_tokens_per_s"]
                                          / summary["nproc1"]["train_tokens_per_s"], 3)
    for n in arms:
        s = summary[f"nproc{n}"]
        print(f"{n} rank(s): {s['train_tokens_per_s']:8.1f} train tokens/s  step {s['step_s']:6.2f}s  "
              f"peak RSS {s['peak_rss_mb']} MiB  learner state/rank {s['learner_state_mb_per_rank']} MiB")
    print(f"tokens/s ratio {args.nproc} ranks / 1 process: {summary['tokens_per_s_ratio']}")
    print("fsdp_scaling " + json.dumps(summary))


if __name__ == "__main__":
    main()
