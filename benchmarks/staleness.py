"""The staleness test bed: the quickstart recipe at simulated staleness k, uncorrected and
with each off-policy correction, 3 seeds each; final held-out accuracy mean ± sd and a
``reasonrl report`` with statistics against the on-policy run (k = 0).

    .venv/bin/python benchmarks/staleness.py OUT                      # the full grid (hours on 2 cores)
    .venv/bin/python benchmarks/staleness.py OUT --steps 100 --ks 0 2 8 --corrections none tis decoupled_ppo

``rollout.simulated_staleness: k`` samples every batch with the weights of exactly k
optimiser versions ago (deterministic, so differences are the corrections', not timing's).
"Uncorrected" is ``off_policy: {name: none}``: the update of no correction, with every
``offpolicy/*`` metric logged. At k = 0 every correction's weights are 1, so only the
uncorrected run is trained there. Runs that finished are skipped, so the script can be
restarted; one run at a time (each uses both cores). The last line is machine-readable:
``staleness <k>/<correction>=<mean accuracy>`` for every cell.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "grpo.yaml"
CORRECTIONS = {
    "none": {"name": "none"},
    "tis": {"name": "tis", "level": "token", "cap": 2.0},
    "mis": {"name": "mis", "level": "token", "cap": 2.0},
    "decoupled_ppo": {"name": "decoupled_ppo", "cap": 5.0},
    "behaviour_ppo": {"name": "behaviour_ppo"},
}


def cells(ks: list[int], corrections: list[str]) -> list[tuple[int, str]]:
    return [(k, c) for k in ks for c in corrections if k > 0 or c == "none"]


def run(out: Path, k: int, correction: str, seed: int, steps: int | None) -> Path:
    run_dir = out / f"k{k}-{correction}-s{seed}"
    if (run_dir / "summary.json").exists():
        print(f"skip {run_dir.name}", flush=True)
        return run_dir
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    sets = [f"train.seed={seed}", f"rollout.simulated_staleness={k}",
            f"off_policy={json.dumps(CORRECTIONS[correction])}", "log.progress=false"]
    if steps:
        sets += [f"train.steps={steps}", f"eval.every={max(steps // 4, 1)}"]
    command = [sys.executable, "-m", "reasonrl.cli", "train", str(RECIPE), "-o", str(run_dir)]
    for s in sets:
        command += ["--set", s]
    start = time.perf_counter()
    with open(out / f"{run_dir.name}.log", "w") as log:
        done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT)
    status = "done" if done.returncode == 0 else f"FAILED (exit {done.returncode}, see {run_dir.name}.log)"
    print(f"{status} {run_dir.name} in {time.perf_counter() - start:.0f}s", flush=True)
    return run_dir


def final(run_dir: Path, key: str) -> float | None:
    path = run_dir / "summary.json"
    return json.loads(path.read_text())["final_eval"].get(key) if path.exists() else None


def late(run_dir: Path, key: str) -> float | None:
    from reasonrl.train.metrics import read_metrics

    values = [r[key] for r in read_metrics(run_dir) if isinstance(r.get(key), (int, float))] if run_dir.exists() else []
    return statistics.mean(values[-20:]) if values else None


def mean_sd(values: list[float | None]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "—"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {sd:.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--ks", type=int, nargs="+", default=[0, 1, 2, 4, 8])
    parser.add_argument("--corrections", nargs="+", default=list(CORRECTIONS), choices=list(CORRECTIONS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=None, help="shorten every run (default: the recipe's)")
    parser.add_argument("--no-train", action="store_true", help="only summarise the runs in OUT")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    grid = cells(args.ks, args.corrections)
    if not args.no_train:
        for seed in args.seeds:  # seed-major: a partial grid still has every cell
            for k, correction in grid:
                run(args.out, k, correction, seed, args.steps)

    print("\n| k | correction | final accuracy | KL(μ‖π) late | IS weight max late | masked/truncated late |")
    print("|---|---|---|---|---|---|")
    line = []
    for k, correction in grid:
        dirs = [args.out / f"k{k}-{correction}-s{s}" for s in args.seeds]
        acc = [final(d, "accuracy") for d in dirs]
        cut = [(late(d, "offpolicy/masked_fraction") or 0) + (late(d, "offpolicy/truncated_fraction") or 0)
               for d in dirs if d.exists()]
        print(f"| {k} | {correction} | {mean_sd(acc)} | {mean_sd([late(d, 'offpolicy/kl_behaviour') for d in dirs])} "
              f"| {mean_sd([late(d, 'offpolicy/is_weight_max') for d in dirs])} | {mean_sd(cut)} |")
        got = [a for a in acc if a is not None]
        if got:
            line.append(f"staleness_{k}/{correction}={statistics.mean(got):.4f}")
    finished = [d for d in sorted(args.out.iterdir()) if (d / "summary.json").exists()]
    if finished and any(d.name.startswith("k0-none-") for d in finished):
        subprocess.run([sys.executable, "-m", "reasonrl.cli", "report", *map(str, finished), "-o",
                        str(args.out / "report.html"), "--baseline", "k0-none"], check=False)
    print(" ".join(line))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
