"""What the report's completions browser shows: the completions of each run, as the trainer
writes them to ``samples.jsonl`` (``reasonrl.train.samples``) and as ``reasonrl eval`` keeps them
in ``eval*.json``, made into the page's data by :func:`samples_payload`.

A view is the rows of one run at one step and split (``train``, ``eval``, the final ``eval``, or
one task of an ``eval.json``); the browser picks a run and a view, filters its rows and puts two
runs side by side on the prompts both were given. The page must stay small enough to open, so
at most ``MAX_ROWS_PER_VIEW`` rows of a view and ``MAX_VIEWS_PER_SPLIT`` steps of a split (evenly
spaced, the first and the last kept) are embedded; the page says what was left out. Prompts and
answers repeat (a group's rows share one, an evaluation gives every run the same), so each text
is embedded once, in ``strings``, and rows refer to it by index.
"""

from __future__ import annotations

import json
from typing import Any

from reasonrl.evaluate.runs import Run, is_finite_number

__all__ = ["SAMPLES_FILE", "MAX_ROWS_PER_VIEW", "MAX_VIEWS_PER_SPLIT", "samples_payload"]

SAMPLES_FILE = "samples.jsonl"  # reasonrl.train.samples.SAMPLES_FILE (evaluate does not import the trainer)
MAX_ROWS_PER_VIEW = 64
MAX_VIEWS_PER_SPLIT = 40
MAX_TEXT = 4000  # characters of one text (the trainer already cuts at reasonrl.train.samples.TEXT_LIMIT)


class _Strings:
    """Each distinct text once; a row holds its index."""

    def __init__(self) -> None:
        self.values: list[str] = []
        self._index: dict[str, int] = {}

    def __call__(self, text: Any) -> int | None:
        if text is None:
            return None
        text = _cut(str(text))
        if text not in self._index:
            self._index[text] = len(self.values)
            self.values.append(text)
        return self._index[text]


def _cut(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "…"


def _number(value: Any) -> float | None:
    return float(value) if is_finite_number(value) else None


def _row(raw: dict[str, Any], strings: _Strings) -> dict[str, Any]:
    terms = raw.get("rewards") if isinstance(raw.get("rewards"), dict) else {}
    correct = raw.get("correct")
    return {"p": strings(raw.get("prompt")), "c": _cut(str(raw.get("completion") or "")), "a": strings(raw.get("answer")),
            "r": _number(raw.get("reward")), "t": {str(k): v for k, v in terms.items() if is_finite_number(v)},
            "v": _number(raw.get("advantage")), "n": raw.get("length") if is_finite_number(raw.get("length")) else None,
            "s": raw.get("stop_reason") if isinstance(raw.get("stop_reason"), str) else None,
            "k": correct if isinstance(correct, bool) else None,
            "g": raw.get("group") if is_finite_number(raw.get("group")) else None}


def _evenly(items: list[Any], most: int) -> list[Any]:
    if len(items) <= most:
        return items
    return [items[round(i * (len(items) - 1) / (most - 1))] for i in range(most)]


def _from_samples_file(run: Run, strings: _Strings, notes: list[str]) -> list[dict[str, Any]]:
    path = run.path / SAMPLES_FILE
    if not path.is_file():
        return []
    views: dict[tuple[str, int, bool], dict[str, Any]] = {}
    bad = 0
    with path.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
                step, split = int(raw["step"]), str(raw["split"])
            except (ValueError, KeyError, TypeError):
                bad += 1  # a line cut short by a crash, or not a sample row
                continue
            final = bool(raw.get("final")) and split == "eval"
            view = views.setdefault((split, step, final), {"rows": [], "total": 0})
            view["total"] += 1
            if len(view["rows"]) < MAX_ROWS_PER_VIEW:
                view["rows"].append(_row(raw, strings))
    if bad:
        notes.append(f"{run.label}: {bad} unreadable line(s) of {SAMPLES_FILE} skipped")
    out = []
    for split in sorted({k[0] for k in views}, key=lambda s: (s != "train", s)):
        keys = sorted((k for k in views if k[0] == split), key=lambda k: (k[1], k[2]))
        kept = _evenly(keys, MAX_VIEWS_PER_SPLIT)
        if len(kept) < len(keys):
            notes.append(f"{run.label}: {len(keys)} {split} steps have samples; {len(kept)} of them, evenly spaced, "
                         "are in this page")
        for split_, step, final in kept:
            view = views[(split_, step, final)]
            label = f"final eval (step {step})" if final else f"step {step} · {split_}"
            out.append({"key": f"{split_}:{step}{':final' if final else ''}", "label": label, "split": split_, "step": step,
                        "total": view["total"], "rows": view["rows"]})
    if any(v["total"] > len(v["rows"]) for v in out):
        notes.append(f"{run.label}: at most {MAX_ROWS_PER_VIEW} rows of a step are in this page")
    return sorted(out, key=lambda v: (v["step"], v["split"] != "train", v["key"]))


def _from_eval_files(run: Run, strings: _Strings, notes: list[str]) -> list[dict[str, Any]]:
    """``reasonrl eval``'s per-problem rows: every sample (``completions``, judged by
    ``sample_correct``) and the greedy completion, whole problems up to ``MAX_ROWS_PER_VIEW`` rows."""
    out = []
    for task, result in run.evals.items():
        problems = result.get("per_problem") if isinstance(result, dict) else None
        if not isinstance(problems, list) or not any(isinstance(p, dict) and "completions" in p for p in problems):
            continue
        rows: list[dict[str, Any]] = []
        total = 0
        for index, problem in enumerate(problems):
            if not isinstance(problem, dict):
                continue
            texts = problem.get("completions") or []
            judged = problem.get("sample_correct") or []
            these = [{"prompt": problem.get("prompt"), "completion": t, "answer": problem.get("answer"),
                      "reward": float(ok) if isinstance(ok, bool) else None, "correct": ok, "group": index}
                     for t, ok in zip(texts, list(judged) + [None] * (len(texts) - len(judged)))]
            if "greedy_completion" in problem:
                ok = problem.get("greedy")
                these.append({"prompt": problem.get("prompt"), "completion": problem["greedy_completion"],
                              "answer": problem.get("answer"), "reward": float(ok) if isinstance(ok, bool) else None,
                              "correct": ok, "group": index, "tag": "greedy"})
            total += len(these)
            if rows and len(rows) + len(these) > MAX_ROWS_PER_VIEW:
                continue
            for raw in these:
                row = _row(raw, strings)
                if raw.get("tag"):
                    row["x"] = raw["tag"]
                rows.append(row)
        if not rows:
            continue
        if total > len(rows):
            notes.append(f"{run.label}: reasonrl eval on {task}: the first {len(rows)} of {total} completions "
                         "(whole problems) are in this page")
        out.append({"key": f"evaljson:{task}", "label": f"reasonrl eval · {task}", "split": "evaljson", "step": None,
                    "total": total, "rows": rows})
    return out


def samples_payload(runs: list[Run]) -> dict[str, Any] | None:
    """The browser's data: ``strings`` (prompts and answers), per run with any completions its
    ``views`` (each: ``key``, shared by the same step and split of every run, ``label``, ``total``
    rows written, the embedded ``rows``) and ``initial`` (the view it opens on: the final
    evaluation if any, as every run answered the same prompts there, else the last view), and
    ``notes`` on what was left out. None when no run has completions."""
    strings = _Strings()
    notes: list[str] = []
    entries = []
    for index, run in enumerate(runs):
        views = _from_samples_file(run, strings, notes) + _from_eval_files(run, strings, notes)
        if not views:
            continue
        evals = [i for i, v in enumerate(views) if v["split"] == "eval"]
        entries.append({"run": index, "views": views, "initial": evals[-1] if evals else len(views) - 1})
    if not entries:
        return None
    return {"strings": strings.values, "runs": entries, "notes": notes,
            "caps": {"rows_per_view": MAX_ROWS_PER_VIEW, "views_per_split": MAX_VIEWS_PER_SPLIT}}
