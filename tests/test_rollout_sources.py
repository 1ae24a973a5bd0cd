"""Rollout sources: sync, simulated staleness and async, with their guarantees."""

import json
import os
import queue
import signal
import subprocess
import sys
import time

import pytest
import torch

from reasonrl.config import ConfigError
from reasonrl.metrics_log import read_metrics
from reasonrl.train.trainer import Trainer

from helpers import (QUIET, FakeInbox, TablePolicy, assert_each_step_trained_its_own_prompts, cfg,
                     comparable_across_sources, learning_recipe, loss_and_grad, mini_recipe, per_step, same_weights,
                     table_batch, train_killing_a_sampler)


# -- async ---------------------------------------------------------------------------------

def test_async_at_staleness_0_is_the_sync_run(tmp_path):
    """The peers' bug (verl #6780): async mode with staleness 0 must train exactly as sync."""
    common = dict(train={"steps": 4, "threads": 1}, rollout={"sampler_threads": 1})
    sync = Trainer(learning_recipe(**common), tmp_path / "sync", **QUIET)
    sync.run()
    asynchronous = Trainer(learning_recipe(**{**common, "rollout": {"sampler_threads": 1, "source": "async",
                                                                   "max_staleness": 0}}), tmp_path / "async", **QUIET)
    asynchronous.run()
    # the sampler scores in its own process: the learner forks no reward workers it would never use
    assert sync.scorer is not None and asynchronous.scorer is None
    sync_rows, async_rows = read_metrics(tmp_path / "sync"), read_metrics(tmp_path / "async")
    assert comparable_across_sources(sync_rows) == comparable_across_sources(async_rows)
    assert same_weights(tmp_path / "sync", tmp_path / "async")
    assert set(per_step(async_rows, "offpolicy/staleness_max").values()) == {0.0}
    assert any(r.get("reward/mean", 0) > 0 for r in sync_rows)  # the runs did something


def test_async_never_trains_a_batch_over_the_staleness_bound(tmp_path):
    recipe = learning_recipe(train={"steps": 8, "threads": 1},
                         rollout={"source": "async", "max_staleness": 2, "sampler_threads": 1})
    Trainer(recipe, tmp_path / "run", **QUIET).run()
    rows = read_metrics(tmp_path / "run")
    stale = per_step(rows, "offpolicy/staleness_max")
    assert sorted(stale) == list(range(1, 9))  # every step trained, once
    assert max(stale.values()) <= 2
    assert max(stale.values()) >= 1  # the sampler did run ahead: the bound was exercised
    assert set(per_step(rows, "async/dropped_batches").values()) == {0}


def test_a_killed_sampler_is_reported_and_replaced_without_losing_or_repeating_a_batch(tmp_path, monkeypatch):
    recipe = learning_recipe(train={"steps": 5, "threads": 1},
                             rollout={"source": "async", "max_staleness": 1, "sampler_threads": 1})
    rows, logs, prompts = train_killing_a_sampler(recipe, tmp_path / "run", monkeypatch)
    assert per_step(rows, "async/sampler_restarts")[5] >= 1
    assert any("sampler process died" in m for m in logs)
    assert_each_step_trained_its_own_prompts(recipe, prompts)
    assert sorted(per_step(rows, "reward/mean")) == [1, 2, 3, 4, 5]


def test_partial_rollouts_record_each_tokens_version(tmp_path):
    from reasonrl.rollout.async_source import SamplerWorker

    recipe = mini_recipe(train={"steps": 1}, rollout={"source": "async", "max_staleness": 1})
    gen = torch.Generator().manual_seed(0)
    worker = SamplerWorker(recipe, {"step": 0, "generator": gen.get_state(), "sampler": {}})
    worker._handle(("weights", 6, 0, worker.policy.weights()))
    out = queue.Queue()
    policy = worker.policy
    worker.loop(FakeInbox(lambda: {k: v + 0.05 * torch.randn_like(v) for k, v in policy.weights().items()}, at_call=5),
                out)
    _, step, batch, _, _, _, after = out.get_nowait()
    mask = batch.completion_mask.bool()
    versions = batch.token_versions[mask]
    assert step == 0 and after["step"] == 1
    assert set(versions.tolist()) == {6, 7}  # the generation continued under the new weights
    assert batch.policy_version == 6
    assert (batch.token_versions[:, :3][mask[:, :3]] == 6).all()  # the first tokens came before the update


class _ArrivedInbox:
    """Weight messages already waiting at the sampler's first read (then ``("stop",)``)."""

    def __init__(self, messages):
        self.messages = list(messages)

    def get_nowait(self):
        if not self.messages:
            raise queue.Empty
        return self.messages.pop(0)

    def get(self, timeout=None):
        return self.messages.pop(0) if self.messages else ("stop",)


@pytest.mark.parametrize("max_staleness, versions", [(1, [0, 0, 1]), (0, [0, 1])])
def test_one_sampler_never_samples_a_batch_with_weights_newer_than_the_step_before_it(tmp_path, max_staleness,
                                                                                       versions):
    """At one step of staleness, weights published at step 1 reach the sampler's inbox before it
    starts batch 1 only when it stalled after sending batch 0 for as long as the learner's step 0
    took (a loaded CI machine). Batch 1 still starts with step 0's weights (what it meets without
    the stall, so a straight and a resumed run stay equal); the newer ones are held for batch 2.
    At staleness 0 batch 1 needs exactly those weights, and takes them."""
    from reasonrl.rollout.async_source import SamplerWorker

    recipe = mini_recipe(train={"steps": len(versions)},
                         rollout={"source": "async", "max_staleness": max_staleness, "partial": False})
    gen = torch.Generator().manual_seed(0)
    worker = SamplerWorker(recipe, {"step": 0, "generator": gen.get_state(), "sampler": {}})
    start = {k: v.clone() for k, v in worker.policy.weights().items()}
    worker._handle(("weights", 0, 0, start))
    newer = {k: v + 0.05 for k, v in start.items()}
    out = queue.Queue()
    worker.loop(_ArrivedInbox([("weights", 1, 1, newer)]), out)
    assert [out.get_nowait()[2].policy_version for _ in versions] == versions
    assert all(torch.equal(worker.policy.weights()[k], newer[k]) for k in newer)


# -- simulated staleness ------------------------------------------------------------------

def test_simulated_staleness_samples_with_the_weights_of_k_versions_ago(tmp_path):
    recipe = learning_recipe(train={"steps": 5}, rollout={"simulated_staleness": 2}, off_policy={"name": "none"})
    Trainer(recipe, tmp_path / "run", **QUIET).run()
    rows = read_metrics(tmp_path / "run")
    stale = per_step(rows, "offpolicy/staleness_max")
    assert stale == {1: 0.0, 2: 1.0, 3: 2.0, 4: 2.0, 5: 2.0}  # one optimiser step per step
    kl = per_step(rows, "offpolicy/kl_behaviour")
    assert kl[1] == pytest.approx(0.0, abs=1e-6) and kl[5] > 1e-6  # stale weights differ from the learner's


def _cli(*args, wait=True):
    command = [sys.executable, "-m", "reasonrl.cli", "train", *map(str, args)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if wait:
        return subprocess.run(command, capture_output=True, text=True, env=env)
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


def kill_9_and_resume(tmp_path, raw: dict, kill_after: int, at_kill=None):
    """Train ``raw`` straight through, then again killed by SIGKILL once the checkpoint of step
    ``kill_after`` exists (``at_kill(pid)`` runs just before the kill and returns a check to run
    just after it), then ``--resume``; return the metric rows of both runs."""
    recipe_file = tmp_path / "recipe.yaml"
    recipe_file.write_text(json.dumps(raw))
    straight = _cli(recipe_file, "-o", tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr
    proc = _cli(recipe_file, "-o", tmp_path / "killed", wait=False)
    target = tmp_path / "killed" / "checkpoints" / f"step_{kill_after:06d}"
    deadline = time.time() + 300
    while not target.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    after_kill = at_kill(proc.pid) if at_kill else None
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert target.exists() and not (tmp_path / "killed" / "summary.json").exists()  # killed mid-run
    if after_kill:
        after_kill()
    resumed = _cli("--resume", tmp_path / "killed")
    assert resumed.returncode == 0, resumed.stderr
    assert same_weights(tmp_path / "straight", tmp_path / "killed")
    return read_metrics(tmp_path / "straight"), read_metrics(tmp_path / "killed")


def test_simulated_staleness_kill_9_and_resume_is_the_straight_run(tmp_path):
    """A real ``kill -9`` at a random step after the first checkpoint, then ``--resume``."""
    import random

    from helpers import MINI_TINY

    raw = {"model": {"backend": "tiny", "tiny": dict(MINI_TINY)},
           "rollout": {"num_generations": 4, "max_new_tokens": 24, "simulated_staleness": 2},
           "off_policy": {"name": "tis", "cap": 2.0},
           "train": {"steps": 8, "prompts_per_step": 4, "checkpoint_every": 1, "micro_batch_size": 8, "threads": 1},
           "eval": {"size": 8}, "log": {"plots": False, "progress": False}}
    kill_after = random.Random().randint(2, 6)  # a checkpoint step after which to kill
    a, b = kill_9_and_resume(tmp_path, raw, kill_after)
    assert comparable_across_sources(a, drop=("perf/",)) == comparable_across_sources(b, drop=("perf/",)), f"killed after step {kill_after}"
    assert max(per_step(a, "offpolicy/staleness_max").values()) == 2.0


# -- corrections in the objective ------------------------------------------------------------

def test_a_correction_whose_ratio_is_one_leaves_the_loss_and_gradient_unchanged():
    from reasonrl.train.objective import totals

    policy, batch = TablePolicy(6, 5), table_batch()
    tot = totals(batch, cfg(), 5)
    plain, _, grad = loss_and_grad(policy, batch, cfg(), tot)
    batch.is_weights = batch.response_mask.float()  # what every correction gives at ratio 1
    weighted, _, grad_w = loss_and_grad(policy, batch, cfg(), tot)
    assert torch.equal(plain, weighted) and torch.equal(grad, grad_w)
    batch.is_weights = 0.5 * batch.response_mask.float()
    halved, _, grad_h = loss_and_grad(policy, batch, cfg(), tot)
    assert halved.item() == pytest.approx(0.5 * plain.item(), rel=1e-6)
    torch.testing.assert_close(grad_h, 0.5 * grad)


def test_behaviour_anchor_takes_the_ratio_against_the_sampling_log_probs(tmp_path):
    recipe = learning_recipe(train={"steps": 2}, rollout={"simulated_staleness": 1}, off_policy={"name": "behaviour_ppo"})
    Trainer(recipe, tmp_path / "run", **QUIET).run()
    rows = read_metrics(tmp_path / "run")
    ratio = per_step(rows, "ratio/mean")
    assert ratio[1] == pytest.approx(1.0, abs=1e-5)  # step 0: the sampler is the learner
    assert abs(ratio[2] - 1.0) > 1e-5  # step 1: π_θ / μ with μ one version old


# -- recipe checks ----------------------------------------------------------------------------

@pytest.mark.parametrize("rollout, message", [
    ({"max_staleness": 2}, "needs rollout.source: async"),
    ({"source": "async", "simulated_staleness": 1, "max_staleness": 1}, "leave rollout.max_staleness at 0"),
    ({"source": "async", "simulated_staleness": 1, "sync_every": 2}, "needs rollout.sync_every: 1"),
    ({"source": "async", "max_staleness": 0, "sync_every": 2}, "would starve the sampler"),
    ({"workers": 2}, "rollout.workers > 1"),
    ({"source": "asink"}, "Did you mean 'async'"),
])
def test_rollout_settings_a_source_cannot_honour_are_recipe_errors(rollout, message):
    with pytest.raises(ConfigError, match=message):
        mini_recipe(rollout=rollout)


def test_off_policy_parameters_are_checked_at_load():
    with pytest.raises(ConfigError, match="off_policy.cap must be >= 1"):
        mini_recipe(off_policy={"name": "tis", "cap": 0.5})
    with pytest.raises(ConfigError, match="off_policy"):
        mini_recipe(off_policy={"name": "tsi"})


def test_simulated_staleness_is_the_same_run_in_process_and_in_an_async_sampler(tmp_path):
    common = dict(train={"steps": 4, "threads": 1}, off_policy={"name": "tis", "cap": 2.0})
    Trainer(learning_recipe(rollout={"simulated_staleness": 2}, **common), tmp_path / "sync", **QUIET).run()
    Trainer(learning_recipe(rollout={"simulated_staleness": 2, "source": "async", "sampler_threads": 1}, **common),
            tmp_path / "async", **QUIET).run()
    a, b = read_metrics(tmp_path / "sync"), read_metrics(tmp_path / "async")
    assert comparable_across_sources(a, drop=("perf/", "async/")) == comparable_across_sources(b, drop=("perf/", "async/"))
    assert same_weights(tmp_path / "sync", tmp_path / "async")
    assert per_step(b, "offpolicy/staleness_max") == {1: 0.0, 2: 1.0, 3: 2.0, 4: 2.0}


def test_async_rejects_a_reward_defined_only_in_this_process():
    def brevity(completion, problem, **_):  # a local function: another process cannot import it
        return 1.0

    with pytest.raises(ConfigError, match="cannot be imported"):
        mini_recipe(rewards=[{"name": brevity}], rollout={"source": "async"})
    mini_recipe(rewards=[{"name": brevity}])  # fine in-process


def test_async_simulated_staleness_resumes_exactly(tmp_path, monkeypatch):
    from helpers import crash_at_step

    recipe = learning_recipe(train={"steps": 5, "threads": 1, "checkpoint_every": 1}, off_policy={"name": "tis"},
                             rollout={"source": "async", "simulated_staleness": 2, "sampler_threads": 1})
    Trainer(recipe, tmp_path / "straight", **QUIET).run()
    with crash_at_step(monkeypatch, 3):
        Trainer(recipe, tmp_path / "resumed", **QUIET).run()
    Trainer(recipe, tmp_path / "resumed", resume=True, **QUIET).run()
    a, b = read_metrics(tmp_path / "straight"), read_metrics(tmp_path / "resumed")
    assert comparable_across_sources(a, drop=("perf/", "async/")) == comparable_across_sources(b, drop=("perf/", "async/"))
    assert same_weights(tmp_path / "straight", tmp_path / "resumed")
    assert max(per_step(b, "offpolicy/staleness_max").values()) == 2.0


def test_a_batch_over_the_staleness_bound_is_dropped_and_sampled_again(monkeypatch):
    """The admission rule should make it unreachable; if a sampler still sends a batch over the
    bound, it is never trained on: dropped, counted, and sampled again by a restarted sampler."""
    from reasonrl.perf import Stopwatch
    from reasonrl.rollout.async_source import AsyncSource
    from reasonrl.rollout.collect import CollectStats
    from reasonrl.rollout.sources import SourceContext

    spawned = []

    class FakeEndpoint:  # the first sampler sends a batch of version 0, its replacement one of version 3
        def __init__(self):
            self.version = 0 if not spawned else 3
            spawned.append(self)

        def receive(self, timeout):
            batch = table_batch()
            batch.policy_version = self.version
            return ("batch", 3, batch, batch, CollectStats(), {}, {"step": 4, "from": self.version})

        def send(self, message):
            pass

        def stop(self):
            pass

    logs = []
    source = AsyncSource(SourceContext(recipe=mini_recipe(rollout={"source": "async", "max_staleness": 1}),
                                       policy=None, scorer=None, task=None, sampler=None, generator=None,
                                       log=logs.append))
    monkeypatch.setattr(AsyncSource, "_spawn", lambda self, i: self.endpoints.__setitem__(i, FakeEndpoint()))
    source.resume_from = [{"step": 3}]
    source._spawn(0)
    batch, _, _ = source.next_batch(3, 3, Stopwatch())
    assert batch.policy_version == 3 and source.resume_from == [{"step": 4, "from": 3}]
    assert source.metrics() == {"async/dropped_batches": 1, "async/sampler_restarts": 1}
    assert len(spawned) == 2 and any("lags 3 versions" in m for m in logs)


def test_async_kill_9_leaves_no_sampler_behind_and_resumes_exactly_at_staleness_0(tmp_path):
    """SIGKILL the learner mid-run: its sampler process exits on its own, and ``--resume``
    gives the straight run's numbers (at max_staleness 0 the sampler is in lockstep)."""
    import psutil

    raw = {"model": {"backend": "tiny"}, "task": {"name": "arithmetic"}, "optim": {"lr": 1e-3},
           "rollout": {"num_generations": 4, "max_new_tokens": 32, "source": "async", "max_staleness": 0,
                       "sampler_threads": 1},
           "train": {"steps": 6, "prompts_per_step": 4, "checkpoint_every": 1, "micro_batch_size": 8, "threads": 1},
           "eval": {"size": 8}, "log": {"plots": False, "progress": False}}

    def at_kill(pid):
        samplers = [c for c in psutil.Process(pid).children(recursive=True) if "python" in c.name()]
        assert samplers, "the async run has no sampler process"

        def none_left():
            gone, alive = psutil.wait_procs(samplers, timeout=15)
            assert not alive, f"left running after the learner's SIGKILL: {[p.pid for p in alive]}"
        return none_left

    a, b = kill_9_and_resume(tmp_path, raw, 3, at_kill)
    assert comparable_across_sources(a) == comparable_across_sources(b)


def test_async_kill_9_and_resume_at_staleness_1_is_the_straight_run(tmp_path):
    """Issue 29 item 9: at ``max_staleness: 1`` the batch of step k+1 is sampled ahead with the
    weights before step k's update. A run killed after the checkpoint of step k and resumed
    trains that very batch (the checkpoint holds it), so weights and metrics are the straight
    run's, bit for bit (before: the resumed sampler restarted at staleness 0 and the weights
    drifted by ~1e-3)."""
    raw = {"model": {"backend": "tiny"}, "task": {"name": "arithmetic"}, "optim": {"lr": 1e-3},
           "rollout": {"num_generations": 4, "max_new_tokens": 32, "source": "async", "max_staleness": 1,
                       "partial": False, "sampler_threads": 1},
           "off_policy": {"name": "tis", "cap": 2.0},
           "train": {"steps": 6, "prompts_per_step": 4, "checkpoint_every": 1, "micro_batch_size": 8, "threads": 1},
           "eval": {"size": 8}, "log": {"plots": False, "progress": False}}
    a, b = kill_9_and_resume(tmp_path, raw, 3)
    assert comparable_across_sources(a, drop=("perf/",)) == comparable_across_sources(b, drop=("perf/",))
    assert set(per_step(a, "offpolicy/staleness_max").values()) == {0.0, 1.0}  # it did run one step ahead


def test_a_checkpoint_holds_the_batch_sampled_ahead_as_plain_data(tmp_path, monkeypatch):
    """At ``max_staleness: 1`` the checkpoint after step 3 waits for the batch of step 3 and stores
    it as tensors and plain data (read back with ``weights_only=True``); the resumed source trains
    that batch as it was and starts its sampler after it, not after the last trained batch."""
    from dataclasses import replace

    from reasonrl.perf import Stopwatch
    from reasonrl.problem import Problem
    from reasonrl.rollout.async_source import AsyncSource
    from reasonrl.rollout.collect import CollectStats
    from reasonrl.rollout.sources import SourceContext

    problems = [Problem("1+1=", "2", meta={"form": "a+b", "span": (0, 3)}) for _ in range(6)]
    sampled = replace(table_batch(), policy_version=2, sample_logprobs=-torch.rand(6, 5),
                      meta={"problem": problems, "completion": ["2"] * 6, "reward/correct": [1.0] * 6})
    stats = CollectStats(sampled_groups=3, sampled_tokens=17, reward_failures={"correct": 1},
                         prompt_sampler_metrics={"sampler/x": 0.5})
    after = {"step": 4, "generator": torch.Generator().manual_seed(7).get_state(), "sampler": {}}

    class Sampler:  # an endpoint whose batch of step 3 arrives at the third poll
        def __init__(self, recipe=None, threads=1, start=None):
            self.start, self.polls = start, 0

        def receive(self, timeout):
            self.polls += 1
            return ("batch", 3, sampled, sampled, stats, {"sample": 1.5}, after) if self.polls == 3 else None

        def send(self, message):
            pass

    monkeypatch.setattr("reasonrl.rollout.endpoints.LocalEndpoint", Sampler)
    recipe = mini_recipe(train={"steps": 6}, rollout={"source": "async", "max_staleness": 1})
    policy = type("Policy", (), {"weights": lambda self: {}})()

    def source():
        s = AsyncSource(SourceContext(recipe=recipe, policy=policy, scorer=None, task=None, sampler=None,
                                      generator=None, log=print))
        s.resume_from = [{"step": 3, "sampler": {}}]
        return s

    straight = source()
    straight.version, straight.step = 2, 3  # published after step 2: the batch of step 3 is older
    straight._spawn(0)
    torch.save(straight.state_dict(), tmp_path / "state.pt")
    assert straight.endpoints[0].polls == 3  # it waited for the batch
    saved = torch.load(tmp_path / "state.pt", weights_only=True)  # plain data: no code runs on load

    resumed = source()
    resumed.load_state_dict(saved)
    resumed.version, resumed.step = 2, 3
    resumed._spawn(0)
    assert resumed.endpoints[0].start["step"] == 4
    assert torch.equal(resumed.endpoints[0].start["generator"], after["generator"])
    batch, every, got = resumed.next_batch(3, 3, Stopwatch())
    assert resumed.endpoints[0].polls == 0  # trained from the checkpoint
    assert torch.equal(batch.completion_ids, sampled.completion_ids) and batch.policy_version == 2
    assert torch.equal(batch.sample_logprobs, sampled.sample_logprobs) and batch.advantages is not None
    assert batch.meta["problem"] == problems and batch.meta["problem"][0].meta == {"form": "a+b", "span": (0, 3)}
    assert got == stats and resumed.resume_from[0]["step"] == 4
