"""Greedy held-out gain of GRPO runs over their base model, seeds pooled (issue 10, item 6).

Reads each run's ``summary.json`` (the base and final greedy outcome of every held-out
problem) and reports per seed base → final accuracy, the mean gain ± sd over seeds, and a
95% two-level bootstrap interval of the mean gain (seeds, then problems), paired per
problem: a run's value is its per-problem ``final − base`` and the bootstrap is
``reasonrl.evaluate.stats.bootstrap_diff`` of those against 0.

``--lenient`` also separates the answer format from the arithmetic: it re-evaluates the
base model and each final model greedily and counts a completion correct when its first
(or its last) integer equals the reference answer, tags or not (only for tasks whose
answers are integers): "a + b = c" answers hold c last, a bare "c" first and last.

    .venv/bin/python benchmarks/smollm2_gain.py RUN_DIR [RUN_DIR ...] [--lenient] [--json OUT]

The last line is machine-readable: ``smollm2_gain=<mean> ci_low=<lo> ci_high=<hi>``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

import numpy as np

from reasonrl.evaluate.stats import bootstrap_diff

INT_RE = re.compile(r"-?\d+")


def load(run: Path) -> dict:
    summary = json.loads((run / "summary.json").read_text())
    base = summary["base_eval_per_problem"]["accuracy"]
    final = summary["final_eval_per_problem"]["accuracy"]
    if len(base) != len(final):
        raise SystemExit(f"{run}: base and final evaluated {len(base)} and {len(final)} problems")
    return {"run": str(run), "base": float(np.mean(base)), "final": float(np.mean(final)),
            "gains": [f - b for f, b in zip(final, base)], "wall_s": summary.get("wall_seconds"),
            "steps": summary.get("steps")}


def lenient_accuracy(model: str, run: Path) -> tuple[float, float, float]:
    """(strict, first-integer, last-integer) greedy accuracy of ``model`` on ``run``'s held-out problems."""
    from reasonrl.config import load_recipe
    from reasonrl.evaluate.accuracy import greedy_texts
    from reasonrl.evaluate.evaluator import Evaluator
    from reasonrl.policy.factory import load_for_eval
    from reasonrl.train.trainer import build_task

    recipe = load_recipe(run / "recipe.json")
    evaluator = Evaluator(recipe, build_task(recipe))
    policy = load_for_eval(model)
    strict = first = last = 0
    problems = evaluator.problems
    texts = greedy_texts(policy, problems, evaluator.budget, evaluator.cfg.batch_size, evaluator.stop)
    for text, problem in zip(texts, problems):
        strict += evaluator.is_correct(text, problem)
        numbers = INT_RE.findall(text)
        first += bool(numbers) and numbers[0] == problem.answer.strip()
        last += bool(numbers) and numbers[-1] == problem.answer.strip()
    return strict / len(problems), first / len(problems), last / len(problems)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--lenient", action="store_true", help="also count untagged correct answers")
    ap.add_argument("--json", type=Path, help="write the numbers here")
    args = ap.parse_args()
    rows = [load(run) for run in args.runs]
    for row in rows:
        print(f"{row['run']}: {row['base']:.3f} -> {row['final']:.3f}  gain {row['final'] - row['base']:+.3f}"
              f"  ({row['steps']} steps, {row['wall_s']:.0f} s)")
    gains = [row["final"] - row["base"] for row in rows]
    low, high = bootstrap_diff([row["gains"] for row in rows], [0.0], num_resamples=4000)
    sd = statistics.stdev(gains) if len(gains) > 1 else float("nan")
    print(f"gain {statistics.mean(gains):+.3f} ± {sd:.3f} over {len(rows)} seeds, "
          f"95% two-level bootstrap [{low:+.3f}, {high:+.3f}]")
    result = {"runs": rows, "gain_mean": statistics.mean(gains), "gain_sd": sd, "ci": [low, high]}
    if args.lenient:
        recipe_model = json.loads((args.runs[0] / "recipe.json").read_text())["model"]["path"]
        result["lenient"] = {"base": lenient_accuracy(recipe_model, args.runs[0])}
        for run in args.runs:
            result["lenient"][str(run)] = lenient_accuracy(str(run), run)
        for name, (strict, first, last) in result["lenient"].items():
            print(f"{name}: strict {strict:.3f}, any format: first integer {first:.3f}, last integer {last:.3f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(f"smollm2_gain={statistics.mean(gains):.4f} ci_low={low:.4f} ci_high={high:.4f}")


if __name__ == "__main__":
    main()
