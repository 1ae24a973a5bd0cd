"""FSG-RL's reward composition and span-level credit (paper: "Function-Structured Reinforcement Learning
with Executable Verifiers for Mathematical Reasoning"; VERIFIED-CODE:
github.com/ZihanLiummyycc/FSG-RL @ b4ee4f57, ``fsg_rl/reward.py`` and ``fsg_rl/grpo.py``).

A problem is a graph of sub-functions (nodes n, edges e); the policy writes one tagged
implementation per node plus ``main``. The verifier scores, per rollout: the format gate F
(every node span parsed with exact tags), signatures, execution / unit / property checks,
node and edge checks, the final answer a, the backward check (``target_call`` output equals
the answer) and group consensus. With the answer gate g = f + (1 − f)·a (f the answer-gate
floor)::

    structural = λ_fmt·F + λ_sig·sig
    process    = λ_exec·exec + λ_unit·unit + λ_prop·prop + λ_node·node + λ_edge·edge
    outcome    = λ_final·a + λ_back·back + λ_cons·cons
    R          = F·(structural + g·process + outcome + λ_teach·t) − λ_eff·eff − λ_rep·1[repaired]

Span rewards, node n (κ the span answer credit)::

    R_n = λ_sig·sig_n + g·(λ_node·node_n + λ_exec·exec_n + λ_unit·unit_n + λ_prop·prop_n)
          + κ·(λ_final·a + λ_back·back)        (n ≠ main)
          + λ_teach·t_n + Σ_{e ∋ n} ½·g·λ_edge·edge_e
    R_main additionally gets λ_final·a + λ_back·back + λ_cons·cons (no κ share);  R_n = 0 if F = 0.

Span-level advantages: a token inside node n's span gets GroupNorm(R_n), every other trained
token GroupNorm(R), GroupNorm(v) = (v − mean_g)/std_g with the *population* std of the group,
and 0 where std_g < 1e-8 (the reference's ``group_normalize``; unlike ``grpo``'s Bessel std + eps).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from reasonrl.algos.masked import _valid, group_inverse, group_sum
from reasonrl.dataflow import declares
from reasonrl.registry import ADVANTAGES

__all__ = ["FSGWeights", "fsg_total_reward", "fsg_span_rewards", "group_normalize", "span_advantages",
           "SPAN_IDS_KEY", "SPAN_REWARDS_KEY"]

SPAN_IDS_KEY = "fsg_span_ids"  # [B, T] long: node index + 1 of each completion token, 0 outside every span
SPAN_REWARDS_KEY = "fsg_span_rewards"  # [B, S] float: R_n of each node (column n)
STD_FLOOR = 1e-8


@dataclass(frozen=True)
class FSGWeights:
    """The λ weights; defaults are the reference's main config (``config/grpo_*.json``)."""

    fmt: float = 0.1
    sig: float = 0.15
    exec: float = 0.5
    unit: float = 0.75
    prop: float = 0.5
    node: float = 0.0
    edge: float = 0.05
    final: float = 1.5
    back: float = 0.75
    cons: float = 0.0
    teach: float = 0.0
    eff: float = 0.0
    rep: float = 0.0
    answer_gate_floor: float = 0.25
    span_answer_credit: float = 0.5

    def gate(self, final: Tensor) -> Tensor:
        """g = f + (1 − f)·a."""
        return self.answer_gate_floor + (1.0 - self.answer_gate_floor) * final


def fsg_total_reward(w: FSGWeights, fmt: Tensor, sig: Tensor, exec_: Tensor, unit: Tensor, prop: Tensor,
                     node: Tensor, edge: Tensor, final: Tensor, back: Tensor, cons: Tensor | float = 0.0,
                     teach: Tensor | float = 0.0, eff: Tensor | float = 0.0,
                     repaired: Tensor | float = 0.0) -> Tensor:
    """R per rollout ([B] each; see the module docstring)."""
    structural = w.fmt * fmt + w.sig * sig
    process = w.exec * exec_ + w.unit * unit + w.prop * prop + w.node * node + w.edge * edge
    outcome = w.final * final + w.back * back + w.cons * cons
    return fmt * (structural + w.gate(final) * process + outcome + w.teach * teach) - w.eff * eff - w.rep * repaired


def fsg_span_rewards(w: FSGWeights, fmt: Tensor, sig_n: Tensor, node_n: Tensor, exec_n: Tensor, unit_n: Tensor,
                     prop_n: Tensor, final: Tensor, back: Tensor, main: int, edges: list[tuple[int, int]] = (),
                     edge_e: Tensor | None = None, cons: Tensor | float = 0.0,
                     teach_n: Tensor | float = 0.0) -> Tensor:
    """R_n per rollout and node ([B, S]; per-node scores [B, S], ``edge_e`` [B, E] for the
    (source, target) node pairs ``edges``, rollout scores [B]; ``main`` the main node's column)."""
    g = w.gate(final).unsqueeze(-1)
    spans = w.sig * sig_n + g * (w.node * node_n + w.exec * exec_n + w.unit * unit_n + w.prop * prop_n)
    spans = spans + w.teach * (teach_n if isinstance(teach_n, Tensor) else torch.full_like(spans, teach_n))
    shared = w.span_answer_credit * (w.final * final + w.back * back)
    others = torch.ones(spans.shape[-1], dtype=torch.bool, device=spans.device)
    others[main] = False
    spans = spans + torch.where(others, shared.unsqueeze(-1), 0.0)
    for k, (src, dst) in enumerate(edges):
        credit = 0.5 * g.squeeze(-1) * w.edge * edge_e[:, k]
        spans[:, src] += credit
        spans[:, dst] += credit
    cons = cons if isinstance(cons, Tensor) else torch.full_like(final, cons)
    spans[:, main] += w.final * final + w.back * back + w.cons * cons
    return torch.where(fmt.unsqueeze(-1) > 0, spans, 0.0)


def group_normalize(values: Tensor, group_ids: Tensor) -> Tensor:
    """(v − mean_g)/std_g per group, population std, 0 where std_g < 1e-8 (a group that agrees,
    or a singleton). ``values`` [B] or [B, S] (each column normalised on its own)."""
    v = values.double()
    inverse, num_groups = group_inverse(group_ids)
    count = group_sum(torch.ones(len(v), dtype=torch.float64, device=v.device), inverse, num_groups)
    count = count.view((-1,) + (1,) * (v.dim() - 1))
    mean = (group_sum(v, inverse, num_groups) / count)[inverse]
    std = (group_sum((v - mean).square(), inverse, num_groups) / count).sqrt()[inverse]
    return torch.where(std >= STD_FLOOR, (v - mean) / std.clamp_min(STD_FLOOR), 0.0).to(values.dtype)


def span_advantages(rewards: Tensor, span_rewards: Tensor, span_ids: Tensor, response_mask: Tensor,
                    group_ids: Tensor) -> Tensor:
    """A[B, T]: GroupNorm(R_n) on the tokens of node n's span (``span_ids`` = n + 1), GroupNorm(R)
    on every other trained token, 0 outside ``response_mask``."""
    if span_ids.shape != response_mask.shape or span_rewards.shape[0] != rewards.shape[0]:
        raise ValueError(f"expected span_ids like response_mask [B,T] and span_rewards [B,S]; got "
                         f"{tuple(span_ids.shape)}, {tuple(response_mask.shape)}, {tuple(span_rewards.shape)}")
    if span_ids.numel() and (int(span_ids.max()) > span_rewards.shape[1] or int(span_ids.min()) < 0):
        raise ValueError(f"span_ids must lie in 0..{span_rewards.shape[1]} (0: outside every span)")
    total = group_normalize(rewards.float(), group_ids)
    per_span = group_normalize(span_rewards.float(), group_ids)  # [B, S]
    padded = torch.cat([total.unsqueeze(-1), per_span], dim=-1)  # column 0: outside every span
    adv = padded.gather(1, span_ids.long())
    return torch.where(_valid(response_mask), adv, 0.0)


@ADVANTAGES.register("fsg_span")
@declares(consumes=(SPAN_IDS_KEY, SPAN_REWARDS_KEY))
def fsg_span(token_rewards: Tensor, response_mask: Tensor, group_ids: Tensor, *, fsg_span_ids: Tensor,
             fsg_span_rewards: Tensor, batch=None) -> Tensor:
    """FSG-RL's span-level advantage (:func:`span_advantages`) with R the sequence reward (the
    sum of ``token_rewards``) and the span rewards and span map the FSG verifier wrote to
    ``batch.aux``."""
    from reasonrl.algos.advantages import check_shapes, sequence_scores

    check_shapes(token_rewards, response_mask, group_ids)
    return span_advantages(sequence_scores(token_rewards, response_mask), fsg_span_rewards, fsg_span_ids,
                           response_mask, group_ids)
