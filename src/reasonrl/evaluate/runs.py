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
from typing import Any

from reasonrl.metrics_log import read_metrics
from reasonrl.recipe import flatten

__all__ = ["BOOTSTRAP_RESAMPLES", "NOT_COMPARED", "ReportError", "Run", "load_run", "group_runs", "differing_keys", "with_defaults", "unique_labels",
           "is_finite_number", "format_number", "final_eval_keys"]


# Keys that differ between seeds of one experiment, or that change where and how fast it runs but
# not what it computes (torch threads only change float reduction order): they never split a group.
NOT_COMPARED = {"train.seed", "run_name", "output_dir", "train.threads", "rollout.sampler_threads"}
_SEED_SUFFIX = re.compile(r"([-_.]?(seed|s)\d+)$", re.IGNORECASE)
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


def group_runs(runs: list[Run]) -> list[tuple[str, list[Run]]]:
    """Runs whose recipes agree on everything but the seed (and naming) form a group."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        key = json.dumps({k: v for k, v in flatten(run.recipe).items() if k not in NOT_COMPARED},
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


def is_finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def format_number(value: Any) -> str:
    if isinstance(value, float):
        return "nan" if not math.isfinite(value) else f"{value:.3f}" if abs(value) < 1e4 else f"{value:.3g}"
    return html.escape(json.dumps(value) if isinstance(value, (list, dict)) else str(value))


def final_eval_keys(runs: list[Run]) -> list[str]:
    """The metrics in the runs' final evaluations (``summary.json``), in the order first seen."""
    keys: list[str] = []
    for r in runs:
        for k in (r.summary or {}).get("final_eval", {}):
            if k not in keys:
                keys.append(k)
    return keys
