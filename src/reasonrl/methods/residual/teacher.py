"""The teacher of Residual Advantage (RA) and CoRA: a second model that scores the
student's rollouts token by token, and (CoRA) learns from the verifier through a LoRA adapter.

Paper: "Residual Advantage (RA) and CoRA"; paper not located; formalised from its abstract. The maths is in
``reasonrl.methods.residual.advantage``; this module only runs the models:

- :meth:`Teacher.annotate` (before the advantage stage) forwards the student and the teacher
  on the completions, without gradients, and writes π_T(y_t|s_t), π_S(y_t|s_t) and the
  state value V(s_t) to ``batch.aux`` for the ``residual`` advantage;
- :meth:`Teacher.update` (CoRA, after the student's update) takes one AdamW step on the
  teacher's adapter with L_T = −(1/Σ_i T_i) Σ_{i,t} A^ver_{i,t} · log π_T(y_{i,t}|s_{i,t}),
  A^ver the verifier advantage the ``residual`` advantage stored in ``batch.aux``, through
  the same optimisation loop as the policy (``reasonrl.train.optim.Learner``).

The Trainer reaches the teacher only through the method hooks: ``reasonrl.methods.residual.method``.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from reasonrl.algos.losses import aggregate, ppo_clip_loss
from reasonrl.algos.masked import masked_mean, masked_sum
from reasonrl.batch import RolloutBatch
from reasonrl.methods.residual.advantage import AUX_KEYS, VERIFIER_KEY, residual_statistics
from reasonrl.policy.hf import HFPolicy
from reasonrl.policy.teacher import build_teacher_policy
from reasonrl.sections import OptimConfig, TeacherConfig
from reasonrl.train.objective import completion_logits
from reasonrl.train.optim import Learner

__all__ = ["Teacher"]


class Teacher:
    """π_T built from a recipe's ``teacher:`` section, checked against the student's vocabulary."""

    def __init__(self, cfg: TeacherConfig, student: HFPolicy, log: Callable[[str], None] | None = None) -> None:
        self.cfg = cfg
        self.policy = build_teacher_policy(cfg.model, student, log, trainable=cfg.update)
        if cfg.lora is not None:
            from reasonrl.policy.lora import apply_lora

            self.policy.model = apply_lora(self.policy.model, cfg.lora)
            self.policy.model.to(student.device)
        self.learner = None
        if cfg.update:
            # Constant LR, no warm-up, the per-tensor AdamW kernel: the teacher's update as first published here.
            optim = OptimConfig(lr=cfg.lr, weight_decay=0.0, warmup_steps=0, schedule="constant",
                                max_grad_norm=cfg.max_grad_norm, params={"fused": False})
            self.learner = Learner(self.policy.parameters(), optim, total_steps=1)

    # -- RA: annotate the batch ---------------------------------------------
    @torch.no_grad()
    def annotate(self, batch: RolloutBatch, student: HFPolicy, temperature: float = 1.0,
                 micro_batch_size: int | None = None) -> dict[str, float]:
        """Write ``teacher_token_prob``, ``student_token_prob`` and ``student_value`` ([N,T],
        float32, zero outside the completion mask) to ``batch.aux``; return summary metrics."""
        parts: dict[str, list[Tensor]] = {k: [] for k in AUX_KEYS}
        for micro in batch.split(micro_batch_size or self.cfg.micro_batch_size):
            stats = residual_statistics(completion_logits(student, micro), completion_logits(self.policy, micro),
                                        micro.completion_ids, micro.completion_mask,
                                        temperature=temperature, top_k=self.cfg.top_k)
            for k, v in stats.items():
                parts[k].append(v)
        for k, v in parts.items():
            batch.aux[k] = torch.cat(v)
        mask = batch.response_mask
        reward = batch.aux["teacher_token_prob"] - batch.aux["student_token_prob"]
        delta = reward - batch.aux["student_value"]
        return {
            "teacher/token_prob": float(masked_mean(batch.aux["teacher_token_prob"], mask)),
            "teacher/student_token_prob": float(masked_mean(batch.aux["student_token_prob"], mask)),
            "teacher/residual_reward": float(masked_mean(reward, mask)),
            "teacher/state_value": float(masked_mean(batch.aux["student_value"], mask)),
            "teacher/abs_delta": float(masked_mean(delta.abs(), mask)),
        }

    # -- CoRA: learn from the verifier ---------------------------------------
    def update(self, batch: RolloutBatch, temperature: float = 1.0, share_prompt: bool = True) -> dict[str, float]:
        """``cfg.epochs`` AdamW steps (default one) on the teacher's adapter with
        L_T = −(1/Σ T_i) Σ A^ver · log π_T(y_t|s_t) (token-mean), or with ``cfg.clip`` the
        PPO clipped surrogate of the ratio π_T/π_T,before against the teacher that entered
        this update (ratio 1 on the first step, so the clip acts from the second epoch)."""
        if self.learner is None:
            raise RuntimeError("Teacher.update needs 'teacher.update: true' in the recipe (CoRA)")
        if VERIFIER_KEY not in batch.aux:
            raise ValueError(f"Teacher.update needs batch.aux['{VERIFIER_KEY}'], written by the 'residual' "
                             "advantage: set 'advantage: {name: residual}' in the recipe")
        total = max(1.0, float(batch.response_mask.float().sum()))
        before: list[Tensor] = []  # log π_T of the teacher that entered this update, per micro-batch
        clip = self.cfg.clip

        def loss_fn(micro: RolloutBatch, _mini: RolloutBatch, epoch: int, j: int) -> tuple[Tensor, dict[str, float]]:
            m = micro.response_mask.float()
            a = micro.aux[VERIFIER_KEY]
            logp, _ = self.policy.completion_logprobs(
                micro.prompt_ids, micro.prompt_mask, micro.completion_ids, micro.completion_mask,
                micro.group_ids if share_prompt else None, temperature=temperature)
            stats = {}
            if epoch == 0:
                before.append(logp.detach())
                stats["loss"] = float(-masked_sum(a * logp.detach(), m)) / total
            if clip is None:
                per_token = torch.where(m.bool(), -a * logp, 0.0)
            else:
                out = ppo_clip_loss(logp, before[j], a, m, epsilon=clip)
                per_token = out.loss
                stats["clipped"] = float(masked_sum(out.clipped, m)) / total / self.cfg.epochs
            return aggregate(per_token, m, "token-mean", total_tokens=total), stats

        self.policy.model.train()
        sums, norms = self.learner.optimise(batch, loss_fn, passes=self.cfg.epochs,
                                            micro_batch_size=self.cfg.micro_batch_size)
        metrics = {"teacher/loss": sums.get("loss", 0.0), "teacher/grad_norm": sum(norms) / len(norms)}
        if clip is not None:
            metrics["teacher/clip_fraction"] = sums.get("clipped", 0.0)
        return metrics

    # -- checkpoints ---------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What an exact resume of CoRA needs: the adapter and its optimiser (empty for RA)."""
        if self.learner is None:
            return {}
        from reasonrl.policy.lora import adapter_state

        return {"adapter": {k: v.detach().clone() for k, v in adapter_state(self.policy.model).items()},
                **self.learner.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        from reasonrl.policy.lora import load_adapter_state

        load_adapter_state(self.policy.model, state["adapter"])
        self.learner.load_state_dict(state)
