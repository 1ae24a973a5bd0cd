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
  mark where both agree), also written to ``<out stem>_stats.json``; that comparison is
  :mod:`reasonrl.evaluate.baseline`.
"""

from __future__ import annotations

import base64
import html
import json
import statistics
from pathlib import Path
from typing import Callable

from reasonrl.evaluate.baseline import compare_to_baseline, comparison_section, find_group
from reasonrl.evaluate.plots import PANELS, Series, plot_panel
from reasonrl.evaluate.runs import (  # noqa: F401  (ReportError: raised by write_report, part of its API)
    BOOTSTRAP_RESAMPLES, NOT_COMPARED, ReportError, Run, differing_keys, final_eval_keys, format_number, group_runs,
    is_finite_number, load_run, unique_labels,
)
from reasonrl.fsutil import atomic_write_text
from reasonrl.recipe import flatten

_MAX_EXTRA_PANELS = 12


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


def _final_table(runs: list[Run], groups: list[tuple[str, list[Run]]]) -> str:
    finals = {r.label: (r.summary or {}).get("final_eval", {}) for r in runs}
    keys = final_eval_keys(runs)
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
            text = "—" if value is None else format_number(value)
            if ci:
                text += f" <small>[{format_number(ci[0])}, {format_number(ci[1])}]</small>"
            if base is not None and value is not None:
                text += f"<br><small>from {format_number(base)}</small>"
            cells.append(f"<td>{text}</td>")
        for _, members in multi:
            values = [finals[m.label][key] for m in members if is_finite_number(finals[m.label].get(key))]
            if values:
                sd = statistics.stdev(values) if len(values) > 1 else 0.0
                cells.append(f"<td class='group'>{format_number(statistics.mean(values))} ± {format_number(sd)}</td>")
            else:
                cells.append("<td class='group'>—</td>")
        lines.append(f"<tr><td>{html.escape(key)}</td>{''.join(cells)}</tr>")
    lines.append("</table><p><small>[low, high]: 95% bootstrap interval over held-out problems; "
                 "“from”: the same metric before training.</small></p>")
    return "\n".join(lines)


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
                    rows.append(f"<tr><td>{html.escape(name)}</td><td>{format_number(value['mean'])} "
                                f"<small>[{format_number(value['ci_low'])}, {format_number(value['ci_high'])}]</small></td></tr>")
                else:
                    rows.append(f"<tr><td>{html.escape(name)}</td><td>{format_number(value)}</td></tr>")
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
                cells = "".join(f"<td>{format_number(flatten(r.recipe).get(key, '(absent)'))}</td>" for r in runs)
                cls = "" if key in NOT_COMPARED else " class='changed'"
                lines.append(f"<tr{cls}><td><code>{html.escape(key)}</code></td>{cells}</tr>")
            lines.append("</table>")
            parts.append("<p>Keys whose values differ between runs (highlighted: differences beyond the seed "
                         "and naming).</p>" + "\n".join(lines))
        else:
            parts.append("<p>All runs use the same recipe.</p>")
    for r in runs:
        flat = flatten(r.recipe)
        rows = "".join(
            f"<tr{' class=changed' if k in diff and k not in NOT_COMPARED else ''}><td><code>{html.escape(k)}</code>"
            f"</td><td>{format_number(v)}</td></tr>" for k, v in flat.items())
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
    name), add the comparison of every other group with it
    (:func:`reasonrl.evaluate.baseline.compare_to_baseline`, ``bootstrap`` resamples) and
    write its rows to :func:`stats_path`. An unknown baseline raises ``ReportError``
    before any file is written."""
    unique: dict[Path, Path] = {}
    for p in map(Path, run_dirs):  # overlapping shell globs (`x_s*` also matches `x_long_s*`) name a run twice;
        key = p.resolve()  # counted twice it would double a group's n and narrow its interval
        if key in unique:
            if warn:
                warn(f"{p}: named more than once; counted once")
            continue
        unique[key] = p
    runs = [load_run(p) for p in unique.values()]
    if not runs:
        raise ReportError("report needs at least one run folder")
    for warning in (w for r in runs for w in r.warnings):
        if warn:
            warn(warning)
    unique_labels(runs)
    groups = group_runs(runs)
    comparison, stats_warnings = "", []
    if baseline is not None:
        def stats_warn(message: str) -> None:
            stats_warnings.append(message)
            if warn:
                warn(message)

        rows = compare_to_baseline(groups, baseline, bootstrap, bootstrap_seed, warn=stats_warn)
        comparison = comparison_section(rows, find_group(groups, baseline), bootstrap, bootstrap_seed)
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
        f"</td><td>{format_number((r.summary or {}).get('wall_seconds', '—'))}</td></tr>" for r in runs)
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
