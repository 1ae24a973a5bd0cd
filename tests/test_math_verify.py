"""The math_verify reward and the process-based timeout runner behind it.

The timeout tests use answers that make sympy run for minutes (see PATHOLOGICAL);
they must come back within timeout + slack from the main thread, from another
thread and from a daemonic multiprocessing.Pool worker, where math-verify's own
signal.alarm timeout cannot work (Math-Verify#50, verl PR #5635).
"""

from __future__ import annotations

import multiprocessing
import operator
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from reasonrl.registry import REWARDS
from reasonrl.rewards import math as math_reward
from reasonrl.rewards.math import (VerifierTimeout, answers_equivalent, extract_prediction,
                                   math_verify_reward)
from reasonrl.rewards.scorer import RewardSpec, Scorer
from reasonrl.isolation import timeout as timeout_module
from reasonrl.isolation.timeout import CallResult, Status, TimeoutRunner, run_with_timeout
from reasonrl.problem import Problem

HAS_MATH_VERIFY = math_reward.importlib.util.find_spec("math_verify") is not None
# The dev extra installs math-verify: in CI these run; the skip is for partial installs only.
needs_math_verify = pytest.mark.skipif(not HAS_MATH_VERIFY, reason="pip install 'reasonrl[math]'")
# Long-running checks: deselect with -m "not slow" for a quick local run; CI runs them.
slow_only = [pytest.mark.slow]

# sympy evaluates 9^(9^9) = 9^387420489 numerically when comparing: minutes of C
# big-integer arithmetic (measured: still running after 15 s), with little memory
# growth in the first seconds.
PATHOLOGICAL = "The answer is \\boxed{9^{9^{9}}}"
PATHOLOGICAL_GOLD = "1"
TIMEOUT = 1.0
SLACK = 3.0


def _reward(completion: str, gold: str, **kw) -> float:
    return math_verify_reward(completion, Problem(prompt="", answer=gold), **kw)


# -- extraction ----------------------------------------------------------------------


@pytest.mark.parametrize("text,expected", [
    # boxed: last one wins, nested and escaped braces balance, spaces trimmed
    ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{\\frac{\\sqrt{3}}{2}} done", "\\frac{\\sqrt{3}}{2}"),
    ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
    ("\\boxed { 7 }", "7"),
    ("#### 5 but finally \\boxed{6}", "6"),  # boxed outranks ####
    ("\\boxed{72} and then truncated \\boxed{7", "72"),  # unclosed box ignored
    ("\\boxed{}", None),  # empty box: no answer, no fall-through to numbers
    ("12 apples \\boxed{ }", None),
    # ####: first number after the last marker, separators dropped
    ("3 + 4 = 7 #### 7", "7"),
    ("#### 1 #### 1,234", "1234"),
    ("#### $1,234,567.50 total", "1234567.50"),
    ("#### -15", "-15"),
    ("2 apples #### none", None),
    # last number
    ("x = 72.", "72"),
    ("First 72 apples, then 5 more, so 77", "77"),
    ("It drops to -7 degrees.", "-7"),
    ("It drops to \u22127 degrees.", "-7"),
    ("10-3", "3"),  # binary minus is not a sign
    ("the total is 1,234.", "1234"),
    ("the list 1,2,3", "3"),
    ("about 0.25 of it", "0.25"),
    ("half, i.e. 1/2.", "1/2"),
    ("no digits here", None),
    ("", None),
])
def test_extract_prediction(text, expected):
    assert extract_prediction(text) == expected


# -- the reward, end to end ----------------------------------------------------------

EQUIVALENT = [
    ("The answer is \\boxed{\\frac{1}{2}}", "0.5"),
    ("\\boxed{1/2}", "\\frac12"),
    ("#### 1,234", "1234"),
    ("x = 72.", "72"),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"),
    ("\\boxed{50\\%}", "0.5"),
    ("So the rate is \\boxed{50\\%}", "50"),
    ("The rate is 50%.", "50\\%"),
    ("The temperature drops to -7 degrees.", "-7"),
    ("#### -15", "-15"),
    ("\\boxed{-\\frac{3}{4}}", "-0.75"),
    ("\\boxed{3}", "3.0"),
    ("First 12, then 30. Final: \\boxed{42}", "42"),
    ("the total is $1,000,000.", "1000000"),
    ("\\boxed{\\dfrac{3}{4}}", "0.75"),
    ("\\boxed{x = 5}", "5"),
    ("\\boxed{10^{3}}", "1000"),
    ("The answer is 0.25", "\\frac{1}{4}"),
    ("The answer is 1/2.", "0.5"),
    ("\\boxed{\\{1, 2\\}}", "\\{1,2\\}"),
    ("we get \\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}"),
    ("\\boxed{1,234}", "1234"),
]
NOT_EQUIVALENT = [
    ("\\boxed{71}", "72"),
    ("#### 73", "72"),
    ("\\boxed{-72}", "72"),
    ("I don't know.", "72"),
    ("", "72"),
    ("\\boxed{}", "72"),
    ("72 apples in total, so \\boxed{}", "72"),
    ("First 72 apples, then 5 more, so 77", "72"),
    ("The answer is 10-3", "-3"),
    ("\\boxed{\\sqrt{2}}", "1.41"),
    ("\\boxed{0.5}", "\\frac{1}{3}"),
]


@needs_math_verify
@pytest.mark.parametrize("completion,gold,expected",
                         [(c, g, 1.0) for c, g in EQUIVALENT] + [(c, g, 0.0) for c, g in NOT_EQUIVALENT])
def test_reward_table(completion, gold, expected):
    assert _reward(completion, gold) == expected


def test_registered_and_lazy():
    assert REWARDS.get("math_verify") is math_verify_reward
    # math-verify (and its parse caches) live only in the worker process; this one
    # never imports it, so importing reasonrl.rewards works without the package.
    assert "math_verify" not in sys.modules


def test_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # makes find_spec/import fail
    monkeypatch.setattr(math_reward, "_checked_install", False)
    with pytest.raises(ImportError, match=r"pip install 'reasonrl\[math\]'"):
        _reward("\\boxed{1}", "1")


@needs_math_verify
def test_answers_equivalent_is_reusable():
    assert answers_equivalent("\\frac{1}{2}", "0.5", timeout=5)
    assert not answers_equivalent("3", "4", timeout=5)
    assert not answers_equivalent("", "4", timeout=5)
    assert not answers_equivalent("\\frac{", "4", timeout=5)  # unparseable, not an error


# -- timeouts ------------------------------------------------------------------------


def _timed_pathological() -> tuple[str, float]:
    start = time.monotonic()
    try:
        value = _reward(PATHOLOGICAL, PATHOLOGICAL_GOLD, timeout=TIMEOUT)
        outcome = f"returned {value}"
    except VerifierTimeout:
        outcome = "VerifierTimeout"
    return outcome, time.monotonic() - start


@needs_math_verify
def test_timeout_main_thread_then_recovers():
    assert threading.current_thread() is threading.main_thread()
    _reward("\\boxed{1}", "1")  # worker warm, so the timing below is the call's own
    old_pid = math_reward._RUNNER.pid
    outcome, elapsed = _timed_pathological()
    assert outcome == "VerifierTimeout"
    assert TIMEOUT <= elapsed < TIMEOUT + SLACK
    if os.path.isdir("/proc"):
        assert not os.path.exists(f"/proc/{old_pid}"), "the killed worker was not reaped"
    # the next call restarts the worker and is right
    assert _reward("\\boxed{\\frac{1}{2}}", "0.5") == 1.0
    assert math_reward._RUNNER.pid not in (None, old_pid)


@needs_math_verify
def test_timeout_from_a_thread():
    results = []
    worker = threading.Thread(target=lambda: results.append(_timed_pathological()))
    worker.start()
    worker.join(TIMEOUT + SLACK + 30)  # + worker start-up
    assert results, "the thread did not finish"
    outcome, elapsed = results[0]
    assert outcome == "VerifierTimeout"
    assert elapsed < TIMEOUT + SLACK + 2  # may include one worker restart (~0.5 s)
    assert _reward("#### 1,234", "1234") == 1.0


def _pool_job(_: int) -> tuple[bool, str, float, float]:
    # Module-level so the pool can pickle it. Warm up first so the measured time is
    # the timeout, not this fresh process's worker start.
    assert _reward("\\boxed{2}", "2") == 1.0
    outcome, elapsed = _timed_pathological()
    after = _reward("\\boxed{2\\sqrt{2}}", "\\sqrt{8}")
    return multiprocessing.current_process().daemon, outcome, elapsed, after


@needs_math_verify
@pytest.mark.parametrize("start_method", ["fork", pytest.param("spawn", marks=slow_only)])
def test_timeout_inside_pool_worker(start_method):
    if start_method not in multiprocessing.get_all_start_methods():
        pytest.skip(f"no {start_method} here")
    _reward("\\boxed{1}", "1")  # a live worker in the parent: a forked child must not use it
    parent_pid = math_reward._RUNNER.pid
    with multiprocessing.get_context(start_method).Pool(1) as pool:
        daemon, outcome, elapsed, after = pool.map(_pool_job, [0])[0]
    assert daemon, "pool workers are daemonic: multiprocessing.Process children are forbidden there"
    assert outcome == "VerifierTimeout"
    assert elapsed < TIMEOUT + SLACK
    assert after == 1.0
    # the parent's worker was left alone and still answers
    assert math_reward._RUNNER.pid == parent_pid
    assert _reward("\\boxed{3}", "3.0") == 1.0


@needs_math_verify
def test_scorer_counts_timeout_as_failure_and_warns_once():
    scorer = Scorer([RewardSpec("math_verify", params={"timeout": TIMEOUT})])
    completions = [PATHOLOGICAL, "\\boxed{\\frac{1}{2}}", PATHOLOGICAL, "#### 7"]
    problems = [Problem("", g) for g in (PATHOLOGICAL_GOLD, "0.5", PATHOLOGICAL_GOLD, "8")]
    with pytest.warns(UserWarning, match="VerifierTimeout") as record:
        scores = scorer(completions, problems, [10] * 4, [False] * 4)
    assert len([w for w in record if "math_verify" in str(w.message)]) == 1
    assert scores.per_function["math_verify"] == [0.0, 1.0, 0.0, 0.0]
    assert scores.failures["math_verify"] == 2


@pytest.mark.parametrize("_", [pytest.param(0, marks=slow_only)])
@needs_math_verify
def test_pathological_input_really_hangs(_):
    # Without a 1 s limit it would run far longer than any reasonable timeout.
    with TimeoutRunner(preload=("math_verify",)) as runner:
        result = runner.call(math_reward._verify_in_worker, ("9^{9^{9}}", "1"), timeout=12)
    assert result.status is Status.TIMEOUT


# -- concurrency ---------------------------------------------------------------------


@needs_math_verify
def test_eight_threads_get_correct_answers():
    cases = [(c, g, 1.0) for c, g in EQUIVALENT[:8]] + [(c, g, 0.0) for c, g in NOT_EQUIVALENT[:4]]
    errors: list[str] = []
    barrier = threading.Barrier(8)

    def hammer(offset: int) -> None:
        barrier.wait()
        for i in range(3 * len(cases)):
            completion, gold, expected = cases[(i + offset) % len(cases)]
            got = _reward(completion, gold)
            if got != expected:
                errors.append(f"{completion!r} vs {gold!r}: {got}")

    threads = [threading.Thread(target=hammer, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []


@needs_math_verify
def test_threads_queue_behind_a_timeout():
    # One thread hits the pathological answer; the others wait for the lock and then
    # get correct answers from the restarted worker.
    outcomes: list = []

    def bad() -> None:
        outcomes.append(_timed_pathological()[0])

    def good() -> None:
        outcomes.append(_reward("\\boxed{1/2}", "0.5"))

    threads = [threading.Thread(target=bad)] + [threading.Thread(target=good) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(map(str, outcomes)) == ["1.0", "1.0", "1.0", "VerifierTimeout"]


# -- the runner on its own (stdlib functions: no math-verify needed) -----------------


@pytest.fixture
def runner():
    with TimeoutRunner() as r:
        yield r


def test_runner_ok_error_and_timeout(runner):
    ok = runner.call(operator.add, (2, 3), timeout=5)
    assert ok == CallResult(Status.OK, 5, elapsed=ok.elapsed) and ok.ok

    err = runner.call(int, ("x",), timeout=5)
    assert err.status is Status.ERROR and err.error.startswith("ValueError") and "int()" in err.traceback

    first_pid = runner.pid
    start = time.monotonic()
    slow = runner.call(time.sleep, (30,), timeout=0.5)
    assert slow.status is Status.TIMEOUT and "0.5" in slow.error
    assert time.monotonic() - start < 0.5 + SLACK
    assert runner.pid is None  # killed, restarted lazily
    assert runner.call(os.getpid, timeout=5).value not in (None, first_pid)
    assert runner.starts == 2


def test_runner_reports_crashes_and_bad_calls(runner):
    died = runner.call(os._exit, (3,), timeout=5)
    assert died.status is Status.ERROR and "exit code 3" in died.error
    assert runner.call(operator.mul, (6, 7), timeout=5).value == 42

    assert runner.call(lambda: 1, timeout=5).status is Status.ERROR  # not picklable
    unpicklable_result = runner.call(threading.Lock, timeout=5)
    assert unpicklable_result.status is Status.ERROR and "pickle" in unpicklable_result.error
    assert runner.call(operator.neg, (1,), timeout=5).value == -1


def test_runner_stdout_of_the_job_does_not_corrupt_the_protocol(runner):
    assert runner.call(print, ("noise on stdout",), timeout=5).status is Status.OK
    assert runner.call(os.write, (1, b"raw noise on fd 1\n"), timeout=5).status is Status.OK
    assert runner.call(operator.add, ("a", "b"), timeout=5).value == "ab"


def test_runner_overhead_is_small(runner):
    runner.call(operator.add, (0, 0), timeout=5)  # start-up excluded
    n = 300
    start = time.perf_counter()
    for i in range(n):
        assert runner.call(operator.add, (i, 1), timeout=5).value == i + 1
    per_call = (time.perf_counter() - start) / n
    assert per_call < 0.005, f"{per_call * 1e3:.2f} ms per call"


def test_runner_works_from_threads_and_shared_default(runner):
    values: list = []
    threads = [threading.Thread(target=lambda k=k: values.append(runner.call(abs, (-k,), timeout=5).value))
               for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(values) == list(range(8))
    assert run_with_timeout(divmod, 7, 2, timeout=5).value == (3, 1)


def test_worker_does_not_outlive_its_parent(tmp_path):
    # Normal exit (atexit) and abrupt exit (no atexit, worker busy) both leave no worker.
    if not os.path.isdir("/proc"):
        pytest.skip("needs /proc")
    # Loaded by path: importing reasonrl.rewards would pull in torch (seconds).
    script = textwrap.dedent("""
        import importlib.util, os, sys, threading, time
        spec = importlib.util.spec_from_file_location("timeout_under_test", sys.argv[2])
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        r = mod.TimeoutRunner()
        print(r.call(os.getpid, timeout=10).value, flush=True)
        if sys.argv[1] == "abrupt":
            threading.Thread(target=r.call, args=(time.sleep, (60,)), kwargs={"timeout": None},
                             daemon=True).start()
            time.sleep(0.3)
            os._exit(0)
    """)
    for mode in ("normal", "abrupt"):
        out = subprocess.run([sys.executable, "-c", script, mode, timeout_module.__file__],
                             capture_output=True, text=True,
                             timeout=60, check=True).stdout
        pid = int(out.split()[0])
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)
        assert not _alive(pid), f"worker {pid} still running after a {mode} exit"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie re-parented to init is init's to reap, not running
