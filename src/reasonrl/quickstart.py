"""The quickstart: embedded model, GRPO on the arithmetic task, before/after table.

The warm-up data teaches a systematic mistake (bracketed problems solved as
if the brackets were absent). More supervised training on that data keeps
the mistake; GRPO with a 0/1 answer reward removes much of it, because about
a third of the sampled solutions still take the right order and the reward
tells them apart.
"""

from __future__ import annotations

import sys
from pathlib import Path

from reasonrl.config import load_recipe

QUICKSTART_RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "grpo.yaml"
# The recipe as it is, with rows that carry no gradient left out of the learner's passes: the same
# update in ~45% less learner time (docs/scaling.md, "Rows without advantage"). Not in the recipe
# itself: its runs are the baseline of the method comparisons, whose token statistics (entropy)
# average over every row.
QUICKSTART_OVERRIDES = ("train.skip_zero_advantage=true",)


def format_table(summary: dict) -> str:
    base, final = summary["base_eval"], summary["final_eval"]
    width = max(len(k) for k in base) + 2
    lines = [f"{'held-out greedy':<{width}} {'before':>8} {'after':>8} {'change':>8}"]
    for key in base:
        b, f = base[key], final.get(key, float("nan"))
        lines.append(f"{key:<{width}} {b:>8.3f} {f:>8.3f} {f - b:>+8.3f}")
    return "\n".join(lines)


def quickstart(seed: int = 0, output: str = "runs/quickstart", overrides: list[str] | None = None) -> dict:
    from reasonrl.evaluate.report import write_report
    from reasonrl.train.trainer import Trainer

    recipe = load_recipe(QUICKSTART_RECIPE, [*QUICKSTART_OVERRIDES, f"train.seed={seed}", *(overrides or [])])
    run_dir = Path(output) / f"seed{seed}"
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    print(f"reasonrl quickstart: GRPO on the embedded arithmetic task (seed {seed}) -> {run_dir}", file=sys.stderr)
    summary = Trainer(recipe, run_dir).run()
    report = write_report([run_dir], run_dir / "report.html", title=f"reasonrl quickstart (seed {seed})")
    print(format_table(summary))
    print(f"\nwall time {summary['wall_seconds']:.0f}s; metrics, plots and the trained model in {run_dir}")
    print(f"report: {report}")
    return summary
