"""The ``python_tests`` reward: run the completion's code in the sandbox, check its tests here.

The code is the last fenced ```python block of the completion (``py``/``python3`` and a
bare ``` fence count too), or the whole completion when it has no fenced block.
``problem.meta["tests"]`` is a string of Python statements, parsed here (:func:`split_tests`):

- a top-level ``assert A <op> B`` (one comparison) where one side is a literal
  (``ast.literal_eval`` reads it) keeps that literal here: the sandbox evaluates only the
  other side and returns its value as data, and this process applies the comparison;
- ``assert not X``: the sandbox evaluates X, this process requires it falsy;
- any other ``assert E``: the sandbox evaluates E, this process requires it truthy;
- every other top-level statement runs in the sandbox as setup, in order.

The sandbox runs a fixed harness (:data:`PROGRAM`) that gets the code and those expressions (never
the literals) as JSON on stdin, runs the code as ``__main__``, then the steps in order, and writes
each value as a marked line on stderr (``isolation.sandbox.values``: strict JSON by exact type;
anything else, a subclass or a namedtuple say, is ``unencodable`` and fails its assert). The
reward is 1.0 iff every step reported and every check holds. So a program that exits early
(``sys.exit(0)``, ``os._exit(0)``), defines an object whose ``==`` is always true, patches
builtins or reads ``main.py`` (the harness: no expected value in it) gains nothing.

What stays forgeable, and why: an assert whose *both* sides are computed (``assert f(2) ==
g(3)``, or against a name the setup assigned) is computed in the sandbox, by the code under test;
so are asserts nested in functions (``def check(candidate): assert ...``). Write expected values
as literals in top-level asserts.

The reward protocol returns a float, so the reason is not recorded per sample; :func:`check`
returns ``(passed, SandboxResult)`` (its ``reason`` names the failed assert) for callers that
want it.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import operator
import re
from dataclasses import dataclass
from typing import Any, Callable

from reasonrl.isolation.sandbox import SandboxResult, run_python
from reasonrl.isolation.sandbox.values import ENCODE, MARK, Malformed, decode, read_rows
from reasonrl.problem import Problem
from reasonrl.registry import REWARDS

__all__ = ["extract_code", "check", "split_tests", "Step", "PROGRAM"]

FENCE_RE = re.compile(r"```[ \t]*(python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)

PROGRAM = ENCODE + f"_MARK = {MARK!r}\n" + r'''
import json, sys
_err = sys.stderr
_spec = json.loads(sys.stdin.read())
def _emit(obj):
    _err.write(_MARK + json.dumps(obj) + "\n")
    _err.flush()
_g = {"__name__": "__main__", "__builtins__": __builtins__}
exec(compile(_spec["code"], "solution.py", "exec"), _g)
for _i, (_kind, _src) in enumerate(_spec["steps"]):
    if _kind == "exec":
        exec(compile(_src, "<tests>", "exec"), _g)
    else:
        _emit({"step": _i, "value": _enc(eval(compile(_src, "<tests>", "eval"), _g))})
_emit({"done": True})
'''
"""The trusted program in the sandbox. stdin: ``{"code": solution, "steps": [["exec" | "eval",
source]]}``. An exception (in the code, a setup statement or an expression) ends it with its
traceback, as a failing test would."""

_COMPARE: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
    ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not, ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b}


@dataclass(frozen=True)
class Step:
    """One top-level statement of the tests: ``kind`` ``"exec"`` (setup, run in the sandbox) or
    ``"eval"`` (``source`` evaluated there, its value checked here: ``op`` against ``literal``,
    the literal on the left iff ``literal_first``; ``op`` None: truthy, or falsy when ``negate``).
    ``line``: its line in the tests."""

    kind: str
    source: str
    line: int
    op: type | None = None
    literal: Any = None
    literal_first: bool = False
    negate: bool = False

    def holds(self, value: Any) -> bool:
        """Whether the value the sandbox reported passes this assert (never raises)."""
        try:
            if self.op is not None:
                a, b = (self.literal, value) if self.literal_first else (value, self.literal)
                return bool(_COMPARE[self.op](a, b))
            return not value if self.negate else bool(value)
        except Exception:  # noqa: BLE001 - an opaque value, or types that do not compare: the assert fails
            return False


def _literal(node: ast.expr) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def split_tests(tests: str) -> list[Step]:
    """``tests`` as :class:`Step` s (module docstring); a ValueError when it does not parse."""
    try:
        tree = ast.parse(tests)
    except (SyntaxError, ValueError) as exc:
        raise ValueError(f"reward 'python_tests': problem.meta['tests'] is not Python: {exc}") from None
    steps = []
    for stmt in tree.body:
        if not isinstance(stmt, ast.Assert):
            steps.append(Step("exec", ast.unparse(stmt), stmt.lineno))
            continue
        test = stmt.test
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            (left_ok, left), (right_ok, right) = _literal(test.left), _literal(test.comparators[0])
            if left_ok != right_ok:  # exactly one side is a literal: it stays here
                side = test.comparators[0] if left_ok else test.left
                steps.append(Step("eval", ast.unparse(side), stmt.lineno, type(test.ops[0]),
                                  left if left_ok else right, literal_first=left_ok))
                continue
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            steps.append(Step("eval", ast.unparse(test.operand), stmt.lineno, negate=True))
            continue
        steps.append(Step("eval", ast.unparse(test), stmt.lineno))
    return steps


def extract_code(completion: str) -> str:
    """The last ```python fenced block (else the last bare ``` block), else the whole text."""
    blocks = FENCE_RE.findall(completion)
    tagged = [body for lang, body in blocks if lang]
    if tagged:
        return tagged[-1]
    return blocks[-1][1] if blocks else completion


def check(completion: str, tests: str, **limits) -> tuple[bool, SandboxResult]:
    """``(passed, result)``: the completion's code and ``tests`` run in the sandbox, each
    checked assert's value compared here (module docstring). When the program ran but a check
    failed, ``result.reason`` says which assert (its line in ``tests``) and the value it got."""
    steps = split_tests(tests)
    stdin = json.dumps({"code": extract_code(completion), "steps": [[s.kind, s.source] for s in steps]})
    result = run_python(PROGRAM, stdin=stdin, **limits)
    values: dict[int, Any] = {}
    done = False
    for row in read_rows(result.stderr):
        try:
            if row.get("done") is True:
                done = True
            elif type(row.get("step")) is int and row["step"] not in values:
                values[row["step"]] = decode(row["value"])
        except (KeyError, Malformed):
            continue
    if not result.ok:
        return False, result
    for i, step in enumerate(steps):
        if step.kind == "eval" and (i not in values or not step.holds(values[i])):
            got = f"got {values[i]!r}"[:200] if i in values else "no value"
            return False, dataclasses.replace(result, reason=f"assert on line {step.line} failed: {step.source} ({got})")
    if not done:
        return False, dataclasses.replace(result, reason="exit code 0 before the tests finished")
    return True, result


@REWARDS.register("python_tests")
def python_tests(completion: str, problem: Problem, *, sandbox_timeout_s: float = 5.0, memory_mb: int = 256,
                 max_procs: int = 16, **_) -> float:
    """1.0 when the completion's code passes ``problem.meta["tests"]`` (module docstring), else 0.0.

    ``sandbox_timeout_s`` is the program's wall time (not the reward spec's ``timeout_s``,
    which bounds the whole call in the scorer and should stay above it)."""
    tests = problem.meta.get("tests")
    if not isinstance(tests, str) or not tests.strip():
        raise ValueError("reward 'python_tests' needs problem.meta['tests'], a string of Python asserts")
    passed, _ = check(completion, tests, timeout_s=sandbox_timeout_s, memory_mb=memory_mb, max_procs=max_procs)
    return float(passed)
