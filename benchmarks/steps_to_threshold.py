"""Steps to a held-out accuracy threshold, per run and over seeds, with intervals.

    .venv/bin/python benchmarks/steps_to_threshold.py RUNS/grpo-s{1,2,3} RUNS/bot_grpo-s{1,2,3} \\
        --baseline grpo --threshold 0.8 [--key eval/accuracy] [--sustain 1] [--out steps.json]

For each run folder: the first step whose evaluation (``KEY`` in ``metrics.jsonl``; step 0 is the
base evaluation, the last step the final one) is ≥ the threshold. ``--sustain K`` asks instead
for the first evaluation from which K consecutive evaluations are all ≥ the threshold, which is
less sensitive to one lucky evaluation (200 problems at accuracy 0.8 have a standard error of
0.028). The resolution is the run's ``eval.every``: a crossing between two evaluations is
reported at the later one, so use a fine schedule (``--set eval.every=5``).

Runs are grouped into arms by their folder name without its seed suffix (``bot_grpo-s1`` →
``bot_grpo``, as ``reasonrl report`` names groups). Per arm: the steps, mean ± sd and a 95%
Student-t interval of the mean (df = n − 1). Against ``--baseline``: the difference of means with
Welch's interval (Welch–Satterthwaite df) and p-value, and a percentile bootstrap interval over
seeds (``reasonrl.evaluate.stats.bootstrap_diff``; with 3 seeds it has few distinct resamples,
so read the t interval beside it).

A run that never reaches the threshold is **censored**: it enters the statistics at its last
evaluated step, a lower bound of its true value, and is counted in ``censored``. Censoring in the
baseline makes a "sooner" difference look smaller (conservative for the method); censoring in
the method arm makes it look larger, and the table says so.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from reasonrl.evaluate.stats import bootstrap_diff, student_t_cdf, welch_t_test
from reasonrl.metrics_log import read_metrics

_SEED_SUFFIX = re.compile(r"([-_.]?(seed|s)\d+)$", re.IGNORECASE)  # as reasonrl.evaluate.runs groups runs


@dataclass
class Crossing:
    run: str
    step: int | None
    """First step at the threshold (None: never reached)."""
    last_step: int
    """The last evaluated step (where a censored run enters the statistics)."""
    evaluations: int

    @property
    def censored(self) -> bool:
        return self.step is None

    @property
    def value(self) -> int:
        return self.last_step if self.step is None else self.step


def evaluations(rows: Sequence[dict[str, Any]], key: str = "eval/accuracy") -> list[tuple[int, float]]:
    """(step, value) of every evaluation in step order; a step logged twice keeps its last value
    (the trainer writes the final evaluation as its own row at the last step)."""
    by_step: dict[int, float] = {}
    for row in rows:
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            by_step[int(row["step"])] = float(value)
    return sorted(by_step.items())


def first_step_reaching(points: Sequence[tuple[int, float]], threshold: float, sustain: int = 1) -> int | None:
    """The first step s of ``points`` (sorted (step, value)) such that the evaluation at s and the
    next ``sustain − 1`` evaluations are all ≥ ``threshold``; None if there is none. A run whose
    last evaluations are above the threshold but fewer than ``sustain`` is not counted as there."""
    if sustain < 1:
        raise ValueError(f"sustain must be >= 1, got {sustain}")
    for i in range(len(points) - sustain + 1):
        if all(v >= threshold for _, v in points[i:i + sustain]):
            return points[i][0]
    return None


def crossing(run_dir: Path, threshold: float, key: str = "eval/accuracy", sustain: int = 1) -> Crossing:
    points = evaluations(read_metrics(run_dir), key)
    if not points:
        raise ValueError(f"{run_dir}: no '{key}' in metrics.jsonl (was eval.every set?)")
    return Crossing(Path(run_dir).name, first_step_reaching(points, threshold, sustain), points[-1][0], len(points))


def arm_of(run_dir: Path) -> str:
    name = Path(run_dir).name
    return _SEED_SUFFIX.sub("", name) or name


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with ``df`` degrees of freedom, by bisection on
    ``student_t_cdf`` (scipy.stats.t.ppf); e.g. 0.975 at df 2 is 4.3027."""
    if not 0.0 < p < 1.0 or not df > 0:
        raise ValueError(f"need 0 < p < 1 and df > 0, got p={p}, df={df}")
    low, high = -1.0, 1.0
    while student_t_cdf(low, df) > p:
        low *= 2.0
    while student_t_cdf(high, df) < p:
        high *= 2.0
    for _ in range(200):
        mid = (low + high) / 2.0
        low, high = (mid, high) if student_t_cdf(mid, df) < p else (low, mid)
        if high - low < 1e-12 * max(1.0, abs(mid)):
            break
    return (low + high) / 2.0


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float, float]:
    """(mean, sd, low, high): the Student-t interval mean ± t_{(1+c)/2, n−1} · sd/√n (NaN bounds
    for fewer than 2 values)."""
    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return mean, math.nan, math.nan, math.nan
    sd = statistics.stdev(values)
    half = t_quantile((1.0 + confidence) / 2.0, n - 1) * sd / math.sqrt(n)
    return mean, sd, mean - half, mean + half


def welch_interval(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float, float]:
    """(difference of means a − b, low, high, p): Welch's interval with the Welch–Satterthwaite
    df and its two-sided p (:func:`welch_t_test`). With no spread in either sample the interval is
    the point and p is NaN."""
    diff = statistics.fmean(a) - statistics.fmean(b)
    t, df, p = welch_t_test(a, b)
    se2 = statistics.variance(a) / len(a) + statistics.variance(b) / len(b)
    if se2 == 0.0:
        return diff, diff, diff, math.nan
    half = t_quantile((1.0 + confidence) / 2.0, df) * math.sqrt(se2)
    return diff, diff - half, diff + half, p


def summarise(crossings: dict[str, list[Crossing]], baseline: str | None, confidence: float = 0.95,
              resamples: int = 2000, seed: int = 0) -> list[dict[str, Any]]:
    """One row per arm: its runs' steps, mean ± sd, t interval, censored count and, against the
    baseline arm, the difference with Welch's and the bootstrap interval."""
    if baseline is not None and baseline not in crossings:
        raise ValueError(f"--baseline '{baseline}' is not an arm; the arms are: {', '.join(crossings)}")
    rows = []
    base = [c.value for c in crossings[baseline]] if baseline is not None else None
    for arm, runs in crossings.items():
        values = [float(c.value) for c in runs]
        mean, sd, low, high = mean_interval(values, confidence)
        row: dict[str, Any] = {"arm": arm, "runs": [asdict(c) for c in runs], "steps": [c.step for c in runs],
                               "censored": sum(c.censored for c in runs), "mean": mean, "sd": sd,
                               "ci_low": low, "ci_high": high}
        if base is not None and arm != baseline:
            row["diff"] = mean - statistics.fmean(base)
            if len(values) >= 2 and len(base) >= 2:
                _, row["welch_low"], row["welch_high"], row["p"] = welch_interval(values, base, confidence)
            row["boot_low"], row["boot_high"] = bootstrap_diff(values, base, num_resamples=resamples, seed=seed,
                                                               confidence=confidence)
        rows.append(row)
    return rows


def _num(x: float | None, fmt: str = "{:.1f}") -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def table(rows: list[dict[str, Any]], threshold: float, baseline: str | None) -> str:
    lines = [f"| arm | first step ≥ {threshold:g} per seed | mean ± sd | 95% t interval | "
             f"difference vs {baseline or '—'} | Welch 95% interval | p | bootstrap 95% interval |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        steps = " / ".join("never" if s is None else str(s) for s in r["steps"])
        lines.append(
            f"| {r['arm']} | {steps} | {_num(r['mean'])} ± {_num(r['sd'])} | [{_num(r['ci_low'])}, {_num(r['ci_high'])}] | "
            f"{_num(r.get('diff'), '{:+.1f}')} | "
            + (f"[{_num(r['welch_low'], '{:+.1f}')}, {_num(r['welch_high'], '{:+.1f}')}]" if "welch_low" in r else "—")
            + f" | {_num(r.get('p'), '{:.3f}')} | "
            + (f"[{_num(r['boot_low'], '{:+.1f}')}, {_num(r['boot_high'], '{:+.1f}')}]" if "boot_low" in r else "—")
            + " |")
    notes = [r["arm"] for r in rows if r["censored"]]
    if notes:
        lines.append("")
        lines.append("Censored (never reached; counted at the last evaluated step, a lower bound): "
                     + ", ".join(f"{r['arm']} {r['censored']} of {len(r['steps'])}" for r in rows if r["censored"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run folders, named <arm>-s<seed>")
    ap.add_argument("--threshold", type=float, default=0.8)
    ap.add_argument("--key", default="eval/accuracy")
    ap.add_argument("--sustain", type=int, default=1, help="consecutive evaluations that must be at the threshold")
    ap.add_argument("--baseline", help="the arm the others are compared with")
    ap.add_argument("--confidence", type=float, default=0.95)
    ap.add_argument("--bootstrap", type=int, default=2000)
    ap.add_argument("--out", type=Path, help="also write the rows as JSON")
    a = ap.parse_args(argv)
    crossings: dict[str, list[Crossing]] = {}
    for run in a.runs:
        crossings.setdefault(arm_of(run), []).append(crossing(run, a.threshold, a.key, a.sustain))
    try:
        rows = summarise(crossings, a.baseline, a.confidence, a.bootstrap)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(table(rows, a.threshold, a.baseline))
    if a.out:
        a.out.write_text(json.dumps({"threshold": a.threshold, "key": a.key, "sustain": a.sustain,
                                     "baseline": a.baseline, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
