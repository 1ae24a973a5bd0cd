"""Reward functions run in forked worker processes under a timeout: a reward that hangs,
crashes its process or is a lambda never stalls, kills or breaks scoring (DESIGN §8).
Wall time is never asserted except as a generous upper bound that a hang would blow."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from helpers import mini_recipe, registered
from reasonrl.config import ConfigError, recipe_from_dict
from reasonrl.rewards.scorer import RewardSpec, Scorer, build_scorer, group_reward
from reasonrl.problem import Problem

P = Problem(prompt="2+3*4;", answer="14")
SLACK = 10.0  # seconds; a hang would be an hour


def live_children() -> set[int]:
    return {child.pid for child in psutil.Process().children(recursive=True) if alive(child.pid)}


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent to reap it has stopped running)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def no_leftovers():
    """Fails the test if it leaves a (non-zombie) child process running."""
    before = live_children()
    yield
    assert live_children() - before == set()




def rows(texts):
    return texts, [P] * len(texts), [len(t) for t in texts], [False] * len(texts)


def hang_on_h(completion, problem, **_):
    if "h" in completion:
        time.sleep(3600)
    return float(len(completion))


@pytest.mark.parametrize("workers", [0, 2])
def test_hung_rows_time_out_score_zero_and_are_counted(workers, no_leftovers):
    texts = ["a", "hb", "cc", "ddd", "eh", "f", "gggg", "hh", "i"]  # rows 1, 4, 7 hang
    timeout = 0.3
    with registered(_hang=hang_on_h), Scorer([RewardSpec("_hang", timeout_s=timeout, workers=workers)]) as scorer:
        start = time.monotonic()
        with pytest.warns(UserWarning) as caught:
            scores = scorer(*rows(texts))
        elapsed = time.monotonic() - start
        assert elapsed < timeout * 3 / max(workers, 1) + SLACK
        assert scores.per_function["_hang"] == [0.0 if "h" in t else float(len(t)) for t in texts]
        assert scores.failures == {"_hang": 3}
        (warning,) = caught  # one warning per function, naming it, the failure and the timeout
        assert "reward '_hang' failed (timed out" in str(warning.message)
        assert "timeout_s=0.3" in str(warning.message)
        assert scorer.worker_pids  # the replacements are alive, ready for the next step
        pids = set(scorer.worker_pids)
        again = scorer(*rows(["x", "yy"]))  # workers are reused across calls
        assert again.per_function["_hang"] == [1.0, 2.0] and again.failures == {"_hang": 0}
        assert pids <= set(scorer.worker_pids)
        pids |= set(scorer.worker_pids)
    assert scorer.worker_pids == []
    assert not any(alive(p) for p in pids)


def slow_pid(completion, problem, **_):
    time.sleep(0.2)
    return float(os.getpid())


def test_workers_score_in_parallel_processes(no_leftovers):
    with registered(_slow=slow_pid), Scorer([RewardSpec("_slow", workers=2)]) as scorer:
        started = set(scorer.start().worker_pids)  # forked now, not on the first call
        assert len(started) == 2
        scores = scorer(*rows(["a"] * 8))
        used = {int(v) for v in scores.per_function["_slow"]}
        assert used == started and os.getpid() not in used


def test_lambdas_and_closures_work_in_workers(no_leftovers):
    offset = 0.5

    def closure(completion, problem, **_):
        return len(completion) + offset

    @group_reward
    def group_closure(completions, problem, **_):
        return [offset * len(completions)] * len(completions)

    lam = lambda completion, problem, *, num_tokens, **_: float(num_tokens == len(completion))  # noqa: E731
    with registered(_closure=closure, _lambda=lam, _group=group_closure):
        specs = [RewardSpec("_closure", workers=2), RewardSpec("_lambda"), RewardSpec("_group", 2.0, workers=1)]
        with Scorer(specs) as scorer:
            scores = scorer(*rows(["a", "bb", "ccc", "dddd"]), group_size=2)
    assert scores.per_function == {"_closure": [1.5, 2.5, 3.5, 4.5], "_lambda": [1.0] * 4, "_group": [1.0] * 4}
    assert scores.total == [4.5, 5.5, 6.5, 7.5]
    assert scores.failures == {"_closure": 0, "_lambda": 0, "_group": 0}


def die_on_x(completion, problem, **_):
    if "x" in completion:
        if "segv" in completion:
            os.kill(os.getpid(), signal.SIGSEGV)
        if "oom" in completion:
            raise MemoryError("out of memory")
        os._exit(1)
    return 1.0


@pytest.mark.parametrize("text, how", [("x", "exit code 1"), ("x segv", "killed by signal SIGSEGV"),
                                       ("x oom", "MemoryError: out of memory")])
def test_a_crashed_worker_fails_that_row_only(text, how, no_leftovers):
    with registered(_die=die_on_x), Scorer([RewardSpec("_die")]) as scorer:
        with pytest.warns(UserWarning, match="reward '_die' failed") as caught:
            scores = scorer(*rows(["a", "b", text, "c", "d"]))
    assert scores.per_function["_die"] == [1.0, 1.0, 0.0, 1.0, 1.0]
    assert scores.failures == {"_die": 1}
    assert how in str(caught[0].message)


@group_reward
def group_hang(completions, problem, **_):
    if any("h" in c for c in completions):
        time.sleep(3600)
    return [1.0] * len(completions)


def test_a_hung_group_reward_fails_its_group(no_leftovers):
    with registered(_ghang=group_hang), Scorer([RewardSpec("_ghang", timeout_s=0.3)]) as scorer:
        with pytest.warns(UserWarning, match="timed out.*that group"):
            scores = scorer(*rows(["a", "b", "h", "c", "d", "e"]), group_size=3)
    assert scores.per_function["_ghang"] == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    assert scores.failures == {"_ghang": 3}


def test_raise_nan_and_timeout_share_the_failure_count(no_leftovers):
    def mixed(completion, problem, **_):
        if completion == "raise":
            raise RuntimeError("verifier crashed")
        if completion == "nan":
            return float("nan")
        if completion == "hang":
            time.sleep(3600)
        return None if completion == "none" else 1.0

    with registered(_mixed=mixed), Scorer([RewardSpec("_mixed", timeout_s=0.3)]) as scorer:
        with pytest.warns(UserWarning) as caught:
            scores = scorer(*rows(["raise", "ok", "nan", "hang", "none", "ok"]))
    assert scores.per_function["_mixed"] == [0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    assert scores.failures == {"_mixed": 3}  # None is "no opinion", not a failure
    messages = [str(w.message) for w in caught]
    # one warning per kind of failure: the raise (NaN is the same kind) and the timeout
    assert len(messages) == 2 and "RuntimeError: verifier crashed" in messages[0] and "timed out" in messages[1]


def test_recipe_keys_and_build_scorer(no_leftovers):
    recipe = recipe_from_dict({"rollout": {"reward_timeout_s": 7.0},
                               "rewards": [{"name": "exact_answer", "timeout_s": 2.5, "workers": 3},
                                           {"name": "format", "timeout_s": None}]})
    assert (recipe.rewards[0].timeout_s, recipe.rewards[0].workers) == (2.5, 3)
    with build_scorer(recipe) as scorer:
        assert scorer.timeouts == [2.5, 7.0]
        assert [s.workers for s in scorer.specs] == [3, 0]
        scores = scorer(*rows(["####14", "3*4=12;2+12=14;####14"]))
    assert scores.per_function == {"exact_answer": [1.0, 1.0], "format": [0.0, 1.0]}
    for raw, key in [({"rewards": [{"name": "exact_answer", "timeout_s": 0}]}, "rewards[0].timeout_s"),
                     ({"rewards": [{"name": "exact_answer", "workers": -1}]}, "rewards[0].workers"),
                     ({"rollout": {"reward_timeout_s": 0}}, "rollout.reward_timeout_s")]:
        with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
            recipe_from_dict(raw)
    with pytest.raises(ValueError, match="timeout_s"):
        Scorer([RewardSpec("exact_answer", timeout_s=0)])
    with pytest.raises(ValueError, match="workers"):
        Scorer([RewardSpec("exact_answer", workers=-1)])


def test_math_verify_workers_start_their_own_verifier():
    from reasonrl.rewards import math as math_reward

    if math_reward.importlib.util.find_spec("math_verify") is None:  # not importorskip: the parent never imports it
        pytest.skip("pip install 'reasonrl[math]'")

    assert math_reward.math_verify_reward("\\boxed{1}", Problem("", "1")) == 1.0  # the parent's verifier is live
    parent_runner = math_reward._RUNNER.pid
    before = live_children()
    problems = [Problem("", g) for g in ("0.5", "2", "\\sqrt{8}", "3")]
    texts = ["\\boxed{\\frac{1}{2}}", "\\boxed{3}", "\\boxed{2\\sqrt{2}}", "#### 3"]
    with Scorer([RewardSpec("math_verify", workers=2)]) as scorer:
        scores = scorer(texts, problems, [5] * 4, [False] * 4)
    assert scores.per_function["math_verify"] == [1.0, 0.0, 1.0, 1.0] and scores.failures == {"math_verify": 0}
    assert math_reward._RUNNER.pid == parent_runner  # left alone, and still answers
    assert math_reward.math_verify_reward("\\boxed{3}", Problem("", "3.0")) == 1.0
    assert live_children() - before == set()  # the workers' own verifiers went with them


def test_a_killed_parent_leaves_no_workers(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent("""
        import os, time
        from reasonrl.registry import REWARDS
        from reasonrl.rewards.scorer import RewardSpec, Scorer
        from reasonrl.problem import Problem

        def hang(completion, problem, **_):  # defined in __main__: fine for a forked worker
            print("busy", os.getpid(), flush=True)
            time.sleep(3600)

        REWARDS._items["_hang"] = hang
        scorer = Scorer([RewardSpec("_hang", workers=2, timeout_s=600)])
        scorer(["a", "b"], [Problem("", "1")] * 2, [1, 1], [False, False])
    """))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        pids = [int(proc.stdout.readline().split()[1]) for _ in range(2)]  # both workers are mid-call
        assert len(set(pids)) == 2 and proc.pid not in pids and all(alive(p) for p in pids)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + SLACK
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    assert not any(alive(p) for p in pids)


ROWS_PER_STEP = 16  # mini_recipe: 4 prompts × 4 generations


def hang_on_some_calls(completion, problem, *, log: str, **_):
    """Hangs on calls 3 and 10 of every step (by call count, kept in a file: worker state is lost
    when a hung worker is replaced); writes H for a hung call, . for the others. Under a lock:
    after a timeout the step's other calls run side by side."""
    with open(log, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        hang = len(f.read().splitlines()) % ROWS_PER_STEP in (3, 10)
        f.write("H\n" if hang else ".\n")
    if hang:
        time.sleep(3600)
    return 1.0


def test_a_hanging_reward_does_not_stall_a_training_run(tmp_path, no_leftovers):
    from reasonrl.train.trainer import Trainer

    before = live_children()
    log = tmp_path / "calls.txt"
    with registered(_hang_e2e=hang_on_some_calls):
        recipe = mini_recipe(rewards=[{"name": "_hang_e2e", "timeout_s": 0.5, "log": str(log)}],
                             train={"steps": 2, "checkpoint_every": 2}, eval={"size": 4})
        trainer = Trainer(recipe, tmp_path / "run", log=lambda m: None)
        with pytest.warns(UserWarning) as caught:
            trainer.run()
    assert len([w for w in caught if "reward '_hang_e2e' failed (timed out" in str(w.message)]) == 1  # once per run
    # The run itself stops its reward workers (not only the garbage collector, later).
    assert live_children() - before == set()
    calls = log.read_text().split()
    assert len(calls) == 2 * ROWS_PER_STEP
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "reward/_hang_e2e" in m]
    assert len(steps) == 2
    for s, m in enumerate(steps):
        hung = calls[s * ROWS_PER_STEP:(s + 1) * ROWS_PER_STEP].count("H")
        assert hung == 2
        assert m.get("reward_failures/_hang_e2e", 0) == hung
        assert m["reward/_hang_e2e"] == pytest.approx((ROWS_PER_STEP - hung) / ROWS_PER_STEP)
