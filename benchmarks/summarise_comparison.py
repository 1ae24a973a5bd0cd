"""Markdown tables for the method-vs-baseline runs of ``benchmarks/compare_methods.sh``.

    .venv/bin/python benchmarks/summarise_comparison.py runs/compare grpo grpo_dropout bot_grpo ...

For each run group (``<name>-s<seed>``) it prints the held-out metrics before training →
their final mean ± sd over seeds and of training-curve statistics that the issue's claims are about:
entropy late in training, rollouts used per update, the first step at which held-out
accuracy reaches a threshold.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from reasonrl.metrics_log import read_metrics

from summarise_runs import mean_sd  # this folder: run as a script, benchmarks/ is on sys.path


def _late_mean(rows, key, last=100):
    values = [r[key] for r in rows if isinstance(r.get(key), (int, float)) and "reward/mean" in r]
    return statistics.mean(values[-last:]) if values else None


def _first_step_reaching(rows, key, threshold):
    for r in rows:
        if isinstance(r.get(key), (int, float)) and r[key] >= threshold:
            return r["step"]
    return None


def summarise(root: Path, group: str, final_keys: list[str], threshold: float) -> dict[str, str]:
    runs = sorted(p for p in root.glob(f"{group}-s*") if (p / "summary.json").is_file())
    finals = [json.loads((p / "summary.json").read_text()) for p in runs]
    rows = [read_metrics(p) for p in runs]
    out = {"runs": str(len(runs))}
    for key in final_keys:
        before = mean_sd([f["base_eval"].get(key) for f in finals]).split(" ± ")[0]
        out[key] = f"{before} → {mean_sd([f['final_eval'].get(key) for f in finals])}"
    out["entropy (last 100 steps)"] = mean_sd([_late_mean(r, "entropy") for r in rows])
    out["sampling −log p (last 100)"] = mean_sd([_late_mean(r, "rollout/neg_logprob") for r in rows])
    out["rows per update"] = mean_sd([_late_mean(r, "train/rows", last=10**9) for r in rows])
    reached = [_first_step_reaching(r, "eval/accuracy", threshold) for r in rows]
    out[f"first step with accuracy ≥ {threshold}"] = ", ".join("never" if s is None else str(s) for s in reached)
    out["wall s"] = mean_sd([f.get("wall_seconds") for f in finals])
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root", type=Path)
    parser.add_argument("groups", nargs="+")
    parser.add_argument("--final", nargs="+", default=["accuracy"], help="final_eval keys to tabulate")
    parser.add_argument("--threshold", type=float, default=0.8)
    args = parser.parse_args()
    table = {g: summarise(args.root, g, args.final, args.threshold) for g in args.groups}
    keys = list(next(iter(table.values())))
    print("| metric | " + " | ".join(args.groups) + " |")
    print("|---|" + "---|" * len(args.groups))
    for key in keys:
        print(f"| {key} | " + " | ".join(table[g][key] for g in args.groups) + " |")


if __name__ == "__main__":
    main()
