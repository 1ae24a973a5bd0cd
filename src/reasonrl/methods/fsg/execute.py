"""FSG-RL's executable checks, run in the hardened sandbox (``reasonrl.isolation.sandbox``).

For each rollout (its spans parsed by ``rewards.fsg_parse``) and each node n of the problem's
graph (``Problem.meta["graph"]``, see ``tasks.function_graph``):

- n's code runs alone in a fresh namespace (``main``'s after the graph's *reference* helpers, so
  its tests score its own wiring), then each of n's tests ``{"call", "expected", "kind"}`` is
  evaluated under a per-test alarm. exec_n = 1 iff the code ran, defined n's function and no
  test raised or timed out (the reference: the node's harness exited 0); unit_n / prop_n = the
  pass rates of its unit / property tests; node_n = (0.25·exec + 0.5·unit + 0.25·prop) over the
  applicable weights (the reference's ``Verifier`` weights).
- The whole program (every runnable span, in graph order, in one namespace) runs
  ``target_call`` with every graph function traced: back = 1[its value equals the stated
  answer]; an edge (s → t) ``uses_value`` scores 1 iff some call of t received a value s
  returned, ``aggregates_result`` iff some value t returned equals one s returned.
- final = 1[stated answer equals ``Problem.answer``].

A node whose code breaks the code policy (``fsg_parse.code_policy_violation``) or does not parse
is never run: 0 on exec, unit and property, and absent from the program.

**The code cannot grade itself** (issue 29). The policy is a first line only; the verifier's
soundness rests on what the model's code can reach, which is nothing it could use:

- every rollout runs in sandboxes of its own: one for its helpers' tests and the whole program,
  and one for ``main``'s test, which needs the reference helpers (the answer key of the other
  nodes' tests, so never in the same process as them). Identical jobs (the same code and tests)
  run once; a sandbox that dies or hangs loses only its own rollout's unfinished checks;
- the sandbox gets the code and the test *inputs* only: a test's call is split (:func:`plan`)
  into the sub-expressions the child evaluates (each call of a graph function, say) and the
  arithmetic, comparisons and ``and``/``or``/``not`` around them, which the parent computes;
  expected values, the comparison (:func:`_eq`) and ``back`` stay in the parent;
- the child reports each value as data (``isolation.sandbox.values``: strict JSON by exact
  type; anything else is ``unencodable`` and fails its test) and the traced calls of the program
  as the values each graph function received and returned; the parent computes the edges;
- a differential test (one without ``expected``: the same call on the node's ``reference``
  code) gets the reference's value from a sandbox that runs reference code only.

A program can therefore only choose the values it reports, which any program can do honestly.
One fixed, trusted harness program (:data:`HARNESS`) runs in each sandbox and gets its job as
JSON on stdin, never as source; results stream out as marked lines, so a sandbox that dies keeps
what finished. Code that hangs inside one C call (out of the alarm's reach) costs its sandbox's
timeout and loses its own unfinished nodes; ``range`` is capped at 10⁷ items, so
``sum(range(huge))`` fails fast instead. Identical (prompt, completion) pairs run once.
``Verdict.seconds`` is the wall time of the rollout's sandboxes as the host measured it (start-up
included), never a time the program reports. Reward ``fsg_full_success`` lives here.

The harness also runs other checks' jobs (:func:`run_jobs`; the teacher judge ``reference`` of
``rewards.fsg_judge``).
"""

from __future__ import annotations

import ast
import json
import operator
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import Any, Sequence

from reasonrl.isolation.sandbox import SandboxResult, run_python
from reasonrl.isolation.sandbox.values import ENCODE, MARK, RAISED, Malformed, Opaque, decode, read_rows
from reasonrl.registry import REWARDS
from reasonrl.methods.fsg.parse import (ParsedCompletion, answers_equal, code_policy_violation, node_ids,
                                        parse_completion, quiet_syntax_warnings, signature_matches)
from reasonrl.problem import Problem

__all__ = ["Verdict", "verify", "run_jobs", "plan", "runnable_spans", "HARNESS", "RELATIONS", "NODE_WEIGHTS",
           "JobRun", "NodeRun", "ProgramRun"]

RELATIONS = ("uses_value", "aggregates_result")
NODE_WEIGHTS = (0.25, 0.5, 0.25)  # execution, unit tests, property tests (the reference's verifier weights)
OUTPUT_BYTES = 1 << 20  # each harness's stdout bound: values come back as data, a program's prints go nowhere

HARNESS = ENCODE + f"_MARK = {MARK!r}\n" + r'''
import json, math, signal, sys
_out = sys.stdout
_spec = json.loads(sys.stdin.read())
_limit = float(_spec["test_timeout"])
class _Alarm(BaseException):
    pass
def _ring(signum, frame):
    raise _Alarm()
signal.signal(signal.SIGALRM, _ring)
class _Sink:
    def write(self, s):
        return len(s)
    def flush(self):
        pass
_mods = {"math": math, "fractions": _fractions}
def _imp(name, globals=None, locals=None, fromlist=(), level=0):
    if level or name.split(".")[0] not in _mods:
        raise ImportError(name)
    return _mods[name.split(".")[0]]
_b = __builtins__ if isinstance(__builtins__, dict) else vars(__builtins__)
_safe = {k: _b[k] for k in ("abs", "min", "max", "round", "int", "float", "sum", "range", "len", "divmod", "pow",
         "bool", "list", "tuple", "dict", "set", "sorted", "reversed", "enumerate", "zip", "map", "filter", "any",
         "all", "str", "isinstance", "ArithmeticError", "ZeroDivisionError", "ValueError", "TypeError")}
_safe["__import__"] = _imp
def _range(*args):
    r = range(*args)
    try:
        n = len(r)
    except OverflowError:
        n = -1
    if not 0 <= n <= 10 ** 7:
        raise ValueError("range longer than 10**7")
    return r
_safe["range"] = _range
def _emit(obj):
    _out.write(_MARK + json.dumps(obj) + "\n")
    _out.flush()
def _timed(fn, seconds):
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
def _run(code, g):
    _timed(lambda: exec(compile(code, "<span>", "exec"), g), _limit)
def _value(src, g, seconds):
    try:
        return _enc(_timed(lambda: eval(compile(src, "<test>", "eval"), g), seconds))
    except BaseException as exc:
        return {"raised": type(exc).__name__}
sys.stdout = _Sink()
for node in _spec["nodes"]:
    g, ran = {"__builtins__": _safe, "__name__": "span"}, False
    try:
        for code in node["setup"] + [node["code"]]:
            _run(code, g)
        ran = callable(g.get(node["name"]))
    except BaseException:
        ran = False
    values = [_value(p, g, _limit) for p in node["probes"]] if ran or node["reference"] else []
    _emit({"node": node["id"], "ran": ran, "values": values})
prog = _spec["program"]
if prog is not None:
    g, calls, budget = {"__builtins__": _safe, "__name__": "program"}, {}, [2000]
    def _note(seen, v):
        e = _enc(v)
        k = json.dumps(e, sort_keys=True)
        if len(seen) < 256 and len(k) <= 1000:
            seen.setdefault(k, e)
    def _tracer(name, fn):
        ins, outs = calls.setdefault(name, ({}, {}))
        def traced(*args, **kwargs):
            r = fn(*args, **kwargs)
            if budget[0] > 0:
                budget[0] -= 1
                for a in args:
                    _note(ins, a)
                _note(outs, r)
            return r
        return traced
    value, ran = None, False
    try:
        for code in prog["codes"]:
            try:
                _run(code, g)
            except BaseException:
                pass
        for name in prog["names"]:
            if callable(g.get(name)):
                g[name] = _tracer(name, g[name])
        value = _timed(lambda: eval(compile(prog["target_call"], "<target>", "eval"), g), 2 * _limit)
        ran = True
    except BaseException:
        ran = False
    _emit({"program": True, "ran": ran, "value": _enc(value) if ran else None,
           "calls": {n: [list(i.values()), list(o.values())] for n, (i, o) in calls.items()}})
_emit({"done": True})
'''
"""The trusted program in every sandbox. stdin: ``{"test_timeout": s, "nodes": [{"id", "name",
"setup": [code], "code", "probes": [expression], "reference": bool}], "program": {"codes",
"names", "target_call"} or None}``. Each node's setup and code run in a fresh namespace (restricted
builtins, imports of ``math``/``fractions`` only), then its probes (when its function was defined,
or always for ``reference`` nodes) each under the per-test alarm; the program runs every code,
traces the named functions and evaluates ``target_call`` under twice the alarm. Lines (marked
``values.MARK``): ``{"node", "ran", "values": [encoded]}``, ``{"program": true, "ran", "value",
"calls": {name: [[values received], [values returned]]}}`` (at most 256 distinct each, from the
first 2000 calls), then ``{"done": true}``."""


@dataclass
class Verdict:
    """Every check of one rollout; per-node lists in graph order."""

    fmt: float
    sig: list[float]
    exec: list[float]
    unit: list[float]
    prop: list[float]
    node: list[float]
    has_unit: list[bool]
    has_prop: list[bool]
    edges: list[float]
    final: float
    back: float
    answer: str | None
    value: Any = None
    seconds: float = 0.0
    rejected: dict[str, str] = field(default_factory=dict)
    sandbox_failed: bool = False

    @staticmethod
    def _mean(values: Sequence[float]) -> float:
        return sum(values) / len(values) if values else 0.0

    def means(self) -> dict[str, float]:
        """sig, exec, node, edge: means over all nodes / edges; unit and prop over the nodes that have such tests."""
        return {"sig": self._mean(self.sig), "exec": self._mean(self.exec), "node": self._mean(self.node),
                "unit": self._mean([u for u, h in zip(self.unit, self.has_unit) if h]),
                "prop": self._mean([p for p, h in zip(self.prop, self.has_prop) if h]),
                "edge": self._mean(self.edges)}

    @property
    def executable(self) -> bool:
        return all(e == 1.0 for e in self.exec)

    @property
    def all_tests_pass(self) -> bool:
        return all((u == 1.0 or not hu) and (p == 1.0 or not hp)
                   for u, p, hu, hp in zip(self.unit, self.prop, self.has_unit, self.has_prop))

    @property
    def full_success(self) -> bool:
        """F, every signature, every node executable, every hidden test passes, the answer right and backed by the code."""
        return bool(self.fmt and all(self.sig) and self.executable and self.all_tests_pass and self.final
                    and self.back)


def check_graph(graph: dict) -> None:
    ids = [n["id"] for n in graph["nodes"]]
    bad = [e for e in graph.get("edges", []) if e["relation"] not in RELATIONS or not {e["source"], e["target"]} <= set(ids)]
    if bad or "main" not in ids:
        raise ValueError(f"function graph: needs a 'main' node and edges between its nodes with relations "
                         f"{RELATIONS}; got nodes {ids}, bad edges {bad}")


def runnable_spans(parsed: ParsedCompletion, graph: dict, policy: bool = True) -> tuple[dict[str, str], dict[str, str]]:
    """({node id: code} of the spans that may run, {node id: why not} of those the code policy
    (``policy``) or the compiler refused); nodes without a span are in neither."""
    runnable, rejected = {}, {}
    for n in graph["nodes"]:
        span = parsed.spans.get(n["id"])
        if span is None:
            continue
        why = code_policy_violation(span.text) if policy else None
        if why is None:
            try:
                with quiet_syntax_warnings():
                    compile(span.text, "<span>", "exec")
            except (SyntaxError, ValueError) as exc:
                why = f"syntax error: {exc}"
        if why is None:
            runnable[n["id"]] = span.text
        else:
            rejected[n["id"]] = why
    return runnable, rejected


# -- tests split between the child (probes) and the parent (everything around them) ----------------

_ARITH = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
          ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge}
_CONSTANTS = (int, float, bool, str, type(None))


@lru_cache(maxsize=4096)
def plan(call: str) -> tuple[tuple, tuple[str, ...]]:
    """``(tree, probes)`` of a test's call: ``probes`` are the sub-expressions the sandbox
    evaluates (every one that is not a constant, ``+ - * / // %``, a comparison ``== != < <= > >=``,
    ``and``/``or``/``not`` or unary ``-``/``+``: a call such as ``f1(3,4)``, a name, a ``**``), and
    ``tree`` is what the parent computes from their values (:func:`_calc`). ``"f1(12,3)*3==12"``
    gives one probe ``f1(12, 3)``; ``"main()"`` gives ``main()`` itself."""
    probes: list[str] = []

    def walk(node: ast.expr) -> tuple:
        if isinstance(node, ast.Constant) and type(node.value) in _CONSTANTS:
            return ("const", node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
            return ("arith", type(node.op), walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd, ast.Not)):
            return ("unary", type(node.op), walk(node.operand))
        if isinstance(node, ast.BoolOp):
            return ("bool", type(node.op), tuple(walk(v) for v in node.values))
        if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
            return ("compare", tuple(type(op) for op in node.ops), tuple(walk(x) for x in (node.left, *node.comparators)))
        source = ast.unparse(node)
        if source not in probes:
            probes.append(source)
        return ("probe", probes.index(source))

    try:
        tree = ast.parse(call, mode="eval").body
    except SyntaxError as exc:
        raise ValueError(f"function graph: the test call {call!r} is not a Python expression ({exc.msg})") from None
    return walk(tree), tuple(probes)


def _number(v: Any) -> bool:
    return type(v) in (int, float, bool, Fraction)


def _calc(tree: tuple, values: Sequence[Any]) -> Any:
    """The value of a :func:`plan` tree given its probes' decoded ``values``, as Python would
    compute it (short-circuit ``and``/``or``, chained comparisons); raises when a probe it needs
    raised, or on arithmetic with anything but numbers (a str or list times an int could be huge)."""
    kind = tree[0]
    if kind == "const":
        return tree[1]
    if kind == "probe":
        value = values[tree[1]]
        if value is RAISED:
            raise ArithmeticError("the probe raised in the sandbox")
        return value
    if kind == "arith":
        a, b = _calc(tree[2], values), _calc(tree[3], values)
        if not (_number(a) and _number(b)):
            raise TypeError(f"arithmetic on {type(a).__name__} and {type(b).__name__}")
        return _ARITH[tree[1]](a, b)
    if kind == "unary":
        x = _calc(tree[2], values)
        if tree[1] is ast.Not:
            return not x
        if not _number(x):
            raise TypeError(f"unary minus/plus on {type(x).__name__}")
        return -x if tree[1] is ast.USub else +x
    if kind == "bool":
        for sub in tree[2]:
            x = _calc(sub, values)
            if (tree[1] is ast.And) != bool(x):  # and: the first falsy value; or: the first truthy one
                return x
        return x
    left = _calc(tree[2][0], values)
    for op, sub in zip(tree[1], tree[2][1:]):
        right = _calc(sub, values)
        if not _COMPARE[op](left, right):
            return False
        left = right
    return True


def _eq(a: Any, b: Any) -> bool:
    """a (a decoded value) equals b: bools only themselves, numbers within 1e-9 relative, else ``==``."""
    if type(a) is bool or type(b) is bool:
        return a is b
    if type(a) in (int, float) and type(b) in (int, float):
        try:
            return abs(a - b) <= 1e-9 * max(1.0, abs(b))
        except (OverflowError, ValueError):
            return False
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - an opaque value or incomparable types: not equal
        return False


# -- running jobs --------------------------------------------------------------------------------

@dataclass
class NodeRun:
    """One node's run: its code ran and defined its function; per test (did not raise, passed)."""

    ran: bool
    tests: list[tuple[bool, bool]]


@dataclass
class ProgramRun:
    """The whole program's run: ``target_call`` returned; its value when a finite number under
    10¹⁵ (else None); per edge, 1.0 iff the traced calls show it."""

    ran: bool
    value: int | float | None
    edges: list[float]


@dataclass
class JobRun:
    """A job's results: its nodes that reported (a node missing never finished), its program's
    (None: none, or it never finished), the sandbox's wall seconds, whether it never finished."""

    nodes: dict[str, NodeRun]
    program: ProgramRun | None
    seconds: float
    failed: bool


def _spec_node(node: dict, key: str, probes: list[str], reference: bool) -> dict:
    return {"id": key, "name": node["name"], "setup": list(node.get("setup", [])), "code": node.get("code", ""),
            "probes": probes, "reference": reference}


def _reported(result: SandboxResult, spec: dict) -> tuple[dict[str, tuple[bool, list]], dict | None, bool]:
    """({node id: (ran, decoded probe values)}, program row, done) of one sandbox's output; a row
    of the wrong shape counts as no result."""
    want = {n["id"]: n for n in spec["nodes"]}
    nodes, program, done = {}, None, False
    for row in read_rows(result.stdout):
        try:
            if "node" in row:
                key, ran, values = row["node"], row["ran"], row["values"]
                if key not in want or key in nodes or type(ran) is not bool or type(values) is not list:
                    continue
                if len(values) != (len(want[key]["probes"]) if ran or want[key]["reference"] else 0):
                    continue
                nodes[key] = (ran, [decode(v) for v in values])
            elif row.get("program") is True and program is None and spec["program"] is not None:
                calls = {name: ([decode(x) for x in ins], [decode(x) for x in outs])
                         for name, (ins, outs) in row["calls"].items() if type(ins) is list and type(outs) is list}
                program = {"ran": row["ran"] is True, "value": decode(row["value"]), "calls": calls}
            elif row.get("done") is True:
                done = True
        except (KeyError, TypeError, ValueError, AttributeError, Malformed):
            continue
    return nodes, program, done


def _back_value(v: Any) -> int | float | None:
    return v if type(v) in (int, float) and v == v and abs(v) < 1e15 else None


def _edges(program: dict, edges: Sequence[Sequence[str]]) -> list[float]:
    out = []
    for src, dst, rel in edges:
        outs = program["calls"].get(src, ([], []))[1]
        ins = program["calls"].get(dst, ([], []))[0 if rel == "uses_value" else 1]
        out.append(float(any(_eq(x, r) for r in outs for x in ins)))
    return out


def _harness_runs(specs: list[dict], pool, limits: dict) -> list[SandboxResult]:
    stdins = [json.dumps(s) for s in specs]
    if pool is not None:
        return pool.map([HARNESS] * len(specs), stdins=stdins, max_output_bytes=OUTPUT_BYTES, **limits)
    return [run_python(HARNESS, stdin=s, max_output_bytes=OUTPUT_BYTES, **limits) for s in stdins]


def run_jobs(jobs: Sequence[dict], *, pool=None, timeout_s: float = 5.0, test_timeout_s: float = 1.0,
             memory_mb: int = 256, per_sandbox: int | None = None) -> list[JobRun]:
    """Run harness jobs, each in a sandbox of its own (identical jobs once), and score their tests
    in this process. A job is ``{"nodes": [{"id", "name", "setup": [code], "code", "tests":
    [{"call", "expected"?}], "reference": [code]?}], "program": {"codes", "names", "target_call",
    "edges": [[source name, target name, relation]]} or None}``; everything in one job shares one
    interpreter, so a job must hold nothing one of its nodes could use to pass another's tests
    (``verify`` runs ``main``'s test, which needs the reference helpers, in a job of its own).

    A test without ``expected`` is differential: it passes iff its call gives the same value on
    the node's ``reference`` code (setup and reference, in a fresh namespace), or both raise. The
    references run in sandboxes of their own, with reference code only (32 nodes a sandbox).

    ``pool``: a ``SandboxPool`` (None: one sandbox at a time); ``timeout_s``: each sandbox's wall
    time; ``test_timeout_s``: each node's code and each probe; ``per_sandbox`` is accepted and
    ignored (every job has its own sandbox now; it was the number of rollouts sharing one)."""
    del per_sandbox
    limits = {"timeout_s": timeout_s, "memory_mb": memory_mb}
    specs: list[dict] = []
    job_spec: list[int] = []
    index: dict[str, int] = {}
    references: dict[str, dict] = {}  # (reference code, name) -> its spec node (probes gathered below)
    for job in jobs:
        nodes = []
        for k, node in enumerate(job["nodes"]):
            probes: list[str] = []
            for t in node["tests"]:
                probes += [p for p in plan(t["call"])[1] if p not in probes]
                if "expected" not in t:
                    key = json.dumps([node["reference"], node["name"]])
                    ref = references.setdefault(key, _spec_node({"name": node["name"], "setup": node["reference"]},
                                                                f"r{len(references)}", [], True))
                    ref["probes"] += [p for p in plan(t["call"])[1] if p not in ref["probes"]]
            nodes.append(_spec_node(node, str(k), probes, False))
        program = job.get("program")
        spec = {"test_timeout": test_timeout_s, "nodes": nodes,
                "program": {k: program[k] for k in ("codes", "names", "target_call")} if program else None}
        key = json.dumps(spec, sort_keys=True)
        if key not in index:
            index[key] = len(specs)
            specs.append(spec)
        job_spec.append(index[key])
    n_jobs = len(specs)
    ref_nodes = list(references.values())
    specs += [{"test_timeout": test_timeout_s, "nodes": ref_nodes[i:i + 32], "program": None}
              for i in range(0, len(ref_nodes), 32)]
    results = _harness_runs(specs, pool, limits) if specs else []
    reported = [_reported(r, s) for r, s in zip(results, specs)]
    ref_values: dict[str, tuple[bool, list]] = {}
    for nodes, _, _ in reported[n_jobs:]:
        ref_values.update(nodes)

    def reference_value(node: dict, t: dict) -> Any:
        ref = references[json.dumps([node["reference"], node["name"]])]
        got = ref_values.get(ref["id"])
        if got is None:
            return Opaque()  # its sandbox died: agrees with nothing
        tree, probes = plan(t["call"])
        try:
            return _calc(tree, [got[1][ref["probes"].index(p)] for p in probes])
        except Exception:  # noqa: BLE001 - the reference raised: agrees only with a candidate that raises
            return RAISED

    out = []
    for job, s in zip(jobs, job_spec):
        nodes, program, done = reported[s]
        spec = specs[s]
        runs = {}
        for k, node in enumerate(job["nodes"]):
            if str(k) not in nodes:
                continue
            ran, values = nodes[str(k)]
            tests = []
            for t in node["tests"]:
                if not ran:
                    tests.append((False, False))
                    continue
                want = t["expected"] if "expected" in t else reference_value(node, t)
                tree, probes = plan(t["call"])
                try:
                    got = _calc(tree, [values[spec["nodes"][k]["probes"].index(p)] for p in probes])
                except Exception:  # noqa: BLE001 - it raised (in the sandbox, or in arithmetic on what it returned)
                    tests.append((False, want is RAISED))
                    continue
                tests.append((True, want is not RAISED and _eq(got, want)))
            runs[node["id"]] = NodeRun(ran, tests)
        prog = None
        if program is not None and job.get("program") is not None:
            value = program["value"] if program["ran"] else None
            prog = ProgramRun(program["ran"], _back_value(value), _edges(program, job["program"]["edges"]))
        out.append(JobRun(runs, prog, float(results[s].wall_s), not done))
    return out


def _jobs(parsed: ParsedCompletion, graph: dict, policy: bool) -> tuple[list[dict], dict[str, str]]:
    """The harness jobs of one rollout (none: nothing runnable) and the nodes the policy rejected:
    its helpers' tests with the whole program, and ``main``'s test with the reference helpers
    apart (they would pass the helpers' tests for any code that found them)."""
    runnable, rejected = runnable_spans(parsed, graph, policy)
    reference = graph.get("reference", {})
    nodes = {n["id"]: {"id": n["id"], "name": n["name"], "code": runnable[n["id"]], "tests": n["tests"], "setup": []}
             for n in graph["nodes"] if n["id"] in runnable}
    program = None
    if "main" in runnable:
        program = {"codes": [runnable[n["id"]] for n in graph["nodes"] if n["id"] in runnable],
                   "names": [n["name"] for n in graph["nodes"]], "target_call": graph["target_call"],
                   "edges": [[_name(graph, e["source"]), _name(graph, e["target"]), e["relation"]] for e in graph["edges"]]}
    helpers = [node for i, node in nodes.items() if i != "main"]
    jobs = [{"nodes": helpers, "program": program}] if helpers or program else []
    if "main" in nodes:
        main = {**nodes["main"], "setup": [reference[m["id"]] for m in graph["nodes"] if m["id"] != "main"]}
        jobs.append({"nodes": [main], "program": None})
    return jobs, rejected


def _name(graph: dict, node_id: str) -> str:
    return next(n["name"] for n in graph["nodes"] if n["id"] == node_id)


def _verdict(parsed: ParsedCompletion, graph: dict, problem: Problem, runs: Sequence[JobRun],
             rejected: dict[str, str]) -> Verdict:
    nodes = {k: v for run in runs for k, v in run.nodes.items()}
    program = next((run.program for run in runs if run.program is not None), None)
    sig, exe, unit, prop, node, has_u, has_p = [], [], [], [], [], [], []
    for n in graph["nodes"]:
        span = parsed.spans.get(n["id"])
        sig.append(float(span is not None and signature_matches(span.text, n["signature"])))
        kinds = [t.get("kind", "unit") for t in n["tests"]]
        r = nodes.get(n["id"])
        runs_n = r.tests if r else [(False, False)] * len(kinds)
        e = float(bool(r and r.ran and all(ok for ok, _ in runs_n)))
        rates = []
        for kind in ("unit", "property"):
            passed = [p for (_, p), k in zip(runs_n, kinds) if k == kind]
            rates.append(sum(passed) / len(passed) if passed else 0.0)
        exe.append(e)
        unit.append(rates[0])
        prop.append(rates[1])
        has_u.append("unit" in kinds)
        has_p.append("property" in kinds)
        weighted = [(NODE_WEIGHTS[0], e)] + [(w, s) for w, s, h in ((NODE_WEIGHTS[1], rates[0], has_u[-1]),
                                                                    (NODE_WEIGHTS[2], rates[1], has_p[-1])) if h]
        node.append(sum(w * s for w, s in weighted) / sum(w for w, _ in weighted))
    value = program.value if program and program.ran else None
    edges = program.edges if program else [0.0] * len(graph["edges"])
    return Verdict(fmt=float(parsed.exact), sig=sig, exec=exe, unit=unit, prop=prop, node=node, has_unit=has_u,
                   has_prop=has_p, edges=[float(x) for x in edges],
                   final=float(answers_equal(parsed.answer, problem.answer)),
                   back=float(value is not None and answers_equal(value, parsed.answer)), answer=parsed.answer,
                   value=value, seconds=sum(run.seconds for run in runs), rejected=rejected,
                   sandbox_failed=any(run.failed for run in runs))


def verify(completions: Sequence[str], problems: Sequence[Problem], *, pool=None, timeout_s: float = 5.0,
           test_timeout_s: float = 1.0, memory_mb: int = 256, per_sandbox: int | None = None,
           policy: bool = True) -> list[Verdict]:
    """One :class:`Verdict` per (completion, problem). ``pool``: a ``SandboxPool`` (None: one
    sandbox at a time with ``run_python``); ``timeout_s``: each sandbox's wall time;
    ``test_timeout_s``: each node's code and each test (the target call: twice that);
    ``policy=False`` runs code the code policy would reject (for testing the sandbox);
    ``per_sandbox``: accepted for old recipes and ignored (each rollout has sandboxes of its own)."""
    del per_sandbox
    if len(completions) != len(problems):
        raise ValueError(f"{len(completions)} completions for {len(problems)} problems")
    keys, unique = [], {}
    for text, problem in zip(completions, problems):
        key = (problem.prompt, problem.answer, text)
        keys.append(key)
        if key not in unique:
            ids = node_ids(problem)  # a clear error for a problem without a graph
            check_graph(problem.meta["graph"])
            parsed = parse_completion(text, ids)
            unique[key] = (parsed, problem, *_jobs(parsed, problem.meta["graph"], policy))
    jobs = [job for _, _, rollout_jobs, _ in unique.values() for job in rollout_jobs]
    runs = iter(run_jobs(jobs, pool=pool, timeout_s=timeout_s, test_timeout_s=test_timeout_s, memory_mb=memory_mb))
    verdicts = {k: _verdict(parsed, problem.meta["graph"], problem, [next(runs) for _ in rollout_jobs], rejected)
                for k, (parsed, problem, rollout_jobs, rejected) in unique.items()}
    return [verdicts[k] for k in keys]


@REWARDS.register("fsg_full_success")
def fsg_full_success(completion: str, problem: Problem, *, sandbox_timeout_s: float = 5.0, **_) -> float:
    """1.0 when the completion is a full solution (:attr:`Verdict.full_success`: format, signatures,
    every node executable and passing its hidden tests, the stated answer right and what the
    program returns), else 0.0. Runs in the sandbox: for evaluation (``eval.reward``)."""
    return float(verify([completion], [problem], timeout_s=sandbox_timeout_s)[0].full_success)
