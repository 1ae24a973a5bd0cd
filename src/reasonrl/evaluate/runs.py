"""Run folders as a report reads them: ``Run`` (recipe, metrics, summary, warnings), their
grouping into seeds of one experiment, the keys in which groups differ, and the number formats
the report and its ``--baseline`` statistics (``evaluate.baseline``) share.
"""

from __future__ import annotations

import html
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from reasonrl.metrics_log import read_metrics
from reasonrl.recipe import flatten

__all__ = ["BOOTSTRAP_RESAMPLES", "NOT_COMPARED", "ReportError", "Run", "load_run", "group_runs", "differing_keys", "with_defaults", "unique_labels",
           "is_finite_number", "format_number", "number_text", "signed_text", "final_eval_keys", "group_name",
           "folder_stem", "resolve_group", "shared_seed_warnings"]


# Keys that differ between seeds of one experiment, or that change where and how fast it runs but
# not what it computes (torch threads only change float reduction order; train.retain_memory only
# where memory comes from): they never split a group.
NOT_COMPARED = {"train.seed", "run_name", "output_dir", "train.threads", "rollout.sampler_threads",
                "train.retain_memory"}
_SEED_SUFFIX = re.compile(r"([-_.]?(seed|s)\d+)$", re.IGNORECASE)
_TIME_SUFFIX = re.compile(r"-\d{8}-\d{6}$")  # api.default_run_dir's time.strftime('%Y%m%d-%H%M%S')
BOOTSTRAP_RESAMPLES = 2000  # the default of ``--bootstrap``


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
    run = Run(path.name, path, rows, with_defaults(recipe) if recipe else recipe, summary, warnings)
    if summary is None:
        planned = recipe.get("train", {}).get("steps", "?")
        warnings.append(f"{path}: no summary.json; the run did not finish (last step logged: {run.last_step} of "
                        f"{planned}); its final evaluation is missing")
    if summary is not None and "final_eval" not in summary:
        _final_eval_from_rows(run)
    for eval_file in sorted(path.glob("eval*.json")):
        try:
            run.evals.update(json.loads(eval_file.read_text()))
        except (json.JSONDecodeError, OSError):
            warnings.append(f"{eval_file}: not readable JSON; skipped")
    return run


def _final_eval_from_rows(run: Run) -> None:
    """A finished run whose ``summary.json`` has no ``final_eval`` (a federation written before
    its server wrote one: its rows are rounds, each with the global model's held-out
    ``eval/*``): its final evaluation is the last evaluation logged, its base the one at step 0."""
    evals = sorted(((r.get("step", 0), r) for r in run.rows if any(k.startswith("eval/") for k in r)),
                   key=lambda item: item[0])
    if not evals or run.summary is None:
        return

    def metrics(row: dict[str, Any]) -> dict[str, Any]:
        return {k[len("eval/"):]: v for k, v in row.items() if k.startswith("eval/")}

    step, last = evals[-1]
    run.summary["final_eval"] = metrics(last)
    if evals[0][0] == 0 and len(evals) > 1:
        run.summary.setdefault("base_eval", metrics(evals[0][1]))
    run.warnings.append(f"{run.path}: summary.json has no final_eval; the final evaluation is the last one in "
                        f"metrics.jsonl (step {step}), without per-problem values (the comparison resamples "
                        f"seeds only)")


def unique_labels(runs: list[Run]) -> None:
    names = [r.path.name for r in runs]
    for run in runs:
        if names.count(run.path.name) > 1:
            run.label = f"{run.path.parent.name}/{run.path.name}"


def with_defaults(recipe: dict[str, Any]) -> dict[str, Any]:
    """A run's recipe with every key added to the schema since it was written, at its default:
    the value that run ran with. Without this a run from before a new key (``rollout.source``)
    would never group with its own seeds run after it."""
    from reasonrl.sections import Recipe

    return _merge_defaults(Recipe().to_dict(), recipe)


def _merge_defaults(default: Any, given: Any) -> Any:
    if not isinstance(default, dict) or not isinstance(given, dict):
        return given
    merged = dict(given)
    for key, value in default.items():
        merged[key] = _merge_defaults(value, given[key]) if key in given else value
    return merged


def group_runs(runs: list[Run], warn: Callable[[str], None] | None = None) -> list[tuple[str, list[Run]]]:
    """Runs whose recipes agree on everything but the seed (and naming) form a group, named by
    :func:`group_name`. Two groups of different recipes never share a name (``--baseline NAME``
    must name one): each such group is named by its first run's label instead, with a warning."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        key = json.dumps({k: v for k, v in flatten(run.recipe).items() if k not in NOT_COMPARED},
                         sort_keys=True, default=str)
        groups.setdefault(key, []).append(run)
    named = [(group_name(members), members) for members in groups.values()]
    names = [name for name, _ in named]
    for i, (name, members) in enumerate(named):
        if names.count(name) > 1:
            if warn and names.index(name) == i:
                clash = [m[0].label for n, m in named if n == name]
                warn(f"{names.count(name)} groups of different recipes would be called '{name}' (first runs: "
                     f"{', '.join(clash)}); each is named by its first run instead. Give each recipe its own run_name "
                     "to name them")
            named[i] = (members[0].label, members)
    return named


def group_name(members: list[Run]) -> str:
    """What a group of seeds is called: the recipe's ``run_name`` when its runs share one; else
    the name their folders share once the parts that tell seeds apart are cut: the time of a
    default folder (``<run_name or recipe file stem>-<YYYYmmdd-HHMMSS>``, ``api.default_run_dir``),
    a seed suffix (``-s1``, ``_seed2``), then whatever follows the longest prefix they share up
    to a ``-``, ``_`` or ``.`` (``grpo-a``, ``grpo-b``: ``grpo``). Else the first run's label.
    The recipe file itself is not recorded in a run folder, so a folder named by hand is all
    there is to go on."""
    run_names = {str(m.recipe.get("run_name") or "").strip() for m in members}
    if len(run_names) == 1 and "" not in run_names:
        return run_names.pop()
    stems = [folder_stem(m.path.name) for m in members]
    if len(set(stems)) == 1:
        return stems[0]
    common = _common_prefix_at_separator(stems)
    return common or members[0].label


def folder_stem(name: str) -> str:
    """A run folder's name without the time of a default folder and without a seed suffix."""
    stem = _TIME_SUFFIX.sub("", name) or name
    return _SEED_SUFFIX.sub("", stem) or stem


def _common_prefix_at_separator(names: list[str]) -> str:
    """The longest prefix of every name that ends where each name ends or goes on with ``-``,
    ``_`` or ``.`` (``grpo-a`` and ``grpo-b``: ``grpo``; ``ab-1`` and ``ac-1``: nothing); at
    least 2 characters."""
    prefix = names[0]
    for name in names[1:]:
        while prefix and not name.startswith(prefix):
            prefix = prefix[:-1]
    while prefix and not all(len(n) == len(prefix) or n[len(prefix)] in "-_." for n in names):
        prefix = prefix[:-1]
    prefix = prefix.rstrip("-_.")
    return prefix if len(prefix) >= 2 else ""


def resolve_group(groups: list[tuple[str, list[Run]]], name: str) -> str:
    """The group ``--baseline NAME`` means: a group's name; else the group of the run(s) whose
    label or folder stem (:func:`folder_stem`) is ``name``, when those runs are all in one group
    (so the names that worked before groups were named by recipe still work). Anything else
    comes back unchanged, for ``baseline.find_group`` to refuse with the list of groups."""
    if any(n == name for n, _ in groups):
        return name
    owners = {n for n, members in groups for r in members if name in (r.label, r.path.name, folder_stem(r.path.name))}
    return owners.pop() if len(owners) == 1 else name


def shared_seed_warnings(groups: list[tuple[str, list[Run]]]) -> list[str]:
    """One warning per group in which two or more runs ran with the same ``train.seed``: such
    runs are repeats, not independent draws of the seed spread, yet the group's mean ± sd, its
    bootstrap interval and Welch's test count each as one."""
    out = []
    for name, members in groups:
        by_seed: dict[str, list[str]] = {}
        for r in members:
            seed = flatten(r.recipe).get("train.seed") if r.recipe else None
            if seed is not None:
                by_seed.setdefault(json.dumps(seed, default=str), []).append(r.label)
        for seed, labels in by_seed.items():
            if len(labels) > 1:
                out.append(f"group '{name}': {len(labels)} runs share train.seed {seed} ({', '.join(labels)}); they are "
                           "repeats, not independent seeds, yet the group's statistics count each as one")
    return out


def differing_keys(runs: list[Run]) -> list[str]:
    flats = [flatten(r.recipe) for r in runs]
    keys = sorted(set().union(*flats))
    return [k for k in keys if len({json.dumps(f.get(k), sort_keys=True, default=str) for f in flats}) > 1]


def is_finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def format_number(value: Any) -> str:
    """A value as the report shows it (HTML-escaped): a number by :func:`number_text`, a list or
    mapping as JSON, anything else as ``str``."""
    if is_finite_number(value) or isinstance(value, float):
        return number_text(value)
    return html.escape(json.dumps(value) if isinstance(value, (list, dict)) else str(value))


def number_text(x: float, scale: float | None = None) -> str:
    """The report's one number format, by magnitude: an integer (or an integral float below
    1e6) as an integer; 0 < |x| < 1e-3 and |x| >= 1e6 in scientific notation; otherwise 3
    significant digits, and no rounding left of the point (1234.6 is 1235, not 1.23e3);
    trailing zeros dropped. 3e-4 → ``3e-4``, 0.0707107 → ``0.0707``, 0.55 → ``0.55``,
    12.345 → ``12.3``, 400.0 → ``400``, 1.5e7 → ``1.5e7``. A fixed ``.3f`` (what it replaces)
    showed a learning rate of 3e-4 and one of 1e-4 both as 0.000. The page's script has the
    same rule (``fmt`` in ``evaluate.page_assets``).

    ``scale``: the size of the numbers ``x`` was computed from; below ``scale`` × 1e-12, ``x`` is
    rounding error and reads 0 (a bootstrap quantile of differences of 0.2 can come out as
    -2.78e-17 where the exact value is 0)."""
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return str(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0 or (scale is not None and abs(x) <= abs(scale) * 1e-12):
        return "0"
    size = abs(x)
    if size < 1e-3 or size >= 1e6:
        mantissa, exponent = f"{x:.2e}".split("e")
        if "." in mantissa:
            mantissa = mantissa.rstrip("0").rstrip(".")
        return f"{mantissa}e{int(exponent)}"
    if x == int(x):
        return str(int(x))
    text = f"{x:.{max(0, 2 - math.floor(math.log10(size)))}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def signed_text(x: float, scale: float | None = None) -> str:
    """:func:`number_text` with an explicit sign, for differences: ``+0.21``, ``-3e-4``, ``0``."""
    text = number_text(x, scale)
    return text if text.startswith("-") or text in ("0", "nan") else "+" + text


def final_eval_keys(runs: list[Run]) -> list[str]:
    """The metrics in the runs' final evaluations (``summary.json``), in the order first seen."""
    keys: list[str] = []
    for r in runs:
        for k in (r.summary or {}).get("final_eval", {}):
            if k not in keys:
                keys.append(k)
    return keys
