"""``reasonrl report --baseline NAME``: every other group's final metrics against one group's.

For each final metric and each group of runs (runs that differ only in their seed,
as :func:`reasonrl.evaluate.report.group_runs` forms them) other than the baseline:
the difference of means, a two-level bootstrap interval, Welch's t-test over seeds
and a mark where both agree. :func:`compare_to_baseline` gives the rows (which
``write_report`` renders and also writes to ``<out stem>_stats.json``). The statistics are in
:mod:`reasonrl.evaluate.stats`.
"""

from __future__ import annotations

import math
import statistics
import zlib
from typing import Any, Callable

from reasonrl.evaluate.runs import BOOTSTRAP_RESAMPLES, ReportError, Run, final_eval_keys, is_finite_number
from reasonrl.evaluate.stats import bootstrap_diff, welch_t_test

SIGNIFICANCE_LEVEL = 0.05  # the mark: Welch's p below this and the (1 − level) bootstrap interval excluding 0


def find_group(groups: list[tuple[str, list[Run]]], name: str) -> tuple[str, list[Run]]:
    """The group called ``name`` (as the report labels it), or the group of a run labelled
    ``name`` when that run is alone in its group; ``ReportError`` naming the known groups."""
    matches = [(n, m) for n, m in groups if n == name]
    if not matches:
        matches = [(n, m) for n, m in groups if len(m) == 1 and m[0].label == name]
    if len(matches) == 1:
        return matches[0]
    known = ", ".join(f"'{n}' ({len(m)} run{'s' if len(m) > 1 else ''}: {', '.join(r.label for r in m)})"
                      for n, m in groups)
    if matches:
        raise ReportError(f"--baseline '{name}' names {len(matches)} groups whose recipes differ; "
                          f"rename the run folders so that the groups' names differ (groups: {known})")
    raise ReportError(f"--baseline '{name}': no group of that name; the groups are: {known}")


def _per_problem(run: Run, key: str, value: float, warn: Callable[[str], None]) -> list[float] | None:
    """The run's per-problem values of ``key`` (``final_eval_per_problem`` in summary.json),
    when present and consistent with its final value."""
    lists = (run.summary or {}).get("final_eval_per_problem")
    values = lists.get(key) if isinstance(lists, dict) else None
    if values is None:
        return None
    if not isinstance(values, list) or not values or not all(is_finite_number(v) for v in values):
        warn(f"{run.path}: final_eval_per_problem['{key}'] is not a non-empty list of numbers; "
             f"the comparison resamples seeds only for {key}")
        return None
    mean = math.fsum(values) / len(values)
    if abs(mean - value) > 1e-6:
        warn(f"{run.path}: the mean of final_eval_per_problem['{key}'] is {mean:.6f} but final_eval['{key}'] "
             f"is {value:.6f}; the comparison resamples seeds only for {key}")
        return None
    return [float(v) for v in values]


def _finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def compare_to_baseline(groups: list[tuple[str, list[Run]]], baseline: str,
                        num_resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0,
                        warn: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """One row per (final metric, non-baseline group): the difference of group means
    (group − baseline), its two-level bootstrap interval (:func:`bootstrap_diff`: seeds,
    then held-out problems where every run of both groups has per-problem values of the
    metric, else seeds only), Welch's t-test over the runs' final values
    (:func:`welch_t_test`; ``None`` with a ``note`` when a group has fewer than 2 runs)
    and ``significant``: p < 0.05 and the interval excludes 0. Each (metric, group) pair
    draws from its own generator, seeded by (``seed``, the metric, the group), so adding
    a run of another group changes no other row. Non-finite numbers are ``None``."""
    if num_resamples < 1:
        raise ReportError(f"--bootstrap must be >= 1, got {num_resamples}")
    base_name, base_members = find_group(groups, baseline)
    warn = warn or (lambda _: None)
    runs = [r for _, members in groups for r in members]

    rows = []
    for key in final_eval_keys(runs):
        def finals(members: list[Run]) -> list[tuple[Run, float]]:
            values = ((r, (r.summary or {}).get("final_eval", {}).get(key)) for r in members)
            return [(r, float(v)) for r, v in values if is_finite_number(v)]

        base = finals(base_members)
        b_values = [v for _, v in base]
        b_problems = [_per_problem(r, key, v, warn) for r, v in base]
        for name, members in groups:
            if members is base_members:
                continue
            mine = finals(members)
            row: dict[str, Any] = {
                "metric": key, "group": name, "baseline": base_name, "mean": None, "baseline_mean": None,
                "diff": None, "ci_low": None, "ci_high": None, "t": None, "df": None, "p": None,
                "n_runs": len(mine), "n_baseline_runs": len(base), "significant": False, "resampled": None,
                "note": None}
            rows.append(row)
            if not mine or not base:
                row["note"] = f"no finite final {key} in {'group ' + name if not mine else 'the baseline'}"
                continue
            g_values = [v for _, v in mine]
            row["mean"], row["baseline_mean"] = statistics.fmean(g_values), statistics.fmean(b_values)
            row["diff"] = row["mean"] - row["baseline_mean"]
            g_problems = [_per_problem(r, key, v, warn) for r, v in mine]
            with_problems = all(p is not None for p in g_problems + b_problems)
            row["resampled"] = "seeds+problems" if with_problems else "seeds"
            low, high = bootstrap_diff(g_problems if with_problems else g_values,
                                       b_problems if with_problems else b_values,
                                       num_resamples=num_resamples,
                                       seed=[seed, zlib.crc32(key.encode()), zlib.crc32(name.encode())],
                                       confidence=1.0 - SIGNIFICANCE_LEVEL)
            row["ci_low"], row["ci_high"] = low, high
            few = [(n, len(v)) for n, v in ((name, g_values), (base_name, b_values)) if len(v) < 2]
            if few:
                row["note"] = ("p undefined: " + " and ".join(f"{n} has {k} run" for n, k in few)
                               + "; Welch's test needs at least 2 runs per group to estimate the seed spread")
                continue
            t, df, p = welch_t_test(g_values, b_values)
            row["t"], row["df"], row["p"] = _finite_or_none(t), _finite_or_none(df), _finite_or_none(p)
            if row["p"] is None:
                row["note"] = "p undefined: within each group every run has the same final value (no seed spread)"
                continue
            row["significant"] = bool(p < SIGNIFICANCE_LEVEL and (low > 0 or high < 0))
    return no_zero_width_intervals(rows)


def no_zero_width_intervals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``compare_to_baseline``'s rows with every interval that has no width set to ``None`` and
    the reason in ``ci_note``. One run a side without per-problem values is a single paired
    difference: every resample draws it again and the "interval" [d, d] would read as
    certainty where there is no estimate of the spread at all. The same holds wherever every
    resample gives one value (runs and problems all alike)."""
    for row in rows:
        low, high = row.get("ci_low"), row.get("ci_high")
        if low is None or high is None or high > low:
            continue
        if row.get("n_runs") == 1 and row.get("n_baseline_runs") == 1 and row.get("resampled") == "seeds":
            row["ci_note"] = "1 run per group and no per-problem values: a single paired difference, nothing to resample"
        else:
            row["ci_note"] = "every resample gives the same difference: no spread between runs or problems to measure"
        row["ci_low"] = row["ci_high"] = None
    return rows
