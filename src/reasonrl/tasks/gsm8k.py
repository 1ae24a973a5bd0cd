"""GSM8K grade-school math word problems from local ``train.jsonl``/``test.jsonl``.

Each row is ``{"question": ..., "answer": "worked solution ...\\n#### 72"}``.

- ``Problem.answer``: the text after ``####`` with thousands commas removed
  (``"#### 1,000"`` -> ``"1000"``), which is what ``exact_answer`` compares.
- ``Problem.solution``: the worked answer with GSM8K's ``<<48/2=24>>`` calculator
  annotations removed and the final ``#### 72`` line kept verbatim. The annotations
  are tool-call markup for a calculator the policy does not have; imitating them
  only teaches it to spend tokens on text nobody executes. The ``####`` line is
  kept because it is the answer format the rewards parse.
- Few-shot: the first ``few_shot`` rows of ``train.jsonl`` become worked exemplars,
  ``template.format(question=q) + " " + solution``, joined by ``shot_separator``
  and followed by it before the final question. Those rows are left out of the
  training stream, so no prompt contains its own answer.
- ``stop_strings``: where a completion should be cut. With a few-shot prompt a
  model tends to go on to invent the next "Question: ..."; cutting at the first
  stop string (which is not part of the completion) keeps the answer that
  ``exact_answer`` reads (it takes the *last* ``####``) the one for this question.
- ``meta``: ``{"index": 0-based row in its file, "split": "train" | "test"}``.
- Every prompt (exemplars included) must fit the model's context with
  ``rollout.max_new_tokens`` (``reasonrl.tasks.lengths``); ``rollout.overlong_prompts``
  can skip or left-truncate the rows that do not.

Training order and the held-out set follow ``reasonrl.tasks.files``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from reasonrl.registry import TASKS
from reasonrl.problem import Problem
from reasonrl.tasks.files import ProblemStream, Row, check_template, read_rows

ANSWER_MARK = "####"
CALCULATOR_RE = re.compile(r"<<[^>]*>>")


@dataclass(frozen=True)
class GSM8KRow:
    index: int
    question: str  # the template applied to this row
    solution: str
    answer: str
    origin: str  # "train.jsonl, line 12": named when the row's prompt is too long for the model


def parse_row(row: Row, template: str) -> GSM8KRow:
    """A validated row; rendering here makes a bad template fail at construction."""
    row.text("question")
    worked = row.text("answer")
    if ANSWER_MARK not in worked:
        raise row.error(f"field 'answer' has no '{ANSWER_MARK} <number>' final line: {worked[-80:]!r}")
    answer = worked.rpartition(ANSWER_MARK)[2].replace(",", "").strip()
    if not answer:
        raise row.error(f"field 'answer' has nothing after '{ANSWER_MARK}'")
    return GSM8KRow(row.index, row.render(template), CALCULATOR_RE.sub("", worked).strip(), answer, row.origin)


@TASKS.register("gsm8k")
@dataclass
class GSM8KTask(ProblemStream):
    """GSM8K from ``path`` (a folder with train.jsonl and test.jsonl); see the module docstring."""

    path: str
    few_shot: int = 0
    template: str = "Question: {question}\nAnswer:"
    shot_separator: str = "\n\n"
    max_train: int = 0  # 0 = every non-exemplar training row
    name: str = "gsm8k"
    stop_strings: list[str] = field(init=False)

    eval_split = "test"

    def __post_init__(self) -> None:
        if self.few_shot < 0:
            raise ValueError(f"task.few_shot must be >= 0, got {self.few_shot}")
        if self.max_train < 0:
            raise ValueError(f"task.max_train must be >= 0 (0 = all), got {self.max_train}")
        check_template(self.template, "template", required="question")
        folder = Path(self.path)
        train = [parse_row(r, self.template) for r in read_rows(str(folder / "train.jsonl"))]
        self._eval = [parse_row(r, self.template) for r in read_rows(str(folder / "test.jsonl"))]
        self._eval_source = str(folder / "test.jsonl")
        if self.few_shot >= len(train):
            raise ValueError(f"task.few_shot={self.few_shot} leaves no training rows; "
                             f"{folder / 'train.jsonl'} has {len(train)}")
        exemplars, self._train = train[: self.few_shot], train[self.few_shot:]
        if self.max_train:
            self._train = self._train[: self.max_train]
        self._prefix = "".join(e.question + " " + e.solution + self.shot_separator for e in exemplars)
        # The text a new question starts with, e.g. "\n\nQuestion:".
        lead = self.template.split("{", 1)[0].rstrip()
        candidates = [self.shot_separator + lead, self.shot_separator]
        self.stop_strings = [s for i, s in enumerate(candidates) if s and s not in candidates[:i]]

    def _problem(self, record: GSM8KRow, split: str) -> Problem:
        return Problem(
            prompt=self._prefix + record.question,
            answer=record.answer,
            solution=record.solution,
            meta={"index": record.index, "split": split},
        )
