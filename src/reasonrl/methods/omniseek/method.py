"""OmniSeek's necessity reward on the method hooks: the model side of
``reasonrl.methods.omniseek.maths`` (arXiv 2610.02181; ``docs/methods/evidence_seeking.md``).

Named in the recipe's ``methods:`` list, with an environment whose observations come in two or
more channels (the ``evidence`` env's streams ``a`` and ``b``)::

    env: {name: evidence}
    methods: [{name: necessity_reward, coef: 0.5}]

Every step, in ``annotate`` (after scoring and selection, before the advantages), on the rows
whose M is not empty (a model token after an observation):

- ℓ^full: the policy's log-probs of the completion tokens, no gradient;
- ℓ^{\\X} for each channel X: the same forward with the attention mask zeroed on the tokens of
  channel X (``batch.aux["env_channel"] == k``). The masked tokens keep their position ids (taken
  from the unmasked mask), so every other token sits where it sat when sampled; no position
  attends to the masked ones, which is the same as deleting them from the sequence while keeping
  the positions (tested; the forward is ``methods.channel_mask.masked_logprobs``, shared with
  ``advice_gain``). A row without tokens of channel X keeps ℓ^{\\X} = ℓ^full (Δ = 0);
- r_nec = c · min_X nec_X (``algos.necessity.necessity_reward``), c = 1[score > 0.5] of the
  correctness reward ``correct_reward`` (its unweighted score, ``batch.meta["reward/<name>"]``);
- ``batch.rewards += coef · r_nec``, before the advantages see the rewards.

The spec counts 2 no-grad forwards (ℓ^full is available from elsewhere); here ``annotate`` runs
before the old log-probs are computed, so it runs its own ℓ^full too: 1 + K forwards. The
log-probs use ``rollout.temperature``, as the policy's loss does (INFERRED; the recipes sample at
1.0, where this is the plain log-likelihood). The policy is in eval mode for the forwards.

Metrics: ``necessity/<channel>`` (nec_X; ``necessity/a``, ``necessity/b``) and
``necessity/reward`` (r_nec before ``coef``), means over the batch's rows (a row with an empty M
counts 0), and ``necessity/rows`` (the share of rows with a non-empty M).
"""

from __future__ import annotations

from typing import Annotated, Any, Optional

import torch

from reasonrl.methods.omniseek.maths import necessity_mask, necessity_reward
from reasonrl.batch import RolloutBatch
from reasonrl.dataflow import ENV_CHANNEL, REWARDS, meta_reward
from reasonrl.hooks import Method, MethodContext
from reasonrl.train.channel_mask import env_channels, eval_mode, masked_logprobs, reward_gate
from reasonrl.params import Range
from reasonrl.registry import METHODS

__all__ = ["NecessityReward"]

DEFAULT_CORRECT = "exact_answer"


@METHODS.register("necessity_reward")
class NecessityReward(Method):
    @classmethod
    def declared_keys(cls, config: Any) -> dict:
        return {"annotate": ((REWARDS,), (ENV_CHANNEL, meta_reward(config.get("correct_reward", DEFAULT_CORRECT))))}

    def __init__(self, coef: Annotated[float, Range(ge=0)] = 0.5, correct_reward: str = DEFAULT_CORRECT,
                 micro_batch_size: Optional[Annotated[int, Range(ge=1)]] = None) -> None:
        """``coef``: the weight of r_nec added to the reward (INFERRED: the paper gives none).
        ``correct_reward``: the recipe reward whose score is the gate c (1 when > 0.5).
        ``micro_batch_size``: rows per forward (default ``train.micro_batch_size``)."""
        self.coef, self.correct_reward, self.micro_batch_size = coef, correct_reward, micro_batch_size
        self.policy = None

    @classmethod
    def check(cls, recipe: Any, need, config: Any) -> None:
        need(recipe.env is not None,
             "masks one evidence channel at a time, so it needs an env whose observations come in two or more "
             "channels (e.g. env: {name: evidence}); this recipe has no env")
        channels = env_channels(recipe)
        need(len(channels) >= 2,
             f"needs an env with two or more observation channels to mask (env '{recipe.env.name}' has "
             f"{list(channels) or 'none'}); use an env that tags its observations (e.g. 'evidence')")
        reward = (config or {}).get("correct_reward", DEFAULT_CORRECT)
        names = [rw.name for rw in recipe.rewards]
        need(reward in names, f"correct_reward '{reward}' (the correctness gate) is not among the recipe's rewards "
                              f"{names}; add it to rewards: or name one of them")

    def setup(self, ctx: MethodContext) -> None:
        self.policy = ctx.policy
        self.channels = env_channels(ctx.recipe)
        self.temperature = ctx.recipe.rollout.temperature
        self.micro = self.micro_batch_size or ctx.recipe.train.micro_batch_size

    def _logprobs(self, batch: RolloutBatch, hidden: Optional[torch.Tensor]) -> torch.Tensor:
        """Log-probs ``[b,T]`` of the completion tokens with the attention keys of the completion
        positions in ``hidden`` masked (None: none); position ids from the unmasked sequence
        (``channel_mask.masked_logprobs``)."""
        if hidden is not None:
            hidden = torch.cat([torch.zeros_like(batch.prompt_mask, dtype=torch.bool), hidden.bool()], dim=1)
        return masked_logprobs(self.policy.model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                               batch.completion_mask, self.temperature, hidden)

    def _forwards(self, batch: RolloutBatch) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """ℓ^full and one ℓ^{\\X} per channel, micro-batch by micro-batch."""
        full, masked = [], [[] for _ in self.channels]
        for micro in batch.split(self.micro):
            channel = micro.aux[ENV_CHANNEL]
            lp = self._logprobs(micro, None)
            full.append(lp)
            for k in range(len(self.channels)):
                hidden = channel == k + 1
                has = hidden.any(-1, keepdim=True)
                masked[k].append(torch.where(has, self._logprobs(micro, hidden), lp) if bool(has.any()) else lp)
        return torch.cat(full), [torch.cat(m) for m in masked]

    @torch.no_grad()
    def annotate(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        n, device = len(batch), batch.rewards.device
        correct = reward_gate(batch, self.correct_reward, "necessity_reward", "correctness reward")
        channel = batch.aux.get(ENV_CHANNEL)
        if channel is None:
            channel = torch.zeros_like(batch.completion_ids)
        mask = necessity_mask(batch.response_mask, channel)
        rows = mask.any(-1).nonzero().flatten()
        reward = torch.zeros(n, device=device)
        nec = torch.zeros(len(self.channels), n, device=device)
        if len(rows):
            sub = batch.select(rows)  # rows with a non-empty M have channel tokens, so aux holds them
            with eval_mode(self.policy.model):
                full, masked = self._forwards(sub)
            r, per_channel = necessity_reward(full, masked, mask[rows], correct[rows])
            reward[rows], nec[:, rows] = r.to(device), per_channel.to(device)
        batch.rewards = batch.rewards + self.coef * reward.to(batch.rewards.dtype)
        metrics = {f"necessity/{name}": float(nec[k].mean()) for k, name in enumerate(self.channels)}
        metrics.update({"necessity/reward": float(reward.mean()), "necessity/rows": len(rows) / max(n, 1)})
        return metrics
