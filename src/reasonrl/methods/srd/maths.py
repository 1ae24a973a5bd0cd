"""Self-Retrospection Distillation (SRD): the hindsight context and the foresight loss.

Source: arXiv 2610.08077, "Self-Retrospection Distillation: Turning Post-hoc Experiences into
Prior Foresight" (Zhang, Chen, Hayashi et al.; https://arxiv.org/abs/2610.08077). Only the abstract and a
secondary note were available; **the formulas below are INFERRED** from that
description, not copied from the paper's Eq. 4–9.

For a prompt x with K scored rollouts τ_1..K, rewards r_k ∈ {0, 1}, and gold answer y*:

- hindsight H = (knowledge: some successful τ_k, pitfalls: some failed τ_k, y*);
- teacher (retrospective) view c_T(x, H); student (trajectory-blind) view c_S(x): the task only;
- foresight f ∼ π_sg(θ)(· | c_T(x, H)), sampled by the same policy without gradient;
- L_SRD = E_x [ (1/|f|) Σ_t JSD_β( π_sg(θ)(·|c_T, f_<t) ‖ π_θ(·|c_S, f_<t) ) ],
  JSD_β(P‖Q) = β KL(P‖M) + (1−β) KL(Q‖M), M = βP + (1−β)Q  (β = 0.5 by default);
- L = L_GRPO + λ_SRD · L_SRD.

L_SRD needs no reward contrast: it is non-zero in a group whose rewards all agree (where
GRPO's advantage, and so its gradient, is zero), and zero when the two views coincide.

The JSD is ``reasonrl.algos.distill.generalized_jsd`` (GKD's β convention, the same as the
formula above with P the teacher). Everything here is pure (no model): building H, fitting it
into the model's context, rendering the templates, and the per-foresight normalisation.
"""

from __future__ import annotations

import string
from typing import Callable, Sequence

import torch
from torch import Tensor

from reasonrl.algos.distill import generalized_jsd, scaled_log_softmax

__all__ = ["TEACHER_FIELDS", "STUDENT_FIELDS", "ITEM_FIELDS", "template_fields", "hindsight", "fit_hindsight",
           "render_teacher", "render_student", "uniform_groups", "group_first_rows", "foresight_jsd",
           "per_foresight_mean"]

# The placeholders each template may use. The student view gets the task only: y* and H must
# never reach it (nor inference), which is what makes the foresight a *prior*.
TEACHER_FIELDS = frozenset({"prompt", "answer", "knowledge", "pitfalls"})
STUDENT_FIELDS = frozenset({"prompt"})
ITEM_FIELDS = frozenset({"completion"})


def template_fields(template: str) -> set[str]:
    """The ``{name}`` placeholders of a ``str.format`` template (raises ValueError if malformed)."""
    return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}


def hindsight(completions: Sequence[str], rewards: Sequence[float], success_threshold: float,
              num_knowledge: int, num_pitfalls: int) -> tuple[list[str], list[str]]:
    """(knowledge, pitfalls): the first ``num_knowledge`` distinct successful completions
    (reward > threshold) and the first ``num_pitfalls`` distinct failed ones, in rollout order.
    The rollouts of a group are i.i.d. given the prompt, so the first ones are a random choice
    that costs no random draw; duplicates are dropped because they add context, not evidence."""
    knowledge: list[str] = []
    pitfalls: list[str] = []
    for text, r in zip(completions, rewards):
        bucket, cap = (knowledge, num_knowledge) if r > success_threshold else (pitfalls, num_pitfalls)
        if len(bucket) < cap and text not in bucket:
            bucket.append(text)
    return knowledge, pitfalls


def fit_hindsight(knowledge: list[str], pitfalls: list[str],
                  fits: Callable[[list[str], list[str]], bool]) -> tuple[list[str], list[str]] | None:
    """The longest prefix of the interleaved order k1, p1, k2, p2, ... (each kind in turn, so
    both stay represented) for which ``fits(knowledge, pitfalls)`` holds; None if not even the
    bare context (no trajectories, only y* and x) fits. ``fits`` is monotone in practice (a
    longer context never fits where a shorter one did not), so the scan stops at the first miss."""
    order = []
    for i in range(max(len(knowledge), len(pitfalls))):
        order += [("k", knowledge[i])] if i < len(knowledge) else []
        order += [("p", pitfalls[i])] if i < len(pitfalls) else []
    best: tuple[list[str], list[str]] | None = None
    for n in range(len(order) + 1):
        k = [t for kind, t in order[:n] if kind == "k"]
        p = [t for kind, t in order[:n] if kind == "p"]
        if not fits(k, p):
            break
        best = (k, p)
    return best


def render_teacher(template: str, knowledge_item: str, pitfall_item: str, prompt: str, answer: str,
                   knowledge: Sequence[str], pitfalls: Sequence[str]) -> str:
    """c_T(x, H): ``template`` with {prompt}, {answer} (y*), and {knowledge}/{pitfalls}, each
    the concatenation of its items rendered with ``knowledge_item``/``pitfall_item``."""
    return template.format(prompt=prompt, answer=answer,
                           knowledge="".join(knowledge_item.format(completion=c) for c in knowledge),
                           pitfalls="".join(pitfall_item.format(completion=c) for c in pitfalls))


def render_student(template: str, prompt: str) -> str:
    """c_S(x): the task only."""
    return template.format(prompt=prompt)


def uniform_groups(rewards: Tensor, group_ids: Tensor) -> dict[int, bool]:
    """{group id: whether every reward of the group's rows in the batch agrees} — the groups
    where GRPO's advantage is 0 and only L_SRD gives a gradient."""
    out: dict[int, bool] = {}
    for gid in torch.unique(group_ids).tolist():
        r = rewards[group_ids == gid]
        out[gid] = bool((r == r[0]).all())
    return out


def group_first_rows(group_ids: Tensor) -> list[tuple[int, list[int]]]:
    """[(group id, its row indices)] in order of each group's first row in the batch."""
    seen: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids.tolist()):
        seen.setdefault(g, []).append(i)
    return list(seen.items())


def foresight_jsd(student_logits: Tensor, teacher_logits: Tensor, beta: float = 0.5,
                  temperature: float = 1.0) -> Tensor:
    """JSD_β(π_T(·|c_T, f_<t) ‖ π_S(·|c_S, f_<t)) per foresight position ``[g, F]``, both
    distributions softmax(logits / temperature); the teacher's side is detached."""
    s = scaled_log_softmax(student_logits, temperature)
    t = scaled_log_softmax(teacher_logits.detach(), temperature)
    return generalized_jsd(s, t, beta)


def per_foresight_mean(per_token: Tensor, mask: Tensor) -> Tensor:
    """(1/|f|) Σ_t d_t for each foresight ``[g]``: each foresight weighs the same whatever its
    length (the E_x of L_SRD is over prompts, not tokens)."""
    mask = mask.to(per_token.dtype)
    return (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)
