"""The method hooks: one protocol for components that own models or state.

A method (a teacher, a critic, an explorer, a synthesiser, a federated client's extras) is a
class registered in ``METHODS`` and named in the recipe's ``methods:`` list (or enabled by a
section of its own, as ``teacher:`` enables ``residual_teacher``). The Trainer never names a
method; it calls these hooks at their stages of ``reasonrl.dataflow.STAGES``, every step::

    rollout → select → [extend_batch] → token_reward → [annotate] → behaviour → advantage
    → update (+ [loss_term]) → [after_update]

- ``check(recipe, need, config)`` (a classmethod): when the recipe loads, rules that depend on
  other sections (``need(cond, message)`` fails the load with a ConfigError).
- ``setup(ctx)``: once, before training (or resuming): build models and learners. ``ctx`` has
  the recipe, the policy, the run folder, a log function and ``ctx.learner(params, optim)``,
  which gives the method the same optimisation loop the policy uses.
- ``extend_batch(batch, step)``: on the scored, selected batch, before ``annotate``: returns
  the batch to train on (rows replaced or added, each scored; e.g. ARG's guided continuations
  for groups that all failed) and metrics. The default returns the batch unchanged.
- ``annotate(batch, step)``: on the scored, selected batch, before advantages; may write the
  ``batch.aux`` keys it declares in ``produces``, and add a reward term to ``batch.rewards``
  (declared as ``reasonrl.dataflow.REWARDS``): the advantage sees the sum, while the prompt
  sampler, dynamic sampling, the selectors and the ``reward/*`` metrics saw the scored rewards
  before it. Returns metrics.
- ``loss_term(inputs)``: a term added to the policy's loss on every micro-batch of the policy
  update (``inputs``: ``reasonrl.train.objective.TermInputs`` — the micro-batch, its mini-batch,
  the policy's completion logits and log-probs with gradient, the loss mask, and ``aggregate``
  with the mini-batch's totals, so the term does not depend on the split). Returns
  ``(loss, stats)``; stats named ``token/<name>`` are token sums, logged as their token mean.
  Only methods that override it are called (a distillation teacher, a self-distillation view).
- ``after_update(batch, step)``: after the policy's optimiser steps, on the same batch; may
  read the keys it declares in ``consumes`` (e.g. the advantages' verifier part). Returns the
  method's metrics for the step's row (its own counters too: there is no separate metrics hook).
- ``holds_policy(step)``: True skips the policy's optimiser step this step (the batch is still
  annotated and ``after_update`` still runs). One method uses it, PPO's critic warming up before
  the policy follows it (verl's ``critic_warmup``); it is a hook, not a Trainer setting, because
  only the method knows when its baseline is ready, and the Trainer must not name a method.
- ``state_dict()`` / ``load_state_dict(state)``: everything an exact resume needs (weights of
  what it trains, optimiser state, RNG streams it owns). Saved in every checkpoint.

Keys a method writes and reads are declared (``declared_keys``) and checked with every other
stage's when the recipe loads (``reasonrl.dataflow``): a reader without a writer is a
recipe error, not a KeyError at step 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from reasonrl.registry import METHODS, ROLLOUT_SOURCES

if TYPE_CHECKING:  # annotations only: loading a recipe (which reads these hooks) imports no torch
    from reasonrl.batch import RolloutBatch

__all__ = ["Method", "MethodContext", "build_methods", "method_specs", "need_learner_scorer"]


@dataclass
class MethodContext:
    """What a method's ``setup`` receives."""

    recipe: Any
    policy: Any
    run_dir: Path
    log: Callable[[str], None]
    learner: Callable[..., Any] = field(repr=False, default=None)
    """``learner(parameters, optim_config) -> reasonrl.train.optim.Learner``."""
    scorer: Any = field(repr=False, default=None)
    """The run's reward scorer (``reasonrl.rewards.scorer.Scorer``) for a method that samples and
    scores rollouts of its own (a teacher's screening, guided continuations); None where the
    rollout source scores elsewhere (async)."""
    task: Any = field(repr=False, default=None)
    generator: Any = field(repr=False, default=None)
    """The run's random generator: draws from it are restored on resume with the run's state."""
    sampler: Any = field(repr=False, default=None)
    """The run's prompt sampler (``reasonrl.rollout.samplers``), for a method that feeds it what
    only a method can measure (the hindsight regrets of ``hindsight_regret``)."""


class Method:
    """Base class of the method hooks; every hook is optional (the defaults do nothing)."""

    section: ClassVar[str | None] = None
    """A recipe section whose presence enables this method with that section as its config
    (``teacher:`` for ``residual_teacher``); methods named in ``methods:`` leave it None. Only the
    residual teacher has one, because ``teacher:`` is a published recipe key; a new method takes
    its settings as parameters of its ``methods:`` entry instead."""

    writes: ClassVar[tuple[str, ...]] = ()
    """Every ``batch.aux`` key it can write, whatever its configuration: named in the error a
    recipe gets when a stage reads one of them and this method is missing."""

    @classmethod
    def declared_keys(cls, config: Any) -> dict[str, tuple[tuple[str, ...], ...]]:
        """``{"annotate": (produces, consumes[, optional]), "extend_batch": ..., "loss_term": ...,
        "after_update": ...}`` for this configuration: the keys each hook writes and reads (aux keys,
        ``meta:<key>`` and ``REWARDS``: ``reasonrl.dataflow``); ``optional`` keys are read when present."""
        return {}

    @classmethod
    def check(cls, recipe: Any, need: Callable[[bool, str], None], config: Any) -> None:
        """Recipe rules of this method that depend on other sections (e.g. an ``env`` with two
        channels), called when the recipe loads: ``need(cond, message)`` makes a ConfigError of
        a failed rule. ``config`` is what the constructor gets (section object or parameters)."""

    def setup(self, ctx: MethodContext) -> None:
        pass

    def extend_batch(self, batch: RolloutBatch, step: int) -> tuple[RolloutBatch, dict[str, float]]:
        return batch, {}

    def annotate(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        return {}

    def loss_term(self, inputs: Any) -> tuple[Any, dict[str, float]]:
        raise NotImplementedError  # never called unless overridden (see the module docstring)

    def after_update(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        return {}

    def holds_policy(self, step: int) -> bool:
        return False

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def need_learner_scorer(recipe: Any, need: Callable[[bool, str], None], what: str) -> None:
    """The load-time rule of a method that samples and scores rollouts of its own with
    ``ctx.scorer`` (a teacher's screening, guided continuations, synthetic tasks): the rollout
    source must score in the learner; one that scores in its samplers (async) leaves the
    methods no scorer. ``what``: what the method does there, for the message."""
    source = recipe.rollout.source
    need(getattr(ROLLOUT_SOURCES.get(source), "scores_in_learner", False),
         f"{what} with the run's reward functions in the learner; rollout.source '{source}' scores elsewhere: "
         "use rollout.source 'sync'")


def learner_scorer(ctx: "MethodContext", name: str, what: str) -> Any:
    """``ctx.scorer`` for a method that scores rollouts of its own (``need_learner_scorer`` is the
    same rule at load; this guards a method built by hand). ``what``: what it scores."""
    if ctx.scorer is None:
        raise ValueError(f"method '{name}' scores {what} with the run's scorer; this rollout source scores "
                         "elsewhere: use rollout.source: sync")
    return ctx.scorer


def method_specs(recipe: Any) -> list[tuple[str, type, Any]]:
    """The recipe's methods as (name, class, config): those enabled by their own section first
    (in registry order), then the ``methods:`` list in its order. ``config`` is the section
    object, or the parameter mapping of a ``methods:`` entry."""
    specs = []
    for name in METHODS.names():
        cls = METHODS.get(name)
        section = getattr(cls, "section", None)
        if section and getattr(recipe, section, None) is not None:
            specs.append((name, cls, getattr(recipe, section)))
    for entry in recipe.methods:
        specs.append((entry.name, METHODS.get(entry.name), entry.params))
    return specs


def build_methods(recipe: Any) -> list[tuple[str, Method]]:
    """Instantiate the recipe's methods (``setup`` is the Trainer's to call)."""
    out = []
    for name, cls, config in method_specs(recipe):
        if callable(getattr(cls, "metrics", None)):  # a hook that was folded into after_update
            raise TypeError(f"method '{name}' ({cls.__qualname__}) defines metrics(), which the Trainer no longer "
                            "calls: return those metrics from after_update(batch, step) instead")
        method = cls(config) if getattr(cls, "section", None) and not isinstance(config, dict) else cls(**config)
        out.append((name, method))
    return out
