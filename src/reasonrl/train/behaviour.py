"""The behaviour policy made explicit: which log-probs the update compares against.

Every sampled token has three log-probs:

- behaviour μ — ``batch.sample_logprobs``, as sampled (stale weights, a bf16 sampler);
- proximal π_prox — ``batch.old_logprobs``, recomputed under the learner's weights before the
  update, when something needs it;
- current π_θ — in the loss, with gradients.

On a single pass π_prox = sg(π_θ) and nothing is recomputed. With ``off_policy`` in the
recipe, π_prox is recomputed so the mismatch can be measured (``offpolicy/*`` metrics) and
corrected: the correction's weights go to ``batch.is_weights`` (multiplied into the per-token
policy loss by the objective) and its anchor decides the PPO ratio's π_old (π_prox, or μ
itself). Without a correction the loss keeps π_old = sg(π_θ) on a single pass — the
uncorrected baseline — so an asynchronous run at staleness 0 trains exactly as the
synchronous one.
"""

from __future__ import annotations

from reasonrl.algos.offpolicy import offpolicy_metrics
from reasonrl.batch import RolloutBatch
from reasonrl.registry import OFF_POLICY
from reasonrl.train.objective import batch_logprobs


def prepare_behaviour(batch: RolloutBatch, recipe, policy, version: int, source_off_policy: bool,
                      measure: bool = False) -> dict[str, float]:
    """Set ``batch.old_logprobs`` (π_old) and ``batch.is_weights`` as the recipe asks; return the
    off-policy metrics: staleness whenever the source may sample with other weights, and the
    behaviour–learner KL, max |Δ log p| and weight statistics whenever a correction runs
    (``off_policy: {name: none}`` measures without correcting) or the source asks to
    ``measure`` (an inference engine: the proximal pass then runs for the metrics alone, and
    π_old stays sg(π_θ) on a single pass). Nothing is logged or recomputed on-policy."""
    r = recipe
    several_steps = r.train.num_iterations > 1 or 0 < r.train.mini_batch_size < len(batch)
    proximal = None
    if several_steps or r.off_policy is not None or (source_off_policy and measure):
        proximal = batch_logprobs(policy, batch, r.train.micro_batch_size, r.rollout.temperature, r.train.share_prompt,
                                  r.train.length_buckets)
    if several_steps or r.off_policy is not None:
        batch.old_logprobs = proximal
    if not (source_off_policy or r.off_policy is not None):
        return {}
    mask = batch.response_mask
    correction = None
    if r.off_policy is not None:
        correction = OFF_POLICY.get(r.off_policy.name)(proximal, batch.sample_logprobs, mask, **r.off_policy.params)
        batch.is_weights = correction.weights
        batch.behaviour_ratio = correction.ratio
        if correction.anchor == "behaviour":
            batch.old_logprobs = batch.sample_logprobs
    versions = batch.token_versions if batch.token_versions is not None else batch.policy_version
    return offpolicy_metrics(proximal, batch.sample_logprobs, mask, correction, versions, version)
