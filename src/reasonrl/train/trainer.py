"""The ``Trainer``: wires the stages together and runs the loop. No algorithm lives here.

A step runs the stages of ``reasonrl.dataflow.STAGES`` in order, one method each::

    rollout (prompt sampler → sample G per prompt → score) → select → extend_batch → token_reward
    → annotate → behaviour (behaviour/proximal log-probs, off-policy weights) → advantage
    → update (num_iterations passes over mini-batches, the Learner) → after_update

then ``source.publish(weights)`` and the next step.

No method is named here: components that own models or state come in through the method
hooks (``reasonrl.hooks``), optimisers and schedules through their registries
(``reasonrl.train.optim``), prompts through the prompt sampler (``reasonrl.rollout.samplers``), batches through the rollout
source (``reasonrl.rollout.sources``: sync, simulated staleness, async). Each batch records the
``policy_version`` (optimiser steps so far) that sampled it, so staleness is measured and bounded.
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from reasonrl.algos.kl import apply_kl_to_rewards
from reasonrl.algos.masked import last_token_mask, masked_mean
from reasonrl.batch import RolloutBatch
from reasonrl.dataflow import STAGE_NAMES
from reasonrl.params import ConfigError
from reasonrl.sections import Recipe
from reasonrl.evaluate.evaluator import EvalResult, Evaluator
from reasonrl.fsutil import atomic_write_text
from reasonrl.hooks import Method, MethodContext, build_methods, method_specs
from reasonrl.params import inject
from reasonrl.perf import Stopwatch
from reasonrl.policy.factory import build_policy
from reasonrl.registry import ADVANTAGES, KL_ESTIMATORS, ROLLOUT_SOURCES, SELECTORS, TOKEN_REWARDS
from reasonrl.rewards.scorer import build_scorer
from reasonrl.rewards.token_level import dense_token_rewards
from reasonrl.policy.attention import packed_unsupported
from reasonrl.rollout.collect import check_rollout_fits
from reasonrl.rollout.samplers import build_sampler
from reasonrl.rollout.sources import SourceContext
from reasonrl.tasks.base import build_task  # noqa: F401  (also part of this module's API)
from reasonrl.tasks.lengths import fit_prompt_lengths
from reasonrl.train import checkpoint as ckpt
from reasonrl.train.allocator import retain_freed_memory
from reasonrl.metrics_log import MetricsWriter, finite_or_none, read_metrics
from reasonrl.train.behaviour import prepare_behaviour
from reasonrl.train.fsdp import ShardedLearner, check_shardable, sharded
from reasonrl.train.guards import FlatSteps, check_prompt_characters, reward_metrics
from reasonrl.train.objective import batch_logprobs, policy_loss_fn, reduce_stats, zero_advantage_skip_blocker
from reasonrl.train.optim import Learner, build_learner
from reasonrl.train.progress import Progress
from reasonrl.train.samples import SampleWriter
from reasonrl.train.trackers import check_trackers, open_trackers

RECIPE_FILE = "recipe.json"


def seed_everything(seed: int) -> torch.Generator:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def outcome_token_rewards(batch: RolloutBatch) -> torch.Tensor:
    """The scalar reward placed on each completion's last trained token (verl's convention)."""
    return batch.rewards.unsqueeze(-1) * last_token_mask(batch.response_mask).float()


@dataclass
class TrainState:
    step: int = 0
    policy_version: int = 0
    base_eval: dict[str, float] = field(default_factory=dict)
    base_eval_ci: dict[str, tuple[float, float]] = field(default_factory=dict)
    base_eval_per_problem: dict[str, list[float]] = field(default_factory=dict)
    wall_seconds: float = 0.0
    nonfinite_streak: int = 0  # training steps in a row that skipped an update (train.max_nonfinite_steps)


class NonFiniteError(RuntimeError):
    """``train.max_nonfinite_steps`` steps in a row had a non-finite loss or gradient: the run stops
    (no such update was applied, so the weights and the checkpoints on disk are finite)."""


@dataclass
class _Step:
    """What the stages of one training step hand each other."""

    step: int
    watch: Stopwatch
    started: float
    batch: Any = None
    sampled: Any = None  # every row sampled this step (samples.jsonl), beside the rows trained on
    stats: Any = None
    metrics: dict[str, Any] = field(default_factory=dict)


class Trainer:
    def __init__(self, recipe: Recipe, run_dir: str | Path, resume: bool = False,
                 log: Callable[[str], None] | None = None) -> None:
        self.recipe = recipe
        self.run_dir = Path(run_dir)
        self.resume = resume
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))

    # -- set-up -------------------------------------------------------------
    def _setup(self) -> None:
        r = self.recipe
        if r.train.threads:
            torch.set_num_threads(r.train.threads)
        self.generator = seed_everything(r.train.seed)
        self.task = build_task(r)
        self.sampler = build_sampler(r, self.task)
        self.evaluator = Evaluator(r, self.task)
        self.samples: SampleWriter | None = None  # opened with the run folder (run)
        check_trackers(r.log.report_to)  # a missing extra fails now, not after the run folder exists
        # Reward workers are forked now, before the model exists, so they share no model pages.
        source = ROLLOUT_SOURCES.get(r.rollout.source)
        self.scorer = build_scorer(r).start() if source.scores_in_learner else None
        # After the fork above, so these workers' memory limits (relative RLIMIT_AS) hold exactly.
        retained = r.train.retain_memory and retain_freed_memory()
        if retained and self.scorer is not None and any(self.scorer.memory_mb):
            self.log("warning: train.retain_memory: a reward worker forked again later (after a timeout or a crash) "
                     "inherits this process's retained free memory, which its memory limit cannot see")
        self.selectors = [(SELECTORS.get(s.name), s.params) for s in r.selection]
        self.token_reward = (TOKEN_REWARDS.get(r.token_reward.name), r.token_reward.params) if r.token_reward else None
        self.policy = build_policy(r.model, log=self.log, decoder=r.rollout.decoder,
                                   gradient_checkpointing=r.train.gradient_checkpointing, precision=r.train.precision)
        check_prompt_characters(r, self.policy, self.task, self.evaluator, self.log)  # a tokenizer that cannot read them
        # Every prompt against the context, before anything tokenises a (possibly huge) row.
        fit_prompt_lengths(r, self.policy, self.task, self.evaluator, self.log)
        check_rollout_fits(r, self.policy, self.task)
        if r.train.length_buckets == 0 and r.train.share_prompt and not r.train.gradient_checkpointing:
            why = packed_unsupported(self.policy.model)
            if why is not None:
                raise ConfigError(f"train.length_buckets: 0 packs the training forward, which this model cannot run: "
                                  f"{why}; set train.length_buckets to 1 or more")
        # The reference model exists only when a KL term uses it.
        self.ref_policy = build_policy(r.model, log=self.log, trainable=False, precision=r.train.precision) \
            if r.loss.kl.coef > 0 else None
        if sharded():  # rank 0 of the FSDP2 learner (reasonrl.train.fsdp)
            check_shardable(r, method_specs(r))
            self.learner = ShardedLearner(self.policy, r)
        else:
            self.learner = build_learner(self.policy, r)  # the optimiser entry may bring its own (logra)
        self.methods = build_methods(r)
        if r.train.skip_zero_advantage:
            blocker = zero_advantage_skip_blocker(r, self._loss_terms(), self.learner)
            if blocker is not None:
                self.log(f"train.skip_zero_advantage: every row is computed, because {blocker}")
        self.flat_steps = FlatSteps(r, self.log)  # warns after train.warn_flat_steps steps with no learning signal
        self.source = source(SourceContext(
            recipe=r, policy=self.policy, scorer=self.scorer, task=self.task, sampler=self.sampler,
            generator=self.generator, log=self.log, learner=self.learner))
        ctx = MethodContext(recipe=r, policy=self.policy, run_dir=self.run_dir, log=self.log,
                            learner=lambda params, optim: Learner(params, optim, r.train.steps),
                            scorer=self.scorer, task=self.task, generator=self.generator, sampler=self.sampler)
        for _, method in self.methods:
            method.setup(ctx)
        self.state = TrainState()

    def setup(self) -> None:
        """Build the pieces without running the loop, for a driver that calls ``train_step``
        itself (a federated client: ``reasonrl.methods.fed_grpo.client``); ``close`` releases them."""
        self._setup()

    def close(self) -> None:
        """Stop the rollout source, the reward workers and the other learner ranks (the end of
        ``run``, or a driver's)."""
        self.source.close()
        self.learner.close()
        if self.scorer is not None:
            self.scorer.close()

    def state_dict(self) -> dict[str, Any]:
        """Everything but the weights that an exact resume needs (a checkpoint's ``state.pt``)."""
        return {
            **self.learner.state_dict(),  # optimizer, scheduler
            "rng": ckpt.rng_state(self.generator),
            "train_state": self.state.__dict__.copy(),
            "recipe": self.recipe.to_dict(),
            "source": self.source.state_dict(),  # the prompt sampler's state, the sampler's weights, batches sampled ahead
            "methods": {name: method.state_dict() for name, method in self.methods},
        }

    def _restore(self) -> None:
        self.load_state_dict(*ckpt.load_latest(self.run_dir, self.policy))
        self.log(f"resumed {self.run_dir} at step {self.state.step}")

    def load_state_dict(self, saved: dict[str, Any], folder: Path | None = None) -> None:
        """The inverse of :meth:`state_dict` (the weights are the caller's; ``folder``: the
        checkpoint's, for what the learner saved apart)."""
        self.learner.load_state_dict(saved, folder)
        ckpt.restore_rng(saved["rng"], self.generator)
        self.state = TrainState(**saved["train_state"])
        # Checkpoints from before rollout sources held the prompt sampler's state at the top level.
        self.source.load_state_dict(saved.get("source") or {"sampler": saved.get("sampler", {})})
        states = saved.get("methods")
        if states is None and self.methods:
            raise ConfigError(f"--resume {self.run_dir}: its checkpoint was written before method hooks existed; "
                              "it cannot restore the state of " + ", ".join(n for n, _ in self.methods))
        for name, method in self.methods:
            method.load_state_dict(states.get(name, {}))

    # -- the loop ------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        r = self.recipe
        started = time.perf_counter()
        try:
            self._setup()  # everything that can reject the input happens before the run folder exists
        except BaseException:
            if getattr(self, "scorer", None) is not None:
                self.scorer.close()
            raise
        if self.resume:
            try:  # a refused or foreign checkpoint must not leave the reward workers and samplers running
                self._restore()
            except BaseException:
                self.close()
                raise
        else:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / RECIPE_FILE).write_text(json.dumps(r.to_dict(), indent=1))
        wall_before = self.state.wall_seconds
        resume_step = self.state.step if self.resume else None
        trackers = open_trackers(r.log.report_to, self.run_dir, run_name=self.run_dir.name,
                                 experiment=r.log.experiment, mlflow_tracking_uri=r.log.mlflow_tracking_uri,
                                 config=r.to_dict(), resume_step=resume_step)
        writer = MetricsWriter(self.run_dir, resume_step=resume_step, trackers=trackers)
        self.samples = SampleWriter(self.run_dir, per_step=r.log.samples_per_step, eval_problems=r.log.samples_eval,
                                    max_mb=r.log.samples_max_mb, seed=r.train.seed, eos_id=self.policy.tokenizer.eos_token_id,
                                    correct_term=r.eval.reward, reward_names=[rw.name for rw in r.rewards],
                                    resume_step=resume_step, trackers=trackers)
        final_eval = EvalResult({})
        try:
            self.source.start(self.state.policy_version, self.state.step)  # an async sampler starts now
            if not self.resume and self.evaluator.problems:
                base = self.evaluator(self.policy)
                self._sample_eval(0, base)
                self.state.base_eval, self.state.base_eval_ci = base.metrics, base.intervals
                self.state.base_eval_per_problem = base.per_problem
                self.log(f"base accuracy {base.metrics['accuracy']:.3f} on {len(self.evaluator.problems)} held-out problems")
                writer.write(0, {f"eval/{k}": v for k, v in base.metrics.items()})
            progress = Progress(r.train.steps, initial=self.state.step, enabled=r.log.progress)
            while self.state.step < r.train.steps:
                step = self.state.step
                metrics = self.train_step(step)
                self.state.step = step + 1
                self.source.publish(self.policy, self.state.policy_version, self.state.step)
                if r.eval.every and self.state.step % r.eval.every == 0 and self.state.step < r.train.steps:
                    result = self.evaluator(self.policy)
                    self._sample_eval(self.state.step, result)
                    metrics.update({f"eval/{k}": v for k, v in result.metrics.items()})
                self.state.wall_seconds = wall_before + time.perf_counter() - started
                writer.write(self.state.step, metrics)
                progress.update(metrics)
                if self.state.step % r.train.checkpoint_every == 0 or self.state.step == r.train.steps:
                    ckpt.save_checkpoint(self.run_dir, self.state.step, self.policy, self.state_dict(),
                                         r.train.keep_checkpoints, self.learner)
            progress.close()
            final_eval = self.evaluator(self.policy)
            self._sample_eval(self.state.step, final_eval, final=True)
            if final_eval.metrics:
                writer.write(self.state.step, {f"eval/{k}": v for k, v in final_eval.metrics.items()})
        finally:
            writer.close()
            self.samples.close()
            self.close()
        merged = None
        if r.model.lora is not None and r.model.save_merged:
            from reasonrl.policy.lora import save_merged

            def merged(path: Path) -> None:
                save_merged(self.policy.model, self.policy.tokenizer, path)
        ckpt.save_final_model(self.run_dir, self.policy, merged)
        summary = self._summary(final_eval, wall_before + time.perf_counter() - started)
        if r.log.plots:
            from reasonrl.evaluate.plots import write_plots

            write_plots(read_metrics(self.run_dir), self.run_dir / "plots")
        return summary

    def train_step(self, step: int) -> dict[str, Any]:
        """One step: the stages of ``reasonrl.dataflow.STAGES``, in that order (each ``_<stage>``
        method below); a stage may end the step early (no rows left to train on)."""
        s = _Step(step, Stopwatch(), time.perf_counter())
        for stage in STAGE_NAMES:
            if getattr(self, f"_{stage}")(s) is False:
                self._sample_train(s)
                return s.metrics
        self._sample_train(s)
        r = self.recipe
        train_seconds = sum(s.watch.seconds[k] for k in ("forward", "backward", "optimizer"))
        tokens = float(s.batch.response_mask.sum())
        if train_seconds > 0:  # not on a step whose policy update was held
            s.metrics["perf/train_tokens_per_s"] = tokens * r.train.num_iterations / train_seconds
        s.metrics["train/rows"] = len(s.batch)
        s.metrics.update(s.watch.metrics())
        s.metrics["perf/step_s"] = round(time.perf_counter() - s.started, 4)
        return s.metrics

    def _sample_train(self, s: "_Step") -> None:
        """This step's sample of completions (numbered as its metrics row: step + 1)."""
        if self.samples is not None:
            self.samples.train(s.step + 1, s.batch, s.sampled)

    def _sample_eval(self, step: int, result: EvalResult, final: bool = False) -> None:
        if self.samples is not None and result.completions:
            self.samples.eval(step, self.evaluator.problems, result.completions, result.per_problem["accuracy"], final,
                              result.per_problem.get("env_reward"))

    # -- the stages, in STAGES order -----------------------------------------------------
    def _rollout(self, s: "_Step") -> None:
        s.batch, s.sampled, s.stats = self.source.next_batch(s.step, self.state.policy_version, s.watch)
        s.metrics = {**self._rollout_metrics(s.sampled, s.stats), **self.source.metrics()}
        self.flat_steps.observe(s.step, s.metrics)

    def _select(self, s: "_Step") -> None:
        pipeline = {"step": s.step, "total_steps": self.recipe.train.steps}
        for (select, params), spec in zip(self.selectors, self.recipe.selection):
            selected = inject(select, (s.batch,), pipeline, params)
            s.batch, extra = selected if isinstance(selected, tuple) else (selected, {})
            s.metrics.update({f"selection/{spec.name}/{k}": v for k, v in extra.items()})

    def _extend_batch(self, s: "_Step") -> None:
        for _, method in self.methods:  # e.g. guided continuations for groups that all failed
            s.batch, extra = method.extend_batch(s.batch, s.step)
            s.metrics.update(extra)

    def _token_reward(self, s: "_Step") -> None:
        if self.token_reward is not None:  # only for the rows that will be trained on
            with s.watch("score"):
                fn, params = self.token_reward
                s.batch.dense_rewards = dense_token_rewards(self.policy.tokenizer, s.batch, fn, params)
        # Sampling is over: the rows to train on are final. An async source samples elsewhere and
        # reports that time as sampler_sample.
        sample_s = s.watch.seconds.get("sample") or s.watch.seconds.get("sampler_sample", 0.0)
        s.metrics["perf/sample_tokens_per_s"] = s.stats.sampled_tokens / max(sample_s, 1e-9)

    def _annotate(self, s: "_Step") -> bool:
        if len(s.batch) == 0:
            s.metrics["skipped"] = 1  # every group agreed on its reward: nothing to learn from
            s.metrics["lr"] = self.learner.end_step()  # the schedule counts training steps, skipped or not
            return False
        with s.watch("logprob"):
            for _, method in self.methods:
                s.metrics.update(method.annotate(s.batch, s.step))
        return True

    def _behaviour(self, s: "_Step") -> None:
        with s.watch("logprob"):
            s.metrics.update(prepare_behaviour(s.batch, self.recipe, self.policy, self.state.policy_version,
                                               self.source.off_policy, self.source.measure_mismatch))

    def _advantage(self, s: "_Step") -> None:
        with s.watch("logprob"):
            self._prepare_advantages(s.batch, s.step)

    def _update(self, s: "_Step") -> None:
        if any(method.holds_policy(s.step) for _, method in self.methods):
            s.metrics["policy_held"] = 1  # e.g. a critic's warm-up: the policy waits for its baseline
            s.metrics["lr"] = self.learner.end_step()
        else:
            s.metrics.update(self._optimise(s.batch, s.watch))
            self._guard_nonfinite(s.step, s.metrics)

    def _after_update(self, s: "_Step") -> None:
        with s.watch("methods"):
            for _, method in self.methods:
                s.metrics.update(method.after_update(s.batch, s.step))

    def _prepare_advantages(self, batch: RolloutBatch, step: int) -> None:
        r = self.recipe
        mb, temp, share, buckets = r.train.micro_batch_size, r.rollout.temperature, r.train.share_prompt, r.train.length_buckets
        if self.ref_policy is not None:
            batch.ref_logprobs = batch_logprobs(self.ref_policy, batch, mb, temp, share, buckets)
        # Credit is computed on every trained token; masking truncated rows is the loss's business
        # (as in TRL), so a masked row still counts in its group's baseline.
        mask = batch.response_mask
        batch.token_rewards = outcome_token_rewards(batch)
        if self.ref_policy is not None and r.loss.kl.in_reward:
            logp = batch.old_logprobs if batch.old_logprobs is not None else batch_logprobs(self.policy, batch, mb, temp, share, buckets)
            kl = KL_ESTIMATORS.get(r.loss.kl.estimator)(logp, batch.ref_logprobs)
            batch.token_rewards = apply_kl_to_rewards(batch.token_rewards, kl, mask, r.loss.kl.coef)
        # The batch.aux keys an advantage declares reading (the critic's ``values``) reach it by name.
        batch.advantages = inject(ADVANTAGES.get(r.advantage.name), (batch.token_rewards, mask, batch.group_ids),
                                  {**batch.aux, "batch": batch, "step": step, "total_steps": r.train.steps},
                                  r.advantage.params)

    def _optimise(self, batch: RolloutBatch, watch: Stopwatch) -> dict[str, float]:
        r = self.recipe
        terms = self._loss_terms()
        # The learner's own policy: the same object in one process, the sharded copy under FSDP
        # (a user's optimiser may bring a learner that does not name it: then it trains ours).
        loss_fn = policy_loss_fn(self.learner.policy or self.policy, r, terms, self.learner)
        sums, norms = self.learner.optimise(batch, loss_fn, passes=r.train.num_iterations,
                                            mini_batch_size=r.train.mini_batch_size,
                                            micro_batch_size=r.train.micro_batch_size, watch=watch)
        # A skipped update (non-finite loss or gradient) still counts as a version: the samplers
        # wait on version numbers, and the weights it "published" are simply unchanged.
        self.state.policy_version += len(norms)
        finite = [n for n in norms if math.isfinite(n)]
        return {**reduce_stats(sums, len(norms)), **self.learner.metrics(),
                "grad_norm": sum(finite) / len(finite) if finite else math.nan,
                "lr": self.learner.end_step(), "policy_version": self.state.policy_version}

    def _loss_terms(self) -> list:
        """The methods' extra loss terms (those that override ``Method.loss_term``)."""
        return [m.loss_term for _, m in self.methods if type(m).loss_term is not Method.loss_term]

    def _guard_nonfinite(self, step: int, metrics: dict[str, Any]) -> None:
        """Log the updates the learner skipped for a non-finite loss or gradient norm; stop the run
        after ``train.max_nonfinite_steps`` steps in a row with one. The LR schedule still advances
        on such a step (it counts training steps, as on a step with nothing to learn from)."""
        skipped = self.learner.skipped
        if not skipped:
            self.state.nonfinite_streak = 0
            return
        self.state.nonfinite_streak += 1
        metrics["train/nonfinite_updates"] = len(skipped)
        limit, streak = self.recipe.train.max_nonfinite_steps, self.state.nonfinite_streak
        what = "; ".join(skipped)
        # Steps are named as in metrics.jsonl (the count of training steps done after this one).
        self.log(f"warning: step {step + 1}: skipped {len(skipped)} update(s) ({what}); {streak} such step(s) "
                 f"in a row, the run stops at train.max_nonfinite_steps={limit}")
        if streak >= limit:
            saved = ckpt.list_checkpoints(self.run_dir)
            raise NonFiniteError(
                f"step {step + 1}: {streak} training steps in a row (train.max_nonfinite_steps={limit}) had a "
                f"non-finite loss or gradient; last: {what}. No such update was applied, so "
                + (f"the last checkpoint, {saved[-1]}, is intact" if saved else "no checkpoint was written yet")
                + ". Look for huge or NaN rewards or advantages (reward/* and reward_failures/* in "
                "metrics.jsonl), or lower optim.lr")

    def _rollout_metrics(self, sampled: RolloutBatch, stats) -> dict[str, Any]:
        lengths = sampled.completion_mask.sum(-1).float()
        m: dict[str, Any] = {
            "reward/mean": float(sampled.rewards.mean()),
            "reward/std": float(sampled.rewards.std()) if len(sampled) > 1 else 0.0,
            "response_length/mean": float(lengths.mean()),
            "response_length/max": float(lengths.max()),
            "truncated_fraction": float(sampled.truncated.float().mean()),
            "zero_variance_group_fraction": stats.zero_variance_groups / max(stats.sampled_groups, 1),
            "sampling_rounds": stats.rounds,
            **stats.prompt_sampler_metrics,
            # Entropy of the sampling distribution estimated over every sampled row, so methods that
            # train on a subset (GRPODropout) compare fairly with those that do not.
            "rollout/neg_logprob": float(-masked_mean(sampled.sample_logprobs, sampled.response_mask)),
        }
        # reward/<name> and reward_failures/<name>, a file's function named by its function's name
        m.update(reward_metrics(sampled.meta, stats.reward_failures, [rw.name for rw in self.recipe.rewards]))
        return m

    def _summary(self, final_eval: EvalResult, wall: float) -> dict[str, Any]:
        summary = {
            "run_dir": str(self.run_dir),
            "steps": self.state.step,
            "base_accuracy": self.state.base_eval.get("accuracy"),
            "final_accuracy": final_eval.metrics.get("accuracy"),
            "base_eval": {k: finite_or_none(v) for k, v in self.state.base_eval.items()},
            "final_eval": {k: finite_or_none(v) for k, v in final_eval.metrics.items()},
            "base_eval_ci": {k: list(v) for k, v in self.state.base_eval_ci.items()},
            "final_eval_ci": {k: list(v) for k, v in final_eval.intervals.items()},
            "base_eval_per_problem": self.state.base_eval_per_problem,
            "final_eval_per_problem": final_eval.per_problem,
            "wall_seconds": round(wall, 2),
        }
        atomic_write_text(self.run_dir / "summary.json", json.dumps(summary, indent=1))
        return summary
