"""On-policy distillation (OPD) on the method hooks: the student samples, a frozen teacher
scores the same tokens, and a per-token divergence is added to the policy's loss.

The baseline every distillation method here is compared with (TRL's ``GKDTrainer``, verl's and
slime's on-policy distillation). The maths is in ``reasonrl.algos.distill``; this module runs
the teacher. Named in the recipe's ``methods:`` list::

    methods:
      - name: opd
        teacher: {backend: tiny, tiny: {warmup_steps: 1500, careless_fraction: 0.2}}
        divergence: reverse_kl     # forward_kl | jsd (with beta) | sampled_reverse_kl
        coef: 1.0
        top_k: null                # the teacher's top-k tokens (renormalised), or the full vocabulary

Added to GRPO (``loss.policy: ppo_clip``), the objective is L_GRPO + coef · D; alone
(``loss.policy: none``) it is coef · D: pure distillation, rewards only logged. D is reduced
like the policy loss (``loss.agg``, with the mini-batch's token totals), so the term does not
depend on the micro-batch split. The teacher runs once per micro-batch of the policy update,
without gradients (with ``train.num_iterations`` > 1, once per pass).

Metrics: ``opd/<divergence>`` (token mean of the divergence before the step),
``opd/teacher_logprob`` and ``opd/student_logprob`` (of the sampled tokens).
"""

from __future__ import annotations

from typing import Annotated, Any, Optional

import torch
from torch import Tensor

from reasonrl.algos.distill import Divergence, logprob_divergence, sampled_reverse_kl_surrogate, scaled_log_softmax
from reasonrl.algos.masked import masked_sum
from reasonrl.batch import RolloutBatch
from reasonrl.hooks import Method, MethodContext
from reasonrl.params import Range
from reasonrl.registry import METHODS
from reasonrl.train.objective import completion_logits

__all__ = ["OnPolicyDistillation", "teacher_logits"]

TOKEN = "token/"


@torch.no_grad()
def teacher_logits(teacher: Any, micro: RolloutBatch, share_prompt: bool) -> Tensor:
    """A frozen model's (teacher's, reference's) next-token logits ``[n, T, V]`` at the
    micro-batch's completion positions, without gradient."""
    return completion_logits(teacher, micro, share_prompt)


@METHODS.register("opd")
class OnPolicyDistillation(Method):
    def __init__(self, teacher: dict,
                 divergence: Divergence = "reverse_kl",
                 coef: Annotated[float, Range(ge=0, why="the weight of the distillation term")] = 1.0,
                 beta: Annotated[float, Range(ge=0, le=1, why="GKD's JSD interpolation")] = 0.5,
                 top_k: Optional[Annotated[int, Range(ge=1)]] = None) -> None:
        """``teacher``: a ``model:`` section (e.g. ``{backend: tiny, tiny: {...}}``, ``{path: ...}``)
        of a model that shares the student's tokenizer. ``divergence``: ``reverse_kl`` (exact,
        mode-seeking), ``forward_kl`` (mode-covering), ``jsd`` (GKD's generalised JSD with
        ``beta``; 0 → forward, 1 → reverse) or ``sampled_reverse_kl`` (the sampled token's
        log-ratio as a score-function term). ``top_k``: the exact divergences over the teacher's
        k most probable tokens, renormalised (None: the whole vocabulary)."""
        self.teacher_cfg, self.divergence, self.coef = teacher, divergence, coef
        self.beta, self.top_k = beta, top_k
        self.teacher = None

    @classmethod
    def check(cls, recipe: Any, need, config: Any) -> None:
        if config.get("divergence") == "sampled_reverse_kl":
            need(recipe.train.num_iterations == 1,
                 "methods[opd]: divergence 'sampled_reverse_kl' is a score-function estimate that holds only on "
                 f"the student's own fresh samples; train.num_iterations is {recipe.train.num_iterations}: set it "
                 "to 1, or use an exact divergence (reverse_kl, forward_kl, jsd)")

    def setup(self, ctx: MethodContext) -> None:
        from reasonrl.policy.teacher import build_teacher_policy

        self.teacher = build_teacher_policy(self.teacher_cfg, ctx.policy, ctx.log, role="opd")
        self.share_prompt = ctx.recipe.train.share_prompt

    def loss_term(self, inputs: Any) -> tuple[Tensor, dict[str, float]]:
        micro, mask = inputs.micro, inputs.mask
        # The teacher's log-distribution once: the divergence and the sampled tokens' log-probs read it.
        t_all = scaled_log_softmax(teacher_logits(self.teacher, micro, self.share_prompt), inputs.temperature)
        t_logp = t_all.gather(-1, micro.completion_ids.unsqueeze(-1)).squeeze(-1)
        if self.divergence == "sampled_reverse_kl":
            # the score-function term and, as its value, the sampled token's log-ratio
            term, value = sampled_reverse_kl_surrogate(inputs.logprobs, t_logp)
        else:
            term = logprob_divergence(scaled_log_softmax(inputs.logits, inputs.temperature), t_all, self.divergence,
                                      self.beta, self.top_k)
            value = term.detach()
        stats = {TOKEN + f"opd/{self.divergence}": float(masked_sum(value, mask)),
                 TOKEN + "opd/teacher_logprob": float(masked_sum(t_logp, mask)),
                 TOKEN + "opd/student_logprob": float(masked_sum(inputs.logprobs.detach(), mask))}
        return self.coef * inputs.aggregate(term), stats
