"""The asynchronous rollout source: samplers fill a bounded queue while the learner trains.

A sampler (``SamplerWorker``) owns everything that sampling needs — the task, the prompt
sampler, the random stream, the reward scorer and its own copy of the model — and runs in a
child process (``rollout.engine: local``, ``spawn``, its own torch threads) or in Ray actors
(``engine: ray``, ``rollout.workers: n``; ``reasonrl.rollout.endpoints``). Weights and batches
cross the boundary as plain tensors, so a vLLM engine can stand in for the sampler later.

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
step, random stream, prompt sampler). The checkpoint stores, per sampler, the state after its
last *trained* batch (and, when simulating staleness, the weights still to be used); a resumed
run, or a sampler that died (reported, then replaced), restarts from it and samples the
following steps again — with the current weights, so batches in flight are re-sampled, not
replayed. Exact resume holds at ``max_staleness: 0`` and with simulated staleness; otherwise
the arrival time of weights depends on timing, as in every asynchronous system.
"""

from __future__ import annotations

import os
import queue
from typing import Any

import torch

from reasonrl.perf import Stopwatch
from reasonrl.rollout.partial import check_partial
from reasonrl.registry import ROLLOUT_SOURCES
from reasonrl.rollout.sources import RolloutSource, SourceContext, check_simulated_staleness, optimizer_steps_per_step

__all__ = ["AsyncSource", "SamplerWorker", "admission_lag"]

POLL_S = 0.5  # how often a waiting learner checks that its sampler is alive


def admission_lag(recipe) -> int:
    """Training steps the sampler may run ahead of the weights it holds."""
    return recipe.rollout.max_staleness // optimizer_steps_per_step(recipe)


def default_threads(workers: int) -> int:
    """Torch threads per sampler when ``rollout.sampler_threads`` is 0: the cores shared
    evenly between the learner and the samplers of this machine."""
    return max(1, (os.cpu_count() or 2) // (workers + 1))


MAX_RESTARTS = 3  # consecutive sampler restarts without a trained batch before the run stops


def _get(inbox):
    """The next message, waiting; a sampler whose learner is gone stops (a learner killed by
    SIGKILL runs no clean-up, and its sampler must not live on holding a model copy)."""
    while True:
        try:
            return inbox.get(timeout=POLL_S)
        except queue.Empty:
            if _orphaned():
                raise _Stop from None


def _orphaned() -> bool:
    import multiprocessing

    parent = multiprocessing.parent_process()
    return parent is not None and not parent.is_alive()


def _names(items: list) -> list[str]:
    """The component names in a recipe list (``rewards: [{name: ...}, ...]``)."""
    return [x["name"] for x in items if isinstance(x, dict) and isinstance(x.get("name"), str)]


class _Stop(Exception):
    pass


class SamplerWorker:
    """Samples and scores the batch of each of its steps, with the weights it was sent.

    Worker ``i`` of ``n`` samples the steps ``i, i + n, …``; ``start`` is the state to continue
    from: ``{"step", "generator", "sampler"}``. Messages in: ``("weights", version,
    published_step, tensors)``, ``("stop",)``. Out: ``("batch", step, batch, every_row, stats,
    seconds, state_after)`` or ``("error", traceback)``.

    With ``rollout.simulated_staleness: k`` the step-b batch is sampled with exactly the weights
    published after step max(0, b − k′), k′ = k / m, and never refreshed mid-generation, so the
    run is deterministic: the one the ``sync`` source samples in-process.
    """

    def __init__(self, recipe, start: dict[str, Any]) -> None:
        from reasonrl.policy.factory import build_policy
        from reasonrl.rollout.samplers import build_sampler
        from reasonrl.rewards.scorer import build_scorer
        from reasonrl.tasks.base import build_task

        self.recipe, self.stride = recipe, start.get("stride", 1)
        self.task = build_task(recipe)
        self.sampler = build_sampler(recipe, self.task)
        self.sampler.load_state_dict(start["sampler"])
        self.generator = torch.Generator()
        self.generator.set_state(start["generator"])
        self.step = start["step"]
        self.scorer = build_scorer(recipe).start()
        policy = build_policy(recipe.model, log=lambda m: None, decoder=recipe.rollout.decoder)
        self.policy = policy.sampling_copy(recipe.rollout.dtype)
        if start.get("lowrank"):  # LoGRA sync: frozen like the learner's, so the same kernels give the same bits
            for p in self.policy.model.parameters():
                p.requires_grad_(False)
        self.version, self.published = -1, -1
        self.simulated = recipe.rollout.simulated_staleness // optimizer_steps_per_step(recipe)
        self.lag = self.simulated if recipe.rollout.simulated_staleness else admission_lag(recipe)
        self.history: dict[int, tuple[int, Any]] = {}  # simulated: published step -> (version, weights)
        self.loaded_step: int | None = None
        # A prefix check needs μ loaded until the switch: newer weights wait in ``pending``.
        self.verify = recipe.rollout.partial and recipe.rollout.prefix_check is not None and not self.simulated
        self.pending: tuple[int, Any] | None = None

    def _handle(self, message) -> None:
        if message[0] == "stop":
            raise _Stop
        if message[0] == "lowrank":
            return self._apply_lowrank(*message[1:])
        _, version, published, tensors = message
        if self.step >= self.recipe.train.steps:
            return  # every batch is out: late weights are of no use
        if self.recipe.rollout.simulated_staleness:
            self.history[published] = (version, tensors)
        elif published >= self.published:  # Ray's threaded actors may deliver two sends out of order
            if self.verify:
                self.pending = (version, tensors)
            else:
                self.policy.set_weights(tensors)
                self.version = version
        self.published = max(self.published, published)

    def _apply_lowrank(self, version: int, published: int, payload: dict) -> None:
        """LoGRA sync: the learner's low-rank updates, applied to the weights held."""
        from reasonrl.train.logra import apply_newer_updates

        apply_newer_updates(self.policy.model, self.version, payload)
        self.version, self.published = max(self.version, version), max(self.published, published)

    def _poll(self, inbox) -> bool:
        """Take the messages that arrived; are newer weights waiting to be loaded?"""
        self._drain(inbox)
        return self.pending is not None

    def _load(self) -> int:
        """Load the waiting weights, if any; the version now loaded."""
        if self.pending is not None:
            self.version, tensors = self.pending
            self.policy.set_weights(tensors)
            self.pending = None
        return self.version

    def _drain(self, inbox) -> int:
        while True:
            try:
                self._handle(inbox.get_nowait())
            except queue.Empty:
                return self.version

    def _use_simulated_weights(self) -> None:
        want = max(0, self.step - self.simulated)
        usable = [p for p in self.history if p <= want]
        chosen = max(usable) if usable else min(self.history)
        if chosen != self.loaded_step:
            self.version, tensors = self.history[chosen]
            self.policy.set_weights(tensors)
            self.loaded_step = chosen
        for p in [p for p in self.history if p < chosen]:
            del self.history[p]

    def loop(self, inbox, outbox) -> None:
        from reasonrl.rollout.collect import collect
        from reasonrl.rollout.episodes import rollout_sampler
        from reasonrl.rollout.inflight import InFlightRollout

        r = self.recipe
        simulated = bool(r.rollout.simulated_staleness)
        refresh = (lambda: self._drain(inbox)) if r.rollout.partial and not simulated and not self.verify else None
        sampler = InFlightRollout(self.policy, r, lambda: self._poll(inbox), self._load) if self.verify \
            else rollout_sampler(self.policy, r)
        try:
            while self.step < r.train.steps:
                # Admission: wait for weights fresh enough for this step (and for the first weights at all).
                while self.published < max(0, self.step - self.lag):
                    self._handle(_get(inbox))
                if simulated:
                    self._use_simulated_weights()
                else:
                    self._drain(inbox)
                    self._load()
                watch = Stopwatch()
                batch, every, stats = collect(sampler, self.scorer, self.task, r, self.step, self.generator,
                                              self.version, watch, self.sampler, refresh=refresh)
                if sampler is not self.policy:  # prefix checks, episodes
                    stats.sampler_metrics = sampler.metrics()
                step, self.step = self.step, self.step + self.stride
                after = {"step": self.step, "generator": self.generator.get_state(),
                         "sampler": self.sampler.state_dict()}
                outbox.put(("batch", step, batch, every, stats, dict(watch.seconds), after))
            while True:  # every batch is out: wait to be stopped
                self._handle(_get(inbox))
        except _Stop:
            pass
        finally:
            self.scorer.close()


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
        self.threads = ro.sampler_threads or default_threads(ro.workers)
        self.restarts_in_a_row = 0
        self.learner_threads = torch.get_num_threads()
        self.n = ro.workers
        self.endpoints: list[Any] = [None] * self.n
        self.resume_from: list[dict[str, Any]] | None = None  # per worker: the state after its last trained batch
        self.ready: dict[int, tuple] = {}  # step -> (worker, message): batches that arrived early
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
        check_partial(recipe, need, real=True)
        need(ro.workers == 1 or recipe.sampler.name == "stream",
             f"rollout.workers > 1 splits the steps between samplers, each with its own copy of the prompt "
             f"sampler; sampler '{recipe.sampler.name}' learns from results, so it needs rollout.workers: 1")
        from reasonrl.config import flatten
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
        start = {**self.resume_from[i], "stride": self.n, "lowrank": self.lowrank}
        self.endpoints[i] = endpoint = engine(self.recipe.to_dict(), self.threads, start)
        if self.k_steps:
            for published, (version, tensors) in sorted(self.snapshots.items()):
                endpoint.send(("weights", version, published, tensors))
        elif self.lowrank:  # whole weights now hold every update so far: label them with the learner's count
            self.ctx.learner.take_updates()
            endpoint.send(("weights", self.ctx.learner.k, self.step, self.ctx.policy.weights()))
        else:
            endpoint.send(("weights", self.version, self.step, self.ctx.policy.weights()))

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

    def _collect_ready(self, step: int, watch: Stopwatch) -> tuple:
        with watch("wait"):
            while step not in self.ready:
                for i, endpoint in enumerate(self.endpoints):
                    message = endpoint.receive(timeout=POLL_S / self.n)
                    if message is None:
                        continue
                    if message[0] == "error":
                        raise RuntimeError(f"async sampler {i} failed:\n{message[1]}")
                    if message[0] == "dead":
                        self._restart(i, message[1])
                        continue
                    self.ready[message[1]] = (i, message)
        return self.ready.pop(step)

    def next_batch(self, step, version, watch):
        max_lag = self.recipe.rollout.max_staleness if not self.k_steps else self.recipe.rollout.simulated_staleness
        while True:
            i, (_, _, batch, every, stats, seconds, after) = self._collect_ready(step, watch)
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
        from reasonrl.train.logra import lowrank_payload_bytes

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
        return {"resume_from": self.resume_from, "counts": dict(self.counts), "snapshots": self.snapshots}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "resume_from" not in state:
            raise ValueError("this checkpoint was written by another rollout source; resume with the same rollout.source")
        self.resume_from = state["resume_from"]
        self.counts.update(state.get("counts", {}))
        self.snapshots = dict(state.get("snapshots", {}))

    def close(self) -> None:
        for endpoint in self.endpoints:
            if endpoint is not None:
                endpoint.stop()
        torch.set_num_threads(self.learner_threads)
        if self.recipe.rollout.engine == "ray":
            from reasonrl.rollout.endpoints import ray_shutdown

            ray_shutdown()
