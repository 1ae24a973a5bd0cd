"""The FSDP2 learner: ``train.nproc`` ranks (torch.distributed processes) train one sharded policy.

Who does what. Rank 0 is the whole trainer of one process (prompt sampler, rollout source,
rewards, selectors, methods, advantages, metrics, checkpoints) with a full copy of the policy
that samples and computes behaviour and reference log-probs. Every rank, rank 0 included, holds
a shard of the trained copy (``fully_shard`` per decoder layer and on the root, as verl's and
prime-rl's FSDP2 workers do) and the optimiser state of its shard. In each optimisation call
rank 0 sends the scored batch (advantages and all) to the other ranks; each mini-batch's
micro-batches are dealt out across ranks, each computed with the whole mini-batch's totals
(``reasonrl.train.objective``), so the gradients summed over ranks (a SUM reduce-scatter) are
the single-process gradient and the step does not depend on the split; clipping and AdamW run
on the shards. Then the full weights are gathered, tensor by tensor, into rank 0's copy.

Why one sampler rather than each rank sampling its share: a sharded model samples only when
every rank joins every decode step (each layer's all-gather), so ranks whose sequences end at
different times would wait on each other token by token; one sampler also keeps the batch, its
random stream and its rewards exactly those of the single-process run (so the equality test can
hold). Sampling scales apart from the learner, as in verl and OpenRLHF: asynchronous Ray
rollout workers (``rollout.source: async``, ``engine: ray``) or an inference engine.

The other ranks run :func:`follow`: a loop over the commands rank 0 broadcasts on a gloo group
(``optimise``, ``save``, ``load``, ``stop``); each is the same :class:`ShardedLearner` method on
every rank, rank 0's call sending the command first, so the collectives inside line up.

Checkpoints: ``learner/`` in each checkpoint folder is a ``torch.distributed.checkpoint`` of the
sharded model and optimiser, keyed by parameter names, so a run saved by N ranks resumes with
any number of ranks, one included (``Learner.load_state_dict``); rank 0 also writes the full
weights (``model/``) and the rest of the state (``state.pt``) as one process does.
"""

from __future__ import annotations

import copy
import math
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from reasonrl.batch import RolloutBatch
from reasonrl.devices import resolve_device
from reasonrl.params import ConfigError
from reasonrl.policy.factory import build_policy
from reasonrl.policy.hf import HFPolicy
from reasonrl.policy.lora import base_model
from reasonrl.hooks import Method
from reasonrl.registry import OPTIMIZERS, POLICY_LOSSES
from reasonrl.train.allocator import retain_freed_memory
from reasonrl.train.objective import policy_loss_fn, takes_group_ids
from reasonrl.train.optim import SHARDED_DIR, Learner, sharded_state

__all__ = ["ShardedLearner", "follow", "init_ranks", "rank_and_size", "shard_model", "sharded"]


def sharded() -> bool:
    """Whether this process is a learner rank (``init_ranks`` ran): its trainer uses FSDP2."""
    return dist.is_available() and dist.is_initialized()


def rank_and_size() -> tuple[int, int]:
    """This process's rank and the number of ranks (0, 1 outside torch.distributed)."""
    return (dist.get_rank(), dist.get_world_size()) if sharded() else (0, 1)


def init_ranks(recipe) -> torch.device:
    """Join the process group the launcher (torchrun, or the Ray actors of ``reasonrl.train.ray_ranks``)
    described in the environment: ``nccl`` on GPUs, ``gloo`` on CPUs, collectives timing out after
    ``train.dist_timeout_s``. Returns this rank's device."""
    device = resolve_device(recipe.model.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                timeout=timedelta(seconds=recipe.train.dist_timeout_s))
    return device


def check_shardable(recipe, methods) -> None:
    """Refuse what the sharded learner cannot run yet, before anything starts (exit 2);
    ``methods``: the recipe's ``(name, class, config)`` (``reasonrl.hooks.method_specs``)."""
    if hasattr(OPTIMIZERS.get(recipe.optim.name), "learner"):
        raise ConfigError(f"train.nproc={recipe.train.nproc}: optim.name '{recipe.optim.name}' brings its own "
                          "learner, which runs in one process; use train.nproc: 1")
    termed = [name for name, cls, _ in methods if getattr(cls, "loss_term", Method.loss_term) is not Method.loss_term]
    if termed:
        raise ConfigError(f"train.nproc={recipe.train.nproc}: method(s) {', '.join(termed)} add a loss term computed "
                          "with state that rank 0 holds; they run with train.nproc: 1 only")


def shard_model(model, precision: str = "fp32"):
    """``fully_shard`` on each decoder layer (the model's ``_no_split_modules``) and on the root,
    with gradients summed over ranks (the loss is already normalised by the whole mini-batch's
    totals) and, for ``bf16``, FSDP2's mixed precision: bf16 parameters in the forward and
    backward, fp32 gradient reduction and fp32 sharded master weights for the optimiser."""
    base = base_model(model)
    names = set(getattr(base, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ConfigError(f"train.nproc > 1: cannot find the decoder layers of {type(base).__name__} to shard "
                          "(its _no_split_modules names none of its modules)")
    mixed = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if precision == "bf16" \
        else MixedPrecisionPolicy()
    for layer in layers:
        fully_shard(layer, mp_policy=mixed)
    fully_shard(model, mp_policy=mixed)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # gloo has no pre-multiplied sum
    return model


class _Commands:
    """Rank 0's commands to the other ranks: pickled objects broadcast on a gloo group (a CPU
    channel beside nccl's, so a batch never has to pass through a GPU to be sent)."""

    def __init__(self, timeout_s: float) -> None:
        self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))

    def send(self, *message: Any) -> None:
        dist.broadcast_object_list([message], src=0, group=self.group)

    def receive(self) -> tuple:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]


class ShardedLearner(Learner):
    """The policy's learner over every rank (see the module docstring). On rank 0 ``full`` is the
    trainer's own policy, kept equal to the trained weights after each ``optimise``."""

    # Every rank must call the model's forward as often as the others (each call gathers the
    # shards): leaving a rank's rows out changes its number of prompt and length-bucket forwards.
    row_skipping = False

    def __init__(self, policy: HFPolicy, recipe) -> None:
        self.rank, self.size = rank_and_size()
        self.recipe = recipe
        self.commands = _Commands(recipe.train.dist_timeout_s)
        # Rank 0 keeps its full policy to sample with and trains a sharded copy; the others
        # need only the shards.
        trained = copy.deepcopy(policy.model) if self.rank == 0 else policy.model
        with torch.no_grad():  # every rank starts from rank 0's weights (a LoRA init draws from each rank's own stream)
            for tensor in trained.state_dict().values():
                dist.broadcast(tensor, src=0)
        shard_model(trained, recipe.train.precision)
        super().__init__(trained.parameters(), recipe.optim, recipe.train.steps)
        self.policy = HFPolicy.__new__(HFPolicy)
        # bf16 comes from FSDP2's mixed precision on the shards, not from autocast.
        self.policy.__dict__.update(policy.__dict__, model=trained, autocast=None)
        # FSDP2's collectives need every rank in every forward, so each micro-batch must take the
        # same number of forwards on every rank: no batch-dependent extra forward for a common
        # prompt prefix or for length buckets (reasonrl.policy.prefix) on the sharded learner.
        self.policy.min_shared_prefix = self.policy.bucket_overhead = sys.maxsize
        self.full = policy if self.rank == 0 else None
        self.whole_groups = takes_group_ids(POLICY_LOSSES.get(recipe.loss.policy))

    def _lead(self, *command: Any) -> None:
        if self.rank == 0:
            self.commands.send(*command)

    # -- the optimisation call, on every rank ------------------------------------------------
    def optimise(self, batch: RolloutBatch, loss_fn, **kw) -> tuple[dict[str, float], list[float]]:
        self._lead("optimise", batch, [g["lr"] for g in self.optimizer.param_groups], kw)
        out = super().optimise(batch, loss_fn, **kw)
        self._gather()
        return out

    def micro_batches(self, mini: RolloutBatch, size: int) -> list[tuple[RolloutBatch, float]]:
        """Micro-batches dealt out round robin; while the whole groups a group-normalising loss
        needs allow it, each rank gets at least one of real rows. A rank with fewer than the
        others runs zero-weighted stand-ins (FSDP's collectives need every rank in every forward)."""
        if not self.whole_groups:
            size = min(size, -(-len(mini) // self.size))
        parts = mini.split(size)
        mine = [(part, 1.0) for part in parts[self.rank::self.size]]
        return mine + [(parts[0], 0.0)] * (-(-len(parts) // self.size) - len(mine))

    def agree(self, bad_loss: str | None) -> str | None:
        flag = torch.tensor([0.0 if bad_loss is None else 1.0])
        dist.all_reduce(flag, group=self.commands.group)
        if bad_loss is None and flag.item() > 0:
            return "loss on another rank"
        return bad_loss

    def total(self, sums: dict[str, float]) -> dict[str, float]:
        every: list[Any] = [None] * self.size
        dist.all_gather_object(every, sums, group=self.commands.group)
        out: dict[str, float] = {}
        for part in every:
            for k, v in part.items():
                out[k] = out.get(k, 0.0) + v
        return out

    def step(self, mini: RolloutBatch) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.parameters, self.cfg.max_grad_norm)
        norm = float(norm.full_tensor() if isinstance(norm, DTensor) else norm)
        if math.isfinite(norm):  # the same norm on every rank: all step, or none
            self.optimizer.step()
        return norm

    @torch.no_grad()
    def _gather(self, check: bool = False) -> None:
        """The trained weights, one tensor at a time, into rank 0's full policy (every rank takes
        part in each gather; beyond rank 0's copy no rank holds the whole model). ``check``:
        compare instead of copy (after a resume, both were written at the same step)."""
        live = self.full._live_state() if self.full is not None else None
        for name, tensor in self.policy._live_state().items():
            whole = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
            if live is None:
                continue
            if not check:
                live[name].copy_(whole)
            elif not torch.equal(whole.to(live[name].dtype), live[name]):
                raise ConfigError(f"--resume: the checkpoint's {SHARDED_DIR}/ and model/ disagree on {name}")

    # -- checkpoints ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"scheduler": self.scheduler.state_dict(), "ranks": self.size}  # the optimiser: save()

    def save(self, folder: Path) -> None:
        self._lead("save", str(folder))
        dcp.save(sharded_state(self.policy.model, self.optimizer), checkpoint_id=str(Path(folder) / SHARDED_DIR))

    def load_state_dict(self, state: dict[str, Any], folder: Path | None = None) -> None:
        if folder is None or not (Path(folder) / SHARDED_DIR).is_dir():
            raise ConfigError(f"--resume: the checkpoint {folder} was written by one process; resume it with "
                              "--nproc 1 (a run saved by several ranks resumes with any number)")
        self._lead("load", str(folder))
        super().load_state_dict(state, Path(folder))
        self._gather(check=True)

    def close(self) -> None:
        self._lead("stop")


def follow(recipe, log=None) -> None:
    """A rank other than 0: build the same policy, shard it, and carry out rank 0's commands
    until it says stop."""
    if recipe.train.retain_memory:
        retain_freed_memory()
    policy = build_policy(recipe.model, log=log, gradient_checkpointing=recipe.train.gradient_checkpointing,
                          precision=recipe.train.precision)
    learner = ShardedLearner(policy, recipe)
    loss_fn = policy_loss_fn(learner.policy, recipe, learner=learner)
    while True:
        command, *args = learner.commands.receive()
        if command == "optimise":
            batch, lrs, kw = args
            for group, lr in zip(learner.optimizer.param_groups, lrs):
                group["lr"] = lr
            learner.optimise(batch, loss_fn, **kw)
        elif command == "save":
            learner.save(Path(args[0]))
        elif command == "load":
            learner.load_state_dict({}, Path(args[0]))
        elif command == "stop":
            return
        else:
            raise RuntimeError(f"learner rank {learner.rank}: unknown command {command!r} from rank 0")
