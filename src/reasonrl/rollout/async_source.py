"""The asynchronous rollout source: samplers fill a bounded queue while the learner trains.

A sampler (``SamplerWorker``) owns everything that sampling needs — the task, the prompt
sampler, the random stream, the reward scorer and its own copy of the model — and runs in a
child process (``rollout.engine: local``, ``spawn``, its own torch threads) or in Ray actors
(``engine: ray``, ``rollout.workers: n``; ``reasonrl.rollout.endpoints``). Weights and batches
cross the boundary as plain tensors; with a vLLM engine (``engine: vllm``, or ``actor_engine:
vllm`` in Ray actors) the sampler hands them on to the engine it started
(``reasonrl.rollout.vllm_engine``).

**Bounded staleness, enforced.** The batch of step b is sampled only once the sampler holds
weights published after step ``b − ⌊max_staleness / m⌋`` (m optimiser steps per training step),
so no token it samples lags the learner by more than ``max_staleness`` versions when step b
trains. The learner also checks every batch: one over the bound (which the admission rule
should make impossible) is never trained on — it is dropped, counted in
``async/dropped_batches``, and its sampler restarts from the state after its last trained
batch with the current weights, so the step trains on a fresh batch of the same prompts. At
``max_staleness: 0`` the sampler waits for each step's weights: the run is the synchronous one,
number for number (one sampler continues the learner's random stream).

**Partial rollouts** (``rollout.partial``): between decode steps the sampler takes any weights
that arrived, so a long generation continues under the newer weights; every token records its
version (``token_versions``) and its behaviour log-prob. With a ``rollout.prefix_check``
(RollVerify) newer weights interrupt the generation instead, and the check decides the stale
prefixes before the rows continue under them (``reasonrl.rollout.inflight``).

**Simulated staleness** (``rollout.simulated_staleness: k``): the step-b batch uses exactly the
weights published after step max(0, b − k/m), without partial updates — deterministic, and the
same run as the ``sync`` source's in-process simulation, whether the sampler is a local
process or a Ray actor.

**Nothing lost, nothing trained twice.** Each batch carries its sampler's state after it (next
step, random stream, prompt sampler). A sampler that died (reported, then replaced) restarts
from the state after its last *trained* batch and samples the following steps again, with the
current weights. The checkpoint after step k stores, per sampler, that state, the weights still
to be used when simulating staleness, and every batch that arrived but is not trained yet:
when the sampler may run ahead (``max_staleness`` ≥ one step's optimiser steps) the batch of
step k was sampled with weights older than the checkpoint's, so the checkpoint waits for it
(the next step needs it anyway, so the run loses no time) and keeps the batch itself — its
token ids, masks, log-probs, rewards and rows, a few MB, where the weights it came from would
be a whole second model. A resumed run trains these saved batches and restarts each sampler
after the last of its own.

**Exact resume** (weights and metrics bit-identical to the uninterrupted run) therefore holds
at ``max_staleness: 0``, with simulated staleness, and at one step of staleness (``max_staleness``
= the optimiser steps of one training step) with one sampler and ``partial: false``: the
sampler starts the batch of step b as it sends that of step b − 1, so with the weights
published after step b − 1 (the oldest it may use, and none newer can exist before step b − 1
trains; should the sampler stall after sending batch b − 1 for that long, newer ones wait for
batch b + 1: ``SamplerWorker``'s ``hold_newer``). Beyond that (``partial: true``, which loads
weights mid-generation; a sampler allowed two or more steps ahead; two or more Ray workers, one
of which waits for weights while the learner trains another's batch) which weights a batch
meets depends on timing, so two uninterrupted runs differ too, as in every asynchronous system;
a resume then replays the saved batches and goes on as such a run could have.
"""

from __future__ import annotations

import os
from dataclasses import asdict, fields
from typing import Any

import torch

from reasonrl.batch import RolloutBatch
from reasonrl.params import ConfigError
from reasonrl.perf import Stopwatch
from reasonrl.policy.lowrank import lowrank_payload_bytes
from reasonrl.problem import Problem
from reasonrl.rollout.collect import CollectStats
from reasonrl.rollout.partial import check_partial
from reasonrl.rollout.vllm_engine import check_vllm, uses_vllm
from reasonrl.registry import ROLLOUT_SOURCES
from reasonrl.rollout.sampler_worker import POLL_S, SamplerWorker, admission_lag  # noqa: F401  (SamplerWorker: re-exported)
from reasonrl.rollout.sources import RolloutSource, SourceContext, check_simulated_staleness, optimizer_steps_per_step

__all__ = ["AsyncSource", "SamplerWorker", "admission_lag"]

def default_threads(workers: int) -> int:
    """Torch threads per sampler when ``rollout.sampler_threads`` is 0: the cores shared
    evenly between the learner and the samplers of this machine."""
    return max(1, (os.cpu_count() or 2) // (workers + 1))


MAX_RESTARTS = 3  # consecutive sampler restarts without a trained batch before the run stops


def _names(items: list) -> list[str]:
    """The component names in a recipe list (``rewards: [{name: ...}, ...]``)."""
    return [x["name"] for x in items if isinstance(x, dict) and isinstance(x.get("name"), str)]


@ROLLOUT_SOURCES.register("async")
class AsyncSource(RolloutSource):
    """Sampling in child processes or Ray actors, concurrently with learning (see the module
    docstring). With ``rollout.workers: n`` (Ray), worker i samples the steps i, i + n, … from a
    random stream of its own; with one worker it continues the learner's stream."""

    off_policy = True
    scores_in_learner = False  # each sampler scores with a scorer of its own

    def __init__(self, ctx: SourceContext) -> None:
        super().__init__(ctx)
        ro = self.recipe.rollout
        self.measure_mismatch = uses_vllm(self.recipe)
        self.threads = ro.sampler_threads or default_threads(ro.workers)
        self.restarts_in_a_row = 0
        self.learner_threads = torch.get_num_threads()
        self.n = ro.workers
        self.endpoints: list[Any] = [None] * self.n
        self.resume_from: list[dict[str, Any]] | None = None  # per worker: the state after its last trained batch
        self.ready: dict[int, tuple] = {}  # step -> (worker, message): batches that arrived early
        self.early = Stopwatch()  # the wait for the next step's batch before a checkpoint
        self.counts = {"async/dropped_batches": 0, "async/sampler_restarts": 0}
        self.version, self.step = 0, 0  # the learner's, as last published
        self.k_steps = ro.simulated_staleness // optimizer_steps_per_step(self.recipe)
        self.snapshots: dict[int, tuple[int, dict]] = {}  # simulated: published step -> (version, weights)
        self.sampler_metrics: dict[str, float] = {}  # the latest batch's partial/* and rollverify/*
        # LoGRA sync: a learner that offers its low-rank updates sends them instead of full weights
        # (one local sampler in lockstep order; simulated staleness and prefix checks keep whole weights).
        learner = ctx.learner
        self.lowrank = (hasattr(learner, "take_updates") and ro.engine == "local" and not self.k_steps
                        and not (ro.partial and ro.prefix_check is not None))
        if self.lowrank:
            learner.record_updates = True
        self.sync_metrics: dict[str, float] = {}
        self.full_bytes = 0

    @classmethod
    def check(cls, recipe, need) -> None:
        ro = recipe.rollout
        need(ro.engine == "ray" or ro.workers == 1, "rollout.workers > 1 needs rollout.engine: ray")
        check_vllm(recipe, need)
        check_partial(recipe, need, real=True)
        need(ro.workers == 1 or recipe.sampler.name == "stream",
             f"rollout.workers > 1 splits the steps between samplers, each with its own copy of the prompt "
             f"sampler; sampler '{recipe.sampler.name}' learns from results, so it needs rollout.workers: 1")
        from reasonrl.recipe import flatten
        from reasonrl.registry import only_in_this_process

        flat = flatten(recipe.to_dict())
        local = sorted({f"{k}: {v}" for k, v in flat.items() if isinstance(v, str) and only_in_this_process(v)}
                       | {f"{k}: {x}" for k, v in flat.items() if isinstance(v, list)
                          for x in _names(v) if only_in_this_process(x)})
        need(not local, "rollout.source: async samples and scores in another process, where "
                        f"{'; '.join(local)} cannot be imported (defined in a script, a local function or an object); "
                        "put it in a file and name it as \"file.py:function\"")
        m = optimizer_steps_per_step(recipe)
        if ro.simulated_staleness:
            need(ro.max_staleness == 0, "rollout.simulated_staleness fixes the lag; leave rollout.max_staleness at 0")
            need(ro.sync_every == 1, "rollout.simulated_staleness needs rollout.sync_every: 1 (every version is used)")
            check_simulated_staleness(recipe, need)
            return
        lag = ro.max_staleness // m
        need(ro.max_staleness == 0 or lag >= 1,
             f"rollout.max_staleness={ro.max_staleness} is below the {m} optimiser steps one training step "
             "makes, so the sampler could never run ahead: use 0 (synchronous) or a multiple of it")
        need(ro.sync_every <= lag + 1,
             f"rollout.sync_every={ro.sync_every} would starve the sampler: with rollout.max_staleness="
             f"{ro.max_staleness} and {m} optimiser step(s) per training step it may run {lag} step(s) ahead, "
             f"so weights must arrive at least every {lag + 1} step(s)")

    # -- the samplers ----------------------------------------------------------------
    def start(self, version: int, step: int) -> "AsyncSource":
        if self.resume_from is None:
            state = {"generator": self.ctx.generator.get_state(), "sampler": self.ctx.sampler.state_dict()}
            self.resume_from = [{**state, "step": step + i} for i in range(self.n)]
            if self.n > 1:  # each worker its own stream
                for i, s in enumerate(self.resume_from):
                    s["generator"] = torch.Generator().manual_seed(self.recipe.train.seed * 1000 + i).get_state()
        self.version, self.step = version, step
        if self.k_steps and step not in self.snapshots:
            self.snapshots[step] = (version, self.ctx.policy.weights())
        if not self.recipe.train.threads and self.recipe.rollout.engine == "local":
            # The learner keeps the cores the sampler does not use (restored by close()).
            torch.set_num_threads(max(1, (os.cpu_count() or 2) - self.n * self.threads))
        for i in range(self.n):
            self._spawn(i)
        return self

    def _spawn(self, i: int) -> None:
        from reasonrl.rollout.endpoints import LocalEndpoint, RayEndpoint

        engine = RayEndpoint if self.recipe.rollout.engine == "ray" else LocalEndpoint
        # From the state after its last batch still to be trained (a resumed checkpoint's), else
        # after its last trained one.
        own = [s for s, (j, _) in self.ready.items() if j == i]
        after = self.ready[max(own)][1][-1] if own else self.resume_from[i]
        # The current weights travel with the start state, not as a message: a Ray actor's calls
        # may run out of order, and the first batch must meet exactly these (SamplerWorker).
        weights = None
        if self.lowrank:  # whole weights now hold every update so far: label them with the learner's count
            self.ctx.learner.take_updates()
            weights = (self.ctx.learner.k, self.step, self.ctx.policy.weights())
        elif not self.k_steps:
            weights = (self.version, self.step, self.ctx.policy.weights())
        start = {**after, "stride": self.n, "lowrank": self.lowrank, "weights": weights}
        self.endpoints[i] = endpoint = engine(self.recipe.to_dict(), self.threads, start)
        for published, (version, tensors) in sorted(self.snapshots.items()) if self.k_steps else ():
            endpoint.send(("weights", version, published, tensors))

    def _restart(self, i: int, why: str) -> None:
        self.restarts_in_a_row += 1
        if self.restarts_in_a_row > MAX_RESTARTS:
            raise RuntimeError(f"async sampler {i}: {why}, {MAX_RESTARTS} times in a row without a batch trained in "
                               "between; giving up (its stderr above says why; a script using the Python API needs "
                               "`if __name__ == \"__main__\":` around its call, since samplers start by spawn)")
        self.ctx.log(f"async sampler {i}: {why}; restarting it from step {self.resume_from[i]['step']} "
                     "(its batches in flight are sampled again with the current weights)")
        self.counts["async/sampler_restarts"] += 1
        self.endpoints[i].stop()
        self.ready = {s: v for s, v in self.ready.items() if v[0] != i}
        self._spawn(i)

    def _wait_for(self, step: int, watch: Stopwatch) -> None:
        """Receive messages until the batch of ``step`` is in ``ready``."""
        with watch("wait"):
            while step not in self.ready:
                for i, endpoint in enumerate(self.endpoints):
                    message = endpoint.receive(timeout=POLL_S / self.n)
                    if message is None:
                        continue
                    if message[0] == "error":
                        raise RuntimeError(f"async sampler {i} failed:\n{message[1]}")
                    if message[0] == "config_error":
                        raise ConfigError(f"async sampler {i}: {message[1]}")
                    if message[0] == "dead":
                        self._restart(i, message[1])
                        continue
                    self.ready[message[1]] = (i, message)

    def next_batch(self, step, version, watch):
        max_lag = self.recipe.rollout.max_staleness if not self.k_steps else self.recipe.rollout.simulated_staleness
        watch.seconds["wait"] += self.early.seconds.pop("wait", 0.0)
        while True:
            self._wait_for(step, watch)
            i, (_, _, batch, every, stats, seconds, after) = self.ready.pop(step)
            if version - batch.policy_version > max_lag:
                self.counts["async/dropped_batches"] += 1
                self._restart(i, f"the batch of step {step} lags {version - batch.policy_version} versions "
                                 f"(bound {max_lag}); it is dropped")
                continue
            for phase, s in seconds.items():  # the sampler's own time, for the perf metrics
                watch.seconds[f"sampler_{phase}"] += s
            self.resume_from[i] = after
            self.restarts_in_a_row = 0
            self.sampler_metrics = dict(stats.sampler_metrics)
            return batch, every, stats

    def publish(self, policy, version, step) -> None:
        self.version, self.step = version, step
        if step >= self.recipe.train.steps or step % self.recipe.rollout.sync_every:
            return
        if self.lowrank:
            return self._publish_lowrank(policy, version, step)
        tensors = policy.weights()
        if self.k_steps:  # keep what a restarted or resumed sampler will still need
            self.snapshots[step] = (version, tensors)
            for p in [p for p in self.snapshots if p < step - self.k_steps]:
                del self.snapshots[p]
        for endpoint in self.endpoints:
            endpoint.send(("weights", version, step, tensors))

    def _publish_lowrank(self, policy, version, step) -> None:
        """LoGRA sync: the updates since the last publish as (D_ℓ, k, α) and the seed, with the
        exact byte count beside that of the whole weights."""

        payload = self.ctx.learner.take_updates()
        if not self.full_bytes:
            self.full_bytes = sum(t.numel() * t.element_size() for t in policy.weights().values())
        self.sync_metrics = {"logra/sync_bytes": lowrank_payload_bytes(payload), "logra/full_sync_bytes": self.full_bytes}
        for endpoint in self.endpoints:
            endpoint.send(("lowrank", version, step, payload))

    def metrics(self) -> dict[str, float]:
        return {**self.counts, **self.sampler_metrics, **self.sync_metrics}

    # -- checkpoints -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The state to resume from (see the module docstring). When the sampler may run ahead
        of real weights, this first waits for the batch of the learner's next step."""
        if admission_lag(self.recipe) and self.step < self.recipe.train.steps:
            self._wait_for(self.step, self.early)
        ahead = {step: {"worker": i, **_plain_message(message)} for step, (i, message) in self.ready.items()}
        return {"resume_from": self.resume_from, "counts": dict(self.counts), "snapshots": self.snapshots,
                "ahead": ahead}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "resume_from" not in state:
            raise ValueError("this checkpoint was written by another rollout source; resume with the same rollout.source")
        self.resume_from = state["resume_from"]
        self.counts.update(state.get("counts", {}))
        self.snapshots = dict(state.get("snapshots", {}))
        self.ready = {step: (saved["worker"], _message(step, saved)) for step, saved in state.get("ahead", {}).items()}

    def close(self) -> None:
        for endpoint in self.endpoints:
            if endpoint is not None:
                endpoint.stop()
        torch.set_num_threads(self.learner_threads)
        if self.recipe.rollout.engine == "ray":
            from reasonrl.rollout.endpoints import ray_shutdown

            ray_shutdown()


# -- a batch sampled ahead, as checkpoint data --------------------------------------------------
# A checkpoint holds tensors and plain data only (it is loaded with ``weights_only=True``): the
# batches' problems and stats travel as dicts.

def _plain_batch(batch: RolloutBatch) -> dict[str, Any]:
    state = {f.name: getattr(batch, f.name) for f in fields(batch)}
    if "problem" in batch.meta:
        state["meta"] = {**batch.meta, "problem": [{f.name: getattr(p, f.name) for f in fields(p)}
                                                   for p in batch.meta["problem"]]}
    return state


def _batch(state: dict[str, Any]) -> RolloutBatch:
    meta = state["meta"]
    if "problem" in meta:
        meta = {**meta, "problem": [Problem(**p) for p in meta["problem"]]}
    return RolloutBatch(**{**state, "meta": meta})


def _plain_message(message: tuple) -> dict[str, Any]:
    """A sampler's ``("batch", step, batch, every_row, stats, seconds, state_after)``."""
    _, _, batch, every, stats, seconds, after = message
    return {"batch": _plain_batch(batch), "every": _plain_batch(every), "stats": asdict(stats),
            "seconds": dict(seconds), "after": after}


def _message(step: int, saved: dict[str, Any]) -> tuple:
    return ("batch", step, _batch(saved["batch"]), _batch(saved["every"]), CollectStats(**saved["stats"]),
            saved["seconds"], saved["after"])
