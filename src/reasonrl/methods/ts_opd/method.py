"""TS-OPD on the method hooks: on-policy distillation routed by where the teacher's knowledge
transfers (https://arxiv.org/abs/2610.05974, INFERRED; the maths and its source are in
``reasonrl.methods.ts_opd.maths``, the divergences in ``reasonrl.algos.distill``).

    methods:
      - name: ts_opd
        teacher: {backend: tiny, tiny: {warmup_steps: 1500, careless_fraction: 0.2}}
        n: 8                        # teacher samples per problem for p̂_T
        delta_lo: 0.25
        delta_hi: 0.5
        gate: disagreement          # confidence | first_divergent | none
        rho: 0.3
        brake: penalty              # scale | null
    loss: {policy: none}            # TS-OPD alone (the paper's student objective); ppo_clip adds GRPO

Every step, on the scored batch (``annotate``):

- p̂_S(x) is the success rate of the student's own group for x (its G rollouts are n = G fresh
  student samples: the student is re-screened every step, at no extra cost); p̂_T(x) comes from
  ``n`` teacher samples scored by the run's reward functions, drawn once per problem and cached
  (the teacher is frozen, so re-screening it would only redraw the same estimate). A rollout
  succeeds when its reward is ≥ ``success_at``.
- each group is routed to acquisition, consolidation or no supervision (``strata``);
- the brake's H̄_θ is the mean of −log π_θ(y_t) over the batch's sampled tokens (an unbiased
  estimate of the mean token entropy of the sampling distribution, with no extra forward
  pass); H_0 is ``h0``, or H̄ at the first step (kept in the checkpoint).

In the policy update (``loss_term``), per micro-batch: the teacher's logits (no gradient), the
gate from the sampled tokens' log-prob gap and the teacher's confidence, the stratum's divergence
over the teacher's ``top_k`` tokens (renormalised), reduced per token like the policy loss. With
``brake: penalty`` and H̄ < H_0 the term −λ_H·H̄ (exact entropy, with gradient) is added; with
``brake: scale`` the consolidation term is multiplied by min(1, H̄/H_0).

Metrics: ``ts_opd/acquisition``, ``/consolidation``, ``/both_fail``, ``/teacher_fails`` (shares of
the batch's groups: the stratum sizes over time), ``/screened`` (problems newly screened),
``/teacher_success`` (mean p̂_T), ``/entropy`` and ``/brake`` (H̄, and the brake's activity or
scale), and per token: ``ts_opd/gated`` (share of all tokens the gate keeps),
``/gated_acquisition`` and ``/gated_consolidation`` (by stratum), ``/divergence`` (the stratum
divergence on gated tokens, summed over all tokens).
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal, Optional

import torch
from torch import Tensor

from reasonrl.methods.ts_opd import maths as ts
from reasonrl.algos.distill import forward_kl, restrict_top_k, reverse_kl, scaled_log_softmax
from reasonrl.algos.masked import group_first_rows, group_inverse, group_sum, masked_mean, masked_sum
from reasonrl.batch import RolloutBatch
from reasonrl.hooks import Method, MethodContext, need_learner_scorer
from reasonrl.train.opd import teacher_logits
from reasonrl.params import Range
from reasonrl.registry import METHODS

__all__ = ["TransferStratifiedOPD", "STRATUM_KEY"]

STRATUM_KEY = "ts_opd_stratum"
TOKEN = "token/"
Rate = Annotated[float, Range(ge=0, le=1, why="a success rate")]


@METHODS.register("ts_opd")
class TransferStratifiedOPD(Method):
    writes = (STRATUM_KEY,)

    @classmethod
    def declared_keys(cls, config: Any) -> dict:
        return {"annotate": ((STRATUM_KEY,), ()), "loss_term": ((), (STRATUM_KEY,))}

    def __init__(self, teacher: dict,
                 n: Annotated[int, Range(ge=1, why="teacher samples per problem")] = 8,
                 delta_lo: Rate = 0.25,
                 delta_hi: Rate = 0.5,
                 success_at: float = 1.0,
                 gate: ts.Gate = "disagreement",
                 rho: Annotated[float, Range(gt=0, le=1, why="the share of each response's tokens kept")] = 0.3,
                 confidence: Rate = 0.9,
                 divergence: Annotated[float, Range(ge=0, why="a log-prob gap")] = 1.0,
                 top_k: Optional[Annotated[int, Range(ge=1)]] = 64,
                 coef: Annotated[float, Range(ge=0)] = 1.0,
                 brake: Optional[Literal["penalty", "scale"]] = "penalty",
                 brake_coef: Annotated[float, Range(ge=0)] = 0.1,
                 h0: Optional[Annotated[float, Range(gt=0)]] = None) -> None:
        """``teacher``: a ``model:`` section sharing the student's tokenizer. ``n``: teacher
        samples per problem (spec default 8). ``delta_lo``/``delta_hi``: the strata thresholds
        (spec 0.25/0.5). ``success_at``: the reward that counts as a success. ``gate`` with
        ``rho`` (disagreement, spec 0.2–0.5), ``confidence`` (teacher max-prob threshold) or
        ``divergence`` (|log-prob gap| of the first divergent span). ``top_k``: the KL over the
        teacher's top-k tokens (spec 64). ``brake``/``brake_coef``/``h0``: the entropy brake
        (λ_H; H_0 default: the first step's entropy)."""
        self.teacher_cfg, self.n, self.delta_lo, self.delta_hi = teacher, n, delta_lo, delta_hi
        self.success_at, self.gate, self.rho, self.confidence, self.divergence = success_at, gate, rho, confidence, divergence
        self.top_k, self.coef, self.brake, self.brake_coef, self.h0 = top_k, coef, brake, brake_coef, h0
        self.teacher_success: dict[str, float] = {}  # p̂_T per prompt text, screened once
        self.step_brake = 0.0  # this step's brake: 1/0 (penalty active) or the scale

    @classmethod
    def check(cls, recipe: Any, need, config: Any) -> None:
        need_learner_scorer(recipe, need, "methods[ts_opd] screens problems")

    def setup(self, ctx: MethodContext) -> None:
        from reasonrl.policy.teacher import build_teacher_policy

        self.teacher = build_teacher_policy(self.teacher_cfg, ctx.policy, ctx.log, role="ts_opd")
        self.recipe, self.scorer, self.task, self.generator = ctx.recipe, ctx.scorer, ctx.task, ctx.generator
        self.share_prompt = ctx.recipe.train.share_prompt

    # -- screening -------------------------------------------------------------------------
    def _screen(self, problems: list) -> int:
        """p̂_T for the problems not screened yet: ``n`` teacher samples each, scored."""
        from reasonrl.perf import Stopwatch
        from reasonrl.rollout.collect import sample_and_score, stop_strings

        todo = list({p.prompt: p for p in problems if p.prompt not in self.teacher_success}.values())
        if not todo:
            return 0
        r = self.recipe
        recipe = dataclasses.replace(r, rollout=dataclasses.replace(r.rollout, num_generations=self.n))
        with torch.no_grad():
            scored, _ = sample_and_score(self.teacher, self.scorer, todo, recipe, self.generator, group_offset=0,
                                         policy_version=0, watch=Stopwatch(), stop=stop_strings(r, self.task))
        ok = (scored.rewards >= self.success_at).float().view(len(todo), self.n).mean(-1)
        for p, rate in zip(todo, ok.tolist()):
            self.teacher_success[p.prompt] = rate
        return len(todo)

    def annotate(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        problems = batch.meta["problem"]
        screened = self._screen(problems)
        inverse, num_groups = group_inverse(batch.group_ids)
        success = (batch.rewards >= self.success_at).float()
        p_s = group_sum(success, inverse, num_groups) / torch.bincount(inverse, minlength=num_groups)
        first = group_first_rows(inverse, num_groups)
        p_t = torch.tensor([self.teacher_success[problems[i].prompt] for i in first.tolist()])
        group_stratum = ts.strata(p_s, p_t, self.delta_lo, self.delta_hi)
        batch.aux[STRATUM_KEY] = group_stratum[inverse]
        entropy = float(masked_mean(-batch.sample_logprobs, batch.response_mask)) if batch.sample_logprobs is not None else 0.0
        if self.h0 is None and self.brake is not None:
            self.h0 = entropy  # H_0: the student's entropy when distillation starts
        if self.brake == "penalty":
            self.step_brake = float(ts.brake_active(entropy, self.h0))
        elif self.brake == "scale":
            self.step_brake = ts.brake_scale(entropy, self.h0)
        g = float(num_groups)
        teacher_ok = p_t >= self.delta_hi
        return {"ts_opd/acquisition": float((group_stratum == ts.ACQUIRE).sum()) / g,
                "ts_opd/consolidation": float((group_stratum == ts.CONSOLIDATE).sum()) / g,
                "ts_opd/both_fail": float((~teacher_ok & (p_s <= self.delta_lo)).sum()) / g,
                "ts_opd/teacher_fails": float((~teacher_ok & (p_s > self.delta_lo)).sum()) / g,
                "ts_opd/screened": screened, "ts_opd/teacher_success": float(p_t.mean()),
                "ts_opd/entropy": entropy, "ts_opd/brake": self.step_brake}

    # -- the loss ----------------------------------------------------------------------------
    def loss_term(self, inputs: Any) -> tuple[Tensor, dict[str, float]]:
        micro, mask, temp = inputs.micro, inputs.mask, inputs.temperature
        s_all = scaled_log_softmax(inputs.logits, temp)
        t_all = scaled_log_softmax(teacher_logits(self.teacher, micro, self.share_prompt), temp)
        tokens = micro.completion_ids.unsqueeze(-1)
        gap = (t_all.gather(-1, tokens).squeeze(-1) - inputs.logprobs.detach()).abs()
        gate = ts.token_gate(self.gate, disagreement=gap, teacher_max_prob=t_all.max(-1).values.exp(), mask=mask,
                             rho=self.rho, confidence=self.confidence, divergence=self.divergence)
        s_k, t_k = restrict_top_k(s_all, t_all, self.top_k) if self.top_k else (s_all, t_all)
        stratum = micro.aux[STRATUM_KEY].unsqueeze(-1).expand_as(gate)
        acquire, consolidate = (stratum == ts.ACQUIRE).float(), (stratum == ts.CONSOLIDATE).float()
        scale_c = self.step_brake if self.brake == "scale" else 1.0
        per_token = gate * (acquire * forward_kl(s_k, t_k) + scale_c * consolidate * reverse_kl(s_k, t_k))
        loss = self.coef * inputs.aggregate(per_token)
        if self.brake == "penalty" and self.step_brake:
            # ∇ λ_H·max(0, H_0 − H̄) = −λ_H ∇H̄ while H̄ < H_0 (decided on the whole batch in annotate).
            entropy = -(s_all.exp() * s_all).sum(-1)
            loss = loss - self.brake_coef * inputs.aggregate(entropy)
        stats = {TOKEN + "ts_opd/gated": float(masked_sum(gate, mask)),
                 TOKEN + "ts_opd/gated_acquisition": float(masked_sum(gate * acquire, mask)),
                 TOKEN + "ts_opd/gated_consolidation": float(masked_sum(gate * consolidate, mask)),
                 TOKEN + "ts_opd/divergence": float(masked_sum(per_token.detach(), mask))}
        return loss, stats

    # -- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"teacher_success": dict(self.teacher_success), "h0": self.h0}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            self.teacher_success, self.h0 = dict(state["teacher_success"]), state["h0"]
