"""The sampler side of the asynchronous rollout source (``rollout.async_source``).

A :class:`SamplerWorker` runs in a child process or a Ray actor (``rollout.endpoints``): it owns
the task, the prompt sampler, the random stream, the reward scorer and its own copy of the
model, samples and scores the batch of each of its steps with the weights it was sent, and
sends the batch back with its state after it. The module docstring of ``async_source`` says
how staleness is bounded and why nothing is lost or trained twice.
"""

from __future__ import annotations

import queue
from typing import Any

import torch

from reasonrl.perf import Stopwatch
from reasonrl.policy.lowrank import apply_newer_updates
from reasonrl.rollout.sources import optimizer_steps_per_step
from reasonrl.rollout.vllm_engine import VLLMSampler, uses_vllm

__all__ = ["SamplerWorker", "admission_lag", "POLL_S"]

POLL_S = 0.5  # how often a waiting learner checks that its sampler is alive


def admission_lag(recipe) -> int:
    """Training steps the sampler may run ahead of the weights it holds."""
    return recipe.rollout.max_staleness // optimizer_steps_per_step(recipe)


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


class _Stop(Exception):
    pass


class SamplerWorker:
    """Samples and scores the batch of each of its steps, with the weights it was sent.

    Worker ``i`` of ``n`` samples the steps ``i, i + n, …``; ``start`` is the state to continue
    from: ``{"step", "generator", "sampler", "weights"}``, the weights as ``(version,
    published_step, tensors)`` (None when simulating staleness: they come as messages). Messages
    in: ``("weights", version, published_step, tensors)``, ``("stop",)``. Out: ``("batch", step,
    batch, every_row, stats, seconds, state_after)`` or ``("error", traceback)``.

    With ``rollout.simulated_staleness: k`` the step-b batch is sampled with exactly the weights
    published after step max(0, b − k′), k′ = k / m, and never refreshed mid-generation, so the
    run is deterministic: the one the ``sync`` source samples in-process.

    Otherwise each batch starts with the newest weights that arrived before it (with partial
    rollouts, those arriving mid-generation are taken too), except the first batch after a
    (re)start: it starts with the weights in ``start`` (or the first ones fresh enough to admit
    it). A resumed sampler thus starts from the checkpoint's weights as the uninterrupted one
    did, however long its start took while the learner trained the batch the checkpoint held
    and published newer weights. (A sampler restarted mid-run starts while the
    learner waits for its batch, so with one sampler no newer weights exist then.)

    One sampler without partial rollouts allowed to run ahead (``hold_newer``: the case
    ``async_source`` promises exact resume for) never starts batch b with weights whose
    ``published_step`` is above b − 1. It starts batch b as it sends batch b − 1, which the
    learner needs before it can publish anything newer, so newer weights are there only if this
    thread stalled between sending and draining for as long as the learner's step took (a loaded
    machine: CI); loading them would make the batch, and a checkpoint holding it, depend on that
    stall. They wait (``held``) for the next batch. (At ``max_staleness: 0`` batch b waits for
    ``published_step`` b itself, nothing newer can exist, and nothing is held.)
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
        if uses_vllm(recipe):  # the engine samples; the local copy tokenises and describes the adapters
            self.policy = VLLMSampler(policy, recipe, log=lambda m: print(f"async sampler: {m}", flush=True))
        else:
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
        self.loaded = -1  # the published step of the weights loaded
        self.held: tuple[int, int, Any] | None = None  # (version, published, tensors) too new for this batch
        self.hold_newer = False  # the start's weights are the first batch's, however new (class docstring)
        if start.get("weights") is not None:
            self._handle(("weights", *start["weights"]))
        self.hold_newer = (self.lag >= 1 and self.stride == 1 and not recipe.rollout.partial
                           and not recipe.rollout.simulated_staleness)

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
        elif self.hold_newer:
            if published > self._newest_usable():
                if self.held is None or published > self.held[1]:
                    self.held = (version, published, tensors)
            elif published > self.loaded:  # Ray's threaded actors may deliver two sends out of order
                self._set(version, published, tensors)
        elif published >= self.published:  # (out of order, as above)
            if self.verify:
                self.pending = (version, tensors)
            else:
                self._set(version, published, tensors)
        self.published = max(self.published, published)

    def _set(self, version: int, published: int, tensors) -> None:
        self.policy.set_weights(tensors)
        self.version, self.loaded = version, published

    def _newest_usable(self) -> int:
        """Under ``hold_newer``: the newest ``published_step`` the batch about to start may use."""
        return max(0, self.step - 1)

    def _release_held(self) -> None:
        """Load the held weights once the batch about to start may use them."""
        if self.held is not None and self.held[1] <= self._newest_usable():
            held, self.held = self.held, None
            if held[1] > self.loaded:
                self._set(*held)

    def _apply_lowrank(self, version: int, published: int, payload: dict) -> None:
        """LoGRA sync: the learner's low-rank updates, applied to the weights held."""

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
            else rollout_sampler(self.policy, r, self.task)
        first = self.step  # the first batch after a (re)start starts with the weights in ``start`` (class docstring)
        try:
            while self.step < r.train.steps:
                # Admission: wait for weights fresh enough for this step (and for the first weights at all).
                while self.published < max(0, self.step - self.lag):
                    self._handle(_get(inbox))
                if simulated:
                    self._use_simulated_weights()
                else:
                    if self.step != first:
                        self._drain(inbox)
                    self._release_held()
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
            if sampler is not self.policy and hasattr(sampler, "close"):  # a verifiers task's endpoint
                sampler.close()
            if isinstance(self.policy, VLLMSampler):
                self.policy.close()
