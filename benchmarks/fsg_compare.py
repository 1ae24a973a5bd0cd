"""FSG-RL vs GRPO on held-out (docs/methods/fsg_rl.md): final-answer accuracy (each run's own
final eval, ``fsg_answer``) and full-solution success, mean ± sd over seeds, and exact McNemar
tests on the paired per-problem outcomes (pooled over seeds) against the SFT start and between
the arms. The runs are RUNS/fsg_rl-s<seed> and RUNS/fsg_grpo-s<seed>; the full-success files
come from ``reasonrl eval`` (EVALS/<run name>.json, and EVALS/fsg_base.json for the warmed-up
model)::

    reasonrl eval --model RUNS/fsg_rl-s1 --task function_graph --task-param careless_fraction=0.5 \\
        --reward fsg_full_success --size 200 --n 1 --temperature 0 --max-new-tokens 160 -o EVALS/fsg_rl-s1.json
    python benchmarks/fsg_compare.py RUNS EVALS

Pooling over seeds pairs each held-out problem three times (once per seed), so the p-values
treat the seeds' outcomes as independent pairs: read them as indicative, not exact.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

ARMS = ("fsg_rl", "fsg_grpo")


def mcnemar(first: list[int], second: list[int]) -> tuple[int, int, float]:
    """(first right only, second right only, exact two-sided p): the binomial test of the discordant pairs."""
    n01 = sum(1 for x, y in zip(first, second) if x and not y)
    n10 = sum(1 for x, y in zip(first, second) if y and not x)
    n = n01 + n10
    if n == 0:
        return n01, n10, 1.0
    tail = sum(math.comb(n, i) for i in range(min(n01, n10) + 1)) / 2 ** n
    return n01, n10, min(1.0, 2 * tail)


def full_success(evals: Path, name: str) -> list[int]:
    result = json.loads((evals / f"{name}.json").read_text())["function_graph"]
    return [int(p["correct"]) for p in result["per_problem"]]


def final_answer(runs: Path, name: str, which: str = "final") -> list[int]:
    summary = json.loads((runs / name / "summary.json").read_text())
    return [int(v) for v in summary[f"{which}_eval_per_problem"]["accuracy"]]


def mean_sd(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {sd:.3f} {[round(v, 3) for v in values]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path)
    ap.add_argument("evals", type=Path)
    args = ap.parse_args()
    runs, evals = args.runs, args.evals
    seeds = [s for s in (1, 2, 3) if all((evals / f"{arm}-s{s}.json").exists() for arm in ARMS)]
    base_full = full_success(evals, "fsg_base")
    base_answer = final_answer(runs, f"fsg_rl-s{seeds[0]}", "base")
    print(f"seeds {seeds}; SFT start: final answer {statistics.mean(base_answer):.3f}, "
          f"full success {statistics.mean(base_full):.3f}")
    for arm in ARMS:
        answers = [statistics.mean(final_answer(runs, f"{arm}-s{s}")) for s in seeds]
        fulls = [statistics.mean(full_success(evals, f"{arm}-s{s}")) for s in seeds]
        print(f"{arm}: final answer {mean_sd(answers)}; full success {mean_sd(fulls)}")
    for metric, get, base in (("final answer", lambda n: final_answer(runs, n), base_answer),
                              ("full success", lambda n: full_success(evals, n), base_full)):
        pairs = {"fsg_rl vs SFT": ([], []), "fsg_grpo vs SFT": ([], []), "fsg_rl vs fsg_grpo": ([], [])}
        for s in seeds:
            rl, grpo = get(f"fsg_rl-s{s}"), get(f"fsg_grpo-s{s}")
            for key, (x, y) in (("fsg_rl vs SFT", (rl, base)), ("fsg_grpo vs SFT", (grpo, base)),
                                ("fsg_rl vs fsg_grpo", (rl, grpo))):
                pairs[key][0].extend(x)
                pairs[key][1].extend(y)
        for key, (x, y) in pairs.items():
            n01, n10, p = mcnemar(x, y)
            print(f"McNemar {metric}, {key}: first right only {n01}, second right only {n10}, p = {p:.3g}")


if __name__ == "__main__":
    main()
