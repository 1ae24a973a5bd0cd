"""What a reward starts dies with its worker, a worker has a memory limit, and hanging
calls time out side by side (issue 29, item 6; DESIGN §8). Timings are asserted only as
"did not serialise" bounds, far above what the concurrent path takes."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from reasonrl.config import ConfigError, recipe_from_dict
from reasonrl.rewards.scorer import RewardSpec, Scorer, build_scorer
from helpers import registered
from test_reward_isolation import SLACK, alive, no_leftovers, rows  # noqa: F401 — a fixture

pytestmark = pytest.mark.usefixtures("no_leftovers")  # no test leaves a child process running

PIDS = "pids"  # reward parameter: the file a reward appends the pids it started to


def started_pids(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def wait_dead(pids: list[int]) -> list[int]:
    """The pids still alive after a generous grace period (a kill is asynchronous)."""
    deadline = time.monotonic() + SLACK
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.02)
    return [p for p in pids if alive(p)]


def detach(completion, problem, *, pids, **_):
    """Starts three processes that leave the worker's process group, then hangs on "h":
    a ``start_new_session`` child, a ``setsid`` child of a shell that exits at once (an
    orphan), and a double-forked grandchild in its own session (an orphan too)."""
    child = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    shell = subprocess.run(["sh", "-c", "setsid sleep 1000 >/dev/null 2>&1 & echo $!"],
                           capture_output=True, text=True, check=True)
    read, write = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.setsid()
        grandchild = os.fork()
        if grandchild == 0:
            os.execvp("sleep", ["sleep", "1000"])
        os.write(write, str(grandchild).encode())
        os._exit(0)
    os.close(write)
    grandchild = int(os.read(read, 64))
    os.close(read)
    os.waitpid(middle, 0)
    with open(pids, "a") as f:
        f.write(f"{child.pid} {shell.stdout.strip()} {grandchild}\n")
    if "h" in completion:
        time.sleep(3600)
    return 1.0


def test_detached_processes_die_with_a_timed_out_worker_and_at_close(tmp_path):
    log = tmp_path / "pids.txt"
    spec = RewardSpec("_detach", timeout_s=2.0, params={PIDS: str(log)})
    with registered(_detach=detach), Scorer([spec]) as scorer:
        with pytest.warns(UserWarning, match="timed out"):
            scores = scorer(*rows(["h"]))
        assert scores.failures == {"_detach": 1}
        on_timeout = started_pids(log)
        assert len(on_timeout) == 3 and all(p > 0 for p in on_timeout)
        assert wait_dead(on_timeout) == []  # the timed-out worker took them with it

        scores = scorer(*rows(["a", "b"]))  # these return, leaving their processes running
        assert scores.per_function["_detach"] == [1.0, 1.0] and scores.failures == {"_detach": 0}
        running = started_pids(log)[3:]
        assert len(running) == 6 and all(alive(p) for p in running)
    assert wait_dead(running) == []  # close() took them with the worker


def test_detached_processes_die_when_the_scorer_is_collected(tmp_path):
    log = tmp_path / "pids.txt"
    with registered(_detach=detach):
        scorer = Scorer([RewardSpec("_detach", params={PIDS: str(log)})])
        assert scorer(*rows(["a"])).failures == {"_detach": 0}
        running = started_pids(log)
        assert len(running) == 3 and all(alive(p) for p in running)
        del scorer  # the finalizer (also run at interpreter exit) kills the worker's whole tree
    assert wait_dead(running) == []


def allocate(completion, problem, *, mb, **_):
    block = bytearray(int(mb) << 20)  # touched: bytearray zero-fills
    return float(len(block) > 0)


def test_a_reward_past_its_memory_limit_scores_zero_and_is_counted():
    limit = 256
    specs = [RewardSpec("_big", params={"mb": 2 * limit}, worker_memory_mb=limit),
             RewardSpec("_small", params={"mb": limit // 4}, worker_memory_mb=limit)]
    with registered(_big=allocate, _small=allocate), Scorer(specs) as scorer:
        with pytest.warns(UserWarning, match=r"reward '_big' failed .*MemoryError"):
            scores = scorer(*rows(["a", "b", "c"]))
        assert scores.per_function == {"_big": [0.0, 0.0, 0.0], "_small": [1.0, 1.0, 1.0]}
        assert scores.failures == {"_big": 3, "_small": 0}
        assert scorer(*rows(["d"])).per_function["_small"] == [1.0]  # the run continues


def test_memory_limit_keys_default_and_are_checked():
    recipe = recipe_from_dict({"rewards": [{"name": "exact_answer"}, {"name": "format", "worker_memory_mb": 0},
                                           {"name": "soft_overlong", "worker_memory_mb": 512}]})
    assert recipe.rollout.reward_memory_mb == 4096
    with build_scorer(recipe) as scorer:
        assert scorer.memory_mb == [4096, 0, 512]  # 0: no limit
    with build_scorer(recipe_from_dict({"rollout": {"reward_memory_mb": 1024}})) as scorer:
        assert scorer.memory_mb == [1024]
    for raw, key in [({"rewards": [{"name": "exact_answer", "worker_memory_mb": -1}]}, r"rewards\[0\]\.worker_memory_mb"),
                     ({"rollout": {"reward_memory_mb": -1}}, r"rollout\.reward_memory_mb")]:
        with pytest.raises(ConfigError, match=key):
            recipe_from_dict(raw)
    with pytest.raises(ValueError, match="'worker_memory_mb' of reward 'exact_answer'"):
        Scorer([RewardSpec("exact_answer", worker_memory_mb=-5)])


def sleep_forever(completion, problem, **_):
    time.sleep(3600)


@pytest.mark.parametrize("workers", [0, 1])
def test_hanging_calls_time_out_side_by_side(workers):
    # One after another these 8 calls would take 8 s; side by side, the first timeout
    # (1 s) and then the other 7 over the extra workers at once (about 1 s more).
    with registered(_forever=sleep_forever), Scorer([RewardSpec("_forever", timeout_s=1.0, workers=workers)]) as scorer:
        start = time.monotonic()
        with pytest.warns(UserWarning, match="timed out"):
            scores = scorer(*rows(["a"] * 8))
        elapsed = time.monotonic() - start
        assert scores.per_function["_forever"] == [0.0] * 8 and scores.failures == {"_forever": 8}
        assert elapsed < 6.0, f"8 hanging calls took {elapsed:.1f} s: they timed out one after another"
        pids = scorer.worker_pids
        assert len(pids) <= max(workers, 1)  # the extra workers were temporary


def orphan(completion, problem, **_):
    """Leaves an orphan that exits at once: a zombie of the worker, its subreaper."""
    middle = os.fork()
    if middle == 0:
        if os.fork() == 0:
            time.sleep(0.05)  # outlive the middle process, so as to be re-parented
        os._exit(0)
    os.waitpid(middle, 0)
    return float(os.getpid())


def test_a_worker_holding_many_zombies_is_replaced(monkeypatch):
    from reasonrl.isolation import worker_procs

    monkeypatch.setattr(worker_procs, "_MAX_ZOMBIES", 3)
    with registered(_orphan=orphan), Scorer([RewardSpec("_orphan")]) as scorer:
        first = {int(v) for v in scorer(*rows(["a"] * 4)).per_function["_orphan"]}
        time.sleep(0.5)  # the orphans exit
        second = {int(v) for v in scorer(*rows(["a"])).per_function["_orphan"]}
        third = {int(v) for v in scorer(*rows(["a"])).per_function["_orphan"]}
    assert len(first) == 1 and first != second  # 4 zombies > 3: replaced before the next run
    assert second == third  # 1 zombie: kept
