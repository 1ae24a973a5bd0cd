"""Mean ± sd over seeds of the final held-out metrics and of chosen training metrics, one
Markdown row per arm, for runs named ``<arm>_s<seed>`` (or ``<arm>-s<seed>``) in one folder.

    .venv/bin/python benchmarks/summarise_runs.py RUNS_DIR ARM [ARM ...] \\
        [--eval accuracy macro pass@1 pass@8] [--train zero_variance_group_fraction:late] \\
        [--unsolved]

- ``--eval``: keys of the final evaluation (``summary.json``); ``macro`` is the mean of the
  per-form accuracies (``accuracy[<form>]``), the macro-average correctness of TS-OPD's claim.
- ``--train KEY[:early|late|all]``: a training metric averaged over the first or last quarter
  of the steps that log it (or all of them); check that every key matches: a key no run logs
  prints "—" and a warning.
- ``--unsolved``: of the held-out problems greedy-wrong at the start, the share right at the
  end; of those right at the start, the share wrong at the end (see :func:`flips`).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

from reasonrl.metrics_log import read_metrics


def mean_sd(values: list[float]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "—"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {sd:.3f}"


def runs_of(root: Path, arm: str) -> list[Path]:
    pattern = re.compile(rf"^{re.escape(arm)}[_-]s\d+$")
    return sorted(p for p in root.iterdir() if pattern.match(p.name) and (p / "summary.json").exists())


def final_value(summary: dict, key: str) -> float | None:
    final = summary.get("final_eval") or {}
    if key == "macro":
        forms = [v for k, v in final.items() if k.startswith("accuracy[")]
        return sum(forms) / len(forms) if forms else None
    return final.get(key)


def train_value(rows: list[dict], key: str, span: str) -> float | None:
    values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    if not values:
        return None
    quarter = max(1, len(values) // 4)
    values = values[:quarter] if span == "early" else values[-quarter:] if span == "late" else values
    return sum(values) / len(values)


def flips(summary: dict) -> tuple[float | None, float | None]:
    """Greedy held-out outcomes per problem, start vs end: (share of the problems wrong at the
    start that are right at the end, share of those right at the start that are wrong at the
    end). Per-problem greedy outcomes are 0/1, so every gain is on a problem unsolved at the
    start; what differs between methods is how many of them are fixed and how many are lost."""
    before = (summary.get("base_eval_per_problem") or {}).get("accuracy")
    after = (summary.get("final_eval_per_problem") or {}).get("accuracy")
    if not before or not after:
        return None, None
    wrong = [i for i, b in enumerate(before) if b < 0.5]
    right = [i for i, b in enumerate(before) if b >= 0.5]
    fixed = sum(after[i] for i in wrong) / len(wrong) if wrong else None
    lost = sum(1 - after[i] for i in right) / len(right) if right else None
    return fixed, lost


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("arms", nargs="+")
    ap.add_argument("--eval", nargs="*", default=["accuracy", "macro", "pass@1", "pass@8"])
    ap.add_argument("--train", nargs="*", default=[])
    ap.add_argument("--unsolved", action="store_true")
    args = ap.parse_args(argv)
    train = [(t.split(":")[0], t.split(":")[1] if ":" in t else "late") for t in args.train]
    header = ["arm", "seeds", *[f"final {k}" for k in args.eval], *[f"{k} ({s})" for k, s in train]]
    if args.unsolved:
        header += ["unsolved at start → solved", "solved at start → lost"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    seen = {k: False for k, _ in train}
    for arm in args.arms:
        runs = runs_of(args.root, arm)
        if not runs:
            print(f"warning: no finished runs for '{arm}' in {args.root}", file=sys.stderr)
            continue
        summaries = [json.loads((r / "summary.json").read_text()) for r in runs]
        rows = [read_metrics(r) for r in runs]
        cells = [arm, str(len(runs))]
        cells += [mean_sd([final_value(s, k) for s in summaries]) for k in args.eval]
        for key, span in train:
            values = [train_value(r, key, span) for r in rows]
            seen[key] |= any(v is not None for v in values)
            cells.append(mean_sd(values))
        if args.unsolved:
            pairs = [flips(s) for s in summaries]
            cells += [mean_sd([p[0] for p in pairs]), mean_sd([p[1] for p in pairs])]
        print("| " + " | ".join(cells) + " |")
    for key, found in seen.items():
        if not found:
            print(f"warning: no run logs '{key}'", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
