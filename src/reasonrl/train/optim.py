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
from typing import Any, Callable, Iterable

import torch
from torch import Tensor

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
    return Learner(policy.parameters(), recipe.optim, recipe.train.steps)


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
                for j, micro in enumerate(mini.split(micro_batch_size)):
                    with timed("forward"):
                        loss, stats = loss_fn(micro, mini, p, j)
                    with timed("backward"):
                        loss.backward()
                    value = float(loss.detach())
                    if bad_loss is None and not math.isfinite(value):
                        bad_loss = f"loss {value} (micro-batch {j})"
                    for k, v in stats.items():
                        sums[k] = sums.get(k, 0.0) + v
                with timed("optimizer"):
                    # A non-finite loss is not stepped on even when its gradient happens to be finite.
                    norm = self.step(mini) if bad_loss is None else math.nan
                    if bad_loss is not None or not math.isfinite(norm):
                        self.skip(mini)
                        self.skipped.append(f"pass {p}, mini-batch {i}: non-finite "
                                            + (bad_loss or f"gradient norm {norm}"))
                norms.append(norm)
        return sums, norms

    # The seams of the loop; an optimiser that needs the model and the mini-batch (LoGRA's
    # sketch hooks and probe, ``reasonrl.methods.logra.optimizer``) brings a subclass that overrides them.
    def begin_step(self, mini: RolloutBatch) -> None:
        self.optimizer.zero_grad(set_to_none=True)

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

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if "scheduler" in state:
            self.scheduler.load_state_dict(state["scheduler"])
