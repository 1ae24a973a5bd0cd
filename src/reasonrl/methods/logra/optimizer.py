"""LoGRA as the policy's optimiser (``optim: {name: logra, params: {...}}``).

arXiv 2610.06647, https://arxiv.org/abs/2610.06647 (VERIFIED-CODE: NVIDIA's NeMo RL integration). The
formulas are pure functions in ``reasonrl.methods.logra.maths``; this module wires them to a model:

1. Every target linear layer (``target_modules``: q, k, v, o, gate, up, down by name) gets a
   forward hook. During the training forward the hook routes its output Y = X Wᵀ through
   :class:`_Sketch`, which keeps only X Aᵀ (``[tokens, r]``) and, in backward, accumulates
   S = Σ_mb (∂L/∂Y)ᵀ (X Aᵀ) = G Aᵀ. Every weight of the model has ``requires_grad`` off, so the
   full weight gradient G is never formed; other parameters (embeddings, norms, LM head) stay
   frozen, as in the paper (a zero-size "anchor" tensor that requires grad keeps the graph alive).
2. ``step``: RowAdam per layer, the global normalisation to η·‖W‖, the forward-mode (JVP) probe
   on the first ``probe_responses`` responses (dual tensors δY = −(X Aᵀ) Dᵀ injected at every
   target layer at once; attention runs in its eager form there, since torch's fused CPU
   attention has no forward-mode derivative), the cosine KL budget minus the mismatch EMA, the
   step scale α, the update W ← W − α D A, and a fresh projection (seed of the next update).

The objective's aggregation (token-mean by default) already divides the loss by the
mini-batch's valid tokens, so the sketch is used as accumulated: dividing again by n_tok, as the
NeMo code does on its summed loss, would only shrink every step's Ŝ, which RowAdam and the
global normalisation make scale-free within a step.

``optim.lr``, ``betas``, ``weight_decay``, ``warmup_steps``, ``schedule`` and ``max_grad_norm`` do
not apply (the step is set by ``update_ratio`` and the KL budget): a recipe that sets them is
refused at load. An async sampler (``rollout.source: async``) receives each update as
(D_ℓ, k, α) plus the projection seed instead of full weights (``async_source``, "LoGRA sync").
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Annotated, Any

import torch
import torch.autograd.forward_ad as fwad
from torch import Tensor

from reasonrl.methods.logra import maths as L
from reasonrl.algos.masked import as_float
from reasonrl.batch import RolloutBatch
from reasonrl.params import ConfigError, Range
from reasonrl.registry import OPTIMIZERS
from reasonrl.sections import OptimConfig
from reasonrl.train.objective import batch_logprobs
from reasonrl.policy.lowrank import apply_lowrank_updates, rademacher_projection
from reasonrl.train.optim import Learner

__all__ = ["LoGRAParams", "logra", "LoGRALearner", "target_layers"]

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class LoGRAParams:
    rank: int
    target_modules: tuple[str, ...]
    beta2: float
    eps: float
    update_ratio: float
    kl_budget: float
    kl_budget_final: float
    schedule_steps: int
    alpha_max: float
    probe_responses: int
    probe_max_tokens: int
    mismatch_subtraction: bool
    mismatch_weight: float
    budget_floor: float
    measure_kl: bool
    seed: int


@OPTIMIZERS.register("logra")
def logra(parameters, *, lr: float, betas: tuple[float, float], weight_decay: float,
          rank: Annotated[int, Range(ge=1)] = 256,
          target_modules: list[str] = TARGETS,
          beta2: Annotated[float, Range(ge=0, lt=1)] = 0.95,
          eps: Annotated[float, Range(ge=0)] = 1e-8,
          update_ratio: Annotated[float, Range(gt=0)] = 6e-5,
          kl_budget: Annotated[float, Range(gt=0)] = 2e-4,
          kl_budget_final: Annotated[float, Range(gt=0)] = 2e-5,
          schedule_steps: Annotated[int, Range(ge=1)] = 300,
          alpha_max: Annotated[float, Range(gt=0)] = 3.0,
          probe_responses: Annotated[int, Range(ge=1)] = 2,
          probe_max_tokens: Annotated[int, Range(ge=1)] = 4096,
          mismatch_subtraction: bool = True,
          mismatch_weight: Annotated[float, Range(ge=0, le=1)] = 0.3,
          budget_floor: Annotated[float, Range(ge=0, le=1)] = 0.5,
          measure_kl: bool = False,
          seed: int = 0) -> LoGRAParams:
    """LoGRA's hyper-parameters (defaults: the NeMo RL code). ``rank`` r of the projections;
    ``target_modules``: linear layers whose name ends with one of these; ``beta2``/``eps``:
    RowAdam; ``update_ratio`` η: the proposed update's norm relative to ‖W‖; ``kl_budget`` b₀ →
    ``kl_budget_final`` b_fin over ``schedule_steps`` H updates (cosine); ``alpha_max``: cap of the
    step scale; ``probe_responses`` / ``probe_max_tokens``: the JVP probe's rows and length;
    ``mismatch_subtraction`` (EMA weight ``mismatch_weight``, floor ``budget_floor`` φ);
    ``measure_kl``: one more forward after each step for the exact KL (``logra/measured_kl``);
    ``seed``: of the projections (A of update k, layer ℓ = hash(seed, k, ℓ)).

    The Learner calls this with ``parameters=None``; the optimiser needs the model, so it is the
    policy's optimiser only (``logra.learner``)."""
    if parameters is not None:
        raise ValueError("optim 'logra' needs the model's layers (hooks, the probe): it can only be the policy's "
                         "optimiser (recipe section optim), not an auxiliary model's")
    return LoGRAParams(rank=rank, target_modules=tuple(target_modules), beta2=beta2, eps=eps,
                       update_ratio=update_ratio, kl_budget=kl_budget, kl_budget_final=kl_budget_final,
                       schedule_steps=schedule_steps, alpha_max=alpha_max, probe_responses=probe_responses,
                       probe_max_tokens=probe_max_tokens, mismatch_subtraction=mismatch_subtraction,
                       mismatch_weight=mismatch_weight, budget_floor=budget_floor, measure_kl=measure_kl, seed=seed)


def _check_recipe(recipe, need) -> None:
    """Combinations LoGRA cannot honour, refused when the recipe loads."""
    need(recipe.model.lora is None, "optim.name: logra updates the target layers' own weights through gradient "
                                    "sketches; it cannot train LoRA adapters: drop model.lora or use optim.name: adamw")
    defaults = OptimConfig()
    for f in fields(OptimConfig):
        if f.name not in ("name", "params"):
            need(getattr(recipe.optim, f.name) == getattr(defaults, f.name),
                 f"optim.{f.name} does not apply to optim.name: logra (its step is set by optim.params.update_ratio "
                 f"and the KL budget); remove it (got {getattr(recipe.optim, f.name)!r})")


def target_layers(model: torch.nn.Module, names: tuple[str, ...]) -> dict[str, torch.nn.Linear]:
    """The model's ``nn.Linear`` layers whose qualified name ends with one of ``names``."""
    return {n: m for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and n.rsplit(".", 1)[-1] in names}


class _Sketch(torch.autograd.Function):
    """Identity on Y in forward; in backward adds (∂L/∂Y)ᵀ (X Aᵀ) to ``slot[0]``."""

    @staticmethod
    def forward(ctx, y, xa, anchor, slot):
        ctx.save_for_backward(xa)
        ctx.slot = slot
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad_y):
        (xa,) = ctx.saved_tensors
        g = grad_y.reshape(-1, grad_y.shape[-1]).float()
        ctx.slot[0] = ctx.slot[0] + g.T @ xa.reshape(-1, xa.shape[-1]).float()
        return grad_y, None, None, None


@contextmanager
def _eager_attention(model):
    old = getattr(model.config, "_attn_implementation", "eager")
    if old != "eager":
        model.set_attn_implementation("eager")
    try:
        yield
    finally:
        if old != "eager":
            model.set_attn_implementation(old)


class LoGRALearner(Learner):
    """The policy's learner when ``optim.name`` is ``logra`` (see the module docstring).
    ``optimise`` is the base class's loop; ``begin_step``/``step``/``skip`` are LoGRA's."""

    row_skipping = False  # its sketch hooks see the activations of every row of the mini-batch

    def __init__(self, policy, recipe) -> None:
        cfg: OptimConfig = recipe.optim
        self.cfg, self.policy, self.recipe = cfg, policy, recipe
        self.hp: LoGRAParams = OPTIMIZERS.get(cfg.name)(None, lr=cfg.lr, betas=cfg.betas,
                                                        weight_decay=cfg.weight_decay, **cfg.params)
        model = policy.model
        self.layers = target_layers(model, self.hp.target_modules)
        if not self.layers:
            raise ConfigError(f"optim.params.target_modules: no linear layer of the model is named "
                              f"{list(self.hp.target_modules)}")
        narrowest = min(min(m.in_features, m.out_features) for m in self.layers.values())
        if self.hp.rank > narrowest:
            raise ConfigError(f"optim.params.rank={self.hp.rank} exceeds the narrowest target layer's width "
                              f"({narrowest}); a sketch wider than its layer stores more than the gradient itself")
        for p in model.parameters():  # the full weight gradient is never formed; the rest stays frozen
            p.requires_grad_(False)
        self.parameters: list[Tensor] = []
        self.anchor = torch.zeros((), requires_grad=True)
        self.k = 0  # updates applied so far
        self.v = {n: torch.zeros(m.out_features) for n, m in self.layers.items()}
        self.mismatch = 0.0
        self.mode: str | None = None  # "sketch" in the training forward, "probe" in the JVP pass
        self.slots: dict[str, list[Tensor]] = {}
        self.dirs: dict[str, Tensor] = {}
        self.record_updates = False  # an async source that syncs low-rank updates turns this on
        self.pending: list[tuple[int, float, dict[str, Tensor]]] = []
        self._sums: dict[str, float] = {}
        self._count = 0
        self._refresh()
        for name, module in self.layers.items():
            module.register_forward_hook(self._hook(name))

    def _refresh(self) -> None:
        """The projections of update k + 1 (a new seed each step)."""
        self.proj = {n: rademacher_projection(self.hp.rank, m.in_features, self.hp.seed, self.k + 1, n)
                     for n, m in self.layers.items()}

    def _hook(self, name: str):
        def hook(module, inputs, output):
            if self.mode == "sketch" and torch.is_grad_enabled():
                with torch.no_grad():
                    xa = inputs[0].detach().float() @ self.proj[name].T
                return _Sketch.apply(output, xa, self.anchor, self.slots[name])
            if self.mode == "probe":
                x = as_float(fwad.unpack_dual(inputs[0]).primal)
                d, a = self.dirs[name].to(x.dtype), self.proj[name].to(x.dtype)
                tangent = -((x @ a.T) @ d.T).to(output.dtype)
                return output + fwad.make_dual(torch.zeros_like(output), tangent)
            return None
        return hook

    # -- the loop's seams ----------------------------------------------------------------
    def begin_step(self, mini: RolloutBatch) -> None:
        self.slots = {n: [torch.zeros(m.out_features, self.hp.rank)] for n, m in self.layers.items()}
        self.mode = "sketch"

    def step(self, mini: RolloutBatch) -> float:
        self.mode = None
        hp, k = self.hp, self.k + 1
        sketches = {n: s[0] for n, s in self.slots.items()}
        self.slots = {}
        grad_norm = float(torch.stack([s.pow(2).sum() for s in sketches.values()]).sum().sqrt())
        if not math.isfinite(grad_norm):  # no update, v untouched: the loop skips this mini-batch
            return grad_norm
        dirs, w_sq, u_sq = {}, 0.0, 0.0
        for n, s in sketches.items():
            dirs[n], self.v[n] = L.row_adam(s, self.v[n], k, hp.beta2, hp.eps)
            w_sq += float(self.layers[n].weight.detach().float().pow(2).sum())
            u_sq += float(L.lowrank_sq_norm(dirs[n], self.proj[n]))
        c = L.global_scale(w_sq, u_sq, hp.update_ratio)
        self.dirs = {n: c * d for n, d in dirs.items()}
        kl_hat, probe_rows, old_logits = self._probe(mini)
        budget = L.cosine_budget(k - 1, hp.kl_budget, hp.kl_budget_final, hp.schedule_steps)
        if hp.mismatch_subtraction:
            self._update_mismatch(mini)
            budget = L.floored_budget(budget, self.mismatch, hp.budget_floor)
        alpha = L.step_scale(budget, kl_hat, hp.alpha_max)
        payload = {"seed": hp.seed, "rank": hp.rank, "updates": [(k, alpha, self.dirs)]}
        apply_lowrank_updates(self.policy.model, payload)
        stats = {"predicted_kl": alpha ** 2 * kl_hat, "predicted_kl_unit": kl_hat, "alpha": alpha,
                 "budget": budget, "mismatch": self.mismatch, "step_norm": alpha * c * u_sq ** 0.5}
        if hp.measure_kl:
            with torch.no_grad(), _eager_attention(self.policy.model):
                new_logits = self._logits(probe_rows)
            stats["measured_kl"] = float(L.exact_kl(old_logits, new_logits, self._probe_mask(probe_rows),
                                                    self.recipe.rollout.temperature))
        for key, value in stats.items():
            self._sums[key] = self._sums.get(key, 0.0) + value
        self._count += 1
        if self.record_updates:
            self.pending.append((k, alpha, self.dirs))
        self.k, self.dirs = k, {}
        self._refresh()
        return grad_norm

    def skip(self, mini: RolloutBatch) -> None:
        """Drop the mini-batch's sketches (a non-finite loss): no update, ``k`` and ``v`` unchanged."""
        self.mode, self.slots = None, {}

    # -- the probe and the mismatch ---------------------------------------------------------
    def _probe_rows(self, mini: RolloutBatch) -> RolloutBatch:
        rows = mini.select(list(range(min(self.hp.probe_responses, len(mini)))))
        t = min(self.hp.probe_max_tokens, rows.completion_ids.shape[1])
        rows.completion_ids, rows.completion_mask = rows.completion_ids[:, :t], rows.completion_mask[:, :t]
        if rows.loss_mask is not None:
            rows.loss_mask = rows.loss_mask[:, :t]
        return rows

    def _probe_mask(self, rows: RolloutBatch) -> Tensor:
        return rows.response_mask.bool()

    def _logits(self, rows: RolloutBatch) -> Tensor:
        return self.policy.completion_logits(rows.prompt_ids, rows.prompt_mask, rows.completion_ids,
                                             rows.completion_mask, None)

    def _probe(self, mini: RolloutBatch) -> tuple[float, RolloutBatch, Tensor]:
        """KL̂ of the unit step D (one forward-mode pass), the probe rows, and their logits now."""
        rows = self._probe_rows(mini)
        self.mode = "probe"
        try:
            with torch.no_grad(), _eager_attention(self.policy.model), fwad.dual_level():
                primal, tangent = fwad.unpack_dual(self._logits(rows))
                primal = primal.clone()
                tangent = torch.zeros_like(primal) if tangent is None else tangent.clone()
        finally:
            self.mode = None
        kl_hat = float(L.predicted_kl(primal, tangent, self._probe_mask(rows), self.recipe.rollout.temperature))
        return kl_hat, rows, primal

    def _update_mismatch(self, mini: RolloutBatch) -> None:
        """m over the tokens of completed (not truncated) sequences; π_prev is the proximal
        log-prob the Trainer recomputed, else one no-grad forward here."""
        if mini.sample_logprobs is None:
            return
        mask = mini.response_mask.bool() & ~mini.truncated.unsqueeze(-1)
        if not bool(mask.any()):
            return
        prev = mini.old_logprobs
        if prev is None:
            r = self.recipe
            prev = batch_logprobs(self.policy, mini, r.train.micro_batch_size, r.rollout.temperature,
                                  r.train.share_prompt)
        self.mismatch = L.update_mismatch(self.mismatch, mini.sample_logprobs, prev, mask, self.hp.mismatch_weight)

    # -- schedule, metrics, sync, state ----------------------------------------------------
    def end_step(self) -> float:
        return self.hp.update_ratio  # no LR: the logged "lr" is η

    def metrics(self) -> dict[str, float]:
        out = {f"logra/{k}": v / self._count for k, v in self._sums.items()} if self._count else {}
        self._sums, self._count = {}, 0
        return out

    def take_updates(self) -> dict[str, Any]:
        """The updates since the last call, as a payload for :func:`apply_lowrank_updates`."""
        updates, self.pending = self.pending, []
        return {"seed": self.hp.seed, "rank": self.hp.rank, "updates": updates}

    def state_dict(self) -> dict[str, Any]:
        return {"logra": {"k": self.k, "v": {n: v.clone() for n, v in self.v.items()}, "mismatch": self.mismatch}}

    def load_state_dict(self, state: dict[str, Any], folder=None) -> None:
        if "logra" not in state:
            raise ValueError("this checkpoint was not written with optim.name: logra; resume with its own optimiser")
        s = state["logra"]
        self.k, self.mismatch = s["k"], s["mismatch"]
        self.v = {n: v.clone() for n, v in s["v"].items()}
        self.pending = []
        self._refresh()


logra.learner = LoGRALearner
logra.check_recipe = _check_recipe
