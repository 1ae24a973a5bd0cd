"""Issue 29, item 1: a reward that runs model code cannot be forged by that code. FSG-RL's verifier
and its reference judge, and the python_tests reward, give the sandboxed program only the test
inputs and compare the values it reports as data here (docs/sandbox.md, "Rewards that run model
code"). Each exploit below forged a pass on the old harness (one interpreter holding the tests,
their expected values and several rollouts); run with the code policy off, none raises a wrong
program's reward above what it earns honestly, and none touches a neighbour's. What a program can
still do in its own process is report values of its choosing: no more than returning them honestly
earns (``test_a_program_that_chooses_the_values_it_reports_earns_what_returning_them_would``)."""

import json

import pytest

from reasonrl.isolation.sandbox.values import ENCODE, MARK, RAISED, Malformed, Opaque, decode, read_rows
from reasonrl.methods.fsg import judge as judge_module
from reasonrl.methods.fsg.execute import _calc, plan, runnable_spans, verify
from reasonrl.methods.fsg.judge import ReferenceJudge
from reasonrl.methods.fsg.method import FSGVerifier
from reasonrl.methods.fsg.parse import code_policy_violation, parse_completion
from reasonrl.problem import Problem
from reasonrl.registry import REWARDS
from reasonrl.rewards.python_tests import check, split_tests

from helpers import IDS, PENS, RIGHT

# f2 is wrong (x+c: 17 instead of 7) but main states the right answer, 7: full success needs
# f2's tests and the backward check (main() must return 7) to be forged.
WRONG = RIGHT.replace("x-c", "x+c")
_HEAD = ("import fractions\nB=fractions.sys.modules['builtins']\nM=fractions.sys.modules\n"
         "type=B.type\nnext=B.next\n")  # the harness's builtins lack them
# The first exploit, verbatim in spirit: every '_' built at run time, so the code policy lets it through.
MODULE_FORGE = ("import fractions\ndef yes(a,b):return True\ndef val(v):return 7\nm=fractions.sys.modules\n"
                "u=m[\"builtins\"].chr(95)\nm[\"builtins\"].setattr(m[u+u+\"main\"+u+u],u+\"eq\",yes)\n"
                "m[\"builtins\"].setattr(m[u+u+\"main\"+u+u],u+\"value\",val)\ndef f2(x,c):return x+c")
# The second: a format string walks f2's globals to the harness's _spec and reads f2's expected values.
FORMAT_READ = ("import fractions\ns=str(fractions.Fraction.limit_denominator)\nu=s[s.find(\"denominator\")-1]\n"
               "q=\"{0.\"+u+u+\"globals\"+u+u+\"[\"+u+u+\"builtins\"+u+u+\"][\"+u+u+\"import\"+u+u+\"].\"+u+u+\"globals\""
               "+u+u+\"[\"+u+\"spec]}\"\n"
               "def f2(x,c):\n t=q.format(f2)\n k=\"'f2(\"+str(x)+\",\"+str(c)+\")', 'expected': \"\n"
               " i=t.find(k)\n if i<0:\n  return x+c\n t=t[i+len(k):]\n return int(t[:t.find(\",\")])")
# Look for a dict holding this call's expected value, else the reference f2, anywhere the code can reach.
_STEAL = ("def steal(x,c,where):\n call='f2(%d,%d)'%(x,c)\n for o in where:\n"
          "  if type(o) is dict and o.get('call')==call and 'expected' in o:\n   return o['expected']\n"
          "  if type(o) is dict and type(o.get('want')) is int:\n   return o['want']\n"
          "  if type(o) is type(f2) and o.__name__=='f2' and o.__code__.co_consts!=f2.__code__.co_consts:\n"
          "   return o(x,c)\n return x+c\n")
FRAMES = (_HEAD + _STEAL + "def frames():\n box=[]\n gen=(box[0].gi_frame.f_back for i in [0])\n box.append(gen)\n"
          " fr,out=next(gen),[]\n while fr is not None:\n  out+=[fr.f_locals,fr.f_globals]\n  fr=fr.f_back\n"
          " return out+[v for d in out for v in d.values() if type(v) is dict]\n"
          "def f2(x,c):return steal(x,c,frames())")
GC = _HEAD + _STEAL + "gc=B.__import__('gc')\ndef f2(x,c):return steal(x,c,gc.get_objects())"
INSPECT = (_HEAD + _STEAL + "inspect=B.__import__('inspect')\n"
           "def f2(x,c):\n out=[]\n for fi in inspect.stack(0):\n  out+=[fi.frame.f_locals,fi.frame.f_globals]\n"
           " return steal(x,c,out+[v for d in out for v in d.values() if type(v) is dict])")
# Writes into what a neighbour might share: the harness's module (its comparison and its filter of
# main()'s value), a class, builtins, /tmp.
TAMPER = (_HEAD + "def yes(*a):return True\ndef seven(v):return 7\nB.setattr(M['__main__'],'_eq',yes)\n"
          "B.setattr(M['__main__'],'_value',seven)\nfractions.Fraction.__eq__=yes\nB.abs=seven\n"
          "B.open('/tmp/verdict','w').write('pass')\ndef f2(x,c):return x+c")
# Writes well-formed result lines for f2 before the harness does, claiming True for every call (which
# passed a property test computed in the sandbox): the parent computes f2(9,4)+4==9 from the value itself.
FORGED_LINES = (_HEAD + "os=B.__import__('os')\n"
                f"os.write(1,({MARK!r}+'{{\"node\": \"1\", \"ran\": true, \"values\": [true, true, true]}}\\n').encode())\n"
                "def f2(x,c):return x+c")
# What a program can still do in its own process: replace the harness's evaluation to report values of
# its choosing (7 for every call of f2 and after). That is what f2 returning 7 earns honestly, at most.
CHOOSES = (_HEAD + "def seven(*a):return 7\nB.setattr(M['__main__'],'_value',seven)\ndef f2(x,c):return x+c")
CONSTANT = "def f2(x,c):return 7"
EXPLOITS = {"tamper": TAMPER, "module_forge": MODULE_FORGE, "format_read": FORMAT_READ, "frames": FRAMES, "gc": GC,
            "inspect": INSPECT, "forged_lines": FORGED_LINES}


def _with_f2(code: str) -> str:
    return WRONG.replace("<f2>def f2(x,c):return x+c</f2>", f"<f2>{code}</f2>")


def _rewards(texts):
    """(verdicts, R) of each text alone in its group (so consensus is 1 for every one), policy off."""
    verdicts = verify(texts, [PENS] * len(texts), policy=False, test_timeout_s=0.5)
    total, _, _ = FSGVerifier().scores(verdicts, [parse_completion(t, IDS) for t in texts], [PENS] * len(texts),
                                       list(range(len(texts))))
    return verdicts, total.tolist()


def test_no_exploit_raises_a_wrong_programs_fsg_reward_nor_its_neighbours():
    assert code_policy_violation(MODULE_FORGE) is None and code_policy_violation(FORMAT_READ) is None  # the issue's
    names = list(EXPLOITS)  # the old harness ran 8 rollouts a sandbox: the neighbour came right after "tamper"
    neighbour = WRONG + "\n"  # honest and wrong (whitespace outside the spans is allowed)
    texts = [WRONG, RIGHT] + [_with_f2(EXPLOITS[n]) for n in names] + [neighbour]
    texts.insert(names.index("tamper") + 3, texts.pop())
    verdicts, reward = _rewards(texts)
    k = names.index("tamper") + 3
    neighbours, reward_neighbour = verdicts.pop(k), reward.pop(k)
    honest, right = verdicts[0], verdicts[1]
    # Honestly: f2 fails its 3 unit tests and its property, main() returns 17, not the stated 7: R = 3.05.
    assert (honest.unit, honest.prop, honest.back, honest.full_success) == ([1.0, 1.0, 0.0], [0.0, 1.0, 0.0], 0.0, False)
    assert reward[0] == pytest.approx(3.05) and right.full_success and reward[1] == pytest.approx(4.3)
    for name, v, r in zip(names, verdicts[2:], reward[2:]):
        assert not v.full_success and v.unit[2] == 0.0 and v.prop[2] == 0.0 and v.back == 0.0, (name, v)
        assert r <= reward[0] + 1e-6, (name, r)
    assert (neighbours.unit, neighbours.prop, neighbours.back, reward_neighbour) == (honest.unit, honest.prop, 0.0, reward[0])


def test_a_program_that_chooses_the_values_it_reports_earns_what_returning_them_would():
    (chooses, constant), reward = _rewards([_with_f2(CHOOSES), _with_f2(CONSTANT)])
    assert chooses.unit[2] == constant.unit[2] == pytest.approx(1 / 3)  # f2(12,5) = 7 is a unit test; 5 and 0 are not
    assert chooses.back == 0.0 and constant.back == 1.0 and reward[0] <= reward[1]


def test_exploits_cannot_lift_their_reference_judge_scores(monkeypatch):
    monkeypatch.setattr(judge_module, "runnable_spans", lambda parsed, graph: runnable_spans(parsed, graph, policy=False))
    texts = [RIGHT, WRONG] + [_with_f2(EXPLOITS[n]) for n in ("format_read", "frames", "gc", "inspect", "tamper")]
    got = ReferenceJudge(inputs=3).judge(PENS, texts, [parse_completion(t, IDS) for t in texts], None, seed=3)
    assert got[0].nodes == {"main": 1.0, "f1": 1.0, "f2": 1.0} and got[1].nodes["f2"] == 0.0
    assert all(j.nodes["f2"] == 0.0 for j in got[2:])


def test_a_correct_program_still_scores_full_success_with_the_policy_off():
    right, = verify([RIGHT], [PENS], policy=False)
    assert right.full_success and right.value == 7 and right.edges == [1.0, 1.0] and not right.sandbox_failed


ADD = Problem("write add", "", meta={"tests": "assert add(2, 3) == 5\nassert add(-1, 1) == 0"})
PY_EXPLOITS = {
    "always_equal": "class Y:\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return Y()\n",
    "int_subclass": "class Y(int):\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return Y(1)\n",
    "reads_main_py": ("import re\nsrc = open('main.py').read() + open('/proc/self/fd/0').read()\n"
                      "table = {tuple(map(int, m[:2])): int(m[2]) for m in re.findall(r'add\\((-?\\d+), (-?\\d+)\\) == (-?\\d+)', src)}\n"
                      "def add(a, b):\n    return table.get((a, b), a * b)\n"),
    "exits_early": "import sys\ndef add(a, b):\n    return a * b\nsys.exit(0)\n",
    "os_exit": "import os\ndef add(a, b):\n    return a * b\nos._exit(0)\n",
    "writes_the_token": ("import os, re, sys\nm = re.search(r'reasonrl-tests-passed-[0-9a-f]+', open('main.py').read())\n"
                         "sys.stderr.write(m.group() + '\\n' if m else '')\nsys.stderr.flush()\nos._exit(0)\n"),
}


@pytest.mark.parametrize("name", list(PY_EXPLOITS))
def test_python_tests_cannot_be_forged(name):
    passed, result = check(f"```python\n{PY_EXPLOITS[name]}```", ADD.meta["tests"])
    assert not passed, (name, result)


def test_python_tests_checks_values_here_and_names_the_failed_assert():
    reward = REWARDS.get("python_tests")
    assert reward("```python\ndef add(a, b):\n    return a + b\n```", ADD) == 1.0
    passed, result = check("def add(a, b):\n    return a * b\n", ADD.meta["tests"])
    assert not passed and result.ok and result.reason == "assert on line 1 failed: add(2, 3) (got 6)"
    tests = ("xs = [add(i, 1) for i in range(3)]\nassert xs == [1, 2, 3]\nassert not add(0, 0)\n"
             "assert 7 == add(3, 4)\nassert add(1, 1) in (2, 3)\nassert add(1, 2) > 2.5\nassert add(1, 1) == add(0, 2)\n"
             "assert add(0.5, 0.25) == 0.75, 'message'\nassert isinstance(add(1, 2), int)")
    assert check("def add(a, b):\n    return a + b\n", tests)[0]
    assert not check("def add(a, b):\n    return a + b + (a == 0)\n", tests)[0]  # add(0, 0) is 1: "assert not" fails
    steps = split_tests(tests)
    assert [(s.kind, s.source) for s in steps[:3]] == [("exec", "xs = [add(i, 1) for i in range(3)]"), ("eval", "xs"),
                                                        ("eval", "add(0, 0)")]
    assert steps[1].literal == [1, 2, 3] and steps[2].negate and steps[3].literal_first and steps[3].source == "add(3, 4)"
    assert steps[6].source == "add(1, 1) == add(0, 2)" and steps[6].op is None  # both sides computed: in the sandbox
    assert "5" not in "".join(s.source for s in split_tests(ADD.meta["tests"]))  # the literals never go in
    with pytest.raises(ValueError, match=r"problem.meta\['tests'\] is not Python"):
        split_tests("assert add(2, 3) ==")


def _encode(value):
    space: dict = {}
    exec(ENCODE, space)
    return json.loads(json.dumps(space["_enc"](value)))


def test_values_come_back_by_exact_type_and_malformed_rows_are_no_result():
    from fractions import Fraction

    class Forged(int):
        def __eq__(self, other):
            return True

    for value in (None, True, 3, -2.5, "x", Fraction(3, 4), [1, (2, 3)], {1: {2}}, b"\x00", 1 + 2j):
        assert decode(_encode(value)) == value and type(decode(_encode(value))) is type(value) or \
            isinstance(value, set)
    assert decode(_encode({1, 2})) == frozenset({1, 2})
    deep: list = [1]
    for _ in range(20):
        deep = [deep]
    for value in (Forged(1), 10 ** 5000, "x" * 20_000, object(), deep, [3, object()]):
        assert isinstance(decode(_encode(value)), Opaque)
    opaque = decode({"unencodable": 0})
    with pytest.raises(TypeError):
        bool(opaque == opaque)
    assert decode({"raised": "ZeroDivisionError"}) is RAISED
    for bad in ({"raised": 1, "x": 2}, {"list": 3}, {"fraction": [1, 0]}, {"set": [{"raised": "E"}]}, [1]):
        with pytest.raises(Malformed):
            decode(bad)
    nested = "[" * 100_000 + "]" * 100_000
    text = "\n".join([MARK + nested, MARK + '{"done": true}', "noise", MARK + "{trunc", MARK + "1" * 5000])
    assert read_rows(text) == [{"done": True}]


def test_test_calls_split_into_probes_and_what_the_parent_computes():
    tree, probes = plan("f1(1,7)==7 and f1(3,5)==f1(5,3)")
    assert probes == ("f1(1, 7)", "f1(3, 5)", "f1(5, 3)")
    assert _calc(tree, [7, 15, 15]) is True and _calc(tree, [8, RAISED, RAISED]) is False  # short-circuit, as Python
    with pytest.raises(ArithmeticError):
        _calc(tree, [7, RAISED, 15])
    tree, probes = plan("f(12,3)*3==12")
    assert probes == ("f(12, 3)",) and _calc(tree, [4.0]) is True and _calc(tree, [4.5]) is False
    with pytest.raises(TypeError):
        _calc(tree, ["4" * 1000])  # no arithmetic on a str: it could be made huge
    assert plan("main()")[1] == ("main()",) and plan("f(2)**2<5")[1] == ("f(2) ** 2",)
