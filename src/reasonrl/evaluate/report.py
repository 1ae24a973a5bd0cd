"""``reasonrl report RUN_DIR [RUN_DIR ...]``: one self-contained HTML file comparing runs.

- With ``baseline=NAME``, first a one-line verdict per group on the headline metric
  (accuracy): the difference, its interval, p and what they say (:func:`verdicts`).
- Runs whose recipes differ only in ``train.seed`` form a group, named by the recipe
  (``run_name``, else the recipe file's stem as the default run folder carries it:
  :func:`reasonrl.evaluate.runs.group_name`): one colour per group, one line style per seed,
  and a mean ± sd column per group in the final table. Two runs of a group with the same seed
  are warned about.
- The final evaluation of each run with its 95% bootstrap interval.
- With ``baseline=NAME``: every other group's final metrics against that group's (the
  difference of means, a two-level bootstrap interval, Welch's t-test over seeds and a mark
  where both agree; :mod:`reasonrl.evaluate.baseline`), also written to
  ``<out stem>_stats.json``. An interval with nothing to resample (one run a side, no
  per-problem values) is "n/a", never a zero-width [x, x].
- Training curves of every run on shared axes (one panel per metric, and one per reward
  term), drawn by the page's own script: hover for values, drag to zoom, click the legend to
  hide runs (:mod:`reasonrl.evaluate.page_assets`). Static PNG copies are written beside the
  page, in ``<out stem>_files/``.
- A completions browser over each run's ``samples.jsonl`` and ``eval*.json`` completions
  (:mod:`reasonrl.evaluate.browser`), when a run has them.
- The recipes: the keys that differ between runs first (highlighted), each full recipe
  folded below.
- Warnings for what a crashed or unfinished run lacks (truncated ``metrics.jsonl``,
  no ``summary.json``); such a run is still reported.

Every number goes through one format (:func:`reasonrl.evaluate.runs.number_text`), and the
page is one file with its data, style and script inline: it opens anywhere, offline.
"""

from __future__ import annotations

import html
import json
import statistics
from pathlib import Path
from typing import Any, Callable

from reasonrl.evaluate.baseline import SIGNIFICANCE_LEVEL, compare_to_baseline, find_group
from reasonrl.evaluate.browser import samples_payload
from reasonrl.evaluate.page_assets import CSS, JS
from reasonrl.evaluate.plots import PANELS, Series, panel_series, plot_panel
from reasonrl.evaluate.runs import (  # noqa: F401  (ReportError: raised by write_report, part of its API)
    BOOTSTRAP_RESAMPLES, NOT_COMPARED, ReportError, Run, differing_keys, final_eval_keys, format_number, group_runs,
    is_finite_number, load_run, number_text, resolve_group, shared_seed_warnings, signed_text, unique_labels,
)
from reasonrl.fsutil import atomic_write_text
from reasonrl.recipe import flatten

_MAX_EXTRA_PANELS = 12
# matplotlib's default colour cycle, so that the page's curves and the PNGs beside it agree
_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
_DASHES = ["", "6 3", "2 3", "8 3 2 3"]  # plots._STYLES: -, --, :, -.
_NOT_TERMS = {"reward/mean", "reward/std"}  # reward/* keys that are the total, not a term
_MARK, _SEEDS_ONLY = "●", "†"
# Headline metrics for the verdict, in order of preference; each is higher-is-better
_HEADLINE = ("accuracy", "greedy")
_HIGHER_IS_BETTER = ("accuracy", "greedy", "avg@", "pass@", "maj@")


def _panels(runs: list[Run]) -> list[tuple[str, list[str], str]]:
    """(name, metric keys, caption) of each panel: the standard panels, one per reward term
    (``reward/<term>``, the term's unweighted mean score) right after the total reward, then
    one per method-specific metric that some run logged."""
    logged = {k for r in runs for row in r.rows for k in row}
    standard = {k for keys in PANELS.values() for k in keys}
    terms = sorted(k for k in logged if k.startswith("reward/") and k not in _NOT_TERMS)
    extra = sorted(k for k in logged if k.startswith(("eval/", "selection/", "teacher/")) and k not in standard
                   and not _table_only(k))
    panels = []
    for name, keys in PANELS.items():
        panels.append((name, keys, f"{name}: {', '.join(keys)}"))
        if name == "reward":
            panels += [(f"reward_term_{_file_name(k[len('reward/'):])}", [k],
                        f"reward term {k[len('reward/'):]}: {k}, its unweighted mean score per step")
                       for k in terms[:_MAX_EXTRA_PANELS]]
    panels += [(_file_name(k), [k], k) for k in extra[:_MAX_EXTRA_PANELS]]
    return panels


def _file_name(key: str) -> str:
    return key.replace("/", "_").replace("@", "_at_")


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


def _interval(row: dict[str, Any]) -> str:
    """A row's interval; ends within rounding error of 0 read 0 (see ``number_text``'s scale)."""
    scale = max(abs(row[k]) for k in ("ci_low", "ci_high", "mean", "baseline_mean") if row.get(k) is not None)
    return f"[{signed_text(row['ci_low'], scale)}, {signed_text(row['ci_high'], scale)}]"


def _headline(metrics: list[str]) -> str | None:
    for name in _HEADLINE:
        if name in metrics:
            return name
    return next((m for m in metrics if m.startswith(("avg@", "pass@"))), metrics[0] if metrics else None)


def verdicts(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Per non-baseline group, (what was measured, what it says) on the headline metric
    (accuracy where the runs have it): ``grpo_dropout vs grpo: accuracy -0.053 [-0.092, -0.015],
    p = 0.019 (3 vs 3 runs)`` and ``worse``. The word is ``better``/``worse`` (``higher``/``lower``
    for a metric not known to be better higher) only where the row is marked significant (Welch's
    p below the level and the interval excluding 0), ``too few runs to tell`` where p is
    undefined, else ``no clear difference``."""
    metric = _headline(list(dict.fromkeys(r["metric"] for r in rows)))
    out = []
    for row in (r for r in rows if r["metric"] == metric):
        text = f"{row['group']} vs {row['baseline']}: {metric}"
        if row["diff"] is None:
            out.append((f"{text}: {row['note'] or 'not compared'}", "no comparison"))
            continue
        text += f" {signed_text(row['diff'])}"
        if row["ci_low"] is not None:
            text += f" {_interval(row)}"
        else:
            text += " (interval n/a)"
        text += f", p = {number_text(row['p'])}" if row["p"] is not None else ", p n/a"
        text += f" ({row['n_runs']} vs {row['n_baseline_runs']} runs)"
        if row["significant"]:
            up = row["diff"] > 0
            known = metric.startswith(_HIGHER_IS_BETTER)
            word = ("better" if up else "worse") if known else ("higher" if up else "lower")
        elif row["p"] is None:
            word = "too few runs to tell" if min(row["n_runs"], row["n_baseline_runs"]) < 2 else "no seed spread to judge by"
        else:
            word = "no clear difference"
        out.append((text, word))
    return out


def verdict_lines(rows: list[dict[str, Any]]) -> list[str]:
    """:func:`verdicts` as plain lines (``<measured> — <word>``), e.g. for a terminal."""
    return [f"{text} — {word}" for text, word in verdicts(rows)]


def _verdict_box(rows: list[dict[str, Any]]) -> str:
    found = verdicts(rows)
    if not found:
        return ""
    tone = {"better": "better", "higher": "better", "worse": "worse", "lower": "worse"}
    lines = "".join(f"<p>{html.escape(text)} — <span class='{tone.get(word, '')}'>{html.escape(word)}</span></p>"
                    for text, word in found)
    return (f"<div class='verdict' id='verdict'>{lines}<small>Difference of group means with its 95% bootstrap interval and "
            "Welch's p over seeds; details under <a href='#comparison'>the comparison</a>.</small></div>")


def _comparison_section(rows: list[dict[str, Any]], baseline: tuple[str, list[Run]], num_resamples: int,
                        seed: int) -> str:
    """The table of ``compare_to_baseline``'s rows and how to read it."""
    name, members = baseline
    parts = [f"<h2 id='comparison'>Against the baseline {html.escape(name)}</h2>",
             f"<p>Baseline <b>{html.escape(name)}</b>: {html.escape(', '.join(r.label for r in members))}. "
             "Difference = group mean − baseline mean of the runs' final values.</p>"]
    if not rows:
        parts.append("<p>Nothing to compare: no other group, or no final evaluation.</p>")
        return "\n".join(parts)
    lines = ["<table><tr><th>metric</th><th>group</th><th>runs</th><th>mean</th><th>baseline mean</th>"
             "<th>difference</th><th>95% interval</th><th>t</th><th>df</th><th>p (Welch)</th><th></th></tr>"]
    for row in rows:
        def num(key: str, fmt: Callable[[float], str] = number_text) -> str:
            return "—" if row[key] is None else fmt(row[key])

        if row["ci_low"] is not None:
            interval = _interval(row)
        elif row.get("ci_note"):
            short = "1 run each" if row["ci_note"].startswith("1 run") else "no spread"
            interval = f"n/a ({short})<br><small>{html.escape(row['ci_note'])}</small>"
        else:
            interval = "—"
        if row["resampled"] == "seeds" and row["ci_low"] is not None:
            interval += f"<sup>{_SEEDS_ONLY}</sup>"
        if row["p"] is not None:
            p_cell = number_text(row["p"])
        elif row["diff"] is None:
            p_cell = "—"
        else:
            p_cell = f"n/a<br><small>{html.escape(row['note'] or '')}</small>"
        t_cell = "n/a" if row["t"] is None and row["diff"] is not None else num("t")
        df_cell = "n/a" if row["df"] is None and row["diff"] is not None else num("df")
        mark = f"<td class='sig' title='seed spread cannot explain it'>{_MARK}</td>" if row["significant"] else "<td></td>"
        lines.append(
            f"<tr><td>{html.escape(row['metric'])}</td><td>{html.escape(row['group'])}</td>"
            f"<td>{row['n_runs']} vs {row['n_baseline_runs']}</td><td>{num('mean')}</td><td>{num('baseline_mean')}</td>"
            f"<td>{num('diff', signed_text)}</td><td>{interval}</td><td>{t_cell}</td><td>{df_cell}</td>"
            f"<td>{p_cell}</td>{mark}</tr>")
    lines.append("</table>")
    parts.append("\n".join(lines))
    notes = [f"{_MARK} marks a difference that the seed spread cannot explain: Welch's two-sided p &lt; "
             f"{SIGNIFICANCE_LEVEL} over the runs' final values and the 95% bootstrap interval excludes 0.",
             f"Interval: {num_resamples} bootstrap resamples (seed {seed}) that draw the runs of each group "
             "with replacement and, within each drawn run, its held-out problems with replacement. "
             "n/a where there is nothing to resample (one run a side and no per-problem values): a single "
             "difference says nothing of its spread."]
    if any(row["resampled"] == "seeds" and row["ci_low"] is not None for row in rows):
        notes.append(f"{_SEEDS_ONLY} Not every run folder has per-problem outcomes of this metric "
                     "(<code>final_eval_per_problem</code> in summary.json): the interval resamples seeds only.")
    notes.append("With a few seeds per group (3 is few) neither the mark nor its absence is strong evidence, "
                 "and comparing many metrics marks some differences by chance.")
    parts.append("".join(f"<p><small>{n}</small></p>" for n in notes))
    return "\n".join(parts)


def _page_data(runs: list[Run], groups: list[tuple[str, list[Run]]], png_dir: Path) -> dict[str, Any]:
    """What the page's script draws: the runs (label, group, colour, dash), each panel's curves
    (also written as PNGs to ``png_dir``) and the completions browser's data."""
    order = [(color, style, run, name) for color, (name, members) in enumerate(groups) for style, run in enumerate(members)]
    page_runs, series = [], []
    for color, style, run, name in order:
        page_runs.append({"label": run.label, "group": name, "color": _COLORS[color % len(_COLORS)],
                          "dash": _DASHES[style % len(_DASHES)]})
        series.append(Series(run.label, run.rows, color_index=color, style_index=style))
    max_step = max(r.last_step for r in runs) or None
    panels = []
    for name, keys, caption in _panels(runs):
        curves = panel_series(keys, series)
        if not curves:
            continue
        plot_panel(name, keys, series, png_dir / f"{name}.png", max_step=max_step)
        title = name if len(keys) > 1 else keys[0] if _file_name(keys[0]) == name else f"{name} ({keys[0]})"
        panels.append({"name": name, "keys": keys, "caption": caption, "title": title, "series": curves})
    return {"runs": page_runs, "panels": panels, "maxStep": max_step, "samples": samples_payload([r for *_, r, _ in order])}


def _script_json(data: Any) -> str:
    """JSON that can sit inside a <script> element: no ``</script>``, no ``<!--`` can end it early."""
    text = json.dumps(data, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def stats_path(out: str | Path) -> Path:
    """Where ``write_report(..., baseline=...)`` writes its statistics: ``<out stem>_stats.json``."""
    out = Path(out)
    return out.parent / f"{out.stem}_stats.json"


def write_report(run_dirs: list[str | Path], out: str | Path, title: str | None = None,
                 warn: Callable[[str], None] | None = None, baseline: str | None = None,
                 bootstrap: int = BOOTSTRAP_RESAMPLES, bootstrap_seed: int = 0) -> Path:
    """Render the report for ``run_dirs`` to ``out`` (HTML) and its PNGs to ``<out stem>_files/``;
    each warning (also shown in the page) is passed to ``warn``. With ``baseline`` (a group
    name, or a run folder's name or stem within one group), add the verdicts and the comparison
    of every other group with it (:func:`reasonrl.evaluate.baseline.compare_to_baseline`,
    ``bootstrap`` resamples) and write its rows to :func:`stats_path`. An unknown baseline
    raises ``ReportError`` before any file is written."""
    warnings: list[str] = []

    def note(message: str) -> None:
        warnings.append(message)
        if warn:
            warn(message)

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
        note(warning)
    unique_labels(runs)
    groups = group_runs(runs, warn=note)
    for warning in shared_seed_warnings(groups):
        note(warning)
    comparison, verdict, rows = "", "", []
    if baseline is not None:
        name = resolve_group(groups, baseline)
        rows = compare_to_baseline(groups, name, bootstrap, bootstrap_seed, warn=note)
        comparison = _comparison_section(rows, find_group(groups, name), bootstrap, bootstrap_seed)
        verdict = _verdict_box(rows)
    out = Path(out)
    png_dir = out.parent / f"{out.stem}_files"
    data = _page_data(runs, groups, png_dir)
    group_of = {id(r): name for name, members in groups for r in members}
    overview = "".join(
        f"<tr><td>{html.escape(r.label)}</td><td>{html.escape(group_of[id(r)])}</td>"
        f"<td>{format_number(flatten(r.recipe).get('train.seed', '—') if r.recipe else '—')}</td>"
        f"<td><code>{html.escape(str(r.path))}</code></td><td>{r.last_step}"
        f"</td><td>{format_number((r.summary or {}).get('wall_seconds', '—'))}</td></tr>" for r in runs)
    title = title or ("reasonrl report: " + ", ".join(r.label for r in runs))[:200]
    samples = data["samples"]
    sections = [("runs", "Runs"), ("final", "Final evaluation"), *([("comparison", "Comparison")] if comparison else []),
                ("curves", "Training curves"), *([("samples", "Completions")] if samples else []), ("recipes", "Recipes")]
    body = [
        f"<h1>{html.escape(title)}</h1>",
        "<nav>" + "".join(f"<a href='#{a}'>{t}</a>" for a, t in sections) + "</nav>",
        verdict,
        "<div class='warn'><b>Warnings</b><ul>" + "".join(f"<li>{html.escape(w)}</li>" for w in warnings)
        + "</ul></div>" if warnings else "",
        "<h2 id='runs'>Runs</h2><table><tr><th>run</th><th>group</th><th>seed</th><th>folder</th><th>last step</th>"
        "<th>wall s</th></tr>" + overview + "</table>",
        "<h2 id='final'>Final evaluation</h2>", _final_table(runs, groups), comparison, _sampled_eval_tables(runs),
        "<h2 id='curves'>Training curves</h2>",
        "<p><small>Faint: per step; solid: exponential moving average. One colour per group (recipe), one line "
        "style per seed.</small></p>" if any(len(m) > 1 for _, m in groups) else "",
        "<div id='rrl-legend'></div><div class='grid' id='rrl-plots'></div>",
        f"<noscript><p>The plots are drawn by the page's script; static copies are in "
        f"<code>{html.escape(png_dir.name)}/</code> beside this file.</p></noscript>",
    ]
    if samples:
        notes = samples["notes"]
        body += ["<h2 id='samples'>Completions</h2>",
                 "<p><small>What the runs wrote (<code>samples.jsonl</code>; <code>eval*.json</code> of "
                 "<code>reasonrl eval</code>). Pick a run and a step, filter, or compare two runs on the prompts both "
                 "were given: evaluations give every run the same prompts.</small></p>",
                 "".join(f"<p><small>{html.escape(n)}</small></p>" for n in notes),
                 "<div id='rrl-browser'></div>"]
    body += ["<h2 id='recipes'>Recipes</h2>", _recipe_section(runs)]
    page = (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<style>{CSS}</style></head><body>{''.join(body)}"
            f"<script type='application/json' id='rrl-data'>{_script_json(data)}</script>"
            f"<script>{JS}</script></body></html>")
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, page)
    if baseline is not None:
        atomic_write_text(stats_path(out), json.dumps(rows, indent=1, allow_nan=False))
    return out
