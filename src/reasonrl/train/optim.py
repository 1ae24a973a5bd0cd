"""Optimisers, LR schedules, and the one optimisation loop every learner uses.

``OPTIMIZERS`` builders are called as ``build(parameters, *, lr, betas, weight_decay, **params)``
and return a ``torch.optim.Optimizer``; ``SCHEDULES`` are LR multipliers after warm-up,
``schedule(step, total) -> float`` with ``step`` counted from the end of warm-up. A recipe
names both in ``optim:`` (``{name: adamw, schedule: cosine}``), or names its own
(``"my_optim.py:build"``).

:class:`Learner` owns one model's trainable parameters, its optimiser, its schedule and its
gradient clipping, and runs passes over mini-batches with micro-batched backward. The
policy and every auxiliary model that learns (the CoRA teacher, later critics and
explorers) go through it, so there is one copy of that loop, and of its guard: an update
whose loss or gradient norm is not finite is skipped, not applied.
"""

from __future__ import annotations

import math
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
import torch.distributed.checkpoint as dcp
from torch import Tensor
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_state_dict, set_model_state_dict,
                                                     set_state_dict)

from reasonrl.batch import RolloutBatch
from reasonrl.sections import OptimConfig
from reasonrl.registry import OPTIMIZERS, SCHEDULES

__all__ = ["adamw", "sgd", "lr_multiplier", "Learner", "LossFn", "build_learner"]


@OPTIMIZERS.register("adamw")
def adamw(parameters: list[Tensor], *, lr: float, betas: tuple[float, float], weight_decay: float,
          fused: bool = True, eps: float = 1e-8) -> torch.optim.Optimizer:
    """AdamW (Loshchilov & Hutter 2019). ``fused``: the single-kernel implementation, about 4×
    faster than the per-tensor loop on CPU (benchmarks/vs_trl.py); the results agree to float
    rounding, not bit for bit."""
    return torch.optim.AdamW(parameters, lr=lr, betas=betas, weight_decay=weight_decay, eps=eps,
                             **({"fused": True} if fused else {}))


@OPTIMIZERS.register("sgd")
def sgd(parameters: list[Tensor], *, lr: float, betas: tuple[float, float], weight_decay: float,
        momentum: float = 0.0, nesterov: bool = False) -> torch.optim.Optimizer:
    """SGD with optional (Nesterov) momentum; ``betas`` is not used."""
    return torch.optim.SGD(parameters, lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)


def _fraction(step: int, total: int) -> float:
    return min(1.0, step / max(1, total))


@SCHEDULES.register("constant")
def constant(step: int, total: int) -> float:
    """η_t = η."""
    return 1.0


@SCHEDULES.register("linear")
def linear(step: int, total: int) -> float:
    """η_t = η·(1 − t/T): linear decay to 0 at the last step."""
    return 1.0 - _fraction(step, total)


@SCHEDULES.register("cosine")
def cosine(step: int, total: int) -> float:
    """η_t = η·½(1 + cos(π t/T)) (Loshchilov & Hutter 2017, without restarts)."""
    return 0.5 * (1.0 + math.cos(math.pi * _fraction(step, total)))


def lr_multiplier(step: int, warmup: int, total: int, schedule: Callable[[int, int], float]) -> float:
    """Linear warm-up over ``warmup`` steps ((step + 1)/warmup), then ``schedule`` over the rest."""
    if step < warmup:
        return (step + 1) / warmup
    return schedule(step - warmup, total - warmup)


# loss_fn(micro, mini, pass_index, micro_index) -> (loss to back-propagate, summed statistics)
LossFn = Callable[[RolloutBatch, RolloutBatch, int, int], tuple[Tensor, dict[str, float]]]


def build_learner(policy, recipe) -> "Learner":
    """The policy's learner: a :class:`Learner` over its trainable parameters, or the subclass
    an optimiser entry names as its ``learner`` attribute, built from the policy and the recipe
    (an optimiser that needs the model's layers and the batch, e.g. LoGRA)."""
    cls = getattr(OPTIMIZERS.get(recipe.optim.name), "learner", None)
    if cls is not None:
        return cls(policy, recipe)
    learner = Learner(policy.parameters(), recipe.optim, recipe.train.steps)
    learner.policy = policy
    return learner


class Learner:
    """One model's optimiser, LR schedule and gradient clipping, and the optimisation loop.

    ``optimise`` runs ``passes`` passes over ``batch`` in mini-batches of ``mini_batch_size``
    rows (0: the whole batch), one optimiser step per mini-batch, each the sum of the losses
    that ``loss_fn`` returns for its micro-batches (gradient accumulation: the loss function
    aggregates with the mini-batch's totals, so the split does not change the step).
    ``end_step`` advances the LR schedule once per training step.

    A mini-batch whose loss (any micro-batch's) or gradient norm is not finite makes no update:
    its gradient is dropped (:meth:`skip`), the parameters and the optimiser's state (Adam's
    moments and step count) stay as they were, and ``skipped`` says why, one line per skipped
    update of the last ``optimise`` call. The caller decides how many in a row end the run
    (the Trainer: ``train.max_nonfinite_steps``).
    """

    policy = None
    """The policy whose parameters this learner trains, when it trains one (``build_learner``):
    the trainer computes the loss with it, and a sharded checkpoint (``learner/``) loads into it."""

    row_skipping = True
    """Whether the loss function may leave out rows whose gradient is exactly zero
    (``train.skip_zero_advantage``); a learner that needs every row sets False (LoGRA's hooks look at
    every row's activations; FSDP2 ranks must make the same forward calls)."""

    def __init__(self, parameters: Iterable[Tensor], cfg: OptimConfig, total_steps: int) -> None:
        self.parameters = [p for p in parameters if p.requires_grad]
        self.cfg = cfg
        build = OPTIMIZERS.get(cfg.name)
        self.optimizer = build(self.parameters, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, **cfg.params)
        schedule = SCHEDULES.get(cfg.schedule)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_multiplier(s, cfg.warmup_steps, total_steps, schedule))

    def optimise(self, batch: RolloutBatch, loss_fn: LossFn, *, passes: int = 1, mini_batch_size: int = 0,
                 micro_batch_size: int, watch: Any = None) -> tuple[dict[str, float], list[float]]:
        """Returns the statistics summed over every micro-batch of every pass, and the gradient
        norm (before clipping) of each optimiser step (NaN or inf for a skipped one)."""
        timed = watch or (lambda _name: nullcontext())
        sums: dict[str, float] = {}
        norms: list[float] = []
        self.skipped: list[str] = []
        for p in range(passes):
            for i, mini in enumerate(batch.split(mini_batch_size or len(batch))):
                self.begin_step(mini)
                bad_loss = None
                for j, (micro, weight) in enumerate(self.micro_batches(mini, micro_batch_size)):
                    with timed("forward"):
                        loss, stats = loss_fn(micro, mini, p, j)
                    if not weight:  # a stand-in that only keeps this rank in step with the others
                        loss, stats = loss * 0.0, {}
                    with timed("backward"):
                        loss.backward()
                    value = float(loss.detach())
                    if bad_loss is None and not math.isfinite(value):
                        bad_loss = f"loss {value} (micro-batch {j})"
                    for k, v in stats.items():
                        sums[k] = sums.get(k, 0.0) + v
                bad_loss = self.agree(bad_loss)
                with timed("optimizer"):
                    # A non-finite loss is not stepped on even when its gradient happens to be finite.
                    norm = self.step(mini) if bad_loss is None else math.nan
                    if bad_loss is not None or not math.isfinite(norm):
                        self.skip(mini)
                        self.skipped.append(f"pass {p}, mini-batch {i}: non-finite "
                                            + (bad_loss or f"gradient norm {norm}"))
                norms.append(norm)
        return self.total(sums), norms

    # The seams of the loop; an optimiser that needs the model and the mini-batch (LoGRA's
    # sketch hooks and probe, ``reasonrl.methods.logra.optimizer``) brings a subclass that overrides them.
    def begin_step(self, mini: RolloutBatch) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    # The seams a learner over several ranks (``reasonrl.train.fsdp.ShardedLearner``) overrides.
    def micro_batches(self, mini: RolloutBatch, size: int) -> list[tuple[RolloutBatch, float]]:
        """The micro-batches this process back-propagates, each with its weight (0: a stand-in)."""
        return [(micro, 1.0) for micro in mini.split(size)]

    def agree(self, bad_loss: str | None) -> str | None:
        """Why the mini-batch's update is skipped (None: it is not), agreed by every rank."""
        return bad_loss

    def total(self, sums: dict[str, float]) -> dict[str, float]:
        """The statistics summed over every rank's micro-batches."""
        return sums

    def step(self, mini: RolloutBatch) -> float:
        """Clip, step; returns the gradient norm before clipping. A non-finite norm changes
        nothing (no optimiser step): the loop then calls :meth:`skip`."""
        norm = float(torch.nn.utils.clip_grad_norm_(self.parameters, self.cfg.max_grad_norm))
        if math.isfinite(norm):
            self.optimizer.step()
        return norm

    def skip(self, mini: RolloutBatch) -> None:
        """Drop the mini-batch's gradient without an update (its loss or gradient was not finite)."""
        self.optimizer.zero_grad(set_to_none=True)

    def metrics(self) -> dict[str, float]:
        """The optimiser's own metrics since the last call (logged with the step)."""
        return {}

    def end_step(self) -> float:
        """Advance the schedule by one training step; returns the LR that step used."""
        lr = self.scheduler.get_last_lr()[0]
        with warnings.catch_warnings():
            # A step with no optimiser step (nothing to learn from, or the policy held for a critic's
            # warm-up) still counts in the schedule; torch warns about exactly that order.
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")
            self.scheduler.step()
        return lr

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def save(self, folder: Path) -> None:
        """Write what ``state_dict`` leaves out into a checkpoint folder (nothing: all of it is there)."""

    def load_state_dict(self, state: dict[str, Any], folder: Path | None = None) -> None:
        """Restore ``state`` (``state_dict``'s); a checkpoint ``folder`` written by several ranks
        holds the optimiser (and the weights) in ``learner/`` instead (``reasonrl.train.fsdp``),
        which loads into this one process's policy and optimiser."""
        if folder is not None and (folder / SHARDED_DIR).is_dir():
            load_sharded(self.policy.model, self.optimizer, folder / SHARDED_DIR)
        else:
            self.optimizer.load_state_dict(state["optimizer"])
        if "scheduler" in state:
            self.scheduler.load_state_dict(state["scheduler"])
            # The schedule decides the LR (a sharded checkpoint's groups may be any rank's copy).
            for group, lr in zip(self.optimizer.param_groups, self.scheduler.get_last_lr()):
                group["lr"] = lr

    def close(self) -> None:
        """Release what the learner holds beyond this process (other ranks: ``ShardedLearner``)."""


# A checkpoint's torch.distributed.checkpoint folder: the learner's model and optimiser state,
# keyed by parameter names, so any number of ranks (one included) reads what any number wrote.
SHARDED_DIR = "learner"


def sharded_state(model, optimizer, with_optimizer: bool | None = None) -> dict[str, Any]:
    """The model's and optimiser's state as torch.distributed.checkpoint saves and loads it:
    keyed by parameter names, each rank's shards as DTensors (plain tensors in one process).
    An optimiser that has not stepped yet is left out (``with_optimizer`` None): reading its
    state would make torch create it with a zero-gradient step that counts in Adam's bias
    correction (a run whose first steps hold the policy, e.g. a critic's warm-up)."""
    if with_optimizer is None:
        with_optimizer = bool(optimizer.state)
    if not with_optimizer:
        return {"model": get_model_state_dict(model)}
    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optim_state}


def load_sharded(model, optimizer, folder: Path) -> None:
    """Load a ``learner/`` folder into ``model`` and ``optimizer`` (sharded or not, whatever the
    number of ranks that wrote it); every rank of the model calls it."""
    saved = dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    state = sharded_state(model, optimizer, with_optimizer=any(k.startswith("optim.") for k in saved))
    dcp.load(state, checkpoint_id=str(folder))
    if "optim" in state:
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    else:
        set_model_state_dict(model, state["model"])
