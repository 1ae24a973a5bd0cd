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
is never run: 0 on exec, unit and property, and absent from the program. Everything runs through
one fixed harness program (trusted; the rollouts' code reaches it as JSON on stdin, never as
source), ``per_sandbox`` rollouts per sandbox, each in its own namespaces, results streamed as
marked lines so a sandbox that dies keeps what finished; the rollouts a failed sandbox left
unfinished run again one per sandbox, so one hostile rollout cannot zero its neighbours. Code
that hangs inside one C call (out of the alarm's reach) costs its chunk's sandbox timeout, then
its own, and loses its own unfinished nodes; ``range`` is capped at 10⁷ items, so
``sum(range(huge))`` fails fast instead.
Identical (prompt, completion) pairs run once. Reward ``fsg_full_success`` lives here.

The harness also runs other checks' jobs (:func:`run_jobs`; the teacher judge ``reference`` of
``rewards.fsg_judge``): a node may carry ``reference`` (code run in a namespace of its own), and
a test without ``expected`` then compares its call with the same call there (a *differential*
test; a reference that raises agrees only with a candidate that raises too).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any, Sequence

from reasonrl.registry import REWARDS
from reasonrl.methods.fsg.parse import (ParsedCompletion, answers_equal, code_policy_violation, node_ids,
                                        parse_completion, quiet_syntax_warnings, signature_matches)
from reasonrl.problem import Problem

__all__ = ["Verdict", "verify", "run_jobs", "runnable_spans", "HARNESS", "RELATIONS", "NODE_WEIGHTS"]

RELATIONS = ("uses_value", "aggregates_result")
NODE_WEIGHTS = (0.25, 0.5, 0.25)  # execution, unit tests, property tests (the reference's verifier weights)

HARNESS = r'''
import fractions, io, json, math, signal, sys, time
_out = sys.stdout
_spec = json.loads(sys.stdin.read())
_mark, _limit = _spec["marker"], float(_spec["test_timeout"])
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
_mods = {"math": math, "fractions": fractions}
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
    _out.write(_mark + json.dumps(obj) + "\n")
    _out.flush()
def _timed(fn, seconds):
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
def _num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)
def _eq(a, b):
    if isinstance(b, bool) or isinstance(a, bool):
        return a is b
    if _num(a) and _num(b):
        try:
            return abs(a - b) <= 1e-9 * max(1.0, abs(b))
        except (OverflowError, ValueError):
            return False
    try:
        return bool(a == b)
    except Exception:
        return False
def _run(codes, g):
    for code in codes:
        _timed(lambda: exec(compile(code, "<span>", "exec"), g), _limit)
def _value(v):
    if _num(v) and abs(v) < 1e15 and v == v:
        return v
    return None
class _Raised:
    pass
sys.stdout = _Sink()
for j, job in enumerate(_spec["jobs"]):
    start = time.perf_counter()
    for node in job["nodes"]:
        g, ran, tests = {"__builtins__": _safe, "__name__": "span"}, False, []
        try:
            _run(node["setup"] + [node["code"]], g)
            ran = callable(g.get(node["name"]))
        except BaseException:
            ran = False
        ref = {"__builtins__": _safe, "__name__": "reference"}
        if ran and "reference" in node:
            try:
                _run(node["reference"], ref)
            except BaseException:
                pass
        for t in node["tests"]:
            if not ran:
                tests.append([False, False])
                continue
            if "expected" in t:
                want = t["expected"]
            else:
                try:
                    want = _timed(lambda: eval(compile(t["call"], "<reference>", "eval"), ref), _limit)
                except BaseException:
                    want = _Raised
            try:
                got = _timed(lambda: eval(compile(t["call"], "<test>", "eval"), g), _limit)
                tests.append([True, _eq(got, want)])
            except BaseException:
                tests.append([False, want is _Raised])
        _emit({"j": j, "node": node["id"], "ran": ran, "tests": tests})
    prog = job.get("program")
    if prog is not None:
        g, log, value, ran = {"__builtins__": _safe, "__name__": "program"}, [], None, False
        def _tracer(name, fn):
            def traced(*args, **kwargs):
                r = fn(*args, **kwargs)
                if len(log) < 2000:
                    log.append((name, args, r))
                return r
            return traced
        try:
            for code in prog["codes"]:
                try:
                    _run([code], g)
                except BaseException:
                    pass
            for name in prog["names"]:
                if callable(g.get(name)):
                    g[name] = _tracer(name, g[name])
            value = _timed(lambda: eval(compile(prog["target_call"], "<target>", "eval"), g), 2 * _limit)
            ran = True
        except BaseException:
            ran = False
        edges = []
        for src, dst, rel in prog["edges"]:
            outs = [r for n, _, r in log if n == src]
            if rel == "uses_value":
                ins = [x for n, a, _ in log if n == dst for x in a]
            else:
                ins = [r for n, _, r in log if n == dst]
            edges.append(float(any(_eq(x, r) for r in outs for x in ins)))
        _emit({"j": j, "program": True, "ran": ran, "value": _value(value), "edges": edges})
    _emit({"j": j, "done": True, "seconds": time.perf_counter() - start})
'''


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


def _job(parsed: ParsedCompletion, graph: dict, policy: bool) -> tuple[dict | None, dict[str, str]]:
    """The harness job of one rollout (None: nothing runnable) and the nodes the policy rejected."""
    runnable, rejected = runnable_spans(parsed, graph, policy)
    if not runnable:
        return None, rejected
    reference = graph.get("reference", {})
    nodes = [{"id": n["id"], "name": n["name"], "code": runnable[n["id"]], "tests": n["tests"],
              "setup": [reference[m["id"]] for m in graph["nodes"] if m["id"] != "main"] if n["id"] == "main" else []}
             for n in graph["nodes"] if n["id"] in runnable]
    program = None
    if "main" in runnable:
        program = {"codes": [runnable[n["id"]] for n in graph["nodes"] if n["id"] in runnable],
                   "names": [n["name"] for n in graph["nodes"]], "target_call": graph["target_call"],
                   "edges": [[_name(graph, e["source"]), _name(graph, e["target"]), e["relation"]] for e in graph["edges"]]}
    return {"nodes": nodes, "program": program}, rejected


def _name(graph: dict, node_id: str) -> str:
    return next(n["name"] for n in graph["nodes"] if n["id"] == node_id)


def _read(stdout: str, marker: str) -> dict[int, dict]:
    """{job index: {"nodes": {id: result}, "program": result, "done": result}} from the marked lines."""
    out: dict[int, dict] = {}
    for line in stdout.splitlines():
        if not line.startswith(marker):
            continue
        try:
            row = json.loads(line[len(marker):])
        except ValueError:
            continue
        slot = out.setdefault(int(row["j"]), {"nodes": {}})
        if "node" in row:
            slot["nodes"][row["node"]] = row
        elif row.get("program"):
            slot["program"] = row
        else:
            slot["done"] = row
    return out


def _verdict(parsed: ParsedCompletion, graph: dict, problem: Problem, result: dict | None,
             rejected: dict[str, str], sandbox_failed: bool) -> Verdict:
    result = result or {"nodes": {}}
    sig, exe, unit, prop, node, has_u, has_p = [], [], [], [], [], [], []
    for n in graph["nodes"]:
        span = parsed.spans.get(n["id"])
        sig.append(float(span is not None and signature_matches(span.text, n["signature"])))
        kinds = [t.get("kind", "unit") for t in n["tests"]]
        r = result["nodes"].get(n["id"])
        runs = r["tests"] if r else [[False, False]] * len(kinds)
        e = float(bool(r and r["ran"] and all(ok for ok, _ in runs)))
        rates = []
        for kind in ("unit", "property"):
            passed = [p for (_, p), k in zip(runs, kinds) if k == kind]
            rates.append(sum(passed) / len(passed) if passed else 0.0)
        exe.append(e)
        unit.append(rates[0])
        prop.append(rates[1])
        has_u.append("unit" in kinds)
        has_p.append("property" in kinds)
        weighted = [(NODE_WEIGHTS[0], e)] + [(w, s) for w, s, h in ((NODE_WEIGHTS[1], rates[0], has_u[-1]),
                                                                    (NODE_WEIGHTS[2], rates[1], has_p[-1])) if h]
        node.append(sum(w * s for w, s in weighted) / sum(w for w, _ in weighted))
    program = result.get("program")
    value = program["value"] if program and program["ran"] else None
    edges = program["edges"] if program else [0.0] * len(graph["edges"])
    return Verdict(fmt=float(parsed.exact), sig=sig, exec=exe, unit=unit, prop=prop, node=node, has_unit=has_u,
                   has_prop=has_p, edges=[float(x) for x in edges],
                   final=float(answers_equal(parsed.answer, problem.answer)),
                   back=float(value is not None and answers_equal(value, parsed.answer)), answer=parsed.answer,
                   value=value, seconds=float(result.get("done", {}).get("seconds", 0.0)), rejected=rejected,
                   sandbox_failed=sandbox_failed)


def run_jobs(jobs: Sequence[dict], *, pool=None, timeout_s: float = 5.0, test_timeout_s: float = 1.0,
             memory_mb: int = 256, per_sandbox: int = 8) -> list[tuple[dict, bool]]:
    """Run harness jobs (``{"nodes": [...], "program": ... or None}``, see :data:`HARNESS`),
    ``per_sandbox`` to a sandbox; the jobs a dead sandbox left unfinished run again one per
    sandbox. Per job: (its streamed results ``{"nodes": {id: row}, "program": row, "done": row}``,
    whether it never finished). ``pool``: a ``SandboxPool`` (None: one sandbox at a time);
    ``timeout_s``: each sandbox's wall time; ``test_timeout_s``: each node's code and each test."""
    from reasonrl.isolation.sandbox import run_python

    results: list[dict] = [{"nodes": {}} for _ in jobs]

    def run(chunks: list[list[int]]) -> list[int]:
        marker = f"FSG{secrets.token_hex(8)}:"
        stdins = [json.dumps({"marker": marker, "test_timeout": test_timeout_s,
                              "jobs": [jobs[i] for i in chunk]}) for chunk in chunks]
        limits = {"timeout_s": timeout_s, "memory_mb": memory_mb}
        if pool is not None:
            outs = pool.map([HARNESS] * len(chunks), stdins=stdins, **limits)
        else:
            outs = [run_python(HARNESS, stdin=s, **limits) for s in stdins]
        unfinished = []
        for chunk, out in zip(chunks, outs):
            read = _read(out.stdout, marker)
            for j, i in enumerate(chunk):
                results[i] = read.get(j, {"nodes": {}})
                if "done" not in results[i]:
                    unfinished.append(i)
        return unfinished

    step = max(1, per_sandbox)
    retry = run([list(range(i, min(i + step, len(jobs)))) for i in range(0, len(jobs), step)]) if jobs else []
    if retry and step > 1:
        retry = run([[i] for i in retry])
    failed = set(retry)
    return [(r, i in failed) for i, r in enumerate(results)]


def verify(completions: Sequence[str], problems: Sequence[Problem], *, pool=None, timeout_s: float = 5.0,
           test_timeout_s: float = 1.0, memory_mb: int = 256, per_sandbox: int = 8,
           policy: bool = True) -> list[Verdict]:
    """One :class:`Verdict` per (completion, problem). ``pool``: a ``SandboxPool`` (None: one
    program at a time with ``run_python``); ``timeout_s``: each sandbox's wall time;
    ``test_timeout_s``: each node's code and each test (the target call: twice that);
    ``policy=False`` runs code the code policy would reject (for testing the sandbox)."""
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
            unique[key] = (parsed, problem, *_job(parsed, problem.meta["graph"], policy))
    todo = [k for k, (_, _, job, _) in unique.items() if job is not None]
    ran = run_jobs([unique[k][2] for k in todo], pool=pool, timeout_s=timeout_s, test_timeout_s=test_timeout_s,
                   memory_mb=memory_mb, per_sandbox=per_sandbox)
    results = dict(zip(todo, (r for r, _ in ran)))
    failed = {k for k, (_, dead) in zip(todo, ran) if dead}
    verdicts = {k: _verdict(parsed, problem.meta["graph"], problem, results.get(k), rejected, k in failed)
                for k, (parsed, problem, _, rejected) in unique.items()}
    return [verdicts[k] for k in keys]


@REWARDS.register("fsg_full_success")
def fsg_full_success(completion: str, problem: Problem, *, sandbox_timeout_s: float = 5.0, **_) -> float:
    """1.0 when the completion is a full solution (:attr:`Verdict.full_success`: format, signatures,
    every node executable and passing its hidden tests, the stated answer right and what the
    program returns), else 0.0. Runs in the sandbox: for evaluation (``eval.reward``)."""
    return float(verify([completion], [problem], timeout_s=sandbox_timeout_s)[0].full_success)
