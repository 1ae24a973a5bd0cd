"""Procedurally generated tasks from the ``reasoning-gym`` package (``pip install reasoning-gym``).

``dataset`` names a reasoning-gym generator (``basic_arithmetic``, ``chain_sum``,
...), ``config`` holds its own options (``min_terms: 2``, ...). One generator is
built with ``seed`` and ``size + eval_size`` items; item ``i`` is reasoning-gym's
``dataset[i]`` (a pure function of seed and index).

Train/eval split: training uses indices ``0 .. size-1``, the held-out set
indices ``size .. size+eval_size-1``. Disjoint indices can still produce the same
question when a config's problem space is small, so a training index whose
question is also an eval question is replaced by the next index (cyclically)
whose question is not: no training prompt ever equals an eval prompt.
Training items are generated lazily and cached, so slow generators cost only
what a run uses; the eval items are generated up front.

Scoring is reasoning-gym's own ``score_answer``: use the ``reasoning_gym`` reward
(``reasonrl.rewards.reasoning_gym``, registered by importing this module). Each
problem's meta carries ``rg_dataset``, ``rg_kwargs`` and the generated ``entry``
so that reward can rebuild (and cache) the scorer by value. ``Problem.answer`` is
the entry's reference answer ("" when the generator has none); ``solution`` is empty.

The train stream's ``seed`` argument only orders the ``size`` items
(see ``reasonrl.tasks.files``); the task's ``seed`` chooses which items exist.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from reasonrl.registry import TASKS
from reasonrl.rewards import reasoning_gym as rg_reward  # registers the "reasoning_gym" reward
from reasonrl.problem import Problem
from reasonrl.tasks.files import ProblemStream, check_template

DEFAULT_TEMPLATE = "Question: {question}\nGive the final answer between <answer> and </answer> tags.\nAnswer:"

Record = tuple[int, dict[str, Any]]  # (generator index, reasoning-gym entry)


class _TrainItems(Sequence[Record]):
    """Training items ``0 .. size-1``, generated on first use, eval questions avoided."""

    def __init__(self, generator: Any, size: int, avoid: set[str]) -> None:
        self._generator, self._size, self._avoid = generator, size, avoid
        self._cache: dict[int, Record] = {}

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, i: int) -> Record:  # type: ignore[override]
        if i not in self._cache:
            self._cache[i] = self._find(i)
        return self._cache[i]

    def _find(self, i: int) -> Record:
        for k in range(self._size):
            j = (i + k) % self._size
            entry = self._generator[j]
            if entry["question"] not in self._avoid:
                return j, entry
        raise ValueError("every training question also appears in the eval set; "
                         "widen the generator's config or lower eval_size")


@TASKS.register("reasoning_gym")
@dataclass
class ReasoningGymTask(ProblemStream):
    """Problems from a reasoning-gym generator (see the module docstring)."""

    dataset: str
    size: int = 1000
    seed: int = 0
    eval_size: int = 100
    config: dict[str, Any] | None = None
    template: str = DEFAULT_TEMPLATE
    name: str = "reasoning_gym"

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"task.size must be >= 1, got {self.size}")
        if self.eval_size < 0:
            raise ValueError(f"task.eval_size must be >= 0, got {self.eval_size}")
        unknown = set(check_template(self.template, "template", required="question")) - {"question"}
        if unknown:
            raise ValueError(f"task.template {self.template!r} may only use {{question}}, not "
                             f"{', '.join(sorted(unknown))}")
        config = dict(self.config or {})
        clash = sorted({"seed", "size"} & config.keys())
        if clash:
            raise ValueError(f"task.config sets {', '.join(clash)}; use task.seed / task.size / task.eval_size")
        self._kwargs = {**config, "seed": self.seed, "size": self.size + self.eval_size}
        generator = rg_reward.generator(self.dataset, self._kwargs)
        self._eval = [(j, generator[j]) for j in range(self.size, self.size + self.eval_size)]
        self._train = _TrainItems(generator, self.size, {e["question"] for _, e in self._eval})
        self._eval_source = f"reasoning-gym '{self.dataset}' (task.eval_size)"

    def extract_answer(self, text: str, problem: Problem) -> str | None:
        """The answer the ``reasoning_gym`` reward scores (its tags, else ``####``): what the
        evaluator's majority vote and format failures read."""
        return rg_reward.extract_answer(text)

    def _problem(self, record: Record, split: str) -> Problem:
        index, entry = record
        answer = entry.get("answer")
        return Problem(
            prompt=self.template.format_map({"question": entry["question"]}),
            answer="" if answer is None else str(answer),
            meta={"index": index, "split": split, "rg_dataset": self.dataset,
                  "rg_kwargs": self._kwargs, "entry": entry},
        )
