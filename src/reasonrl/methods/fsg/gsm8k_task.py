"""FSG-RL's function graphs derived from GSM8K's calculator annotations, without an LLM decomposer
(github.com/ZihanLiummyycc/FSG-RL; ``docs/methods/fsg_rl.md``).

A GSM8K solution marks each computation, ``Natalia sold 48/2 = <<48/2=24>>24 clips in May.
Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.``. Each annotated step
becomes one helper, and the problem has exactly ``function_graph``'s schema, prompt and completion
(the constructors are shared), so the ``fsg_verifier`` method, the ``fsg_answer`` /
``fsg_full_success`` rewards and the ``fsg_span`` advantage work unchanged::

    prompt      main()
                f1(a,b):clips in May
                f2(a,x1):clips altogether in April and May
                Natalia sold clips to 48 of her friends in April, and then ...
    completion  <main>def main():x1=f1(48,2);x2=f2(48,x1);return x2#24;72</main><f1>def f1(a,b):return a/b</f1><f2>def f2(a,x1):return a+x1</f2>

Derivation rules, per row:

- **Steps.** Every ``<<expr=value>>`` in order. ``expr`` must be arithmetic: numbers, ``+ - * /``,
  unary signs and brackets (``ast``-checked, evaluated exactly in fractions), and must equal
  ``value`` (relative 1e-9, ``fsg_parse.answers_equal``). A step without an operator (``<<+10=10>>``,
  a restatement) is dropped: it computes nothing.
- **Parameters.** Each number of ``expr``, left to right: if it equals an earlier step's value it is
  that step's result, parameter ``x<k>`` fed by helper ``f<k>`` (a ``uses_value`` edge; the latest
  such step when several match; one parameter however often it occurs); else it is a literal, a
  parameter of its own (``a``, ``b``, …, in order, ``x`` skipped) whose value ``main`` passes.
  A literal that merely happens to equal an earlier result is read as that result: the
  annotations do not say which it is.
- **Answer.** The last step's value must equal the final ``#### answer``. Steps the last one does not
  depend on (through ``uses_value`` edges) are dropped, the rest renumbered ``f1..fn`` in order.
  ``main`` calls the helpers in order, ``x<k>=f<k>(…)``, returns the last one and states each
  value in its comment; an ``aggregates_result`` edge runs from the last helper to ``main``.
- **Sub-question** (the public ``desc``): the words right after the step's result in the solution
  (letters only, up to 6, ``clips in May``), which name what the step counts without giving a
  number; ``step k`` when there are none.
- **Tests.** Each helper: the call ``main`` makes (its inputs → its value). A helper that is one
  operator on two parameters (``a/b``) also gets ``function_graph``'s fixed inputs and property
  test for that operator (``OPS``; their divisions are exact, so ``/`` and ``//`` agree there).
  Any other helper gets its expression at two fixed probe inputs (a probe that divides by zero is
  left out) and no property test: no law holds for every expression. ``main``: ``main()`` == the
  answer, run with the reference helpers (as ``function_graph``).

A row that breaks a rule is skipped, counted by reason in ``task.coverage`` (``SKIP_REASONS``).
Splits: train.jsonl for training, test.jsonl held out. ``Problem.meta``: ``index`` (0-based row),
``split``, ``form`` (``"<n>-step"``, so evaluation reports accuracy per graph size) and ``graph``.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path

from reasonrl.registry import TASKS
from reasonrl.methods.fsg.parse import MAX_LITERAL, answers_equal
from reasonrl.problem import Problem
from reasonrl.tasks.files import ProblemStream, read_rows
from reasonrl.methods.fsg.task import (OPS, FunctionGraphTask, helper_node, main_code, main_node, public_prompt,
                                           render_completion)
from reasonrl.tasks.gsm8k import CALCULATOR_RE, parse_row

__all__ = ["GSM8KGraphTask", "Unusable", "derive_problem", "SKIP_REASONS"]

SKIP_REASONS = ("no_annotations", "unparsable", "inconsistent", "answer_mismatch")
MAX_EXPRESSION_CHARS = 200  # bounds the parser's recursion; GSM8K's longest is far shorter
LETTERS = "abcdefghijklmnopqrstuvwyz"  # literal parameters; x<k> are results
BINARY = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div"}  # ast op -> OPS name
PROBES = ((3, 4, 5, 6, 7, 8, 9, 10), (10, 4, 9, 3, 8, 2, 7, 5))  # probe inputs, cycled past 8 parameters
DESC_WORDS = 6
_DESC = re.compile(r"[ \t$]*-?[\d.,]*[ \t]*%?[ \t]*([A-Za-z][A-Za-z' -]*)")  # one line: never the next sentence


class Unusable(ValueError):
    """A row this task cannot turn into a graph; ``reason`` is one of ``SKIP_REASONS``."""

    def __init__(self, reason: str, detail: str):
        assert reason in SKIP_REASONS, reason
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def _checked(text: str) -> ast.expr:
    """``text`` as an arithmetic tree of numbers, ``+ - * /``, unary signs and brackets; unary signs
    on a number fold into it (``-3`` is one literal), ``+x`` becomes ``x``."""
    if len(text) > MAX_EXPRESSION_CHARS:
        raise Unusable("unparsable", f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError) as exc:
        raise Unusable("unparsable", f"{text!r} is not an expression ({exc})") from None

    def clean(node: ast.expr) -> ast.expr:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            if abs(node.value) > MAX_LITERAL:
                raise Unusable("unparsable", f"literal {node.value} is beyond the code policy's {MAX_LITERAL}")
            return node
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
            inner = clean(node.operand)
            if isinstance(node.op, ast.UAdd):
                return inner
            if isinstance(inner, ast.Constant):
                return ast.Constant(-inner.value)
            return ast.UnaryOp(ast.USub(), inner)
        if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
            return ast.BinOp(clean(node.left), node.op, clean(node.right))
        raise Unusable("unparsable", f"{text!r} has {ast.unparse(node)!r}, not plain arithmetic")

    return clean(tree)


def _value(node: ast.expr, env: dict[str, Fraction]) -> Fraction:
    """The exact value of a checked tree (``env``: parameter values); ZeroDivisionError on x/0.

    Not ``envs.calculator.evaluate_expression``: that one takes integers, ``+ - *`` and 40
    characters only, and would leave 58% of GSM8K's training rows without a graph (every one with
    a division or a decimal). Widening that one to ``/`` and decimals would make this one redundant."""
    if isinstance(node, ast.Constant):
        return Fraction(str(node.value))  # the decimal as written, not its binary float
    if isinstance(node, ast.Name):
        return env[node.id]
    if isinstance(node, ast.UnaryOp):
        return -_value(node.operand, env)
    a, b = _value(node.left, env), _value(node.right, env)
    if isinstance(node.op, ast.Add):
        return a + b
    if isinstance(node.op, ast.Sub):
        return a - b
    return a * b if isinstance(node.op, ast.Mult) else a / b


def _literals(node: ast.expr) -> list[ast.Constant]:
    """The tree's numbers, left to right (``ast.walk`` is breadth-first, not source order)."""
    if isinstance(node, ast.Constant):
        return [node]
    if isinstance(node, ast.UnaryOp):
        return _literals(node.operand)
    if isinstance(node, ast.BinOp):
        return _literals(node.left) + _literals(node.right)
    return []


def _number(v: Fraction | int | float) -> int | float:
    """A JSON-able value: an int when whole, else the nearest float."""
    v = Fraction(v)
    return int(v) if v.denominator == 1 else float(v)


def _text(v: Fraction | int | float) -> str:
    """How a value is written in code and in main's comment: ``24``, ``0.2``; never an exponent,
    which ``fsg_parse.stated_answer`` would not read."""
    v = _number(v)
    text = repr(v)
    return text if "e" not in text else f"{v:.17f}".rstrip("0").rstrip(".")


def _desc(after: str, k: int) -> str:
    """The sub-question: the words right after the step's result in the solution (module docstring)."""
    m = _DESC.match(after)
    words = [w for w in (m.group(1).split() if m else []) if any(c.isalpha() for c in w)][:DESC_WORDS]
    return " ".join(words) if words else f"step {k}"


@dataclass
class _Step:
    tree: ast.expr  # the checked expression, its numbers as written
    value: Fraction
    after: str  # the solution's text after the annotation
    refs: dict[int, int] = field(default_factory=dict)  # literal position -> index of the earlier step it is


def _steps(worked: str) -> list[_Step]:
    """The row's annotated steps that compute something, each with the earlier steps it uses."""
    steps: list[_Step] = []
    matches = list(CALCULATOR_RE.finditer(worked))
    if not matches:
        raise Unusable("no_annotations", "the solution has no <<expr=value>> annotation")
    for m in matches:
        body = m.group(0)[2:-2]
        if body.count("=") != 1:
            raise Unusable("unparsable", f"<<{body}>> is not one 'expr=value'")
        expr, stated = body.split("=")
        tree = _checked(expr)
        try:
            claimed = Fraction(stated.strip().replace(",", ""))
        except (ValueError, ZeroDivisionError):
            raise Unusable("unparsable", f"<<{body}>>: value {stated!r} is not a number") from None
        try:
            value = _value(tree, {})
        except ZeroDivisionError:
            raise Unusable("inconsistent", f"<<{body}>> divides by zero") from None
        if not answers_equal(float(value), float(claimed)):
            raise Unusable("inconsistent", f"<<{body}>>: {expr.strip()} is {_text(value)}, not {stated.strip()}")
        if isinstance(tree, ast.Constant):
            continue  # a restatement, no computation
        step = _Step(tree, value, worked[m.end():])
        for pos, lit in enumerate(_literals(tree)):
            match = [j for j, s in enumerate(steps) if answers_equal(lit.value, float(s.value))]
            if match:
                step.refs[pos] = match[-1]
        steps.append(step)
    if not steps:
        raise Unusable("no_annotations", "every annotation is a bare number")
    return steps


def _parameterise(step: _Step, results: dict[int, str], values: dict[str, Fraction]
                  ) -> tuple[ast.expr, list[str], dict[str, Fraction]]:
    """The step's expression over parameters (``results``: literal position -> ``x<k>``, whose
    values are in ``values``; every other literal a letter of its own), the parameters in order of
    first use and the arguments ``main`` passes."""
    params: list[str] = []
    args: dict[str, Fraction] = {}
    letters, position = iter(LETTERS), 0

    def rename(node: ast.expr) -> ast.expr:
        nonlocal position
        if isinstance(node, ast.UnaryOp):
            return ast.UnaryOp(node.op, rename(node.operand))
        if isinstance(node, ast.BinOp):
            return ast.BinOp(rename(node.left), node.op, rename(node.right))
        if position in results:
            param, arg = results[position], values[results[position]]
        else:
            param, arg = next(letters, None), Fraction(str(node.value))
            if param is None:
                raise Unusable("unparsable", f"a step has more than {len(LETTERS)} numbers")
        position += 1
        if param not in params:
            params.append(param)
            args[param] = arg
        return ast.Name(param, ast.Load())

    return rename(step.tree), params, args


def derive_problem(question: str, worked: str, answer: str, meta: dict | None = None) -> Problem:
    """The function-graph problem of one GSM8K row (``worked``: its annotated solution, ``answer``:
    its final answer); :class:`Unusable` when a derivation rule fails (module docstring)."""
    steps = _steps(worked)
    if not answers_equal(float(steps[-1].value), answer):
        raise Unusable("answer_mismatch", f"the last step gives {_text(steps[-1].value)}, the answer is {answer}")
    needed, todo = set(), [len(steps) - 1]
    while todo:
        j = todo.pop()
        if j not in needed:
            needed.add(j)
            todo.extend(steps[j].refs.values())
    kept = sorted(needed)
    number_of = {j: k for k, j in enumerate(kept, start=1)}  # original index -> helper number

    nodes, reference, calls, values, edges = [], {}, [], {}, []
    for k, j in enumerate(kept, start=1):
        name = f"f{k}"
        code_tree, params, args = _parameterise(steps[j], {p: f"x{number_of[i]}" for p, i in steps[j].refs.items()},
                                                values)
        values[f"x{k}"] = _value(code_tree, args)
        call_args = [_text(args[p]) for p in params]
        tests = [{"call": f"{name}({','.join(call_args)})", "expected": _number(values[f'x{k}']), "kind": "unit"}]
        single = (isinstance(code_tree, ast.BinOp) and len(params) == 2
                  and [getattr(code_tree.left, "id", None), getattr(code_tree.right, "id", None)] == params)
        op = OPS[BINARY[type(code_tree.op)]] if single else None
        probes = op[2] if op else [tuple(probe[i % len(probe)] for i in range(len(params))) for probe in PROBES]
        for inputs in probes:
            try:
                want = _value(code_tree, {p: Fraction(v) for p, v in zip(params, inputs)})
            except ZeroDivisionError:
                continue
            tests.append({"call": f"{name}({','.join(map(str, inputs))})", "expected": _number(want), "kind": "unit"})
        if op:
            tests.append({"call": op[3].format(f=name), "expected": True, "kind": "property"})
        nodes.append(helper_node(name, params, _desc(steps[j].after, k), tests))
        reference[name] = f"def {name}({','.join(params)}):return {ast.unparse(code_tree).replace(' ', '')}"
        calls.append(f"x{k}={name}({','.join(p if p.startswith('x') else _text(args[p]) for p in params)})")
        edges += [{"source": f"f{p[1:]}", "target": name, "relation": "uses_value"} for p in params if p.startswith("x")]
    n = len(kept)
    edges.append({"source": f"f{n}", "target": "main", "relation": "aggregates_result"})
    stated = [_text(values[f"x{k}"]) for k in range(1, n + 1)]
    nodes.insert(0, main_node(_number(values[f"x{n}"])))
    reference = {"main": main_code(";".join(calls) + f";return x{n}", stated), **reference}
    graph = {"nodes": nodes, "edges": edges, "target_call": "main()", "reference": reference}
    return Problem(prompt=public_prompt(nodes, " ".join(question.split())), answer=answer,
                   solution=render_completion(reference), meta={**(meta or {}), "form": f"{n}-step", "graph": graph})


@dataclass(frozen=True)
class _Record:
    index: int
    question: str
    worked: str
    answer: str


def _derivable(path: Path, coverage: Counter) -> list[_Record]:
    """The rows of ``path`` that become graphs; ``coverage`` counts them (``graphs``) and the rest by reason."""
    out = []
    for row in read_rows(str(path)):
        parsed = parse_row(row, "{question}")  # validates the row; its solution has the annotations removed
        record = _Record(row.index, parsed.question, row.text("answer"), parsed.answer)
        try:
            derive_problem(record.question, record.worked, record.answer)
        except Unusable as exc:
            coverage[exc.reason] += 1
            continue
        coverage["graphs"] += 1
        out.append(record)
    return out


@TASKS.register("gsm8k_graph")
@dataclass
class GSM8KGraphTask(ProblemStream):
    """GSM8K problems as function graphs from their calculator annotations (module docstring);
    ``path``: a folder with train.jsonl (training) and test.jsonl (held out). ``coverage``:
    ``{"train": {...}, "test": {...}}``, the rows that became graphs and the skipped ones by reason.

    ``few_shot``: the first ``few_shot`` training graphs become worked exemplars (prompt, then
    solution, then a blank line) before every prompt, and leave the training stream, so no prompt
    holds its own solution. No cold start exists for a real model (``function_graph``'s warm-up is
    for the embedded one), and a base model has never seen this tag format; the exemplars show
    it. The solutions are one line, so ``stop_strings`` then cuts a completion at its newline,
    before the model goes on to invent the next problem."""

    path: str
    few_shot: int = 0
    name: str = "gsm8k_graph"
    coverage: dict[str, dict[str, int]] = field(init=False)
    stop_strings: list[str] = field(init=False)

    eval_split = "test"
    extract_answer = FunctionGraphTask.extract_answer  # main's stated answer

    def __post_init__(self) -> None:
        if self.few_shot < 0:
            raise ValueError(f"task.few_shot must be >= 0, got {self.few_shot}")
        folder = Path(self.path)
        counts = {"train": Counter(), "test": Counter()}
        train = _derivable(folder / "train.jsonl", counts["train"])
        self._eval = _derivable(folder / "test.jsonl", counts["test"])
        self._eval_source = f"{folder / 'test.jsonl'} (its rows with a graph)"
        self.coverage = {split: {k: c[k] for k in ("graphs", *SKIP_REASONS)} for split, c in counts.items()}
        if self.few_shot >= len(train) or not self._eval:
            raise ValueError(f"task 'gsm8k_graph': {folder} has too few rows with a function graph for "
                             f"few_shot={self.few_shot} (coverage {self.coverage})")
        exemplars, self._train = train[:self.few_shot], train[self.few_shot:]
        self._prefix = "".join(p.prompt + p.solution + "\n\n" for p in (self._derive(r) for r in exemplars))
        self.stop_strings = ["\n"] if self.few_shot else []

    @staticmethod
    def _derive(record: _Record, meta: dict | None = None) -> Problem:
        return derive_problem(record.question, record.worked, record.answer, meta)

    def _problem(self, record: _Record, split: str) -> Problem:
        problem = self._derive(record, {"index": record.index, "split": split})
        return replace(problem, prompt=self._prefix + problem.prompt)
