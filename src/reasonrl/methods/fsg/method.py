"""FSG-RL's verifier on the method hooks (github.com/ZihanLiummyycc/FSG-RL; ``docs/methods/fsg_rl.md``).

Named in the recipe's ``methods:`` list, with the ``function_graph`` task and the span-level
advantage::

    methods: [{name: fsg_verifier}]          # the λ weights are its parameters
    advantage: {name: fsg_span}

Every step, in ``annotate`` (after scoring and selection, before the advantages), for every row:

1. parse the completion's tagged spans against ``problem.meta["graph"]`` (``rewards.fsg_parse``):
   format gate F, signatures sig_n, the stated answer;
2. run each node's code with its unit and property tests, and the whole program's
   ``target_call``, in the sandbox (``rewards.fsg_exec``, a ``SandboxPool`` of ``workers``):
   exec_n, unit_n, prop_n, node_n, the edge checks edge_e, the backward check and a_final;
3. consensus cons (the share of the group whose span of node n, or stated answer for main,
   is the same as this rollout's, averaged over its nodes; the reference's
   ``apply_group_consensus``) and, when ``lambda_eff > 0``, the efficiency penalty
   eff = ⅓·(min(1, runtime/runtime_budget_s) + min(1, spans/tool_budget) + min(1, tokens/token_budget));
   with a ``teacher``, the teacher group judge (``rewards.fsg_judge``), called once per group
   (``teacher_workers`` groups at once): t per rollout and t_n per node, in [0, 1];
4. with the answer gate g = f + (1 − f)·a_final::

       R   = F·(λ_fmt·F + λ_sig·sig + g·(λ_exec·exec + λ_unit·unit + λ_prop·prop + λ_node·node + λ_edge·edge)
                + λ_final·a + λ_back·back + λ_cons·cons + λ_teach·t) − λ_eff·eff
       R_n = F·(λ_sig·sig_n + g·(λ_node·node_n + λ_exec·exec_n + λ_unit·unit_n + λ_prop·prop_n)
                + κ·(λ_final·a + λ_back·back)[n ≠ main] + λ_teach·t_n + Σ_{e∋n} ½·g·λ_edge·edge_e
                + (λ_final·a + λ_back·back + λ_cons·cons)[n = main])

   (``algos.fsg.fsg_total_reward`` / ``fsg_span_rewards``; sig, exec, node, edge are means over
   all nodes / edges, unit and prop over the nodes that have such tests);
5. ``batch.rewards``: ``reward: replace`` (default) sets it to R — R is the whole FSG-RL reward,
   the recipe's reward functions (e.g. ``fsg_answer``) then only feed the sampling statistics and
   ``reward/*`` metrics; ``add`` adds R to their sum; ``keep`` leaves it (metrics only: the
   baseline recipe logs the same numbers while training on the answer alone);
6. with ``span_map`` (default), ``batch.aux["fsg_span_rewards"]`` [B, S] (R_n, node column n,
   0-padded to the batch's largest graph) and ``batch.aux["fsg_span_ids"]`` [B, T]: node index + 1
   on every completion token whose characters overlap node n's span content (between its tags,
   as the reference's span offsets; ``rewards.token_level.token_char_spans``), 0 elsewhere (tags,
   padding). Spans are mapped whether or not F = 1 (when F = 0 every R_n is 0).

The teacher is off by default (``teacher: null``: t = t_n = 0). ``teacher`` names a judge of
``FSG_JUDGES`` (``reference``: differential testing against the graph's reference code, an
offline privileged stand-in; ``openai_chat``: the reference's LLM judge behind an HTTP endpoint)
or ``file.py:Class``, built with ``teacher_params`` (checked against its signature when the
recipe loads); ``lambda_teach`` is the reference's teacher-run 0.25. A judge that raises leaves
its group's t = t_n = 0 and is counted (``teacher_fail_open``, as the reference's ``fail_open``);
``teacher_fail_open: false`` stops the run instead. The judge's seed comes from (``train.seed``,
step, the group's first row), never from global state, so a resumed run judges alike. There is
no repair loop (repaired = 0, so λ_rep is not a parameter): it regenerates rollouts from a
teacher's feedback, a sampling stage of its own, not a score of this one.

Metrics (means over the batch's rows): ``fsg/final_accuracy`` and ``fsg/full_success`` (the
paper's two), ``fsg/format``, ``fsg/executable`` (every node ran and no test raised),
``fsg/signature``, ``fsg/unit``, ``fsg/property``, ``fsg/edge``, ``fsg/backward``,
``fsg/consensus``, ``fsg/reward`` (R), ``fsg/rejected`` (rows with a node the code policy
refused), ``fsg/sandbox_failed`` (rows whose sandbox did not finish), ``fsg/verify_s``; with a
teacher also ``fsg/teacher`` (t), ``fsg/teacher_failed`` (share of groups whose judge failed) and
``fsg/teacher_s`` (the judge's seconds, part of ``fsg/verify_s``).
"""

from __future__ import annotations

import time
import zlib
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any, Literal

import torch

from reasonrl.methods.fsg.advantage import SPAN_IDS_KEY, SPAN_REWARDS_KEY, FSGWeights, fsg_span_rewards, fsg_total_reward
from reasonrl.batch import RolloutBatch
from reasonrl.dataflow import REWARDS
from reasonrl.hooks import Method, MethodContext
from reasonrl.params import Range
from reasonrl.registry import METHODS
from reasonrl.methods.fsg.execute import Verdict, verify
from reasonrl.methods.fsg.judge import build_judge, check_judge, group_scores
from reasonrl.methods.fsg.parse import ParsedCompletion, node_ids, parse_completion

__all__ = ["FSGVerifier", "consensus", "span_token_ids"]

_W = FSGWeights()
Weight = Annotated[float, Range(ge=0)]
LAMBDA_TEACH = 0.25  # the reference's teacher runs (config/grpo_teacher_*.json)


def rows_by_group(group_ids: list[int]) -> dict[int, list[int]]:
    """The row indices of each group, in order of first appearance."""
    groups: dict[int, list[int]] = defaultdict(list)
    for i, g in enumerate(group_ids):
        groups[g].append(i)
    return groups


def consensus(parsed: list[ParsedCompletion], ids: list[list[str]], group_ids: list[int]) -> list[float]:
    """Per rollout: over its nodes with a span, the share of its group's spans of that node that
    agree with its own (whitespace-free code; ``main``: the stated answer when there is one), averaged."""
    def value(p: ParsedCompletion, node: str) -> str | None:
        span = p.spans.get(node)
        if span is None or not span.text.strip():
            return None
        if node == "main" and p.answer is not None:
            return "answer:" + p.answer
        return "code:" + "".join(span.text.split())

    groups = rows_by_group(group_ids)
    out = [0.0] * len(parsed)
    for rows in groups.values():
        counts = {node: Counter(v for r in rows if (v := value(parsed[r], node)) is not None) for node in ids[rows[0]]}
        for r in rows:
            scores = [counts[n][v] / sum(counts[n].values()) for n in ids[r] if (v := value(parsed[r], n)) is not None]
            out[r] = sum(scores) / len(scores) if scores else 0.0
    return out


def span_token_ids(tokenizer, batch: RolloutBatch, parsed: list[ParsedCompletion], ids: list[list[str]]) -> torch.Tensor:
    """[B, T] long: node index + 1 on the completion tokens that overlap that node's span content."""
    from reasonrl.rewards.token_level import token_char_spans

    out = torch.zeros(batch.completion_ids.shape, dtype=torch.long)
    lengths = batch.completion_mask.sum(-1).tolist()
    for i, (p, nodes) in enumerate(zip(parsed, ids)):
        if not p.spans:
            continue
        chars = token_char_spans(tokenizer, batch.completion_ids[i, :int(lengths[i])].tolist())
        for k, node in enumerate(nodes):
            span = p.spans.get(node)
            if span is None:
                continue
            for t, (s, e) in enumerate(chars):
                if s < span.end and e > span.start:
                    out[i, t] = k + 1
    return out


@METHODS.register("fsg_verifier")
class FSGVerifier(Method):
    writes = (SPAN_IDS_KEY, SPAN_REWARDS_KEY)

    def __init__(self, reward: Literal["replace", "add", "keep"] = "replace", span_map: bool = True,
                 lambda_fmt: Weight = _W.fmt, lambda_sig: Weight = _W.sig, lambda_exec: Weight = _W.exec,
                 lambda_unit: Weight = _W.unit, lambda_prop: Weight = _W.prop, lambda_node: Weight = _W.node,
                 lambda_edge: Weight = _W.edge, lambda_final: Weight = _W.final, lambda_back: Weight = _W.back,
                 lambda_cons: Weight = _W.cons, lambda_eff: Weight = _W.eff,
                 answer_gate_floor: Annotated[float, Range(ge=0, le=1)] = _W.answer_gate_floor,
                 span_answer_credit: Weight = _W.span_answer_credit,
                 sandbox_timeout_s: Annotated[float, Range(gt=0)] = 5.0,
                 test_timeout_s: Annotated[float, Range(gt=0)] = 1.0,
                 memory_mb: Annotated[int, Range(ge=32)] = 256,
                 workers: Annotated[int, Range(ge=1)] = 2,
                 per_sandbox: Annotated[int, Range(ge=1)] = 8,
                 runtime_budget_s: Annotated[float, Range(gt=0)] = 5.0,
                 tool_budget: Annotated[int, Range(ge=1)] = 8,
                 token_budget: Annotated[int, Range(ge=1)] = 2048,
                 teacher: str | None = None, teacher_params: dict | None = None,
                 lambda_teach: Weight = LAMBDA_TEACH, teacher_workers: Annotated[int, Range(ge=1)] = 2,
                 teacher_fail_open: bool = True) -> None:
        """``reward``: what R does to ``batch.rewards`` (module docstring); ``span_map``: write
        the span rewards and the token→node map for ``advantage: fsg_span``. ``lambda_*``: the
        weights λ (defaults: the reference's main config, ``FSGWeights()``). ``sandbox_timeout_s``:
        each sandbox's wall time (the reference's 5 s); ``test_timeout_s``: each node's code and
        each test; ``workers``: sandboxes at once; ``per_sandbox``: ignored (each rollout has its own).
        ``runtime_budget_s``, ``tool_budget``, ``token_budget``: the efficiency penalty's scales
        (the reference's 5 s, 8 code blocks, 2048 tokens), used only when ``lambda_eff > 0``.
        ``teacher``: the teacher group judge (None: off; a name of ``FSG_JUDGES`` or
        ``file.py:Class``) built with ``teacher_params``; ``lambda_teach``: λ_teach, used only with
        a teacher; ``teacher_workers``: groups judged at once; ``teacher_fail_open``: a judge that
        raises zeroes its group's t and t_n (counted in ``fsg/teacher_failed``) instead of
        stopping the run (module docstring)."""
        self.check_params(teacher=teacher, teacher_params=teacher_params, lambda_teach=lambda_teach)
        self.reward, self.span_map = reward, span_map
        self.weights = FSGWeights(fmt=lambda_fmt, sig=lambda_sig, exec=lambda_exec, unit=lambda_unit,
                                  prop=lambda_prop, node=lambda_node, edge=lambda_edge, final=lambda_final,
                                  back=lambda_back, cons=lambda_cons, teach=lambda_teach if teacher else 0.0,
                                  eff=lambda_eff, answer_gate_floor=answer_gate_floor,
                                  span_answer_credit=span_answer_credit)
        self.judge = build_judge(teacher, teacher_params or {}) if teacher else None
        self.teacher, self.teacher_workers, self.teacher_fail_open = teacher, teacher_workers, teacher_fail_open
        self.seed, self.log = 0, lambda message: None
        self.limits = {"timeout_s": sandbox_timeout_s, "test_timeout_s": test_timeout_s, "memory_mb": memory_mb,
                       "per_sandbox": per_sandbox}
        self.workers = workers
        self.budgets = (runtime_budget_s, tool_budget, token_budget)
        self.tokenizer = None

    @staticmethod
    def check_params(teacher: str | None = None, teacher_params: dict | None = None,
                     lambda_teach: float = LAMBDA_TEACH, **_) -> None:
        """The teacher's settings, when the recipe loads (a ValueError naming the key)."""
        if teacher is not None:
            check_judge(teacher, teacher_params or {})
        elif teacher_params:
            raise ValueError("teacher_params is set but teacher is not; name a judge (teacher: reference, "
                             "teacher: openai_chat, or teacher: path/to/file.py:Class)")
        elif lambda_teach != LAMBDA_TEACH:
            raise ValueError("lambda_teach weighs the teacher judge's scores, and teacher is not set; name a judge "
                             "(teacher: reference, openai_chat or path/to/file.py:Class) or drop lambda_teach")

    @classmethod
    def declared_keys(cls, config: Any) -> dict:
        produces = (SPAN_IDS_KEY, SPAN_REWARDS_KEY) if (config or {}).get("span_map", True) else ()
        if (config or {}).get("reward", "replace") != "keep":
            produces += (REWARDS,)
        return {"annotate": (produces, ())}

    @classmethod
    def check(cls, recipe: Any, need, config: Any) -> None:
        reward = (config or {}).get("reward", "replace")
        need(recipe.advantage.name != "fsg_span" or reward != "keep",
             "advantage fsg_span with reward: keep would give the tokens outside the spans the recipe's reward and "
             "those inside FSG's span rewards; use reward: replace (or add)")

    def setup(self, ctx: MethodContext) -> None:
        from reasonrl.isolation.sandbox import sandbox_backend

        self.tokenizer = ctx.policy.tokenizer
        if self.judge is not None:  # its seeds start from the run's; its failures go to the run's log
            self.seed, self.log = ctx.recipe.train.seed if ctx.recipe is not None else 0, ctx.log
        sandbox_backend()  # fail at the start, with the sandbox's own message, not at step 1

    def verify(self, completions: list[str], problems: list) -> list[Verdict]:
        from reasonrl.isolation.sandbox import SandboxPool

        with SandboxPool(self.workers, memory_mb=self.limits["memory_mb"]) as pool:
            return verify(completions, problems, pool=pool, **self.limits)

    def teach(self, completions: list[str], problems: list, parsed: list[ParsedCompletion], verdicts: list[Verdict],
              group_ids: list[int], step: int) -> tuple[list[float], list[list[float]], int]:
        """(t [B], t_n per row in graph order, groups whose judge failed): the judge called once per
        group, with the seed of (run seed, step, the group's first row)."""
        groups = rows_by_group(group_ids)
        who = f"fsg_verifier teacher '{self.teacher}'"

        def judge(rows: list[int]) -> tuple[list[float], list[list[float]]]:
            seed = zlib.crc32(f"{self.seed}:{step}:{rows[0]}".encode())
            got = self.judge.judge(problems[rows[0]], [completions[r] for r in rows], [parsed[r] for r in rows],
                                   [verdicts[r] for r in rows], seed=seed)
            return group_scores(got, len(rows), node_ids(problems[rows[0]]), who)

        t, t_n, failed = [0.0] * len(completions), [[0.0] * len(node_ids(p)) for p in problems], 0
        with ThreadPoolExecutor(self.teacher_workers, thread_name_prefix="fsg-judge") as pool:
            futures = [(rows, pool.submit(judge, rows)) for rows in groups.values()]
            for rows, future in futures:
                try:
                    ts, tns = future.result()
                except Exception as exc:  # noqa: BLE001 - fail open as the reference: the group keeps t = 0
                    if not self.teacher_fail_open:
                        raise
                    failed += 1
                    if failed == 1:
                        self.log(f"step {step}: {who} failed on a group (its t = 0; fsg/teacher_failed is the "
                                 f"share of groups that failed): {type(exc).__name__}: {exc}")
                    continue
                for r, a, b in zip(rows, ts, tns):
                    t[r], t_n[r] = a, b
        return t, t_n, failed

    def scores(self, verdicts: list[Verdict], parsed: list[ParsedCompletion], problems: list, group_ids: list[int],
               num_tokens: list[int] | None = None,
               teach: tuple[list[float], list[list[float]]] | None = None) -> tuple[torch.Tensor, torch.Tensor, list[float]]:
        """(R [B], R_n [B, S] zero-padded, cons [B]) of the verdicts (module docstring, steps 3-4);
        ``teach``: the judge's (t per row, t_n per row in graph order), None: t = t_n = 0."""
        w, t = self.weights, torch.tensor
        ids = [node_ids(p) for p in problems]
        cons = consensus(parsed, ids, group_ids)
        means = [v.means() for v in verdicts]
        col = {k: t([m[k] for m in means]) for k in ("sig", "exec", "unit", "prop", "node", "edge")}
        fmt, final, back = (t([getattr(v, k) for v in verdicts]) for k in ("fmt", "final", "back"))
        eff = 0.0
        if w.eff > 0:
            runtime, tools, tokens = self.budgets
            eff = t([(min(1.0, v.seconds / runtime) + min(1.0, len(p.spans) / tools)
                      + min(1.0, (num_tokens[i] if num_tokens else 0) / tokens)) / 3.0
                     for i, (v, p) in enumerate(zip(verdicts, parsed))])
        total = fsg_total_reward(w, fmt, col["sig"], col["exec"], col["unit"], col["prop"], col["node"], col["edge"],
                                 final, back, cons=t(cons), teach=t(teach[0]) if teach else 0.0, eff=eff)
        spans = torch.zeros(len(verdicts), max(len(n) for n in ids))
        for i, (v, nodes, problem) in enumerate(zip(verdicts, ids, problems)):
            graph_edges = [(nodes.index(e["source"]), nodes.index(e["target"])) for e in problem.meta["graph"]["edges"]]
            row = fsg_span_rewards(w, fmt[i:i + 1], t([v.sig]), t([v.node]), t([v.exec]), t([v.unit]), t([v.prop]),
                                   final[i:i + 1], back[i:i + 1], main=nodes.index("main"), edges=graph_edges,
                                   edge_e=t([v.edges]) if graph_edges else None, cons=t(cons[i:i + 1]),
                                   teach_n=t([teach[1][i]]) if teach else 0.0)
            spans[i, :len(nodes)] = row[0]
        return total, spans, cons

    def annotate(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        started = time.perf_counter()
        completions, problems = batch.meta["completion"], batch.meta["problem"]
        ids = [node_ids(p) for p in problems]
        verdicts = self.verify(completions, problems)
        parsed = [parse_completion(c, n) for c, n in zip(completions, ids)]
        num_tokens = batch.response_mask.sum(-1).tolist()
        teach, teacher = None, {}
        if self.judge is not None:
            judged = time.perf_counter()
            t, t_n, failed = self.teach(completions, problems, parsed, verdicts, batch.group_ids.tolist(), step)
            teach = (t, t_n)
            teacher = {"fsg/teacher": sum(t) / max(len(t), 1),
                       "fsg/teacher_failed": failed / max(len(set(batch.group_ids.tolist())), 1),
                       "fsg/teacher_s": round(time.perf_counter() - judged, 4)}
        total, spans, cons = self.scores(verdicts, parsed, problems, batch.group_ids.tolist(), num_tokens, teach)
        if self.reward == "replace":
            batch.rewards = total.to(batch.rewards.dtype)
        elif self.reward == "add":
            batch.rewards = batch.rewards + total.to(batch.rewards.dtype)
        if self.span_map:
            if self.tokenizer is None:
                raise RuntimeError("fsg_verifier: setup() was not called (it takes the policy's tokenizer for the span map)")
            batch.aux[SPAN_REWARDS_KEY] = spans
            batch.aux[SPAN_IDS_KEY] = span_token_ids(self.tokenizer, batch, parsed, ids)
        n = max(len(verdicts), 1)

        def mean(values) -> float:
            return float(sum(values)) / n

        means = [v.means() for v in verdicts]
        return {"fsg/final_accuracy": mean(v.final for v in verdicts),
                "fsg/full_success": mean(v.full_success for v in verdicts),
                "fsg/format": mean(v.fmt for v in verdicts),
                "fsg/executable": mean(v.executable for v in verdicts),
                **{f"fsg/{name}": mean(m[key] for m in means)
                   for name, key in (("signature", "sig"), ("unit", "unit"), ("property", "prop"), ("edge", "edge"))},
                "fsg/backward": mean(v.back for v in verdicts),
                "fsg/consensus": mean(cons),
                "fsg/reward": float(total.mean()) if len(total) else 0.0,
                "fsg/rejected": mean(bool(v.rejected) for v in verdicts),
                "fsg/sandbox_failed": mean(v.sandbox_failed for v in verdicts),
                **teacher,
                "fsg/verify_s": round(time.perf_counter() - started, 4)}
