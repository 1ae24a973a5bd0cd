"""Language drift of the chain of thought, logged during training: the perplexity of the batch's
reasoning spans under a frozen reference model (by default the run's initial weights).

Source: arXiv 2610.02015 (Sullivan & Koller, "On Language Drift during RLVR Post-Training",
https://arxiv.org/abs/2610.02015); the metric is INFERRED, defined in ``reasonrl.methods.drift.measure``:

    D(z) = −(1/|z|) Σ_t log p_ref(z_t | x, z_<t)     over the tokens z before the answer marker

Named in the recipe's ``methods:`` list; it changes nothing in training (no gradient, no batch
key written)::

    methods:
      - name: drift
        every: 10            # measure on steps 0, 10, 20, ... (one reference forward on the batch)
        reference: null      # a model section; null: a frozen copy of the policy's initial weights
        marker: "####"       # where the reasoning ends and the answer begins
        max_rows: null       # measure only the batch's first rows (cost), or all of them

Metrics on a measured step (absent on the others): ``drift/ref_nll`` (mean D over the rows with a
non-empty span), ``drift/ref_ppl`` (exp of it), ``drift/reasoning_tokens`` (mean span length),
``drift/empty_spans`` (fraction of rows that answer at once). A step whose batch is empty (every
group filtered out by a selection stage) calls no ``annotate``, so it logs none.
"""

from __future__ import annotations

from typing import Annotated, Optional

from reasonrl.batch import RolloutBatch
from reasonrl.methods.drift.measure import ANSWER_MARK, drift_summary, reasoning_nll
from reasonrl.hooks import Method, MethodContext
from reasonrl.params import Range
from reasonrl.registry import METHODS

__all__ = ["ReasoningDrift"]


@METHODS.register("drift")
class ReasoningDrift(Method):
    def __init__(self, every: Annotated[int, Range(ge=1, why="measure on every step divisible by it")] = 10,
                 reference: Optional[dict] = None, marker: str = ANSWER_MARK,
                 max_rows: Optional[Annotated[int, Range(ge=1)]] = None,
                 micro_batch_size: Annotated[int, Range(ge=1)] = 64) -> None:
        """``every``: measure on steps 0, every, 2·every, ... ``reference``: a ``model:`` section
        of a model that reads the policy's token ids (None: a frozen copy of the policy as it is
        when the run starts, i.e. its initial weights; a resumed run rebuilds the same copy, since
        methods are set up before the checkpoint is loaded). ``marker``: the text that ends the
        reasoning. ``max_rows``: only the batch's first rows are measured."""
        if not marker:
            raise ValueError("methods[drift]: marker must be a non-empty string (the text that starts the answer)")
        self.every, self.reference_cfg, self.marker = every, reference, marker
        self.max_rows, self.micro_batch_size = max_rows, micro_batch_size
        self.reference = None

    @classmethod
    def check(cls, recipe, need, config) -> None:
        need(config.get("marker", ANSWER_MARK) != "",
             "methods[drift]: marker must be a non-empty string (the text that starts the answer, e.g. '####')")

    def setup(self, ctx: MethodContext) -> None:
        if self.reference_cfg is None:
            # Setup runs before a resumed run loads its checkpoint: this is the initial policy.
            self.reference = ctx.policy.sampling_copy()
        else:
            from reasonrl.policy.teacher import build_teacher_policy

            self.reference = build_teacher_policy(self.reference_cfg, ctx.policy, ctx.log, role="drift")
        self.share_prompt = ctx.recipe.train.share_prompt

    def annotate(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        if step % self.every:
            return {}
        rows = batch if self.max_rows is None or len(batch) <= self.max_rows else batch.select(list(range(self.max_rows)))
        nll, lengths = reasoning_nll(self.reference, rows.prompt_ids, rows.prompt_mask, rows.completion_ids,
                                     rows.completion_mask, self.marker, self.micro_batch_size,
                                     rows.group_ids if self.share_prompt else None,
                                     # an episode's environment tokens are not the model's reasoning
                                     counted=rows.loss_mask)
        return {f"drift/{k}": v for k, v in drift_summary(nll, lengths).items()}
