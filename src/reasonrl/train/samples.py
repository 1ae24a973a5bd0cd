"""What the model writes: a sample of each step's completions in ``samples.jsonl``.

A run's metrics say *that* the reward moved; only the completions say *why* (a format the reward
misses, a length that runs into the budget, an answer copied from the few-shot prompt). Each
training step writes ``log.samples_per_step`` completions, whole groups so a row is seen beside
the rows it was compared with, chosen by a generator of their own (seeded by the run's seed and
the step) so that the run's own random stream, and with it every number of the run, is the same
with or without samples. Each evaluation writes the greedy completions of the first
``log.samples_eval`` held-out problems: the same prompts in every run of a task, which is what a
comparison of two runs on one prompt needs (``reasonrl report``'s completions browser).

One JSON object per line::

    {"step": 3, "split": "train", "prompt": "...", "completion": "...", "answer": "12",
     "rewards": {"exact": 1.0}, "reward": 1.0, "advantage": 0.53, "length": 7,
     "stop_reason": "eos", "correct": true, "group": 5}

``stop_reason``: ``eos`` (the model ended it), ``stop`` (a stop string did), ``length`` (the token
budget did). ``correct``: the ``eval.reward`` term equals 1 (None where the step has no such
term). Eval rows have ``split: "eval"``, ``group`` = the problem's index and ``final: true`` on
the evaluation after the last step. The file is bounded (``log.samples_max_mb``; texts longer
than ``TEXT_LIMIT`` characters are cut), and on ``--resume`` it is cut back to the checkpoint,
as ``metrics.jsonl`` is. Trackers that take text receive the same rows
(``reasonrl.train.trackers``).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import torch

from reasonrl.batch import RolloutBatch
from reasonrl.rewards.scorer import reward_metric_names

__all__ = ["SAMPLES_FILE", "TEXT_LIMIT", "SampleWriter", "batch_rows", "stop_reasons"]

SAMPLES_FILE = "samples.jsonl"
TEXT_LIMIT = 4000  # characters of a prompt or completion kept (a few-shot prompt is ~300)


def stop_reasons(batch: RolloutBatch, eos_id: int | None) -> list[str]:
    """Per row: ``length`` when the budget cut it, ``eos`` when its last attended token is EOS,
    else ``stop`` (a stop string ended it; its tokens stay in the completion)."""
    lengths = batch.completion_mask.ne(0).long().sum(-1)
    out = []
    for i, n in enumerate(lengths.tolist()):
        if bool(batch.truncated[i]):
            out.append("length")
        elif n and eos_id is not None and int(batch.completion_ids[i, _last_attended(batch.completion_mask[i])]) == eos_id:
            out.append("eos")
        else:
            out.append("stop")
    return out


def _last_attended(mask: torch.Tensor) -> int:
    return int(torch.nonzero(mask.ne(0)).max())


def _cut(text: Any) -> Any:
    return text[:TEXT_LIMIT] + "…" if isinstance(text, str) and len(text) > TEXT_LIMIT else text


def batch_rows(batch: RolloutBatch, rows: list[int], step: int, eos_id: int | None,
               correct_term: str | None, term_names: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The sample rows of ``rows`` of ``batch``: per-term rewards from its ``reward/<term>`` meta,
    each named as its metric is (``term_names``: a file's function by its function's name), and
    the per-row advantage (the mean over its trained tokens; GRPO's is the same on every token)."""
    names = term_names or {}
    terms = {names.get(k[len("reward/"):], k[len("reward/"):]): v for k, v in batch.meta.items() if k.startswith("reward/")}
    reasons = stop_reasons(batch, eos_id)
    lengths = batch.completion_mask.ne(0).sum(-1).tolist()
    advantages = None
    if batch.advantages is not None:
        mask = batch.response_mask.float()
        advantages = ((batch.advantages.float() * mask).sum(-1) / mask.sum(-1).clamp(min=1)).tolist()
    missing = [None] * len(batch)
    prompts, completions, answers = (batch.meta.get(k, missing) for k in ("prompt", "completion", "answer"))
    out = []
    for i in rows:
        rewards = {t: _number(v[i]) for t, v in terms.items()}
        correct = rewards.get(correct_term) if correct_term else None
        out.append({
            "step": step, "split": "train",
            "prompt": _cut(prompts[i]), "completion": _cut(completions[i]), "answer": _text_or_none(answers[i]),
            "rewards": rewards, "reward": _number(batch.rewards[i]),
            "advantage": None if advantages is None else round(advantages[i], 6),
            "length": int(lengths[i]), "stop_reason": reasons[i],
            "correct": None if correct is None else correct == 1.0,
            "group": int(batch.group_ids[i]),
        })
    return out


def _number(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return round(value, 6) if value == value and abs(value) != float("inf") else None


def _text_or_none(value: Any) -> str | None:
    return None if value is None else _cut(str(value))


class SampleWriter:
    """Appends sample rows to ``RUN_DIR/samples.jsonl`` and hands them to the trackers."""

    def __init__(self, run_dir: Path, *, per_step: int, eval_problems: int, max_mb: float, seed: int,
                 eos_id: int | None, correct_term: str | None, reward_names: list[str] = (),
                 resume_step: int | None = None, trackers: list | None = None) -> None:
        self.path = Path(run_dir) / SAMPLES_FILE
        self.per_step, self.eval_problems, self.seed = per_step, eval_problems, seed
        self.max_mb, self.max_bytes = max_mb, int(max_mb * 2**20)
        self.eos_id, self.correct_term = eos_id, correct_term
        self.term_names = reward_metric_names(list(reward_names))
        self.trackers = list(trackers or [])
        if resume_step is not None and self.path.exists():
            kept = [line for line in self.path.read_text().splitlines() if _written_before(line, resume_step)]
            self.path.write_text("".join(line + "\n" for line in kept))
        self.size = self.path.stat().st_size if self.path.exists() else 0
        self.full = self.size >= self.max_bytes
        self._file = open(self.path, "a", buffering=1) if (per_step or eval_problems) else None

    def train(self, step: int, trained: RolloutBatch | None, sampled: RolloutBatch | None) -> None:
        """Whole groups of this step's rows, up to ``per_step`` rows: from the rows trained on
        (they carry advantages), else, on a step that trained on none, from every sampled row."""
        batch = trained if trained is not None and len(trained) else sampled
        if not self.per_step or batch is None or not len(batch):
            return
        groups: dict[int, list[int]] = {}
        for i, g in enumerate(batch.group_ids.tolist()):
            groups.setdefault(int(g), []).append(i)
        order = list(groups)
        random.Random(self.seed * 1_000_003 + step).shuffle(order)
        rows: list[int] = []
        for g in order:
            if rows and len(rows) + len(groups[g]) > self.per_step:
                break
            rows += groups[g][:self.per_step]
        self._write(step, "train", batch_rows(batch, rows, step, self.eos_id, self.correct_term, self.term_names))

    def eval(self, step: int, problems: list, completions: list[str], outcomes: list[float],
             final: bool = False, env_rewards: list[float] | None = None) -> None:
        """The greedy completions of the first ``eval_problems`` held-out problems; ``env_rewards``:
        the rewards an environment's rubric gave them (a verifiers task), else the outcome is the reward."""
        n = min(self.eval_problems, len(completions))
        rows = [{"step": step, "split": "eval", "prompt": _cut(problems[i].prompt), "completion": _cut(completions[i]),
                 "answer": _text_or_none(problems[i].answer),
                 "rewards": {"env": _number(env_rewards[i])} if env_rewards else {},
                 "reward": _number(env_rewards[i] if env_rewards else outcomes[i]),
                 "advantage": None, "length": None, "stop_reason": None, "correct": bool(outcomes[i] == 1.0),
                 "group": i, **({"final": True} if final else {})} for i in range(n)]
        self._write(step, "eval", rows)

    def _write(self, step: int, split: str, rows: list[dict[str, Any]]) -> None:
        if not rows or self._file is None:
            return
        if not self.full:
            text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
            if self.size + len(text.encode()) > self.max_bytes:
                self.full = True
                print(f"warning: {self.path} reached log.samples_max_mb={self.max_mb:g}; no more samples are "
                      "written to it in this run", file=sys.stderr)
            else:
                self._file.write(text)
                self.size += len(text.encode())
        for tracker in list(self.trackers):
            log_samples = getattr(tracker, "log_samples", None)
            if log_samples is None:
                continue
            try:
                log_samples(step, split, rows)
            except Exception as exc:  # noqa: BLE001 — a tracker outage must not kill the run
                self.trackers.remove(tracker)
                print(f"warning: {type(tracker).__name__} failed on samples ({type(exc).__name__}: {exc}); it receives "
                      f"no more samples in this run ({self.path.name} is complete)", file=sys.stderr)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _written_before(line: str, checkpoint_step: int) -> bool:
    """Was this row written before the checkpoint was taken? A row of a later step was not, nor
    the final evaluation's (it follows the last checkpoint)."""
    try:
        row = json.loads(line)
        step = int(row["step"])
    except (ValueError, KeyError, TypeError):
        return False  # a line cut short by a crash
    return step < checkpoint_step or (step == checkpoint_step and not row.get("final"))
