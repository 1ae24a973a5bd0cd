"""Residual Advantage (RA) and its co-evolving-teacher variant CoRA: token-level credit
from a teacher's probabilities on the student's own rollouts.

Paper: "Residual Advantage (RA) and CoRA"; paper not located; formalised from its abstract, confidence
INFERRED. Nearest verified prior art: vOPD (arXiv 2605.07865), which uses the closed-form
expectation of a per-token teacher signal under the student as a state-value baseline.

With π_S the student and π_T the teacher on state s_t = (x, y_<t):

    r_t  = π_T(y_t|s_t) − π_S(y_t|s_t)                      bounded one-step reward, in [−1, 1]
    V(s) = E_{a∼π_S}[π_T(a|s) − π_S(a|s)] = Σ_a π_S π_T − Σ_a π_S²
    δ_t  = r_t − V(s_t)                                      E_{y_t∼π_S}[δ_t] = 0
    δ̃_t  = δ_t − (1/T_i) Σ_t' δ_t'                           centred within response i
    Â_t  = A^ver_t + λ · clip(δ̃_t, −c, c)

The verifier advantage A^ver decides each response's direction; δ̃ only moves credit
between the tokens of one response (its mean over the response is zero, unless the
optional clip cuts it). The model-side statistics (π_T(y_t), π_S(y_t), V) are computed
by ``reasonrl.policy.teacher.Teacher.annotate`` into ``batch.aux``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from reasonrl.algos.masked import as_float, masked_mean
from reasonrl.dataflow import declares
from reasonrl.algos.advantages import base_advantage
from reasonrl.registry import ADVANTAGES

__all__ = [
    "AUX_KEYS",
    "residual_reward",
    "residual_state_value",
    "residual_state_value_topk",
    "residual_statistics",
    "center_per_response",
    "residual_advantages",
    "residual",
]

# The per-token statistics the 'residual' advantage reads from batch.aux ([N, T] each).
AUX_KEYS = ("teacher_token_prob", "student_token_prob", "student_value")
VERIFIER_KEY = "verifier_advantage"


def residual_reward(teacher_token_prob: Tensor, student_token_prob: Tensor) -> Tensor:
    """One-step residual reward r_t = π_T(y_t|s_t) − π_S(y_t|s_t) ∈ [−1, 1].

    A probability difference, not a log-ratio, so it stays bounded where either model
    puts almost no mass on the sampled token. Formalised from the spec (paper not available).
    """
    return as_float(teacher_token_prob) - as_float(student_token_prob)


def residual_state_value(student_probs: Tensor, teacher_probs: Tensor) -> Tensor:
    """V(s) = E_{a∼π_S(·|s)}[π_T(a|s) − π_S(a|s)] = Σ_a π_S(a|s)π_T(a|s) − Σ_a π_S(a|s)².

    Inputs are full next-token distributions ``[..., V]`` (last dimension the vocabulary);
    returns ``[...]``. The closed form makes δ = r − V an exact control variate: its
    expectation over the student's own next token is zero. Formalised from the spec
    (paper not available).
    """
    if student_probs.shape != teacher_probs.shape:
        raise ValueError(f"student_probs and teacher_probs must share one [..., V] shape; got "
                         f"{tuple(student_probs.shape)} and {tuple(teacher_probs.shape)}")
    ps, pt = as_float(student_probs), as_float(teacher_probs)
    return (ps * (pt - ps)).sum(-1)


def residual_state_value_topk(student_probs: Tensor, teacher_probs: Tensor, k: int) -> Tensor:
    """V(s) with the sums restricted to U = top-k(π_S) ∪ top-k(π_T):
    V_k(s) = Σ_{a∈U} π_S(a|s)(π_T(a|s) − π_S(a|s)).

    For engines that return only top-k log-probs (no renormalisation, as the spec states
    it); the error against :func:`residual_state_value` is at most the student's mass
    outside U. Formalised from the spec (paper not available).
    """
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"top-k state value: k must be an integer >= 1, got {k!r}")
    if student_probs.shape != teacher_probs.shape:
        raise ValueError(f"student_probs and teacher_probs must share one [..., V] shape; got "
                         f"{tuple(student_probs.shape)} and {tuple(teacher_probs.shape)}")
    ps, pt = as_float(student_probs), as_float(teacher_probs)
    k = min(k, ps.shape[-1])
    union = torch.zeros_like(ps, dtype=torch.bool)
    union.scatter_(-1, ps.topk(k, dim=-1).indices, True)
    union.scatter_(-1, pt.topk(k, dim=-1).indices, True)
    return torch.where(union, ps * (pt - ps), 0.0).sum(-1)


def residual_statistics(
    student_logits: Tensor,
    teacher_logits: Tensor,
    tokens: Tensor,
    response_mask: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
) -> dict[str, Tensor]:
    """The per-token inputs of RA from both models' next-token logits ``[B,T,V]``.

    Returns float32 ``[B,T]`` tensors, zero outside the mask: ``teacher_token_prob`` =
    π_T(y_t|s_t), ``student_token_prob`` = π_S(y_t|s_t) and ``student_value`` = V(s_t)
    (:func:`residual_state_value`, or :func:`residual_state_value_topk` with ``top_k``).
    Both distributions are softmax(logits / temperature) (as for the trainer's reference
    model); each is normalised over its own logits, and when the widths differ (checkpoints
    of one family may pad their embedding tables differently) the sums run over the shared
    ids. Formalised from the spec (paper not available).
    """
    if student_logits.shape[:2] != tokens.shape or teacher_logits.shape[:2] != tokens.shape \
            or tokens.shape != response_mask.shape:
        raise ValueError(f"logits must be [B,T,V] over tokens/response_mask [B,T]; got student "
                         f"{tuple(student_logits.shape)}, teacher {tuple(teacher_logits.shape)}, tokens "
                         f"{tuple(tokens.shape)}, mask {tuple(response_mask.shape)}")
    scale = temperature if temperature > 0 else 1.0
    ps = torch.softmax(student_logits.float() / scale, dim=-1)
    pt = torch.softmax(teacher_logits.float() / scale, dim=-1)
    width = min(ps.shape[-1], pt.shape[-1])
    ps, pt = ps[..., :width], pt[..., :width]
    if tokens.numel() and int(tokens.max()) >= width:
        raise ValueError(f"token id {int(tokens.max())} is outside the {width} ids both models share")
    idx = tokens.long().unsqueeze(-1)
    value = residual_state_value(ps, pt) if top_k is None else residual_state_value_topk(ps, pt, top_k)
    valid = response_mask.bool()
    return {
        "teacher_token_prob": torch.where(valid, pt.gather(-1, idx).squeeze(-1), 0.0),
        "student_token_prob": torch.where(valid, ps.gather(-1, idx).squeeze(-1), 0.0),
        "student_value": torch.where(valid, value, 0.0),
    }


def center_per_response(values: Tensor, response_mask: Tensor) -> Tensor:
    """x̃_{i,t} = x_{i,t} − (1/T_i) Σ_{t'} m_{i,t'} x_{i,t'}, T_i = Σ_t m_{i,t}; zero outside the mask."""
    valid = response_mask.bool()
    mean = masked_mean(values, response_mask, dim=-1)
    return torch.where(valid, as_float(values) - mean.unsqueeze(-1), 0.0)


def residual_advantages(
    verifier_advantages: Tensor,
    teacher_token_prob: Tensor,
    student_token_prob: Tensor,
    student_value: Tensor,
    response_mask: Tensor,
    *,
    lam: float = 0.5,
    clip: float | None = None,
) -> Tensor:
    """Residual Advantage: Â_{i,t} = A^ver_{i,t} + λ · clip(δ̃_{i,t}, −c, c).

    δ_{i,t} = (π_T(y_t) − π_S(y_t)) − V(s_t) and δ̃ its centring within response i
    (:func:`center_per_response`). Without ``clip`` every response's mean advantage over
    its tokens equals its mean verifier advantage, and ``lam = 0`` returns A^ver exactly.
    All inputs are [B,T]; the result is zero outside the mask and detached.
    Formalised from the abstract (RA/CoRA; paper not located).
    """
    shapes = [tuple(t.shape) for t in (verifier_advantages, teacher_token_prob, student_token_prob,
                                       student_value, response_mask)]
    if len(set(shapes)) != 1 or len(shapes[0]) != 2:
        raise ValueError("verifier_advantages, teacher_token_prob, student_token_prob, student_value and "
                         f"response_mask must share one [B,T] shape; got {shapes}")
    _check_lam_clip(lam, clip)
    valid = response_mask.bool()
    delta = residual_reward(teacher_token_prob.detach(), student_token_prob.detach()) - as_float(student_value.detach())
    centred = center_per_response(delta, response_mask)
    if clip is not None:
        centred = centred.clamp(-clip, clip)
    return torch.where(valid, as_float(verifier_advantages.detach()) + lam * centred, 0.0)


def _check_lam_clip(lam: float, clip: float | None) -> None:
    if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not math.isfinite(lam):
        raise ValueError(f"advantage.lam must be a finite number (the weight λ of the residual term), got {lam!r}")
    if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float)) or not clip > 0):
        raise ValueError(f"advantage.clip must be a number > 0 (δ̃ is clipped to [−clip, clip]) or null, "
                         f"got {clip!r}")


@ADVANTAGES.register("residual")
@declares(produces=(VERIFIER_KEY,), consumes=AUX_KEYS)
def residual(
    token_rewards: Tensor,
    response_mask: Tensor,
    group_ids: Tensor,
    *,
    batch,
    step: int | None = None,
    total_steps: int | None = None,
    base: str = "grpo",
    lam: float = 0.5,
    clip: float | None = None,
    base_params: dict | None = None,
) -> Tensor:
    """Residual Advantage (RA/CoRA) over any registered verifier advantage ``base``.

    A^ver = ADVANTAGES[base](token_rewards, response_mask, group_ids, **base_params), then
    :func:`residual_advantages` with the teacher statistics of ``batch.aux`` (written by
    ``Teacher.annotate``). A^ver is stored in ``batch.aux["verifier_advantage"]`` so that
    the CoRA teacher update uses exactly it. Formalised from the spec (paper not available).
    """
    _check_lam_clip(lam, clip)
    aux = getattr(batch, "aux", None) or {}
    missing = [k for k in AUX_KEYS if k not in aux]
    if missing:
        raise ValueError(f"advantage 'residual' needs a `teacher:` section in the recipe: batch.aux lacks "
                         f"{', '.join(missing)} (written by Teacher.annotate before the advantage stage)")
    verifier = base_advantage("residual", base, base_params, token_rewards, response_mask, group_ids, batch, step,
                              total_steps)
    aux[VERIFIER_KEY] = verifier.detach()
    return residual_advantages(verifier, aux["teacher_token_prob"], aux["student_token_prob"], aux["student_value"],
                               response_mask, lam=lam, clip=clip)
