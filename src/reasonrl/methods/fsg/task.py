"""FSG-RL's task on the embedded model: arithmetic word problems given as a graph of sub-functions
(github.com/ZihanLiummyycc/FSG-RL; ``docs/methods/fsg_rl.md``).

Each problem is a chain of sub-questions, one Python function per node, plus ``main``. The
prompt is the public graph (each node's interface and question, no tests) and then the problem::

    main()
    f1(a,b):pens
    f2(x,c):left
    3 boxes of 4 pens,5 lost.left?

and its worked solution (what the SFT cold start imitates) writes one tagged span per node, in
graph order, with nothing outside the spans::

    <main>def main():return f2(f1(3,4),5)#12;7</main><f1>def f1(a,b):return a*b</f1><f2>def f2(x,c):return x-c</f2>

``main``'s span ends with a comment stating the values of the helper calls, in order; its last
number is the stated answer (``#12;7``: answer 7). The verifier checks the stated answer against
``Problem.answer`` (a_final) and against what ``main()`` actually returns (the backward check).
``main`` comes first and the problem last (the reference lists ``main`` last): the char-level
model then copies the problem's numbers into ``main``'s call from a few dozen positions back,
not from the far end of its context; Python resolves the helpers when ``main()`` runs.

``Problem.meta`` holds the kind (``form``), its numbers (``values``) and, under ``graph``, the
private graph the verifier reads (``reasonrl.methods.fsg.execute``)::

    {"nodes": [{"id": "main", "name": "main", "signature": "main()", "desc": "",
                "tests": [{"call": "main()", "expected": 7, "kind": "unit"}]},
               {"id": "f1", "name": "f1", "signature": "f1(a,b)", "desc": "pens",
                "tests": [{"call": "f1(3,4)", "expected": 12, "kind": "unit"}, ...,
                          {"call": "f1(1,7)==7 and f1(3,5)==f1(5,3)", "expected": True, "kind": "property"}]}, ...],
     "edges": [{"source": "f1", "target": "f2", "relation": "uses_value"},
               {"source": "f2", "target": "main", "relation": "aggregates_result"}],
     "target_call": "main()", "reference": {"main": "def main():return f2(f1(3,4),5)#12;7", ...}}

``main``'s own unit test runs its code with the *reference* helpers, so it scores main's wiring
alone; the whole program the policy wrote runs once more for the backward and edge checks.

The warm-up (``warmup_problems``) writes a share ``careless_fraction`` of the solutions with the
kind's systematic mistake: one helper with the wrong operator (``x+c`` for "lost"), the stated
values consistent with that wrong program. Supervised learning copies the mistake; the unit tests,
the answer and the backward check are what RL can fix it with (as ``arithmetic``'s careless share).
The train/eval split is by a stable hash of the problem's text.
"""

from __future__ import annotations

import itertools
import random
import string
from dataclasses import dataclass
from typing import Any, Sequence

from reasonrl.registry import TASKS
from reasonrl.problem import Problem
from reasonrl.tasks.base import in_eval_split

__all__ = ["FunctionGraphTask", "KINDS", "Kind", "ALPHABET", "OPS", "build_problem", "render_completion",
           "public_prompt", "main_node", "helper_node", "main_code"]

# Every lowercase letter (so the model can write any identifier, hostile ones too), digits and
# the punctuation of the tags and of simple Python.
ALPHABET = string.ascii_lowercase + string.digits + " \n():,=+-*/<>#;.?_%"

# op name -> (Python operator, value, the fixed unit-test inputs, the property test with {f} the name)
OPS: dict[str, tuple[str, Any, tuple[tuple[int, int], ...], str]] = {
    "add": ("+", lambda x, y: x + y, ((3, 4), (8, 5)), "{f}(0,7)==7 and {f}(6,0)==6"),
    "sub": ("-", lambda x, y: x - y, ((9, 4), (7, 7)), "{f}(9,4)+4==9"),
    "mul": ("*", lambda x, y: x * y, ((3, 4), (7, 2)), "{f}(1,7)==7 and {f}(3,5)=={f}(5,3)"),
    "div": ("//", lambda x, y: x // y, ((12, 3), (20, 4)), "{f}(12,3)*3==12"),
}
PREVIOUS = "x"  # the argument that carries the previous node's value


@dataclass(frozen=True)
class Kind:
    """One problem template: a chain of steps ``(question, op, first arg, second arg)``, an arg being
    a number of the text (a letter) or ``x``, the previous step's value; ``careless`` = (step index,
    wrong op), the warm-up's systematic mistake."""

    name: str
    text: str
    steps: tuple[tuple[str, str, str, str], ...]
    careless: tuple[int, str]

    @property
    def letters(self) -> list[str]:
        return sorted({a for _, _, *args in self.steps for a in args if a != PREVIOUS})


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("pens", "{a} boxes of {b} pens,{c} lost.left?", (("pens", "mul", "a", "b"), ("left", "sub", "x", "c")),
         (1, "add")),
    Kind("pets", "{a} cats,{b} dogs,{c} treats each.treats?", (("pets", "add", "a", "b"), ("treats", "mul", "x", "c")),
         (0, "mul")),
    Kind("seats", "{a} rows of {b} seats,{c} taken in each.free?",
         (("free in a row", "sub", "b", "c"), ("free", "mul", "x", "a")), (0, "add")),
    Kind("share", "{a} apples,{b} more,shared by {c}.each?", (("apples", "add", "a", "b"), ("each", "div", "x", "c")),
         (1, "sub")),
    Kind("nuts", "{a} bags of {b} nuts.nuts?", (("nuts", "mul", "a", "b"),), (0, "add")),
    Kind("eggs", "{a} crates of {b} eggs,{c} broke,packs of {d}.packs?",
         (("eggs", "mul", "a", "b"), ("whole", "sub", "x", "c"), ("packs", "div", "x", "d")), (1, "add")),
)}


def _chain(kind: Kind, values: dict[str, int], ops: Sequence[str]) -> list[int] | None:
    """The value of every step under ``ops``; None when a step leaves the natural numbers."""
    out, prev = [], None
    for (_, _, p, q), op in zip(kind.steps, ops):
        x, y = (prev if p == PREVIOUS else values[p]), (prev if q == PREVIOUS else values[q])
        if op == "div" and (y == 0 or x % y):
            return None
        prev = OPS[op][1](x, y)
        if prev < 0:
            return None
        out.append(prev)
    return out


def _params(step: tuple[str, str, str, str]) -> tuple[str, str]:
    return step[2], step[3]


def node_code(name: str, params: tuple[str, str], op: str) -> str:
    return f"def {name}({params[0]},{params[1]}):return {params[0]}{OPS[op][0]}{params[1]}"


def main_call(kind: Kind, values: dict[str, int]) -> str:
    """``f2(f1(3,4),5)``: the chain with the problem's numbers."""
    call = None
    for i, (_, _, p, q) in enumerate(kind.steps, start=1):
        args = [call if a == PREVIOUS else str(values[a]) for a in (p, q)]
        call = f"f{i}({args[0]},{args[1]})"
    return call


def render_completion(codes: dict[str, str]) -> str:
    """The tagged completion of ``{node id: code}`` (in that order)."""
    return "".join(f"<{node}>{code}</{node}>" for node, code in codes.items())


# The graph schema's pieces, shared with every task that builds function graphs (``gsm8k_graph``),
# so the verifier (``rewards.fsg_exec``) reads one schema.

def main_node(answer: Any) -> dict:
    """``main``'s node: no parameters, one unit test ``main()`` == the answer."""
    return {"id": "main", "name": "main", "signature": "main()", "desc": "",
            "tests": [{"call": "main()", "expected": answer, "kind": "unit"}]}


def helper_node(name: str, params: Sequence[str], desc: str, tests: list[dict]) -> dict:
    """A helper's node: its id is its name, its public signature ``name(p1,p2)``."""
    return {"id": name, "name": name, "signature": f"{name}({','.join(params)})", "desc": desc, "tests": tests}


def main_code(body: str, stated: Sequence[Any]) -> str:
    """``main``'s code: ``body`` then the comment ``#v1;v2;…;answer`` stating each helper call's value
    in order (its last number is the stated answer, ``fsg_parse.stated_answer``)."""
    return f"def main():{body}#{';'.join(map(str, stated))}"


def public_prompt(nodes: list[dict], question: str) -> str:
    """The public graph (each node's interface and question, no tests), then the problem."""
    lines = [f"{n['signature']}:{n['desc']}" if n["desc"] else n["signature"] for n in nodes]
    return "\n".join([*lines, question]) + "\n"


def build_problem(kind: Kind, values: dict[str, int], careless: bool = False) -> Problem:
    """The problem, its public prompt, private graph and worked (or careless) solution."""
    ops = [op for _, op, _, _ in kind.steps]
    answers = _chain(kind, values, ops)
    if answers is None:
        raise ValueError(f"kind '{kind.name}' has no natural answer for {values}")
    names = [f"f{i}" for i in range(1, len(kind.steps) + 1)]
    call = main_call(kind, values)
    nodes = [main_node(answers[-1])]
    reference, prev_value = {"main": main_code(f"return {call}", answers)}, None
    for i, (step, name) in enumerate(zip(kind.steps, names)):
        desc, op, p, q = step
        params = _params(step)
        actual = tuple(prev_value if a == PREVIOUS else values[a] for a in (p, q))
        inputs = (actual, *OPS[op][2])
        tests = [{"call": f"{name}({x},{y})", "expected": OPS[op][1](x, y), "kind": "unit"} for x, y in inputs]
        tests.append({"call": OPS[op][3].format(f=name), "expected": True, "kind": "property"})
        nodes.append(helper_node(name, params, desc, tests))
        reference[name] = node_code(name, params, op)
        prev_value = answers[i]
    edges = [{"source": names[i], "target": names[i + 1], "relation": "uses_value"} for i in range(len(names) - 1)]
    edges.append({"source": names[-1], "target": "main", "relation": "aggregates_result"})
    graph = {"nodes": nodes, "edges": edges, "target_call": "main()", "reference": reference}
    codes = dict(reference)
    if careless:
        index, wrong = kind.careless
        wrong_ops = list(ops)
        wrong_ops[index] = wrong
        stated = _chain(kind, values, wrong_ops)
        if stated is not None:  # else the mistake has no natural value here: the correct solution
            codes[names[index]] = node_code(names[index], _params(kind.steps[index]), wrong)
            codes["main"] = main_code(f"return {call}", stated)
    return Problem(prompt=render_prompt(kind, values, nodes), answer=str(answers[-1]),
                   solution=render_completion(codes),
                   meta={"form": kind.name, "values": dict(values), "graph": graph})


def render_prompt(kind: Kind, values: dict[str, int], nodes: list[dict]) -> str:
    return public_prompt(nodes, kind.text.format(**values))


@TASKS.register("function_graph")
@dataclass
class FunctionGraphTask:
    """Word problems as graphs of sub-functions (see the module docstring). ``kinds``: the
    templates used (default all of ``KINDS``); numbers in ``2..max_operand``;
    ``careless_fraction``: the warm-up's share of solutions with the kind's systematic mistake."""

    kinds: list[str] | None = None
    max_operand: int = 9
    eval_fraction: float = 0.1
    careless_fraction: float = 0.5
    name: str = "function_graph"
    alphabet = ALPHABET

    def __post_init__(self) -> None:
        names = list(KINDS) if self.kinds is None else list(self.kinds)
        unknown = [k for k in names if k not in KINDS]
        if unknown or not names:
            raise ValueError(f"task.kinds must name some of {', '.join(KINDS)}; got {self.kinds!r}")
        if not 2 <= self.max_operand <= 99:
            raise ValueError(f"task.max_operand must be in 2..99, got {self.max_operand}")
        if not 0.0 < self.eval_fraction < 1.0:
            raise ValueError(f"task.eval_fraction must be in (0, 1), got {self.eval_fraction}")
        if not 0.0 <= self.careless_fraction <= 1.0:
            raise ValueError(f"task.careless_fraction must be in [0, 1], got {self.careless_fraction}")
        self._train, self._eval = [], []
        numbers = range(2, self.max_operand + 1)
        for name in names:
            kind = KINDS[name]
            for combo in itertools.product(numbers, repeat=len(kind.letters)):
                values = dict(zip(kind.letters, combo))
                if _chain(kind, values, [op for _, op, _, _ in kind.steps]) is None:
                    continue
                key = (name, tuple(sorted(values.items())))
                (self._eval if in_eval_split(kind.text.format(**values), self.eval_fraction) else self._train).append(key)
        if not self._train or not self._eval:
            raise ValueError("task 'function_graph' produced an empty split; raise max_operand or add kinds")
        random.Random(1234).shuffle(self._eval)

    def _problem(self, key, careless: bool = False) -> Problem:
        name, values = key
        return build_problem(KINDS[name], dict(values), careless=careless)

    def train_problems(self, step: int, count: int, seed: int) -> list[Problem]:
        rng = random.Random(f"{seed}:{step}")
        return [self._problem(rng.choice(self._train)) for _ in range(count)]

    def warmup_problems(self, step: int, count: int, seed: int) -> list[Problem]:
        """Training problems whose ``solution`` carries the kind's mistake with probability ``careless_fraction``."""
        rng = random.Random(f"warmup:{seed}:{step}")
        return [self._problem(rng.choice(self._train), careless=rng.random() < self.careless_fraction)
                for _ in range(count)]

    def eval_problems(self, count: int) -> list[Problem]:
        if count > len(self._eval):
            raise ValueError(f"asked for {count} eval problems; the held-out split has {len(self._eval)}")
        return [self._problem(key) for key in self._eval[:count]]

    def extract_answer(self, text: str, problem: Problem) -> str | None:
        """The stated answer of ``main``'s span (for majority voting and format failures)."""
        from reasonrl.methods.fsg.parse import parse_completion

        return parse_completion(text, [n["id"] for n in problem.meta["graph"]["nodes"]]).answer
