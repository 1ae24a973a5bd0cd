"""An embedded temporal-grounding task with dense and sparse views (SAVER's analogue of video
frames; paper not located, arXiv id not found, INFERRED from its abstract;
``docs/methods/saver.md``).

An input is a sequence E = (e_0..e_{N-1}) of ``length`` "frames", each a digit. Background
frames are low digits (0-4); one event is a run of ``min_event``..``max_event`` frames that all
show one high digit c (5-9), its class. The question: where does the event happen (the inclusive
span s-e) and what is it (c). A completion answers ``s-e=c``::

    dense  view:  0314202133477777777701242340013203;   ->   11-19=7
    sparse view:  ...4.......7.......7.......3......;   ->   11-19=7   (budget 4: every 8th frame)

The sparse view S(E) keeps a budget b of the N frames, at a uniform stride N/b from a random
offset (the analogue of sampling b video frames), and shows the others as ``.``, so every kept
frame stays at its own position (its timestamp). b = N is the dense view.

``views`` says what ``train_problems`` emits: ``paired`` (SAVER's training input: for each input
its dense view then its sparse view at ``budget``, two problems with the same ``meta["pair"]``, so
they get two GRPO groups and ``methods.saver`` can pair them), ``sparse`` (the baseline: sparse
views only, each of a different input) or ``dense``. ``eval_problems`` always gives the held-out
inputs at ``budget`` frames (``budget: <length>`` = dense), the same inputs at every budget, so
one recipe evaluates sparse accuracy and ``benchmarks/saver_budgets.py`` sweeps the budget.

``decoys`` (default 0) adds that many shorter runs of other high digits (1..``min_event`` − 1
frames, apart from the event and from each other); the event is the longest run. A decoy makes
the dense view mislead a model that grounds the first or any high run, so the best dense rollout
can be wrong and SAVER's reliability gate has something to close on (with no decoys the dense
view is easy and the gate stays open). The warm-up has no decoys: the model meets them in RL.

Warm-up (``warmup_problems``, what ``TinySpec(task="grounding")`` imitates): views at a budget
drawn from {N, N/2, N/4, N/8} with the true span and class, except that a share
``careless_fraction`` of the solutions move each boundary by up to ``jitter`` frames (a careless
annotator): supervised learning copies the imprecision and only the grounding reward removes it.
On sparse views the warm-up already has to guess the boundaries between kept frames.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Annotated, Literal, Optional

from reasonrl.params import Range
from reasonrl.policy.char_tokenizer import ARITHMETIC_CHARS
from reasonrl.registry import TASKS
from reasonrl.problem import Problem
from reasonrl.tasks.base import in_eval_split

__all__ = ["GroundingTask", "sparse_indices", "sparse_view", "HIDDEN"]

HIDDEN = "."  # a frame the sparse view does not show
LOW, HIGH = "01234", "56789"  # background digits, event classes


def sparse_indices(length: int, budget: int, rng: random.Random) -> list[int]:
    """S: the ``budget`` frame indices a sparse view keeps: floor(o + j·N/b), j = 0..b−1, with the
    offset o uniform in [0, N/b) (uniform stride, random offset). Distinct and increasing since
    N/b ≥ 1; b = N keeps every frame."""
    if not 1 <= budget <= length:
        raise ValueError(f"budget must be in 1..{length} (the sequence length), got {budget}")
    stride = length / budget
    offset = rng.random() * stride
    return [min(length - 1, math.floor(offset + j * stride)) for j in range(budget)]


def sparse_view(frames: str, kept: list[int]) -> str:
    """The frames with every index outside ``kept`` shown as ``HIDDEN``."""
    keep = set(kept)
    return "".join(f if i in keep else HIDDEN for i, f in enumerate(frames))


@TASKS.register("grounding")
@dataclass
class GroundingTask:
    """Ground one event in a sequence of digit frames; see the module docstring."""

    length: Annotated[int, Range(ge=8, le=99, why="indices are written with at most two digits")] = 32
    min_event: Annotated[int, Range(ge=1)] = 6
    max_event: Annotated[int, Range(ge=1)] = 12
    budget: Optional[Annotated[int, Range(ge=1)]] = None
    """Frames the sparse view keeps (training and eval); default length // 8 (SAVER's N/8)."""
    views: Literal["paired", "sparse", "dense"] = "paired"
    decoys: Annotated[int, Range(ge=0, le=4)] = 0
    """Shorter runs of other high digits in every input (the event is the longest run)."""
    careless_fraction: Annotated[float, Range(ge=0, le=1)] = 0.5
    jitter: Annotated[int, Range(ge=0)] = 2
    eval_fraction: Annotated[float, Range(gt=0, lt=1)] = 0.1
    name: str = "grounding"

    alphabet = ARITHMETIC_CHARS + HIDDEN  # every character of prompts and solutions

    def __post_init__(self) -> None:
        if not self.min_event <= self.max_event <= self.length:
            raise ValueError(f"task.min_event <= task.max_event <= task.length ({self.length}) must hold, got "
                             f"{self.min_event}, {self.max_event}")
        if self.budget is None:
            self.budget = max(1, self.length // 8)
        if not 1 <= self.budget <= self.length:
            raise ValueError(f"task.budget must be in 1..{self.length} (task.length), got {self.budget}")
        if self.decoys and self.min_event < 2:
            raise ValueError("task.decoys needs task.min_event >= 2 (a decoy is shorter than the event)")
        room = self.length - self.max_event - 1 - self.decoys * self.min_event
        if self.decoys and room < 0:
            raise ValueError(f"task.decoys={self.decoys} do not fit beside an event of up to "
                             f"{self.max_event} frames in task.length={self.length} frames")

    # -- drawing inputs ------------------------------------------------------------------------
    def _input(self, rng: random.Random, held_out: bool) -> tuple[str, int, int, str]:
        """(frames, s, e, c) of the requested split (drawn until the hash puts it there)."""
        while True:
            n = rng.randint(self.min_event, self.max_event)
            s = rng.randrange(self.length - n + 1)
            c = rng.choice(HIGH)
            frames = "".join(c if s <= i < s + n else rng.choice(LOW) for i in range(self.length))
            if self.decoys:
                frames = self._add_decoys(frames, s, s + n - 1, c, rng)
                if frames is None:
                    continue
            if in_eval_split(frames, self.eval_fraction) == held_out:
                return frames, s, s + n - 1, c

    def _add_decoys(self, frames: str, s: int, e: int, c: str, rng: random.Random) -> str | None:
        """``decoys`` runs of 1..min_event−1 frames of a high digit other than c, each with at least
        one background frame between it and the event or another decoy (so runs never merge and
        the event stays the unique longest run). Positions are drawn until they fit; None (draw
        another input) when 100 draws do not, which a crowded sequence can cause."""
        out = list(frames)
        taken = [(s - 1, e + 1)]  # occupied spans, padded by one background frame
        for _ in range(self.decoys):
            for _ in range(100):
                n = rng.randint(1, self.min_event - 1)
                a = rng.randrange(self.length - n + 1)
                if all(a + n - 1 < lo or a > hi for lo, hi in taken):
                    break
            else:
                return None
            d = rng.choice([h for h in HIGH if h != c])
            out[a:a + n] = d * n
            taken.append((a - 1, a + n))
        return "".join(out)

    def _view(self, frames: str, s: int, e: int, c: str, budget: int, rng: random.Random, pair: str,
              view: str) -> Problem:
        kept = sparse_indices(self.length, budget, rng)
        answer = f"{s}-{e}={c}"
        return Problem(prompt=sparse_view(frames, kept) + ";", answer=answer, solution=answer,
                       meta={"pair": pair, "view": view, "budget": budget, "span": (s, e), "label": c})

    def train_problems(self, step: int, count: int, seed: int) -> list[Problem]:
        rng = random.Random(f"grounding:{seed}:{step}")
        out: list[Problem] = []
        i = 0
        while len(out) < count:
            frames, s, e, c = self._input(rng, held_out=False)
            pair = f"{seed}:{step}:{i}"
            if self.views in ("paired", "dense"):
                out.append(self._view(frames, s, e, c, self.length, rng, pair, "dense"))
            if self.views in ("paired", "sparse"):
                out.append(self._view(frames, s, e, c, self.budget, rng, pair, "sparse"))
            i += 1
        return out[:count]  # an odd count ends on a dense view without its partner

    def eval_problems(self, count: int) -> list[Problem]:
        inputs, views = random.Random("grounding-eval"), random.Random(f"grounding-eval-view:{self.budget}")
        out = []
        for i in range(count):
            frames, s, e, c = self._input(inputs, held_out=True)
            view = "dense" if self.budget == self.length else "sparse"
            out.append(self._view(frames, s, e, c, self.budget, views, f"eval:{i}", view))
        return out

    def warmup_problems(self, step: int, count: int, seed: int) -> list[Problem]:
        """Views at budgets N, N/2, N/4, N/8 whose solution is the (partly jittered) span; see
        the module docstring."""
        rng = random.Random(f"grounding-warmup:{seed}:{step}")
        budgets = sorted({max(1, self.length // d) for d in (1, 2, 4, 8)})
        out = []
        for i in range(count):
            frames, s, e, c = self._input(rng, held_out=False)
            budget = rng.choice(budgets)
            p = self._view(frames, s, e, c, budget, rng, f"warmup:{i}", "dense" if budget == self.length else "sparse")
            ws, we = s, e
            if rng.random() < self.careless_fraction:
                ws = min(max(0, s + rng.randint(-self.jitter, self.jitter)), self.length - 1)
                we = min(max(ws, e + rng.randint(-self.jitter, self.jitter)), self.length - 1)
            out.append(Problem(p.prompt, p.answer, f"{ws}-{we}={c}", p.meta))
        return out

    def extract_answer(self, completion: str, problem: Problem) -> str | None:
        """The normalised ``s-e=c`` (for majority voting and format-failure counts), or None."""
        from reasonrl.methods.saver.reward import extract_grounding  # here: rewards import tasks

        return extract_grounding(completion)

    def group_metrics(self, problem: Problem, completions: list[str]) -> dict[str, float]:
        """Means over one problem's samples: ``iou`` (span IoU with the gold span, 0 when
        unparsable) and ``answer_acc`` (the class is right)."""
        from reasonrl.methods.saver.maths import span_iou
        from reasonrl.methods.saver.reward import parse_grounding

        if not completions:
            raise ValueError("group_metrics needs at least one completion")
        preds = [parse_grounding(c) for c in completions]
        gold = parse_grounding(problem.answer)
        return {"iou": sum(span_iou(p[:2] if p else None, gold[:2]) for p in preds) / len(preds),
                "answer_acc": sum(p is not None and p[2] == gold[2] for p in preds) / len(preds)}
