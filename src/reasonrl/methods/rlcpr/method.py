"""RLCPR on the method hooks: a verifier-free probability reward scored by the policy itself.

Everything is INFERRED: no RLCPR paper text, abstract or code could be found, so the method
is formalised after its closest published relatives, RLPR (the mean-probability reward and
its std filter) and VeriFree (arxiv.org/abs/2505.21493). The maths is in ``reasonrl.methods.rlcpr.maths``; this module runs
the forwards. Named in the recipe's ``methods:`` list::

    methods:
      - name: rlcpr
        length_penalty: 0.1   # λ_len of the concentration-aware penalty; 0 = the plain probability reward
        delta: 0.05           # δ, the band around p_T that defines the concentration point t*
        debias: false         # subtract r(∅), the answer's probability without a trace

Every step, in ``annotate`` (after scoring and selection, before the advantages):

1. Each completion is cut into its trace z (its tokens before the first ``marker``, ``####``;
   all of it when there is none; a final EOS is not part of it) and the trace's segment
   boundaries (after every token that holds ``separator``, ``;``), so the sampled token ids
   are used as sampled, never re-tokenised. Boundaries t_0 = 0 < … < t_K = T; at most
   ``max_segments`` + 1 of them, evenly thinned.
2. For every boundary t that is needed, one teacher-forced forward of the policy, without
   gradient and in eval mode, over ``prompt + z_{≤t} + marker + y*`` (+ EOS with
   ``answer_end``, so "3" is not a full-credit prefix of "35"), y* the tokenised reference
   answer; p_t = the mean probability of the y* tokens. Only T is needed for the plain
   reward, 0 and T for debiasing, all boundaries for the penalty; the empty trace is the
   same sequence for a whole group and runs once per group.
3. r̃ = r(z) (``kind`` prob or logprob), debiased with r(∅) when ``debias``; t* from the
   p_t; r_final = r̃ − λ_len (T − t*)/T · 1[r̃ ≥ ``gate``] (``algos.rlcpr``).
4. ``batch.rewards`` = ``coef`` · r_final (``combine: replace``: verifier-free; the recipe's
   reward functions are still logged as ``reward/<name>``) or += it (``combine: add``).
5. The prompt sampler, when it takes them (``uncertainty`` with ``feedback: method``), gets
   each group's coef · r_final (``record_rewards``): the uncertainty-aware sampling learns from
   the probability reward, not from the scorer's, so with ``combine: replace`` and no verifier
   among the recipe's ``rewards:`` nothing in training reads a verifier (``recipes/rlcpr.yaml``).

The forwards use the plain probabilities (temperature 1), not ``rollout.temperature``: the
reward is the model's belief in the answer, not a sampling distribution.

Metrics: ``rlcpr/reward`` (mean r_final), ``rlcpr/prob`` (mean p_T), ``rlcpr/p_empty`` (mean
p_0, when measured), ``rlcpr/group_std`` (mean over groups of the unbiased std of r_final:
the signal the posterior concentration phenomenon erodes), ``rlcpr/trace_len``,
``rlcpr/t_star_frac`` (mean t*/T) and ``rlcpr/penalised`` (share of rows the gate let the
penalty reach), and ``rlcpr/prob_right`` / ``rlcpr/prob_wrong`` (mean p_T of the rows the
``monitor`` reward scores > 0.5 or not, when the recipe has it): whether the verifier-free
reward tracks correctness.
"""

from __future__ import annotations

import bisect
from typing import Annotated, Any, Literal, Optional

import torch
from torch import Tensor

from reasonrl.algos.masked import group_first_rows, group_inverse, group_std
from reasonrl.methods.rlcpr.maths import Kind, answer_reward, concentration_penalty, concentration_point, debias
from reasonrl.batch import RolloutBatch
from reasonrl.dataflow import REWARDS, meta_reward
from reasonrl.hooks import Method, MethodContext
from reasonrl.train.channel_mask import eval_mode
from reasonrl.params import Range
from reasonrl.registry import METHODS

__all__ = ["RLCPR", "split_trace", "answer_probabilities", "thin", "group_rewards"]


def split_trace(pieces: list[str], marker: str, separator: str) -> tuple[int, list[int]]:
    """(T, boundaries) of one completion given the decoded text of each of its tokens: T =
    the number of tokens before the one where ``marker`` starts (all of them without a
    marker); boundaries = 0, the prefix length after every token of the trace holding
    ``separator``, and T (sorted, unique)."""
    starts, pos = [], 0
    for piece in pieces:
        starts.append(pos)
        pos += len(piece)
    at = "".join(pieces).find(marker)
    trace_len = len(pieces) if at < 0 else bisect.bisect_right(starts, at) - 1
    cuts = {0, trace_len} | {j + 1 for j in range(trace_len) if separator in pieces[j]}
    return trace_len, sorted(cuts)


def group_rewards(prompts: list[str], groups: list[int], rewards: list[float]) -> tuple[list[str], list[list[float]]]:
    """(each group's prompt, its rows' rewards), groups in order of first appearance: what the
    prompt sampler's ``record_rewards`` takes."""
    order: dict[int, int] = {}
    out_prompts: list[str] = []
    out_rewards: list[list[float]] = []
    for prompt, group, reward in zip(prompts, groups, rewards):
        if group not in order:
            order[group] = len(out_prompts)
            out_prompts.append(prompt)
            out_rewards.append([])
        out_rewards[order[group]].append(float(reward))
    return out_prompts, out_rewards


def thin(boundaries: list[int], max_segments: int) -> list[int]:
    """At most ``max_segments`` + 1 boundaries: the first and last kept, the inner ones evenly
    thinned (the forward count per row is bounded whatever the trace's length)."""
    if len(boundaries) <= max_segments + 1:
        return boundaries
    inner, keep = boundaries[1:-1], max_segments - 1
    picked = {inner[round(k * (len(inner) - 1) / max(keep - 1, 1))] for k in range(keep)} if keep else set()
    return [boundaries[0], *sorted(picked), boundaries[-1]]


@torch.no_grad()
def answer_probabilities(policy: Any, prompt_ids: Tensor, prompt_mask: Tensor,
                         jobs: list[tuple[int, list[int], list[int]]], micro: int) -> tuple[Tensor, Tensor]:
    """(mean probability, mean log-probability) of each job's answer tokens, [J] each: a job is
    (prompt row, context token ids after the prompt, answer token ids), scored by one
    teacher-forced forward of ``policy`` (no gradient) over prompt + context + answer. The
    caller puts the model in eval mode."""
    probs, logps = [], []
    device = policy.device
    for start in range(0, len(jobs), micro):
        chunk = jobs[start:start + micro]
        width = max(len(c) + len(a) for _, c, a in chunk)
        ids = torch.full((len(chunk), width), int(policy.tokenizer.pad_token_id), dtype=torch.long)
        seen = torch.zeros(len(chunk), width, dtype=torch.long)
        answer = torch.zeros(len(chunk), width, dtype=torch.bool)
        for k, (_, context, ans) in enumerate(chunk):
            n = len(context) + len(ans)
            ids[k, :n] = torch.tensor(context + ans, dtype=torch.long)
            seen[k, :n] = 1
            answer[k, len(context):n] = True
        rows = torch.tensor([r for r, _, _ in chunk], dtype=torch.long)
        logp, _ = policy.completion_logprobs(prompt_ids[rows].to(device), prompt_mask[rows].to(device),
                                             ids.to(device), seen.to(device))
        logp = logp.float().cpu()
        probs.append(answer_reward(logp, answer, "prob"))
        logps.append(answer_reward(logp, answer, "logprob"))
    return torch.cat(probs), torch.cat(logps)


@METHODS.register("rlcpr")
class RLCPR(Method):
    @classmethod
    def declared_keys(cls, config: Any) -> dict:
        # The monitored reward's scores are logged when the recipe has it, not needed.
        return {"annotate": ((REWARDS,), (), (meta_reward(config.get("monitor", "exact_answer")),))}

    def __init__(self, kind: Kind = "prob", debias: bool = False,
                 length_penalty: Annotated[float, Range(ge=0, why="λ_len; 0 is the plain probability reward")] = 0.1,
                 delta: Annotated[float, Range(ge=0, le=1)] = 0.05,
                 gate: Annotated[float, Range(ge=0, le=1)] = 0.5,
                 marker: str = "####", separator: str = ";", answer_end: bool = True,
                 max_segments: Annotated[int, Range(ge=1)] = 16,
                 combine: Literal["replace", "add"] = "replace",
                 coef: Annotated[float, Range(ge=0)] = 1.0,
                 monitor: str = "exact_answer",
                 micro_batch_size: Optional[Annotated[int, Range(ge=1)]] = None) -> None:
        """``kind``: the reward is the mean probability (RLPR) or mean log-probability of y*.
        ``debias``: subtract the empty trace's reward. ``length_penalty``: λ_len (0 turns the
        concentration penalty off: the baseline). ``delta``: δ of t*. ``gate``: the penalty
        applies when the probability-form r̃ ≥ gate. ``marker``/``separator``: the end of the
        trace and of its segments in the completion's text. ``answer_end``: score the EOS after
        y* too. ``max_segments``: the most boundaries measured per trace. ``combine``/``coef``:
        replace the rewards with coef · r_final, or add it. ``monitor``: a recipe reward whose
        score splits ``rlcpr/prob_right``/``prob_wrong`` (ignored when absent).
        ``micro_batch_size``: sequences per forward (default ``train.micro_batch_size``)."""
        self.kind, self.debias, self.length_penalty, self.delta = kind, debias, length_penalty, delta
        self.gate, self.marker, self.separator, self.answer_end = gate, marker, separator, answer_end
        self.max_segments, self.combine, self.coef, self.monitor = max_segments, combine, coef, monitor
        self.micro_batch_size = micro_batch_size
        self.policy = None
        self.sink = None  # the prompt sampler's record_rewards, when it has one
        self._answers: dict[str, list[int]] = {}

    @classmethod
    def check(cls, recipe: Any, need, config: Any) -> None:
        for key in ("marker", "separator"):
            value = (config or {}).get(key, "x")
            need(isinstance(value, str) and value != "",
                 f"methods[rlcpr]: {key} must be a non-empty string (the trace's end and segment separator in the "
                 f"completion text, e.g. '####' and ';'); got {value!r}")

    def setup(self, ctx: MethodContext) -> None:
        self.policy = ctx.policy
        self.sink = getattr(ctx.sampler, "record_rewards", None)  # None: another sampler
        self.micro = self.micro_batch_size or ctx.recipe.train.micro_batch_size
        tok = self.policy.tokenizer
        self._marker_ids = tok(self.marker, add_special_tokens=False)["input_ids"]
        self._eos = tok.eos_token_id

    def _answer_ids(self, answer: str) -> list[int]:
        if answer not in self._answers:
            ids = self.policy.tokenizer(str(answer), add_special_tokens=False)["input_ids"]
            self._answers[answer] = ids + ([self._eos] if self.answer_end and self._eos is not None else [])
        return self._answers[answer]

    def _traces(self, batch: RolloutBatch) -> list[tuple[list[int], int, list[int]]]:
        """Per row: (trace token ids, T, the boundaries to measure)."""
        tok, out = self.policy.tokenizer, []
        for ids, mask in zip(batch.completion_ids.tolist(), batch.completion_mask.tolist()):
            ids = [t for t, m in zip(ids, mask) if m]
            if ids and ids[-1] == self._eos:
                ids = ids[:-1]
            trace_len, cuts = split_trace(tok.batch_decode([[t] for t in ids]), self.marker, self.separator)
            if self.length_penalty > 0:
                cuts = thin(cuts, self.max_segments)
            else:  # only the full trace (and the empty one to debias) is needed
                cuts = sorted({trace_len} | ({0} if self.debias else set()))
            out.append((ids[:trace_len], trace_len, cuts))
        return out

    @torch.no_grad()
    def annotate(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        n = len(batch)
        traces = self._traces(batch)
        answers = [self._answer_ids(a) for a in batch.meta["answer"]]
        groups = batch.group_ids.tolist()
        # One job per (row, boundary); the empty trace once per group (its sequence is the group's).
        keys, jobs, where = [], [], {}
        for i, (ids, _, cuts) in enumerate(traces):
            for t in cuts:
                key = ("group", groups[i]) if t == 0 else ("row", i, t)
                if key not in where:
                    where[key] = len(jobs)
                    jobs.append((i, ids[:t] + self._marker_ids, answers[i]))
                keys.append((i, t, where[key]))
        with eval_mode(self.policy.model):
            prob, logp = answer_probabilities(self.policy, batch.prompt_ids, batch.prompt_mask, jobs, self.micro)
        width = max(len(c) for _, _, c in traces)
        p = torch.zeros(n, width)
        valid = torch.zeros(n, width, dtype=torch.bool)
        positions = torch.zeros(n, width, dtype=torch.long)
        for i, (_, _, cuts) in enumerate(traces):
            valid[i, :len(cuts)] = True
            positions[i, :len(cuts)] = torch.tensor(cuts)
        column = {}
        for i, t, j in keys:
            k = traces[i][2].index(t)
            p[i, k] = prob[j]
            column[(i, t)] = j
        trace_len = torch.tensor([t for _, t, _ in traces])
        final_j = torch.tensor([column[(i, int(trace_len[i]))] for i in range(n)])
        score = prob if self.kind == "prob" else logp
        reward, gate_value = score[final_j], prob[final_j]
        p_empty = None
        if self.debias:
            empty_j = torch.tensor([column[(i, 0)] for i in range(n)])
            p_empty = prob[empty_j]
            reward = debias(reward, score[empty_j], self.kind)
            gate_value = debias(gate_value, p_empty, "prob")
        metrics: dict[str, float] = {}
        if self.length_penalty > 0:
            t_star = concentration_point(p, valid, positions, self.delta)
            final = concentration_penalty(reward, gate_value, t_star, trace_len, self.length_penalty, self.gate)
            has = trace_len > 0
            metrics["rlcpr/t_star_frac"] = float((t_star[has].float() / trace_len[has]).mean()) if has.any() else 0.0
            metrics["rlcpr/penalised"] = float(((gate_value >= self.gate) & has & (t_star < trace_len)).float().mean())
        else:
            final = reward
        final = self.coef * final.to(batch.rewards.dtype).to(batch.rewards.device)
        batch.rewards = final if self.combine == "replace" else batch.rewards + final
        if self.sink is not None:
            self.sink(*group_rewards(batch.meta["prompt"], groups, final.tolist()))
        metrics.update(self._metrics(batch, final, prob[final_j], p_empty, trace_len))
        return metrics

    def _metrics(self, batch: RolloutBatch, final: Tensor, p_end: Tensor, p_empty: Optional[Tensor],
                 trace_len: Tensor) -> dict[str, float]:
        inverse, num_groups = group_inverse(batch.group_ids)
        first = group_first_rows(inverse.cpu(), num_groups)  # one row per group
        out = {"rlcpr/reward": float(final.mean()), "rlcpr/prob": float(p_end.mean()),
               "rlcpr/group_std": float(group_std(final.float().cpu(), batch.group_ids.cpu())[first].mean()),
               "rlcpr/trace_len": float(trace_len.float().mean())}
        if p_empty is not None:
            out["rlcpr/p_empty"] = float(p_empty.mean())
        scores = batch.meta.get(f"reward/{self.monitor}")
        if scores is not None:
            right = torch.tensor([float(v) > 0.5 for v in scores])
            if right.any():
                out["rlcpr/prob_right"] = float(p_end[right].mean())
            if (~right).any():
                out["rlcpr/prob_wrong"] = float(p_end[~right].mean())
        return out
