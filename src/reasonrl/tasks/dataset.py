"""A generic question/answer task from any local data file.

``train_path`` and ``eval_path`` are each ``.jsonl``, ``.json``, ``.parquet`` or
``hf:<name>[:<split>]`` (see ``reasonrl.tasks.files``). Per row:

- prompt: ``template`` formatted with the row's fields by name; ``{prompt}``
  always means the value of ``prompt_field`` (a non-empty string), so the default
  ``"{prompt}"`` works whatever the column is called;
- answer: the ``answer_field`` value (a string or a number), or, with
  ``answer_regex``, its first match's group 1 (the whole match if the regex has
  no group), stripped. E.g. ``"####\\s*(.+)$"`` reads GSM8K-style answers;
- solution: the ``solution_field`` value when set, else empty;
- meta: ``{"index": 0-based row in its file, "split": "train" | "eval"}``.

Every prompt must fit the model's context with ``rollout.max_new_tokens``
(``reasonrl.tasks.lengths``, checked when the trainer has the tokenizer).

Training order and the held-out set follow ``reasonrl.tasks.files``. The two
files are trusted to be disjoint; that is the data's job, not the loader's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

from reasonrl.registry import TASKS
from reasonrl.problem import Problem
from reasonrl.tasks.files import ProblemStream, Row, check_template, read_rows


class Record(NamedTuple):
    origin: str  # "train.jsonl, line 12": named when the row's prompt is too long for the model
    problem: Problem


@TASKS.register("dataset")
@dataclass
class DatasetTask(ProblemStream):
    """Prompts and answers read from ``train_path``/``eval_path`` (see the module docstring)."""

    train_path: str
    eval_path: str
    prompt_field: str = "prompt"
    answer_field: str = "answer"
    solution_field: str | None = None
    template: str = "{prompt}"
    answer_regex: str | None = None
    name: str = "dataset"

    def __post_init__(self) -> None:
        check_template(self.template, "template")
        try:
            self._answer_re = re.compile(self.answer_regex) if self.answer_regex else None
        except re.error as exc:
            raise ValueError(f"task.answer_regex {self.answer_regex!r} is not a valid regex: {exc}") from None
        # Parse every row now: a bad row is a recipe error before training, not at step 3000.
        self._train = [self._parse(r) for r in read_rows(self.train_path)]
        self._eval = [self._parse(r) for r in read_rows(self.eval_path)]
        self._eval_source = self.eval_path

    def _parse(self, row: Row) -> Record:
        prompt = row.render(self.template, {"prompt": row.text(self.prompt_field)})
        answer = row.answer_text(self.answer_field)
        if self._answer_re is not None:
            found = self._answer_re.search(answer)
            if found is None:
                raise row.error(f"answer_regex {self.answer_regex!r} does not match field "
                                f"'{self.answer_field}': {answer[-80:]!r}")
            answer = found.group(1) if self._answer_re.groups else found.group(0)
            answer = (answer or "").strip()
            if not answer:
                raise row.error(f"answer_regex {self.answer_regex!r} matched an empty answer")
        solution = row.text(self.solution_field) if self.solution_field else ""
        return Record(row.origin, Problem(prompt=prompt, answer=answer, solution=solution, meta={"index": row.index}))

    def _problem(self, record: Record, split: str) -> Problem:
        p = record.problem
        return Problem(p.prompt, p.answer, p.solution, {**p.meta, "split": split})
