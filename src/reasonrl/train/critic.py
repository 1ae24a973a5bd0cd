"""PPO's critic on the method hooks: a value model that owns its weights and its learner.

Named in the recipe's ``methods:`` list, with the ``gae`` advantage (``docs/methods/ppo.md``)::

    advantage: {name: gae, gamma: 1.0, lam: 0.95}
    methods: [{name: critic, lr: 1.0e-4, warmup_steps: 5}]

Every step:

- ``annotate`` (before the advantages): V(s_t) of every completion token under the critic
  as it is now, without gradients → ``batch.aux["values"]``, which ``gae`` turns into
  advantages and returns R = A + V (``batch.aux["returns"]``);
- ``after_update`` (after the policy's step): ``epochs`` passes of the clipped value loss
  ½·max((V − R)², (clip(V, V_old ± c) − R)²) (``reasonrl.algos.critic.clipped_value_loss``), V_old
  the values the advantages were computed with, reduced with the batch's totals so the
  micro-batch split does not change the step, through the same ``Learner`` as the policy;
- ``holds_policy``: for the first ``warmup_steps`` steps the policy is not updated and only
  the critic learns (verl's ``critic_warmup``), so the first policy steps see a baseline that
  has already fitted the returns' scale rather than V ≡ 0.

The checkpoint holds the value model's weights and its optimiser, so a resumed run equals the
straight one. Metrics: ``critic/value_loss``, ``critic/clip_fraction``, ``critic/explained_variance``
(1 − Var(R − V)/Var(R) over the batch's tokens, before the update; verl ``vf_explained_var``),
``critic/value_mean``, ``critic/return_mean``, ``critic/grad_norm``.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Optional

import torch

from reasonrl.algos.critic import RETURNS_KEY, VALUES_KEY, clipped_value_loss
from reasonrl.algos.losses import aggregate
from reasonrl.algos.masked import masked_mean, masked_var
from reasonrl.batch import RolloutBatch
from reasonrl.hooks import Method, MethodContext
from reasonrl.params import Range
from reasonrl.registry import METHODS
from reasonrl.sections import AggMode

__all__ = ["Critic"]


@METHODS.register("critic")
class Critic(Method):
    writes = (VALUES_KEY,)

    @classmethod
    def declared_keys(cls, config: Any) -> dict:
        return {"annotate": ((VALUES_KEY,), ()), "after_update": ((), (VALUES_KEY, RETURNS_KEY))}

    def __init__(self, model: Optional[dict] = None,
                 lr: Annotated[float, Range(gt=0)] = 1e-5,
                 warmup_steps: Annotated[int, Range(ge=0)] = 0,
                 epochs: Annotated[int, Range(ge=1)] = 1,
                 clip: Optional[Annotated[float, Range(gt=0, why="the value clip range")]] = 0.5,
                 agg: AggMode = "token-mean",
                 max_grad_norm: Annotated[float, Range(gt=0)] = 1.0,
                 weight_decay: Annotated[float, Range(ge=0)] = 0.0,
                 micro_batch_size: Optional[Annotated[int, Range(ge=1)]] = None) -> None:
        """``model``: None for a copy of the policy's weights, or a ``model:`` section (e.g.
        ``{backend: tiny, tiny: {...}}`` or ``{path: ...}``) for a separate model that shares the
        policy's tokenizer. ``lr``: the critic's own AdamW rate, constant (verl's critic default
        1e-5, the LLM scale; small models want more). ``clip``: verl's ``cliprange_value`` 0.5 (None:
        the plain ½(V − R)²). ``micro_batch_size``: default ``train.micro_batch_size``."""
        self.model_cfg, self.lr, self.warmup_steps, self.epochs = model, lr, warmup_steps, epochs
        self.clip, self.agg, self.max_grad_norm, self.weight_decay = clip, agg, max_grad_norm, weight_decay
        self.micro_batch_size = micro_batch_size
        self.value_model = None

    def setup(self, ctx: MethodContext) -> None:
        from reasonrl.sections import OptimConfig
        from reasonrl.policy.value import value_model_from, value_model_from_policy

        if self.model_cfg is None:
            self.value_model = value_model_from_policy(ctx.policy)
        else:
            from reasonrl.params import build_section
            from reasonrl.sections import ModelConfig
            from reasonrl.policy.factory import build_policy

            cfg = build_section(ModelConfig, self.model_cfg, "recipe", "methods[critic].model")
            # Building an uncached tiny model draws from the global RNG; keep the run's stream intact.
            with torch.random.fork_rng(devices=[]):
                other = build_policy(dataclasses.replace(cfg, lora=None), log=ctx.log)
            self.value_model = value_model_from(other, ctx.policy)
        self.micro = self.micro_batch_size or ctx.recipe.train.micro_batch_size
        optim = OptimConfig(lr=self.lr, weight_decay=self.weight_decay, warmup_steps=0, schedule="constant",
                            max_grad_norm=self.max_grad_norm)
        self.learner = ctx.learner(self.value_model.parameters(), optim)

    def _values(self, batch: RolloutBatch) -> torch.Tensor:
        return self.value_model(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)

    @torch.no_grad()
    def annotate(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        self.value_model.eval()
        batch.aux[VALUES_KEY] = torch.cat([self._values(m) for m in batch.split(self.micro)])
        return {"critic/value_mean": float(masked_mean(batch.aux[VALUES_KEY], batch.response_mask))}

    def holds_policy(self, step: int) -> bool:
        return step < self.warmup_steps

    def after_update(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        mask = batch.response_mask
        total_tokens = max(1.0, float(mask.sum()))
        returns, old = batch.aux[RETURNS_KEY], batch.aux[VALUES_KEY]
        residual_var = masked_var(returns - old, mask, unbiased=False)
        return_var = masked_var(returns, mask, unbiased=False)
        metrics = {"critic/return_mean": float(masked_mean(returns, mask)),
                   "critic/explained_variance": float(1.0 - residual_var / return_var) if return_var > 1e-12 else 0.0}

        def loss_fn(micro: RolloutBatch, _mini: RolloutBatch, _pass: int, _j: int):
            per_token, clipped = clipped_value_loss(self._values(micro), micro.aux[VALUES_KEY],
                                                    micro.aux[RETURNS_KEY], micro.response_mask, self.clip)
            loss = aggregate(per_token, micro.response_mask, self.agg, total_tokens=total_tokens,
                             total_seqs=len(batch))
            tokens = float(micro.response_mask.sum())
            return loss, {"loss": float(loss.detach()), "clipped": float(clipped) * tokens}

        self.value_model.train()
        sums, norms = self.learner.optimise(batch, loss_fn, passes=self.epochs, micro_batch_size=self.micro)
        metrics.update({"critic/value_loss": sums.get("loss", 0.0) / self.epochs,
                        "critic/clip_fraction": sums.get("clipped", 0.0) / (total_tokens * self.epochs),
                        "critic/grad_norm": sum(norms) / len(norms)})
        return metrics

    def state_dict(self) -> dict[str, Any]:
        weights = {k: v.detach().clone() for k, v in self.value_model.state_dict().items()}
        return {"value_model": weights, **self.learner.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        self.value_model.load_state_dict(state["value_model"])
        self.learner.load_state_dict(state)
