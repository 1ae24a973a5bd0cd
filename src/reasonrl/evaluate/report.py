"""``reasonrl report RUN_DIR [RUN_DIR ...]``: one self-contained HTML file comparing runs.

- Training curves of every run on shared axes (one panel per metric), embedded as
  base64 PNGs (also written beside the HTML), so the file opens anywhere, offline.
- Runs whose recipes differ only in ``train.seed`` form a group: one colour per group,
  one line style per seed, and a mean ± sd row per group in the final table.
- The final evaluation of each run with its 95% bootstrap interval.
- The recipes: the keys that differ between runs first (highlighted), each full recipe
  folded below.
- Warnings for what a crashed or unfinished run lacks (truncated ``metrics.jsonl``,
  no ``summary.json``); such a run is still reported.
- With ``baseline=NAME``: every other group's final metrics against that group's (the
  difference of means, a two-level bootstrap interval, Welch's t-test over seeds and a
  mark where both agree), also written to ``<out stem>_stats.json``. The statistics are
  in :mod:`reasonrl.evaluate.stats`.
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
import statistics
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from reasonrl.config import flatten
from reasonrl.evaluate.plots import PANELS, Series, plot_panel
from reasonrl.evaluate.stats import bootstrap_diff, welch_t_test
from reasonrl.fsutil import atomic_write_text
from reasonrl.train.metrics import read_metrics

_NOT_COMPARED = {"train.seed", "run_name", "output_dir"}  # differ between seeds of one experiment
_SEED_SUFFIX = re.compile(r"([-_.]?(seed|s)\d+)$", re.IGNORECASE)
_MAX_EXTRA_PANELS = 12
BOOTSTRAP_RESAMPLES = 2000
SIGNIFICANCE_LEVEL = 0.05  # the mark: Welch's p below this and the (1 − level) bootstrap interval excluding 0
_MARK, _SEEDS_ONLY = "●", "†"


class ReportError(ValueError):
    """A folder that is not a run; the message names it."""


@dataclass
class Run:
    label: str
    path: Path
    rows: list[dict[str, Any]]
    recipe: dict[str, Any]
    summary: dict[str, Any] | None
    warnings: list[str] = field(default_factory=list)
    evals: dict[str, Any] = field(default_factory=dict)  # eval*.json files written by `reasonrl eval`

    @property
    def last_step(self) -> int:
        return max((r.get("step", 0) for r in self.rows), default=0)


def load_run(path: Path) -> Run:
    path = Path(path)
    metrics_path = path / "metrics.jsonl"
    if not metrics_path.is_file():
        raise ReportError(f"{path}: not a run folder (no metrics.jsonl)")
    warnings: list[str] = []
    bad: list[int] = []
    rows = read_metrics(path, on_malformed=bad.append)
    if bad:
        warnings.append(f"{metrics_path}: skipped {len(bad)} malformed line(s) ({', '.join(map(str, bad[:5]))}); "
                        "the run was probably stopped while writing")
    recipe_path = path / "recipe.json"
    recipe = json.loads(recipe_path.read_text()) if recipe_path.is_file() else {}
    if not recipe:
        warnings.append(f"{path}: no recipe.json; its recipe cannot be compared")
    summary_path = path / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
    run = Run(path.name, path, rows, recipe, summary, warnings)
    if summary is None:
        planned = recipe.get("train", {}).get("steps", "?")
        warnings.append(f"{path}: no summary.json; the run did not finish (last step logged: {run.last_step} of "
                        f"{planned}); its final evaluation is missing")
    for eval_file in sorted(path.glob("eval*.json")):
        try:
            run.evals.update(json.loads(eval_file.read_text()))
        except (json.JSONDecodeError, OSError):
            warnings.append(f"{eval_file}: not readable JSON; skipped")
    return run


def _unique_labels(runs: list[Run]) -> None:
    names = [r.path.name for r in runs]
    for run in runs:
        if names.count(run.path.name) > 1:
            run.label = f"{run.path.parent.name}/{run.path.name}"


def group_runs(runs: list[Run]) -> list[tuple[str, list[Run]]]:
    """Runs whose recipes agree on everything but the seed (and naming) form a group."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        key = json.dumps({k: v for k, v in flatten(run.recipe).items() if k not in _NOT_COMPARED},
                         sort_keys=True, default=str)
        groups.setdefault(key, []).append(run)
    named = []
    for members in groups.values():
        stems = {_SEED_SUFFIX.sub("", m.path.name) or m.path.name for m in members}
        name = stems.pop() if len(stems) == 1 else members[0].label
        named.append((name, members))
    return named


def differing_keys(runs: list[Run]) -> list[str]:
    flats = [flatten(r.recipe) for r in runs]
    keys = sorted(set().union(*flats))
    return [k for k in keys if len({json.dumps(f.get(k), sort_keys=True, default=str) for f in flats}) > 1]


def _panels(runs: list[Run]) -> dict[str, list[str]]:
    """The standard panels plus one per method-specific metric that some run logged."""
    panels = dict(PANELS)
    standard = {k for keys in PANELS.values() for k in keys}
    extra = sorted({k for r in runs for row in r.rows for k in row
                    if k.startswith(("eval/", "selection/", "teacher/")) and k not in standard
                    and not _table_only(k)})
    for key in extra[:_MAX_EXTRA_PANELS]:
        panels[key.replace("/", "_").replace("@", "_at_")] = [key]
    return panels


def _table_only(key: str) -> bool:
    """Metrics too many or too redundant to plot: per-form accuracies, calibration, and
    pass@1 / maj@1 (pass@1 equals avg@n; maj@1 is one sample's accuracy)."""
    return "[" in key or "/calibration/" in key or key.endswith(("pass@1", "maj@1"))


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "nan" if not math.isfinite(value) else f"{value:.3f}" if abs(value) < 1e4 else f"{value:.3g}"
    return html.escape(json.dumps(value) if isinstance(value, (list, dict)) else str(value))


def _final_table(runs: list[Run], groups: list[tuple[str, list[Run]]]) -> str:
    finals = {r.label: (r.summary or {}).get("final_eval", {}) for r in runs}
    keys = []
    for r in runs:
        for k in (r.summary or {}).get("final_eval", {}):
            if k not in keys:
                keys.append(k)
    if not keys:
        return "<p>No final evaluation (no run finished with <code>eval.size</code> &gt; 0).</p>"
    head = "".join(f"<th>{html.escape(r.label)}</th>" for r in runs)
    multi = [(name, members) for name, members in groups if len(members) > 1]
    head += "".join(f"<th class='group'>{html.escape(name)}<br><small>mean ± sd, {len(m)} runs</small></th>"
                    for name, m in multi)
    lines = [f"<table><tr><th>metric</th>{head}</tr>"]
    for key in keys:
        cells = []
        for r in runs:
            value = finals[r.label].get(key)
            ci = (r.summary or {}).get("final_eval_ci", {}).get(key)
            base = (r.summary or {}).get("base_eval", {}).get(key)
            text = "—" if value is None else _fmt(value)
            if ci:
                text += f" <small>[{_fmt(ci[0])}, {_fmt(ci[1])}]</small>"
            if base is not None and value is not None:
                text += f"<br><small>from {_fmt(base)}</small>"
            cells.append(f"<td>{text}</td>")
        for _, members in multi:
            values = [finals[m.label][key] for m in members if _finite(finals[m.label].get(key))]
            if values:
                sd = statistics.stdev(values) if len(values) > 1 else 0.0
                cells.append(f"<td class='group'>{_fmt(statistics.mean(values))} ± {_fmt(sd)}</td>")
            else:
                cells.append("<td class='group'>—</td>")
        lines.append(f"<tr><td>{html.escape(key)}</td>{''.join(cells)}</tr>")
    lines.append("</table><p><small>[low, high]: 95% bootstrap interval over held-out problems; "
                 "“from”: the same metric before training.</small></p>")
    return "\n".join(lines)


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


def _metric_keys(runs: list[Run]) -> list[str]:
    keys: list[str] = []
    for r in runs:
        for k in (r.summary or {}).get("final_eval", {}):
            if k not in keys:
                keys.append(k)
    return keys


def _per_problem(run: Run, key: str, value: float, warn: Callable[[str], None]) -> list[float] | None:
    """The run's per-problem values of ``key`` (``final_eval_per_problem`` in summary.json),
    when present and consistent with its final value."""
    lists = (run.summary or {}).get("final_eval_per_problem")
    values = lists.get(key) if isinstance(lists, dict) else None
    if values is None:
        return None
    if not isinstance(values, list) or not values or not all(_finite(v) for v in values):
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
    for key in _metric_keys(runs):
        def finals(members: list[Run]) -> list[tuple[Run, float]]:
            values = ((r, (r.summary or {}).get("final_eval", {}).get(key)) for r in members)
            return [(r, float(v)) for r, v in values if _finite(v)]

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
    return rows


def _fmt_p(p: float) -> str:
    return f"{p:.3f}" if p >= 0.01 else f"{p:.2g}"


def _comparison_section(rows: list[dict[str, Any]], baseline: tuple[str, list[Run]], num_resamples: int,
                        seed: int) -> str:
    name, members = baseline
    parts = [f"<h2>Against the baseline {html.escape(name)}</h2>",
             f"<p>Baseline <b>{html.escape(name)}</b>: {html.escape(', '.join(r.label for r in members))}. "
             "Difference = group mean − baseline mean of the runs' final values.</p>"]
    if not rows:
        parts.append("<p>Nothing to compare: no other group, or no final evaluation.</p>")
        return "\n".join(parts)
    lines = ["<table><tr><th>metric</th><th>group</th><th>runs</th><th>mean</th><th>baseline mean</th>"
             "<th>difference</th><th>95% interval</th><th>t</th><th>df</th><th>p (Welch)</th><th></th></tr>"]
    for row in rows:
        def num(key: str, fmt: Callable[[float], str] = _fmt) -> str:
            return "—" if row[key] is None else fmt(row[key])

        interval = "—" if row["ci_low"] is None else f"[{row['ci_low']:+.3f}, {row['ci_high']:+.3f}]"
        if row["resampled"] == "seeds":
            interval += f"<sup>{_SEEDS_ONLY}</sup>"
        if row["p"] is not None:
            p_cell = _fmt_p(row["p"])
        elif row["diff"] is None:
            p_cell = "—"
        else:
            p_cell = f"n/a<br><small>{html.escape(row['note'] or '')}</small>"
        t_cell = "n/a" if row["t"] is None and row["diff"] is not None else num("t")
        df_cell = "n/a" if row["df"] is None and row["diff"] is not None else num("df", lambda v: f"{v:.1f}")
        mark = f"<td class='sig' title='seed spread cannot explain it'>{_MARK}</td>" if row["significant"] else "<td></td>"
        lines.append(
            f"<tr><td>{html.escape(row['metric'])}</td><td>{html.escape(row['group'])}</td>"
            f"<td>{row['n_runs']} vs {row['n_baseline_runs']}</td><td>{num('mean')}</td><td>{num('baseline_mean')}</td>"
            f"<td>{num('diff', lambda v: f'{v:+.3f}')}</td><td>{interval}</td><td>{t_cell}</td><td>{df_cell}</td>"
            f"<td>{p_cell}</td>{mark}</tr>")
    lines.append("</table>")
    parts.append("\n".join(lines))
    notes = [f"{_MARK} marks a difference that the seed spread cannot explain: Welch's two-sided p &lt; "
             f"{SIGNIFICANCE_LEVEL} over the runs' final values and the 95% bootstrap interval excludes 0."]
    notes.append(f"Interval: {num_resamples} bootstrap resamples (seed {seed}) that draw the runs of each group "
                 "with replacement and, within each drawn run, its held-out problems with replacement.")
    if any(row["resampled"] == "seeds" for row in rows):
        notes.append(f"{_SEEDS_ONLY} Not every run folder has per-problem outcomes of this metric "
                     "(<code>final_eval_per_problem</code> in summary.json): the interval resamples seeds only.")
    notes.append("With a few seeds per group (3 is few) neither the mark nor its absence is strong evidence, "
                 "and comparing many metrics marks some differences by chance.")
    parts.append("".join(f"<p><small>{n}</small></p>" for n in notes))
    return "\n".join(parts)


def _sampled_eval_tables(runs: list[Run]) -> str:
    parts = []
    for r in runs:
        for task, result in r.evals.items():
            metrics = result.get("metrics", {}) if isinstance(result, dict) else {}
            if not metrics:
                continue
            rows = []
            for name, value in metrics.items():
                if isinstance(value, dict):
                    rows.append(f"<tr><td>{html.escape(name)}</td><td>{_fmt(value['mean'])} "
                                f"<small>[{_fmt(value['ci_low'])}, {_fmt(value['ci_high'])}]</small></td></tr>")
                else:
                    rows.append(f"<tr><td>{html.escape(name)}</td><td>{_fmt(value)}</td></tr>")
            parts.append(f"<h3>{html.escape(r.label)} — <code>reasonrl eval</code> on {html.escape(task)} "
                         f"(n={result.get('n')}, {result.get('num_problems')} problems)</h3>"
                         f"<table><tr><th>metric</th><th>value</th></tr>{''.join(rows)}</table>")
    return "\n".join(parts)


def _recipe_section(runs: list[Run]) -> str:
    diff = differing_keys(runs) if len(runs) > 1 else []
    parts = []
    if len(runs) > 1:
        if diff:
            head = "".join(f"<th>{html.escape(r.label)}</th>" for r in runs)
            lines = [f"<table class='diff'><tr><th>recipe key</th>{head}</tr>"]
            for key in diff:
                cells = "".join(f"<td>{_fmt(flatten(r.recipe).get(key, '(absent)'))}</td>" for r in runs)
                cls = "" if key in _NOT_COMPARED else " class='changed'"
                lines.append(f"<tr{cls}><td><code>{html.escape(key)}</code></td>{cells}</tr>")
            lines.append("</table>")
            parts.append("<p>Keys whose values differ between runs (highlighted: differences beyond the seed "
                         "and naming).</p>" + "\n".join(lines))
        else:
            parts.append("<p>All runs use the same recipe.</p>")
    for r in runs:
        flat = flatten(r.recipe)
        rows = "".join(
            f"<tr{' class=changed' if k in diff and k not in _NOT_COMPARED else ''}><td><code>{html.escape(k)}</code>"
            f"</td><td>{_fmt(v)}</td></tr>" for k, v in flat.items())
        parts.append(f"<details><summary>Full recipe of {html.escape(r.label)}</summary>"
                     f"<table>{rows}</table></details>")
    return "\n".join(parts)


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1400px;color:#222;padding:0 1em}
h1{font-size:1.5em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.6em 0;font-size:.9em}
td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}
th{background:#f3f3f3}.group{background:#eef5ff}.sig{font-weight:bold;color:#0a6}tr.changed td{background:#fff3c4}
.warn{background:#fff4e5;border:1px solid #f0a040;padding:.6em 1em;border-radius:4px}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:1em}
.grid figure{margin:0}.grid img{width:100%;border:1px solid #eee}
small{color:#666}details{margin:.4em 0}code{font-size:.95em}
"""


def stats_path(out: str | Path) -> Path:
    """Where ``write_report(..., baseline=...)`` writes its statistics: ``<out stem>_stats.json``."""
    out = Path(out)
    return out.parent / f"{out.stem}_stats.json"


def write_report(run_dirs: list[str | Path], out: str | Path, title: str | None = None,
                 warn: Callable[[str], None] | None = None, baseline: str | None = None,
                 bootstrap: int = BOOTSTRAP_RESAMPLES, bootstrap_seed: int = 0) -> Path:
    """Render the report for ``run_dirs`` to ``out`` (HTML) and its PNGs to ``<out stem>_files/``;
    each warning (also shown in the page) is passed to ``warn``. With ``baseline`` (a group
    name), add the comparison of every other group with it (:func:`compare_to_baseline`,
    ``bootstrap`` resamples) and write its rows to :func:`stats_path`. An unknown baseline
    raises ``ReportError`` before any file is written."""
    runs = [load_run(Path(p)) for p in run_dirs]
    if not runs:
        raise ReportError("report needs at least one run folder")
    for warning in (w for r in runs for w in r.warnings):
        if warn:
            warn(warning)
    _unique_labels(runs)
    groups = group_runs(runs)
    comparison, stats_warnings = "", []
    if baseline is not None:
        def stats_warn(message: str) -> None:
            stats_warnings.append(message)
            if warn:
                warn(message)

        rows = compare_to_baseline(groups, baseline, bootstrap, bootstrap_seed, warn=stats_warn)
        comparison = _comparison_section(rows, find_group(groups, baseline), bootstrap, bootstrap_seed)
    out = Path(out)
    png_dir = out.parent / f"{out.stem}_files"
    series = []
    for color, (_, members) in enumerate(groups):
        for style, run in enumerate(members):
            series.append(Series(run.label, run.rows, color_index=color, style_index=style))
    max_step = max(r.last_step for r in runs) or None
    figures = []
    for name, keys in _panels(runs).items():
        path = png_dir / f"{name}.png"
        if plot_panel(name, keys, series, path, max_step=max_step):
            encoded = base64.b64encode(path.read_bytes()).decode()
            figures.append(f"<figure><img alt='{html.escape(name)}' src='data:image/png;base64,{encoded}'>"
                           f"<figcaption><small>{html.escape(name)}: {html.escape(', '.join(keys))}</small>"
                           "</figcaption></figure>")
    warnings = [w for r in runs for w in r.warnings] + stats_warnings
    overview = "".join(
        f"<tr><td>{html.escape(r.label)}</td><td><code>{html.escape(str(r.path))}</code></td><td>{r.last_step}"
        f"</td><td>{_fmt((r.summary or {}).get('wall_seconds', '—'))}</td></tr>" for r in runs)
    title = title or ("reasonrl report: " + ", ".join(r.label for r in runs))[:200]
    body = [
        f"<h1>{html.escape(title)}</h1>",
        "<div class='warn'><b>Warnings</b><ul>" + "".join(f"<li>{html.escape(w)}</li>" for w in warnings)
        + "</ul></div>" if warnings else "",
        "<h2>Runs</h2><table><tr><th>run</th><th>folder</th><th>last step</th><th>wall s</th></tr>"
        + overview + "</table>",
        "<h2>Final evaluation</h2>", _final_table(runs, groups), comparison, _sampled_eval_tables(runs),
        "<h2>Training curves</h2>",
        "<p><small>Faint: per step; solid: exponential moving average. One colour per recipe, one line "
        "style per seed.</small></p>" if any(len(m) > 1 for _, m in groups) else "",
        "<div class='grid'>" + "".join(figures) + "</div>",
        "<h2>Recipes</h2>", _recipe_section(runs),
    ]
    page = (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_CSS}</style></head><body>{''.join(body)}</body></html>")
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, page)
    if baseline is not None:
        atomic_write_text(stats_path(out), json.dumps(rows, indent=1, allow_nan=False))
    return out
