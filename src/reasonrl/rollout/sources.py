"""Rollout sources (``ROLLOUT_SOURCES``): the seam between sampling and learning.

The Trainer asks its source for each step's batch and hands it the new weights after each
step; where and with which weights the batch was sampled is the source's business:

- ``start(version, step)``: begin (after any resume) from the learner's current weights;
- ``next_batch(step, version, watch) -> (train_batch, every_sampled_row, CollectStats)``: the
  batch the learner trains on at ``step`` while its weights are at optimiser ``version``;
- ``publish(policy, version, step)``: the learner's weights after ``step`` (plain tensors,
  ``HFPolicy.weights()``), by version;
- ``state_dict()`` / ``load_state_dict(state)``: what an exact resume needs (the prompt sampler
  and, for a stale sampler, the weights it still has to sample with or the batches it sampled
  ahead with weights the checkpoint no longer holds);
- ``close()``.

``sync`` (this module) samples each batch in-process; ``async`` (``rollout.async_source``)
samples in another process while the learner trains. Every batch records its
``policy_version`` (the oldest weights that sampled it) and, where tokens may come from
several versions, ``token_versions``; a source whose sampler can differ from the learner
(stale weights, another precision) says so with ``off_policy``, so the Trainer recomputes the
proximal log-probs and logs the mismatch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from reasonrl.batch import RolloutBatch
from reasonrl.perf import Stopwatch
from reasonrl.registry import ROLLOUT_SOURCES
from reasonrl.rollout.collect import CollectStats, collect
from reasonrl.rollout.episodes import rollout_sampler
from reasonrl.rollout.partial import PartialRollout, check_partial
from reasonrl.rollout.vllm_engine import VLLMSampler, check_vllm, uses_vllm

__all__ = ["SourceContext", "RolloutSource", "SyncSource", "optimizer_steps_per_step", "check_simulated_staleness"]


@dataclass
class SourceContext:
    """What a source is built from (``cls(ctx)``)."""

    recipe: Any
    policy: Any  # the learner's HFPolicy
    scorer: Any
    task: Any
    sampler: Any  # the prompt sampler
    generator: torch.Generator  # the sampling random stream (saved with the Trainer's RNG state)
    log: Callable[[str], None]
    learner: Any = None  # the policy's Learner (LoGRA's async sync takes its low-rank updates)


def optimizer_steps_per_step(recipe) -> int:
    """Optimiser steps (policy versions) one training step makes: mini-batches × passes over a
    full batch of ``prompts_per_step × num_generations`` rows."""
    rows = recipe.train.prompts_per_step * recipe.rollout.num_generations
    mini = recipe.train.mini_batch_size or rows
    return math.ceil(rows / mini) * recipe.train.num_iterations


class RolloutSource:
    """Base class; see the module docstring for the protocol."""

    off_policy = False  # may the sampler's weights differ from the learner's?
    # Log the behaviour–learner mismatch every step (an extra forward of the learner) even when
    # no correction asks for the proximal log-probs: an inference engine's numbers are its own.
    measure_mismatch = False
    # Does this source score rewards with the learner's scorer (``SourceContext.scorer``)? A
    # source whose samplers score in their own processes says no, and the learner forks no
    # reward workers of its own.
    scores_in_learner = True

    def __init__(self, ctx: SourceContext) -> None:
        self.ctx = ctx
        self.recipe = ctx.recipe

    @classmethod
    def check(cls, recipe, need: Callable[[bool, str], None]) -> None:
        """Reject, at load time, rollout settings this source cannot honour."""

    def start(self, version: int, step: int) -> "RolloutSource":
        """Begin at optimiser ``version`` and training ``step`` (after any resume), with the
        learner's current weights."""
        return self

    def next_batch(self, step: int, version: int, watch: Stopwatch) -> tuple[RolloutBatch, RolloutBatch, CollectStats]:
        raise NotImplementedError

    def publish(self, policy, version: int, step: int) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"sampler": self.ctx.sampler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ctx.sampler.load_state_dict(state.get("sampler", {}))

    def close(self) -> None:
        pass


@ROLLOUT_SOURCES.register("sync")
class SyncSource(RolloutSource):
    """Sample, then learn, in this process.

    By default the learner's own model samples (today's numbers, unchanged). Two settings give
    the sampler weights of its own, refreshed from the learner in ``publish``:

    - ``rollout.simulated_staleness: k``: the batch of step b is sampled with the weights
      published after step max(0, b − k/m) (m optimiser steps per training step, so k versions
      ago when every step trains; the first k/m steps lag less). The snapshots still needed
      are part of the checkpoint, so a resumed run samples exactly what the straight run
      sampled. Deterministic, unlike real asynchrony: the test bed of the off-policy
      corrections, and the same rule as the async source's simulated mode.
    - ``rollout.dtype``: a sampler in another precision (a bf16 copy beside an fp32 learner).
    - ``rollout.engine: vllm``: a vLLM engine samples (``reasonrl.rollout.vllm_engine``), with the
      weights synced after every ``rollout.sync_every``-th step (and at the start, so a resumed
      run samples with the checkpoint's weights); each batch's ``policy_version`` is the version
      the engine holds. The engine is another implementation of the model, so the source is
      off-policy and the behaviour–learner mismatch is measured every step (``measure_mismatch``).

    With ``rollout.simulated_partial: j`` (and staleness) the stale weights sample only each
    completion's first j tokens; the rows still running continue under the learner's weights,
    after ``rollout.prefix_check`` decided their prefixes (``rollout.partial``).
    """

    def __init__(self, ctx: SourceContext) -> None:
        super().__init__(ctx)
        r = ctx.recipe
        self.k_steps = r.rollout.simulated_staleness // optimizer_steps_per_step(r)
        own_dtype = r.rollout.dtype is not None and r.rollout.dtype != r.model.dtype
        self.engine = uses_vllm(r)
        self.off_policy = self.measure_mismatch = self.engine
        self.off_policy = self.off_policy or self.k_steps > 0 or own_dtype
        if self.engine:
            self.behaviour = VLLMSampler(ctx.policy, r, ctx.log)
        else:
            self.behaviour = ctx.policy.sampling_copy(r.rollout.dtype) if self.off_policy else ctx.policy
        # simulated: published step -> (version, weights); step 0 holds the initial weights
        self.snapshots: dict[int, tuple[int, dict[str, torch.Tensor]]] = {}
        self.loaded: int | None = 0  # the published step whose weights are in ``self.behaviour``
        if self.k_steps:
            self.snapshots[0] = (0, ctx.policy.weights())
        self.partial = PartialRollout(self.behaviour, ctx.policy, r) if r.rollout.simulated_partial else None
        own = hasattr(ctx.task, "rollout_sampler")  # a task that runs its episodes (verifiers)
        self.episodes = rollout_sampler(self.behaviour, r, ctx.task) if r.env is not None or own else None

    @classmethod
    def check(cls, recipe, need) -> None:
        ro = recipe.rollout
        need(ro.engine != "ray", "rollout.engine: ray needs rollout.source: async")
        check_vllm(recipe, need)
        need(ro.workers == 1, "rollout.workers > 1 needs rollout.source: async with rollout.engine: ray")
        need(ro.max_staleness == 0, "rollout.max_staleness bounds an asynchronous sampler: it needs "
                                    "rollout.source: async (for a deterministic lag use rollout.simulated_staleness)")
        check_simulated_staleness(recipe, need)
        check_partial(recipe, need)

    def _sampling_step(self, step: int) -> int:
        usable = [p for p in self.snapshots if p <= max(0, step - self.k_steps)]
        return max(usable) if usable else min(self.snapshots)

    def start(self, version: int, step: int) -> "SyncSource":
        if self.engine:  # the learner's weights now (a resumed run's), not the model folder's
            self.behaviour.set_weights(self.ctx.policy.weights(), version)
        return self

    def next_batch(self, step, version, watch):
        sampled_version = version if not self.engine else self.behaviour.version
        if self.k_steps:
            chosen = self._sampling_step(step)
            sampled_version, weights = self.snapshots[chosen]
            if self.loaded != chosen:
                self.behaviour.set_weights(weights)
                self.loaded = chosen
        c = self.ctx
        sampler = self.partial.at(sampled_version, version) if self.partial else self.episodes or self.behaviour
        return collect(sampler, c.scorer, c.task, self.recipe, step, c.generator, sampled_version,
                       watch, c.sampler)

    def metrics(self) -> dict[str, float]:
        sampler = self.partial or self.episodes
        out = sampler.metrics() if sampler else {}
        if self.engine:
            out.update(self.behaviour.metrics())
        return out

    def publish(self, policy, version, step) -> None:
        if not self.off_policy:
            return
        if self.engine:
            if step < self.recipe.train.steps and step % self.recipe.rollout.sync_every == 0:
                self.behaviour.set_weights(policy.weights(), version)
            return
        if not self.k_steps:  # another precision, current weights
            self.behaviour.set_weights(policy.weights())
            return
        self.snapshots[step] = (version, policy.weights())
        # Keep the snapshot the next step samples with, and every newer one.
        oldest_needed = self._sampling_step(step)
        for p in [p for p in self.snapshots if p < oldest_needed]:
            del self.snapshots[p]

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.k_steps:
            state["snapshots"] = self.snapshots
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.k_steps:
            self.snapshots = dict(state["snapshots"])
            self.loaded = None
        elif self.off_policy and not self.engine:  # the sampler follows the restored learner (the engine: at start)
            self.behaviour.set_weights(self.ctx.policy.weights())

    def close(self) -> None:
        if hasattr(self.episodes, "close"):  # a verifiers task's rollout: its endpoint's threads and port
            self.episodes.close()
        if self.engine:
            self.behaviour.close()


def check_simulated_staleness(recipe, need) -> None:
    """Simulated staleness counts optimiser versions but lags whole training steps."""
    m = optimizer_steps_per_step(recipe)
    k = recipe.rollout.simulated_staleness
    need(k % m == 0, f"rollout.simulated_staleness={k} must be a multiple of the {m} optimiser steps one "
                     "training step makes (the sampler lags whole steps)")
