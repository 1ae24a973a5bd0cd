"""A small multi-label task for the embedded character-level model.

A prompt names a residue r and a sorted list of distinct two-digit numbers; the
gold label SET Y is every listed number x with x ≡ r (mod ``modulus``)::

    7:13,17,28,44,57,60,87,92;   ->   Y = {17, 57, 87}   (modulus 10: "ends in 7")

A completion names ONE label, e.g. ``57``; ``parse_label`` returns None for
anything else. Every prompt has between ``min_labels`` and ``max_labels`` valid
labels (2..6 by default) and ``list_size - |Y|`` distractors.

Warm-up design (``warmup_problems``): the imitation target is the SMALLEST
valid label with probability ``collapse`` (default 0.85), otherwise one of the
other valid labels uniformly. The warmed model thus names mostly one easy label
(the first match in the sorted list) but keeps some probability on the others,
so sampling explores them. Under the per-rollout ``label_hit`` reward a group
that repeats the easy label already scores 1 per rollout, so GRPO only sharpens
the mode; under ``coverage`` a rollout that names a second correct label earns
more than the repeaters, so the group learns to spread over Y. With
``collapse: 1.0`` the model would never sample the other labels and neither
reward could move it.

Train/eval split: each prompt is assigned by a stable hash of its text, so the
held-out set never overlaps a training prompt.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from reasonrl.registry import TASKS
from reasonrl.problem import Problem
from reasonrl.tasks.base import split_draws

LABEL_RE = re.compile(r"[1-9][0-9]*")
LOW, HIGH = 10, 99  # labels are two-digit numbers


def parse_label(completion: str) -> str | None:
    """The number a completion names (surrounding whitespace ignored), or None when the
    text is not exactly one number without leading zeros."""
    text = completion.strip()
    return text if LABEL_RE.fullmatch(text) else None


@TASKS.register("multilabel")
@dataclass
class MultiLabelTask:
    """Name one number of the list that is ≡ r (mod ``modulus``); see the module docstring."""

    list_size: int = 8
    modulus: int = 10
    min_labels: int = 2
    max_labels: int = 6
    collapse: float = 0.85
    """Fraction of warm-up solutions that name the smallest valid label."""
    eval_fraction: float = 0.1
    name: str = "multilabel"

    alphabet = "0123456789:,;"  # every character of prompts and solutions (the tiny model's vocabulary)

    def __post_init__(self) -> None:
        if not 2 <= self.modulus <= 10:
            raise ValueError(f"task.modulus must be in 2..10 (the residue is one digit), got {self.modulus}")
        members = min(len(self._residue_class(r)) for r in range(self.modulus))
        if not 1 <= self.min_labels <= self.max_labels <= members:
            raise ValueError(f"task.min_labels and task.max_labels must satisfy 1 <= min_labels <= max_labels <= "
                             f"{members} (numbers {LOW}..{HIGH} per residue class), got {self.min_labels}, "
                             f"{self.max_labels}")
        others = (HIGH - LOW + 1) - max(len(self._residue_class(r)) for r in range(self.modulus))
        if not self.max_labels <= self.list_size <= self.min_labels + others:
            raise ValueError(f"task.list_size must be in {self.max_labels}..{self.min_labels + others} "
                             f"(room for max_labels labels and the distractors), got {self.list_size}")
        if not 0.0 <= self.collapse <= 1.0:
            raise ValueError(f"task.collapse must be in [0, 1], got {self.collapse}")
        if not 0.0 < self.eval_fraction < 1.0:
            raise ValueError(f"task.eval_fraction must be in (0, 1), got {self.eval_fraction}")

    def _residue_class(self, r: int) -> list[int]:
        return [x for x in range(LOW, HIGH + 1) if x % self.modulus == r]

    def _draw(self, rng: random.Random) -> Problem:
        r = rng.randrange(self.modulus)
        labels = sorted(rng.sample(self._residue_class(r), rng.randint(self.min_labels, self.max_labels)))
        others = [x for x in range(LOW, HIGH + 1) if x % self.modulus != r]
        numbers = sorted(labels + rng.sample(others, self.list_size - len(labels)))
        gold = tuple(str(x) for x in labels)
        return Problem(
            prompt=f"{r}:{','.join(map(str, numbers))};",
            answer=",".join(gold),
            solution=gold[0],
            meta={"labels": gold, "num_labels": len(gold)},
        )

    def _stream(self, rng: random.Random, count: int, split: str) -> list[Problem]:
        return split_draws(lambda: self._draw(rng), count, split == "eval", self.eval_fraction,
                           "multilabel", "raise eval_fraction")

    def train_problems(self, step: int, count: int, seed: int) -> list[Problem]:
        return self._stream(random.Random(f"{seed}:{step}"), count, "train")

    def eval_problems(self, count: int) -> list[Problem]:
        return self._stream(random.Random("multilabel-eval"), count, "eval")

    def warmup_problems(self, step: int, count: int, seed: int) -> list[Problem]:
        """Training problems whose ``solution`` collapses onto the smallest valid label
        with probability ``collapse`` (see the module docstring)."""
        rng = random.Random(f"warmup:{seed}:{step}")
        out = []
        for p in self._stream(rng, count, "train"):
            labels = p.meta["labels"]
            easy = rng.random() < self.collapse or len(labels) == 1
            pick = labels[0] if easy else rng.choice(labels[1:])
            out.append(Problem(prompt=p.prompt, answer=p.answer, solution=pick, meta=p.meta))
        return out

    def extract_answer(self, completion: str, problem: Problem) -> str | None:
        """The named label, for majority voting and format-failure counts (None if malformed)."""
        return parse_label(completion)

    def group_metrics(self, problem: Problem, completions: list[str]) -> dict[str, float]:
        """Quality of one group of k = len(completions) samples:

        - ``recall_at_k``: |∪ correct labels named| / |Y| (what the coverage reward targets);
        - ``hit_rate``: fraction of completions naming a correct label;
        - ``distinct_correct``: number of distinct correct labels named;
        - ``easy_rate``: fraction naming the warm-up's easy label (the smallest), the collapse;
        - ``parse_rate``: fraction that parse as one label.
        """
        if not completions:
            raise ValueError("group_metrics needs at least one completion")
        gold = set(problem.meta["labels"])
        named = [parse_label(c) for c in completions]
        correct = [x for x in named if x is not None and x in gold]
        k = len(completions)
        easy = min(gold, key=int)
        return {
            "recall_at_k": len(set(correct)) / len(gold),
            "hit_rate": len(correct) / k,
            "distinct_correct": float(len(set(correct))),
            "easy_rate": sum(x == easy for x in named) / k,
            "parse_rate": sum(x is not None for x in named) / k,
        }
