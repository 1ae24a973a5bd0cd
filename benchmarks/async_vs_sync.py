"""Synchronous vs asynchronous rollouts, same recipe and number of sampled completions.

    .venv/bin/python benchmarks/async_vs_sync.py [--tiny-steps 40] [--smollm2-steps 12] [--repeats 1]

For the embedded model (the quickstart recipe) and for SmolLM2-135M-Instruct
(``recipes/smollm2_grpo.yaml``, the recipe that teaches it), in one run: ``rollout.source: sync``, then ``async``
at ``max_staleness`` 1 and 2. Each run trains the same number of steps on the same number of
sampled completions, without held-out evaluation (accuracy at staleness 1 is measured over 3
seeds by the full quickstart runs, see docs/async.md). Reported per run: the run's wall time
(model loading included: the async sampler process loads its own copy), trained tokens per
second (completion tokens trained on ÷ that time) and the ratio to the synchronous run. On 2 cores the sync run's sampler and
learner each get both threads in turn; the async run gives each one thread, concurrently.

The last line is machine-readable:
``async_speedup_smollm2=<x> async_speedup_tiny=<y>`` (the better of staleness 1 and 2).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = {
    "tiny": (ROOT / "recipes" / "grpo.yaml", ["eval.size=0", "eval.every=0"]),
    "smollm2": (ROOT / "recipes" / "smollm2_grpo.yaml", ["eval.size=0", "eval.every=0"]),
}
MODES = {
    "sync": [],
    "async_k1": ["rollout.source=async", "rollout.max_staleness=1"],
    "async_k2": ["rollout.source=async", "rollout.max_staleness=2"],
}


def train(recipe: Path, sets: list[str], run_dir: Path) -> dict[str, float]:
    command = [sys.executable, "-m", "reasonrl.cli", "train", str(recipe), "-o", str(run_dir),
               "--set", "log.progress=false", "--set", "log.plots=false"]
    for s in sets:
        command += ["--set", s]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    from reasonrl.metrics_log import read_metrics

    rows = [r for r in read_metrics(run_dir) if "perf/step_s" in r]
    summary = json.loads((run_dir / "summary.json").read_text())
    seconds = summary["wall_seconds"]
    tokens = sum(r.get("response_length/mean", 0.0) * r.get("train/rows", 0) for r in rows)
    stale = [r.get("offpolicy/staleness_mean", 0.0) for r in rows]
    return {"seconds": seconds, "tokens_per_s": tokens / max(seconds, 1e-9), "steps": len(rows),
            "staleness_mean": sum(stale) / max(len(stale), 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny-steps", type=int, default=40)
    parser.add_argument("--smollm2-steps", type=int, default=12)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--repeats", type=int, default=1, help="runs per mode (the median time is kept)")
    args = parser.parse_args()
    steps = {"tiny": args.tiny_steps, "smollm2": args.smollm2_steps}
    speedups = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            recipe, sets = MODELS[model]
            results = {}
            for mode, extra in MODES.items():
                times = []
                for rep in range(args.repeats):
                    run_dir = Path(tmp) / f"{model}-{mode}-{rep}"
                    times.append(train(recipe, [*sets, f"train.steps={steps[model]}", *extra], run_dir))
                times.sort(key=lambda t: t["seconds"])
                results[mode] = times[len(times) // 2]
            base = results["sync"]
            print(f"\n{model}: {steps[model]} steps of {recipe.name}")
            print(f"  {'mode':<10} {'wall s':>8} {'tokens/s':>10} {'ratio':>7} {'staleness':>10}")
            for mode, res in results.items():
                ratio = res["tokens_per_s"] / max(base["tokens_per_s"], 1e-9)
                print(f"  {mode:<10} {res['seconds']:>8.1f} {res['tokens_per_s']:>10.1f} {ratio:>7.2f} "
                      f"{res['staleness_mean']:>10.2f}")
            speedups[model] = max(results[m]["tokens_per_s"] for m in ("async_k1", "async_k2")) / base["tokens_per_s"]
    print(" ".join(f"async_speedup_{m}={speedups[m]:.2f}" for m in args.models))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
