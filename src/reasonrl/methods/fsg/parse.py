"""FSG-RL's static checks of a completion: tagged spans, the format gate, signatures, the stated
answer and the code policy (github.com/ZihanLiummyycc/FSG-RL; the reference's ``fsg_rl/parsing.py``,
``executable_eval.py`` and ``sandbox_safety.py``, re-derived for the ``function_graph`` format).

- **Spans.** Node ``n``'s span is the first ``<n>…</n>`` of the completion; its content (between
  the tags) is its Python code. Only the graph's own node ids count as tags, so ``a<b`` in code
  is not one.
- **Format gate** F = 1 iff the tags are exactly ``<n1></n1><n2></n2>…`` in graph order (each node
  once, nothing nested or repeated), nothing but whitespace lies outside the spans, and no span
  is empty.
- **Signature** of node ``n``: its code parses and has exactly one top-level ``def`` of the node's
  name whose parameters (names, order, kinds) are the public signature's; annotations and
  defaults are ignored (as the reference's ``check_python_signatures``).
- **Stated answer**: ``main``'s span ends with a comment ``#v1;v2;…;answer``; its last number.
- **Code policy** (:func:`code_policy_violation`): an allowlist of syntax — functions, arithmetic,
  comparisons, ``if``/``for``/``while``, calls, ``import math``/``fractions`` — with no name or
  attribute starting with ``_``, none of ``eval``/``exec``/``open``/``getattr``/…, no attribute
  writes, no ``try`` (it could swallow the harness's per-test alarm), no ``**`` but by a literal
  exponent ≤ 64 and no integer literal beyond 10¹². A node that breaks it is never run and scores
  0 on every execution check; the sandbox (``rewards.sandbox``) contains whatever the policy
  misses. Rewards ``fsg_answer`` (the stated answer is right) and ``fsg_format`` (F) live here.
"""

from __future__ import annotations

import ast
import re
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Sequence

from reasonrl.registry import REWARDS
from reasonrl.problem import Problem

__all__ = ["Span", "ParsedCompletion", "parse_completion", "signature_matches", "code_policy_violation",
           "answers_equal", "stated_answer", "node_ids", "ALLOWED_MODULES"]

ALLOWED_MODULES = frozenset({"math", "fractions"})
FORBIDDEN_NAMES = frozenset({
    "eval", "exec", "compile", "open", "input", "globals", "locals", "vars", "getattr", "setattr", "delattr",
    "hasattr", "breakpoint", "exit", "quit", "help", "dir", "type", "object", "memoryview", "super", "id",
    "classmethod", "staticmethod", "property", "iter", "next", "print", "os", "sys", "subprocess", "socket",
})
MAX_EXPONENT = 64
MAX_LITERAL = 10**12
_ALLOWED_SYNTAX = (
    ast.Module, ast.FunctionDef, ast.arguments, ast.arg, ast.Return, ast.Assign, ast.AugAssign, ast.Expr,
    ast.If, ast.For, ast.While, ast.Break, ast.Continue, ast.Pass, ast.BinOp, ast.UnaryOp, ast.BoolOp,
    ast.Compare, ast.IfExp, ast.Call, ast.keyword, ast.Name, ast.Constant, ast.Tuple, ast.List, ast.Subscript,
    ast.Slice, ast.Attribute, ast.Import, ast.ImportFrom, ast.alias, ast.ListComp, ast.GeneratorExp,
    ast.comprehension, ast.operator, ast.unaryop, ast.cmpop, ast.boolop, ast.expr_context,
)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@dataclass(frozen=True)
class Span:
    """Node ``node``'s content ``text`` = completion[start:end] (between its tags)."""

    node: str
    text: str
    start: int
    end: int


@dataclass
class ParsedCompletion:
    spans: dict[str, Span] = field(default_factory=dict)
    """The first span of each node that has one."""
    exact: bool = False
    """The format gate F (module docstring)."""
    answer: str | None = None
    """``main``'s stated answer."""


def node_ids(problem: Problem) -> list[str]:
    graph = problem.meta.get("graph") if isinstance(problem.meta, dict) else None
    if not isinstance(graph, dict) or not graph.get("nodes"):
        raise ValueError("FSG checks need problem.meta['graph'] with 'nodes' (a function-graph task, e.g. "
                         "task: {name: function_graph})")
    return [n["id"] for n in graph["nodes"]]


def _tag_re(ids: Sequence[str]) -> re.Pattern:
    return re.compile(r"<(/?)(" + "|".join(re.escape(i) for i in ids) + r")>")


def parse_completion(text: str, ids: Sequence[str], main: str = "main") -> ParsedCompletion:
    """Spans, the format gate and the stated answer of ``text`` for the graph's node ``ids``."""
    out = ParsedCompletion()
    for node in ids:
        m = re.search(rf"<{re.escape(node)}>(.*?)</{re.escape(node)}>", text, re.DOTALL)
        if m:
            out.spans[node] = Span(node, m.group(1), m.start(1), m.end(1))
    tags = list(_tag_re(ids).finditer(text))
    expected = [(close, node) for node in ids for close in ("", "/")]
    if [(m.group(1), m.group(2)) for m in tags] == expected:
        outside = text[:tags[0].start()] + "".join(text[tags[k].end():tags[k + 1].start()]
                                                   for k in range(1, len(tags) - 1, 2)) + text[tags[-1].end():]
        out.exact = not outside.strip() and all(out.spans[n].text.strip() for n in ids)
    if main in out.spans:
        out.answer = stated_answer(out.spans[main].text)
    return out


def stated_answer(main_text: str) -> str | None:
    """The last number of the ``#v1;…;answer`` comment that ends ``main``'s code."""
    if "#" not in main_text:
        return None
    last = main_text.rsplit("#", 1)[1].split(";")[-1].strip()
    return last if _NUMBER.fullmatch(last) else None


def answers_equal(a, b) -> bool:
    """Numeric equality (relative 1e-9) of two answers given as numbers or strings; bools are not numbers."""
    if a is None or b is None or isinstance(a, bool) or isinstance(b, bool):
        return False
    try:
        x, y = float(a), float(b)
    except (TypeError, ValueError, OverflowError):
        return str(a).strip() == str(b).strip()
    return abs(x - y) <= 1e-9 * max(1.0, abs(y))


def _shape(fn: ast.FunctionDef) -> tuple:
    a = fn.args
    return (fn.name, [x.arg for x in a.posonlyargs], [x.arg for x in a.args], a.vararg and a.vararg.arg,
            [x.arg for x in a.kwonlyargs], a.kwarg and a.kwarg.arg)


@contextmanager
def quiet_syntax_warnings():
    """Model-written code's SyntaxWarnings (``1(2)``, ``1_a``) are not the run's: parsing or
    compiling it inside this block keeps them off the run's stderr."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        yield


def parse_untrusted(code: str) -> ast.Module:
    """``ast.parse`` of model-written code, its SyntaxWarnings silenced."""
    with quiet_syntax_warnings():
        return ast.parse(code)


def signature_matches(code: str, signature: str) -> bool:
    """Exactly one top-level ``def`` of the signature's name, with the same parameters."""
    expected = ast.parse(f"def {signature}:\n    pass\n").body[0]
    try:
        tree = parse_untrusted(code)
    except (SyntaxError, ValueError):
        return False
    defs = [s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == expected.name]
    return len(defs) == 1 and _shape(defs[0]) == _shape(expected)


def code_policy_violation(code: str) -> str | None:
    """Why ``code`` may not run (None: it may); see the module docstring."""
    try:
        tree = parse_untrusted(code)
    except (SyntaxError, ValueError) as exc:
        return f"syntax error: {exc.msg if isinstance(exc, SyntaxError) else exc}"
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED_SYNTAX):
            return f"{type(node).__name__} is not allowed"
        if isinstance(node, ast.Name) and (node.id.startswith("_") or node.id in FORBIDDEN_NAMES):
            return f"name '{node.id}' is not allowed"
        if isinstance(node, (ast.FunctionDef, ast.arg)) and (getattr(node, "name", None) or node.arg).startswith("_"):
            return "names starting with '_' are not allowed"
        if isinstance(node, ast.Attribute) and (node.attr.startswith("_") or not isinstance(node.ctx, ast.Load)):
            return f"attribute '{node.attr}' is not allowed (no '_' names, no attribute writes)"
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            bad = [m for m in mods if m.split(".")[0] not in ALLOWED_MODULES]
            if bad or (isinstance(node, ast.ImportFrom) and any(a.name == "*" or a.name.startswith("_")
                                                                for a in node.names)):
                return f"import of {bad or mods} is not allowed (only {', '.join(sorted(ALLOWED_MODULES))})"
        if isinstance(node, ast.Constant):
            if isinstance(node.value, str) and "_" in node.value:
                return "strings with '_' are not allowed"
            if isinstance(node.value, int) and not isinstance(node.value, bool) and abs(node.value) > MAX_LITERAL:
                return f"integer literals beyond {MAX_LITERAL} are not allowed"
            if isinstance(node.value, bytes):
                return "bytes literals are not allowed"
        if isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, ast.Pow):
            e = node.right if isinstance(node, ast.BinOp) else node.value
            if not (isinstance(e, ast.Constant) and type(e.value) is int and 0 <= e.value <= MAX_EXPONENT):
                return f"'**' needs a literal exponent in 0..{MAX_EXPONENT}"
    return None


@REWARDS.register("fsg_answer")
def fsg_answer(completion: str, problem: Problem, **_) -> float:
    """a_final: 1.0 when ``main``'s stated answer equals ``problem.answer`` (numerically), else 0.0."""
    answer = parse_completion(completion, node_ids(problem)).answer
    return float(answers_equal(answer, problem.answer))


@REWARDS.register("fsg_format")
def fsg_format(completion: str, problem: Problem, **_) -> float:
    """The format gate F: exact tags in graph order, nothing outside the spans, no empty span."""
    return float(parse_completion(completion, node_ids(problem)).exact)
