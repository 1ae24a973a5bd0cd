"""Ray rollout workers (``rollout.engine: ray``): a local Ray cluster per test, shut down after."""

import os
import subprocess

import pytest
import ray

from reasonrl import train
from reasonrl.metrics_log import read_metrics
from reasonrl.train.trainer import Trainer

from fsdp_helpers import close_metrics, max_relative_diff, one_process, raw_recipe, recipe_file

from helpers import (QUIET, assert_each_step_trained_its_own_prompts, comparable_across_sources, learning_recipe,
                     per_step, same_weights, train_killing_a_sampler)


def raylets() -> int:
    """Raylets of the clusters this process started: a Ray session is named after the pid of the
    process that started it (``session_<date>_<time>_<us>_<pid>``), so another test's cluster on
    the other pytest worker (tests/test_vllm_train.py starts one) is not counted."""
    out = subprocess.run(["pgrep", "-c", "-f", f"raylet.*session_[^/ ]*_{os.getpid()}([/ ]|$)"],
                         capture_output=True, text=True)
    return int(out.stdout.strip() or 0)


@pytest.fixture
def user_ray():
    """A Ray session the user started (``ray.init(address=...)`` on a real cluster): reasonrl
    must use it and leave it running."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_two_ray_workers_train_every_step_once_within_the_bound_and_shut_ray_down(tmp_path):
    assert not ray.is_initialized()
    recipe = learning_recipe(train={"steps": 6, "threads": 1},
                             rollout={"source": "async", "engine": "ray", "workers": 2, "max_staleness": 2,
                                      "sampler_threads": 1})
    Trainer(recipe, tmp_path / "run", **QUIET).run()
    rows = read_metrics(tmp_path / "run")
    stale = per_step(rows, "offpolicy/staleness_max")
    assert sorted(stale) == [1, 2, 3, 4, 5, 6] and max(stale.values()) <= 2
    assert set(per_step(rows, "async/sampler_restarts").values()) == {0}
    assert not ray.is_initialized() and raylets() == 0  # the cluster it started is gone


def test_ray_and_local_samplers_give_the_same_run_in_simulated_staleness_mode(tmp_path, user_ray):
    def recipe(engine):
        return learning_recipe(train={"steps": 4, "threads": 1}, off_policy={"name": "tis"},
                               rollout={"source": "async", "engine": engine, "simulated_staleness": 1,
                                        "sampler_threads": 1})

    Trainer(recipe("local"), tmp_path / "local", **QUIET).run()
    Trainer(recipe("ray"), tmp_path / "ray", **QUIET).run()
    a, b = read_metrics(tmp_path / "local"), read_metrics(tmp_path / "ray")
    assert comparable_across_sources(a, drop=("perf/",)) == comparable_across_sources(b, drop=("perf/",))
    assert same_weights(tmp_path / "local", tmp_path / "ray")
    assert ray.is_initialized()  # the user's session is left as it was


def test_a_killed_ray_worker_is_reported_and_replaced(tmp_path, user_ray, monkeypatch):
    recipe = learning_recipe(train={"steps": 5, "threads": 1},
                             rollout={"source": "async", "engine": "ray", "workers": 2, "max_staleness": 1,
                                      "sampler_threads": 1})
    rows, logs, prompts = train_killing_a_sampler(recipe, tmp_path / "run", monkeypatch, worker=1)
    assert per_step(rows, "async/sampler_restarts")[5] >= 1
    assert any("sampler actor died" in m for m in logs)
    assert_each_step_trained_its_own_prompts(recipe, prompts)


def test_a_ray_worker_at_staleness_1_resumes_exactly(tmp_path, user_ray, monkeypatch):
    """Issue 29 item 9 with Ray: the checkpoint holds the batch the worker sampled ahead with
    pre-checkpoint weights; the resumed run trains it, the worker starts after it with the
    checkpoint's weights, and weights and metrics are the straight run's. (With two or more
    workers a worker waits for weights while the learner trains another's batch, so which
    weights it meets is timing, uninterrupted or not.)"""
    from helpers import crash_at_step

    recipe = learning_recipe(train={"steps": 4, "threads": 1, "checkpoint_every": 1}, off_policy={"name": "tis"},
                             rollout={"source": "async", "engine": "ray", "max_staleness": 1, "partial": False,
                                      "sampler_threads": 1})
    Trainer(recipe, tmp_path / "straight", **QUIET).run()
    with crash_at_step(monkeypatch, 2):
        Trainer(recipe, tmp_path / "resumed", **QUIET).run()
    Trainer(recipe, tmp_path / "resumed", resume=True, **QUIET).run()
    a, b = read_metrics(tmp_path / "straight"), read_metrics(tmp_path / "resumed")
    assert comparable_across_sources(a, drop=("perf/",)) == comparable_across_sources(b, drop=("perf/",))
    assert same_weights(tmp_path / "straight", tmp_path / "resumed")
    assert per_step(a, "offpolicy/staleness_max") == {1: 0.0, 2: 1.0, 3: 1.0, 4: 1.0}


def test_ray_places_two_learner_ranks_and_a_rollout_worker_and_stops_its_cluster(tmp_path):
    """``train.engine: ray`` from Python: 2 FSDP2 learner actors and 1 Ray rollout worker in one
    placement group (async at staleness 0, synchronous training in another process) train as one
    process does; the local cluster it started is gone after."""
    assert not ray.is_initialized()
    one_process(recipe_file(tmp_path), tmp_path / "one")
    raw = raw_recipe(rollout={"source": "async", "engine": "ray", "workers": 1}, train={"nproc": 2, "engine": "ray"})
    assert train(raw, tmp_path / "ray")["steps"] == 3
    close_metrics(tmp_path / "one", tmp_path / "ray")
    assert max_relative_diff(tmp_path / "one", tmp_path / "ray") < 1e-5
    shards = sorted(p.name for p in (tmp_path / "ray" / "checkpoints" / "step_000003" / "learner").glob("*.distcp"))
    assert shards == ["__0_0.distcp", "__1_0.distcp"]
    assert not ray.is_initialized() and raylets() == 0
