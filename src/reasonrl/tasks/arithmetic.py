"""The embedded task: multi-step arithmetic with worked solutions.

Problems have four forms, ``a+b*c``, ``c*b+a``, ``(a+b)*c`` and ``c*(a+b)``,
with ``a, b`` in ``0..max_operand`` and ``c`` in ``2..9``. A worked solution
writes one step per ``;``-separated segment and ends with ``####N``::

    (3+4)*5;  ->  3+4=7;7*5=35;####35

The warm-up data (``solution_for(..., careless=True)``) contains a systematic
mistake: in most bracketed examples the solution ignores the brackets, with
self-consistent steps and a wrong final answer. Supervised learning copies the
mistake; only a reward on the final answer can remove it. That is the point
of the quickstart demo.

Train/eval split: every problem is assigned to a split by a stable hash of its
text, so the held-out set never overlaps any training prompt.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from reasonrl.registry import TASKS
from reasonrl.problem import Problem
from reasonrl.tasks.base import in_eval_split

FORMS = ("a+b*c", "c*b+a", "(a+b)*c", "c*(a+b)")
BRACKETED = {"(a+b)*c", "c*(a+b)"}
PROMPT_END = ";"  # the prompt is the expression followed by this separator
ANSWER_MARK = "####"


def render(form: str, a: int, b: int, c: int) -> str:
    return form.replace("a", str(a)).replace("b", str(b)).replace("c", str(c))


def worked_solution(form: str, a: int, b: int, c: int, careless: bool = False) -> str:
    """The step-by-step solution; ``careless`` ignores brackets (wrong, but consistent)."""
    if form in BRACKETED and careless:
        form = "a+b*c" if form == "(a+b)*c" else "c*a+b"
    if form == "a+b*c":
        x = b * c
        steps = [f"{b}*{c}={x}", f"{a}+{x}={a + x}"]
    elif form == "c*b+a":
        x = c * b
        steps = [f"{c}*{b}={x}", f"{x}+{a}={x + a}"]
    elif form == "c*a+b":
        x = c * a
        steps = [f"{c}*{a}={x}", f"{x}+{b}={x + b}"]
    elif form == "(a+b)*c":
        s = a + b
        steps = [f"{a}+{b}={s}", f"{s}*{c}={s * c}"]
    elif form == "c*(a+b)":
        s = a + b
        steps = [f"{a}+{b}={s}", f"{c}*{s}={c * s}"]
    else:
        raise ValueError(f"unknown arithmetic form '{form}'; allowed: {', '.join(FORMS)}")
    final = steps[-1].split("=")[-1]
    return ";".join(steps) + f";{ANSWER_MARK}{final}"


def true_answer(form: str, a: int, b: int, c: int) -> int:
    return eval(render(form, a, b, c))  # the expression is generated here, never user input


@TASKS.register("arithmetic")
@dataclass
class ArithmeticTask:
    """Procedurally generated arithmetic problems (see module docstring)."""

    max_operand: int = 20
    eval_fraction: float = 0.1
    careless_fraction: float = 0.7
    template: str = "{expr}" + PROMPT_END
    """The prompt for one problem; ``{expr}`` is the expression. A pretrained model wants
    words, e.g. ``"Question: What is {expr}?\\nAnswer:"``."""
    forms: tuple[str, ...] | None = None
    """The problem forms to draw from (None: all four). ``["(a+b)*c", "c*(a+b)"]`` is the
    embedded model's hard split: the bracketed forms whose warm-up carried the systematic
    mistake, where most of its groups fail entirely."""
    few_shot: int = 0
    """Worked, correct exemplars (``template`` + " " + solution) put before each prompt;
    they are fixed training problems, left out of the training stream."""
    name: str = "arithmetic"

    @property
    def stop_strings(self) -> list[str]:
        # With exemplars a model goes on to write the next problem; cut at the blank line.
        return ["\n\n"] if self.few_shot else []

    def __post_init__(self) -> None:
        if self.max_operand < 1:
            raise ValueError(f"task.max_operand must be >= 1, got {self.max_operand}")
        if not 0.0 < self.eval_fraction < 1.0:
            raise ValueError(f"task.eval_fraction must be in (0, 1), got {self.eval_fraction}")
        if self.forms is not None:
            unknown = [f for f in self.forms if f not in FORMS]
            if unknown or not self.forms:
                raise ValueError(f"task.forms must be a non-empty list of {', '.join(FORMS)}; got {list(self.forms)}")
            self.forms = tuple(self.forms)
        space = [
            (form, a, b, c)
            for form in (self.forms or FORMS)
            for a in range(self.max_operand + 1)
            for b in range(self.max_operand + 1)
            for c in range(2, 10)
        ]
        self._train, self._eval = [], []
        for key in space:
            (self._eval if in_eval_split(render(*key), self.eval_fraction) else self._train).append(key)
        if "{expr}" not in self.template:
            raise ValueError(f"task.template must contain {{expr}}, got {self.template!r}")
        if not 0 <= self.few_shot < len(self._train):
            raise ValueError(f"task.few_shot must be in 0..{len(self._train) - 1}, got {self.few_shot}")
        if not self._train or not self._eval:
            raise ValueError("task 'arithmetic' produced an empty split; raise max_operand")
        random.Random(1234).shuffle(self._eval)
        # Drawing exemplars must leave the stream untouched when there are none: the
        # embedded model's warm-up data and the quickstart depend on it.
        picked = set(random.Random(4321).sample(range(len(self._train)), self.few_shot))
        shots = [k for i, k in enumerate(self._train) if i in picked]
        self._train = [k for i, k in enumerate(self._train) if i not in picked]
        self._prefix = "".join(self.template.format(expr=render(*k)) + " " + worked_solution(*k) + "\n\n"
                               for k in shots)

    def _problem(self, key: tuple[str, int, int, int], careless: bool = False) -> Problem:
        form, a, b, c = key
        return Problem(
            prompt=self._prefix + self.template.format(expr=render(form, a, b, c)),
            answer=str(true_answer(form, a, b, c)),
            solution=worked_solution(form, a, b, c, careless=careless),
            meta={"form": form, "bracketed": form in BRACKETED},
        )

    def train_problems(self, step: int, count: int, seed: int) -> list[Problem]:
        rng = random.Random(f"{seed}:{step}")
        return [self._problem(rng.choice(self._train)) for _ in range(count)]

    def warmup_problems(self, step: int, count: int, seed: int) -> list[Problem]:
        """Training problems whose ``solution`` carries the systematic bracket mistake."""
        rng = random.Random(f"warmup:{seed}:{step}")
        out = []
        for _ in range(count):
            key = rng.choice(self._train)
            out.append(self._problem(key, careless=rng.random() < self.careless_fraction))
        return out

    def eval_problems(self, count: int) -> list[Problem]:
        if count > len(self._eval):
            raise ValueError(f"asked for {count} eval problems; the held-out split has {len(self._eval)}")
        return [self._problem(key) for key in self._eval[:count]]

