"""A calculator tool on the embedded arithmetic task: the ``calculator`` environment and the
``arithmetic_tools`` task whose warm-up shows the call syntax.

A call is an expression in brackets, ``[7*5]``; the environment answers ``=35`` and the model
goes on (``[3+4]=7;[7*5]=35;####35``). Writing ``7*5=35`` itself stays allowed, so using the
tool is the model's choice: the ``arithmetic_tools`` warm-up writes a share ``tool_fraction``
of the steps as calls (the rest as plain steps), and a reward on the final answer can move
that share. Without the environment (plain GRPO on the same model) nothing answers a call and
the model writes the ``=35`` itself, as in its warm-up text: the no-tool baseline.
"""

from __future__ import annotations

import ast
import random
from dataclasses import dataclass
from typing import Annotated

from reasonrl.envs.base import Environment, Step
from reasonrl.params import Range
from reasonrl.policy.char_tokenizer import ARITHMETIC_CHARS
from reasonrl.registry import ENVIRONMENTS, TASKS
from reasonrl.tasks.arithmetic import ArithmeticTask
from reasonrl.problem import Problem

__all__ = ["Calculator", "ArithmeticToolsTask", "evaluate_expression"]

OPEN, CLOSE = "[", "]"
MAX_EXPRESSION_CHARS = 40  # a call longer than this is refused, not evaluated
MAX_VALUE = 10**9


def evaluate_expression(text: str) -> int | None:
    """The integer value of ``text`` if it is an expression of integers, ``+ - *`` and
    brackets (at most ``MAX_EXPRESSION_CHARS`` characters, every value within ±10⁹); else
    None. Parsed with ``ast``, never ``eval``: model-written text is untrusted."""
    if not text or len(text) > MAX_EXPRESSION_CHARS:
        return None
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return None

    def value(node) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            out = node.value
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            out = -value(node.operand)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
            a, b = value(node.left), value(node.right)
            out = a + b if isinstance(node.op, ast.Add) else a - b if isinstance(node.op, ast.Sub) else a * b
        else:
            raise ValueError(type(node).__name__)
        if abs(out) > MAX_VALUE:
            raise ValueError("too large")
        return out

    try:
        return value(tree.body)
    except ValueError:
        return None


@ENVIRONMENTS.register("calculator")
@dataclass
class Calculator(Environment):
    """Answers a turn that ends in a call ``[expr]`` with ``=value`` (``=`` alone when the
    expression is not one it evaluates); any other turn ends the episode.

    ``call_cost``: a per-turn reward of −cost for each call (0: calls are free).
    ``max_calls``: calls answered per episode; a further call ends it."""

    call_cost: Annotated[float, Range(ge=0)] = 0.0
    max_calls: Annotated[int, Range(ge=1)] = 8

    stop = (CLOSE,)
    info_keys = ("tool_calls", "tool_errors")

    def reset(self, problem, seed: int) -> str:
        self.calls = 0
        return ""

    def step(self, action: str) -> Step:
        start = action.rfind(OPEN)
        if not action.endswith(CLOSE) or start < 0 or self.calls >= self.max_calls:
            return Step(done=True)
        self.calls += 1
        result = evaluate_expression(action[start + 1:-1])
        return Step(observation="=" if result is None else f"={result}", reward=-self.call_cost if self.call_cost else 0.0,
                    info={"tool_calls": 1.0, "tool_errors": float(result is None)})

    def state_dict(self):
        return {"calls": self.calls}

    def load_state_dict(self, state):
        self.calls = state["calls"]


@TASKS.register("arithmetic_tools")
@dataclass
class ArithmeticToolsTask(ArithmeticTask):
    """The arithmetic task with the calculator's call syntax in its alphabet and warm-up: each
    step of a worked solution is written as a call ``[a+b]=s`` with probability
    ``tool_fraction`` (the ``=s`` being what the calculator would answer)."""

    tool_fraction: float = 0.3
    name: str = "arithmetic_tools"
    alphabet = ARITHMETIC_CHARS + OPEN + CLOSE

    def __post_init__(self) -> None:
        if not 0.0 <= self.tool_fraction <= 1.0:
            raise ValueError(f"task.tool_fraction must be in [0, 1], got {self.tool_fraction}")
        super().__post_init__()

    def warmup_problems(self, step: int, count: int, seed: int) -> list[Problem]:
        rng = random.Random(f"tools:{seed}:{step}")
        out = []
        for p in super().warmup_problems(step, count, seed):
            *steps, final = p.solution.split(";")
            steps = [f"{OPEN}{s.split('=')[0]}{CLOSE}={s.split('=')[1]}" if rng.random() < self.tool_fraction else s
                     for s in steps]
            out.append(Problem(p.prompt, p.answer, ";".join([*steps, final]), p.meta))
        return out
