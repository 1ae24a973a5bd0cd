"""``arithmetic_steps``: process supervision for the embedded arithmetic task.

A token reward (``TOKEN_REWARDS``) that returns one value per character of a
completion such as ``3+4=7;7*5=35;####35`` for the prompt ``(3+4)*5;``:

- The completion is cut into ``;``-terminated segments; a segment's characters and
  its ``;`` share one value.
- A step segment ``a op b = c`` (op in ``+ - *``, spaces allowed) gets 1 when it is a
  legal reduction of the current expression, i.e. ``a op b`` is an operation whose two
  operands are already numbers in the expression's parse tree (brackets and precedence
  respected; ``+`` and ``*`` may swap their operands), AND c is its value. The
  expression then takes c in place of that operation. Otherwise the step gets 0 and the
  expression is left as it was, so a later step is judged against the true state, not
  against a mistaken one: the careless ``4*5=20;3+20=23`` for ``(3+4)*5`` gets 0 on both.
- The answer segment ``####N`` gets 1 when N equals the problem's answer, else 0.
  Everything after N (and after the first answer) gets 0.
- Anything else (malformed text, an empty segment) gets 0.

Pure Python; garbage in gives zeros out, never an exception. The expression is the
last arithmetic expression in the prompt, so task templates and few-shot exemplars
before it do not matter.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from reasonrl.registry import TOKEN_REWARDS

__all__ = ["arithmetic_steps", "parse_expression", "step_rewards"]

RIGHT, WRONG = 1.0, 0.0
_MAX_EXPR_CHARS = 200  # bounds the parser's recursion on hostile prompts

# Bounded digit runs: int() refuses strings of over 4300 digits, and no step needs them.
_NUM = r"(-?\d{1,60})"
_STEP = re.compile(rf"\s*{_NUM}\s*([-+*])\s*{_NUM}\s*=\s*{_NUM}\s*")
_ANSWER = re.compile(rf"\s*####\s*{_NUM}(?!\d)")
_EXPR = re.compile(r"[0-9()+\-*]*[+\-*][0-9()+\-*]*")
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*"}
_COMMUTATIVE = {"+", "*"}

Tree = int | list  # an int, or [op, left, right]


def parse_expression(text: str) -> Tree | None:
    """Parse an integer expression over ``+ - *`` and brackets into ``[op, left, right]``
    lists; None when it is not one. ``ast.parse`` only parses, it never evaluates."""
    if not text or len(text) > _MAX_EXPR_CHARS or not re.fullmatch(r"[0-9()+\-*\s]+", text):
        return None
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None

    def convert(n: ast.AST) -> Tree:
        if isinstance(n, ast.Constant) and type(n.value) is int:
            return n.value
        if isinstance(n, ast.BinOp) and type(n.op) in _OPS:
            return [_OPS[type(n.op)], convert(n.left), convert(n.right)]
        raise ValueError("not an arithmetic expression")

    try:
        tree = convert(node)
    except (ValueError, RecursionError):
        return None
    return tree if isinstance(tree, list) else None


def _apply(op: str, a: int, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def _reduce(tree: Tree, op: str, a: int, b: int, value: int) -> Tree | None:
    """``tree`` with its first (left-to-right) reducible ``a op b`` replaced by ``value``;
    None when there is none."""
    if isinstance(tree, int):
        return None
    node_op, left, right = tree
    if isinstance(left, int) and isinstance(right, int):
        if node_op == op and ((left, right) == (a, b) or (op in _COMMUTATIVE and (left, right) == (b, a))):
            return value
        return None
    for k in (1, 2):
        reduced = _reduce(tree[k], op, a, b, value)
        if reduced is not None:
            out = list(tree)
            out[k] = reduced
            return out
    return None


def _expression_of(prompt: str) -> Tree | None:
    candidates = [c for c in _EXPR.findall(prompt) if any(ch.isdigit() for ch in c)]
    return parse_expression(candidates[-1]) if candidates else None


def _int_or_none(text: Any) -> int | None:
    try:
        return int(str(text).strip())
    except (TypeError, ValueError):
        return None


def step_rewards(completion: str, expression: Tree | None, answer: int | None) -> list[float]:
    """Per-character rewards of ``completion`` (see the module docstring); ``expression``
    is the parsed prompt (None: no step can be judged), ``answer`` the true answer."""
    out = [WRONG] * len(completion)
    state = expression
    start = 0
    while start < len(completion):
        end = completion.find(";", start)
        end = len(completion) if end < 0 else end + 1  # the ';' belongs to its segment
        segment = completion[start:end]
        segment = segment.removesuffix(";")
        answer_match = _ANSWER.match(segment)
        if answer_match is not None:
            if answer is not None and _int_or_none(answer_match.group(1)) == answer:
                out[start:start + answer_match.end()] = [RIGHT] * answer_match.end()
            break  # the derivation is over: whatever follows earns nothing
        step = _STEP.fullmatch(segment)
        if step is not None and state is not None:
            a, op, b, c = int(step.group(1)), step.group(2), int(step.group(3)), int(step.group(4))
            reduced = _reduce(state, op, a, b, c) if c == _apply(op, a, b) else None
            if reduced is not None:
                state = reduced
                out[start:end] = [RIGHT] * (end - start)
        start = end
    return out


@TOKEN_REWARDS.register("arithmetic_steps")
def arithmetic_steps(completion: str, problem) -> list[float]:
    """One reward per character of ``completion``: 1 on the characters of each right,
    legal step and of a right ``####N`` answer, 0 elsewhere (module docstring)."""
    if not isinstance(completion, str):
        return []
    expression = _expression_of(str(getattr(problem, "prompt", "")))
    answer = _int_or_none(getattr(problem, "answer", None))
    return step_rewards(completion, expression, answer)
