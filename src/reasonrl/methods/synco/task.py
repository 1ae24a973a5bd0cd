"""The Synthesizer's task for SynCo (``reasonrl.methods.synco.method``): propose a new arithmetic
problem with its answer, and the parser that reads a proposal back.

**Confidence: INFERRED** (SynCo, paper not located; formalised from its abstract: a task
τ = (question q, reference answer a_S)). The format, in the embedded tokenizer's alphabet ``0123456789+-*()=;#``::

    prompt (a seed problem):    (3+4)*5;
    proposal:                   (13+2)*6;13+2=15;15*6=90;####90

the question ``(13+2)*6`` ends at the first ``;``, the reference answer a_S follows ``####``;
between them the Synthesizer may write its own worked steps (the arithmetic task's format),
which is how a tiny model can get a_S right at all (an answer without steps is a guess). The
steps are not checked; only a_S is the reference answer. ``(13+2)*6;####90`` is also well formed.

The warm-up data (``warmup_problems``, what ``TinySpec(task="arithmetic_proposals")`` imitates)
teaches the format: for a seed problem drawn from the arithmetic task's training split, a NEW
problem of the same form (``same_form_fraction``) or another, with fresh operands, also from the
training split (never the held-out one), its worked solution and its answer — wrong in
``wrong_fraction`` of the examples by a careless slip in the last step (its result ±1, ±2 or
±10, carried to the answer: ``15*6=92;####92``). The slip is independent of the
Reasoner's own systematic mistake (ignoring brackets), so the Reasoner's majority vote can catch
it; SynCo's reliability filter and the Synthesizer's RL have something to fix.

The parser (:func:`parse_proposal`) is a small recursive-descent grammar, never ``eval``:

    expr   := term (("+" | "-") term)*
    term   := factor ("*" factor)*
    factor := number | "(" expr ")"
    number := "0" | [1-9][0-9]*            (no sign, no leading zeros)

A proposal is well formed when it is exactly ``<expr>;[<steps>;]####<integer>`` (one ``####``,
nothing after the answer; steps only of ``0-9+-*()=;``), the question has at least one operator
(a bare number is not a problem) and at most ``max_question_chars`` characters.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from reasonrl.registry import TASKS
from reasonrl.tasks.arithmetic import ANSWER_MARK, BRACKETED, FORMS, PROMPT_END, render, worked_solution
from reasonrl.problem import Problem
from reasonrl.tasks.base import in_eval_split

# The embedded tokenizer's alphabet (``reasonrl.policy.char_tokenizer.ARITHMETIC_CHARS``; not
# imported, so that loading the task registry imports no model code).
ARITHMETIC_CHARS = "0123456789+-*()=;#"

__all__ = ["Proposal", "evaluate_expression", "form_of", "parse_proposal", "slip", "ArithmeticProposalTask"]

MAX_NUMBER_DIGITS = 6  # a number longer than this is not a problem the embedded models can state


class _Parser:
    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def expr(self) -> int:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.peek()
            self.pos += 1
            rhs = self.term()
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self) -> int:
        value = self.factor()
        while self.peek() == "*":
            self.pos += 1
            value *= self.factor()
        return value

    def factor(self) -> int:
        if self.peek() == "(":
            self.pos += 1
            value = self.expr()
            if self.peek() != ")":
                raise ValueError("unbalanced bracket")
            self.pos += 1
            return value
        start = self.pos
        while self.peek().isdigit() and self.peek().isascii():
            self.pos += 1
        digits = self.text[start:self.pos]
        if not digits:
            raise ValueError(f"expected a number at {start}")
        if len(digits) > 1 and digits[0] == "0":
            raise ValueError("leading zero")
        if len(digits) > MAX_NUMBER_DIGITS:
            raise ValueError("number too long")
        return int(digits)


def evaluate_expression(text: str) -> int | None:
    """The value of an arithmetic expression in the grammar above, or None when ``text`` is not
    one (any other character, a sign, unbalanced brackets, trailing text)."""
    if not text or len(text) > 200:
        return None
    parser = _Parser(text)
    try:
        value = parser.expr()
    except ValueError:
        return None
    return value if parser.pos == len(text) else None


_FORM_PATTERNS = {
    "a+b*c": re.compile(r"^(?P<a>\d+)\+(?P<b>\d+)\*(?P<c>[2-9])$"),
    "c*b+a": re.compile(r"^(?P<c>[2-9])\*(?P<b>\d+)\+(?P<a>\d+)$"),
    "(a+b)*c": re.compile(r"^\((?P<a>\d+)\+(?P<b>\d+)\)\*(?P<c>[2-9])$"),
    "c*(a+b)": re.compile(r"^(?P<c>[2-9])\*\((?P<a>\d+)\+(?P<b>\d+)\)$"),
}


def form_of(question: str, max_operand: int | None = None) -> str | None:
    """Which of the arithmetic task's forms ``question`` is (operands a, b without leading zeros
    and at most ``max_operand``, c in 2..9), else None."""
    for form, pattern in _FORM_PATTERNS.items():
        m = pattern.match(question)
        if m is None:
            continue
        a, b = m.group("a"), m.group("b")
        if any(len(x) > 1 and x[0] == "0" for x in (a, b)):
            return None
        if max_operand is not None and (int(a) > max_operand or int(b) > max_operand):
            return None
        return form
    return None


@dataclass(frozen=True)
class Proposal:
    question: str  # the expression, without the ';'
    answer: str  # a_S, canonical integer text
    value: int  # the question's true value (for metrics: this domain can check a_S)
    form: str | None  # one of the arithmetic forms, or None

    @property
    def correct(self) -> bool:
        return str(self.value) == self.answer


_ANSWER_RE = re.compile(r"^-?\d{1,%d}$" % (MAX_NUMBER_DIGITS + 1))
_STEPS_RE = re.compile(r"^(?:[0-9+\-*()=]+;)*$")  # the worked steps between the question and ####


def parse_proposal(text: str, max_question_chars: int = 20, max_operand: int | None = None) -> Proposal | None:
    """``<expr>;####<integer>`` → a :class:`Proposal`; None for anything else (see module docs).
    ``max_operand`` only decides ``form`` (out-of-range operands are a valid, unformed problem)."""
    text = text.strip()
    if text.count(ANSWER_MARK) != 1 or text.count("#") != len(ANSWER_MARK):
        return None
    head, answer = text.split(ANSWER_MARK)
    if not head.endswith(PROMPT_END) or not _ANSWER_RE.match(answer):
        return None
    question, _, steps = head.partition(PROMPT_END)
    if not _STEPS_RE.match(steps):
        return None
    if not question or len(question) > max_question_chars or "=" in question:
        return None
    if not any(op in question for op in "+-*"):
        return None  # a bare number states its own answer
    value = evaluate_expression(question)
    if value is None:
        return None
    return Proposal(question=question, answer=str(int(answer)), value=value, form=form_of(question, max_operand))


def slip(value: int, rng: random.Random) -> int:
    """A careless arithmetic slip: ``value`` ± 1, 2 or 10 (never negative, never ``value``)."""
    delta = rng.choice((-10, -2, -1, 1, 2, 10))
    return value + delta if value + delta >= 0 else value + abs(delta)


@TASKS.register("arithmetic_proposals")
@dataclass
class ArithmeticProposalTask:
    """Seed problem → a new problem with its (sometimes wrong) answer; see the module docstring.

    ``train_problems``/``eval_problems`` give seeds whose ``solution`` is a correct proposal
    and whose ``answer`` is its answer (for inspecting a Synthesizer); a Reasoner does not train
    on this task."""

    max_operand: int = 20
    eval_fraction: float = 0.1
    """The arithmetic task's held-out fraction: seeds and proposals are drawn from its training split."""
    wrong_fraction: float = 0.3
    same_form_fraction: float = 0.5
    forms: tuple[str, ...] | None = None
    name: str = "arithmetic_proposals"
    alphabet: str = ARITHMETIC_CHARS

    def __post_init__(self) -> None:
        if self.max_operand < 1:
            raise ValueError(f"max_operand must be >= 1, got {self.max_operand}")
        for key in ("wrong_fraction", "same_form_fraction"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ValueError(f"{key} must be in [0, 1], got {getattr(self, key)}")
        if self.forms is not None:
            unknown = [f for f in self.forms if f not in FORMS]
            if unknown or not self.forms:
                raise ValueError(f"forms must be a non-empty list of {', '.join(FORMS)}; got {list(self.forms)}")
            self.forms = tuple(self.forms)
        self._train = [(form, a, b, c) for form in (self.forms or FORMS) for a in range(self.max_operand + 1)
                       for b in range(self.max_operand + 1) for c in range(2, 10)
                       if not in_eval_split(render(form, a, b, c), self.eval_fraction)]
        if not self._train:
            raise ValueError("arithmetic_proposals has no training problems; raise max_operand")

    def _fresh(self, seed_key: tuple, rng: random.Random) -> tuple:
        form = seed_key[0] if rng.random() < self.same_form_fraction else rng.choice(self.forms or FORMS)
        while True:  # fresh operands, in the training split; terminates: the split is most of the space
            key = (form, rng.randint(0, self.max_operand), rng.randint(0, self.max_operand), rng.randint(2, 9))
            if key != seed_key and not in_eval_split(render(*key), self.eval_fraction):
                return key

    def _example(self, rng: random.Random, wrong_fraction: float) -> Problem:
        seed_key = rng.choice(self._train)
        key = self._fresh(seed_key, rng)
        question = render(*key)
        value = evaluate_expression(question)
        steps = worked_solution(*key).split(PROMPT_END)[:-1]  # "a+b=s", "s*c=v" (the "####v" dropped)
        wrong = rng.random() < wrong_fraction
        answer = slip(value, rng) if wrong else value
        steps[-1] = steps[-1].rsplit("=", 1)[0] + f"={answer}"  # a slip in the last step, carried on
        return Problem(prompt=render(*seed_key) + PROMPT_END, answer=str(answer),
                       solution=f"{question}{PROMPT_END}{PROMPT_END.join(steps)}{PROMPT_END}{ANSWER_MARK}{answer}",
                       meta={"form": key[0], "bracketed": key[0] in BRACKETED, "wrong": wrong})

    def warmup_problems(self, step: int, count: int, seed: int) -> list[Problem]:
        """Seed → proposal pairs, ``wrong_fraction`` of them with a slipped answer."""
        rng = random.Random(f"proposals:{seed}:{step}")
        return [self._example(rng, self.wrong_fraction) for _ in range(count)]

    def train_problems(self, step: int, count: int, seed: int) -> list[Problem]:
        rng = random.Random(f"proposals-train:{seed}:{step}")
        return [self._example(rng, 0.0) for _ in range(count)]

    def eval_problems(self, count: int) -> list[Problem]:
        rng = random.Random("proposals-eval")
        return [self._example(rng, 0.0) for _ in range(count)]
