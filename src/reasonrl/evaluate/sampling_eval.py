"""n samples per problem → avg@k, pass@k, maj@k, greedy, calibration, with CIs.

Used by ``reasonrl eval`` and by the training evaluation callback (``eval.n``). The
per-problem rows (correct counts, per-sample outcomes and confidences) are returned
beside the aggregates so that anyone can recompute every number.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

import torch

from reasonrl.evaluate.answer_spans import answer_confidences
from reasonrl.evaluate.calibration import auroc, brier_score, expected_calibration_error, overconfidence_rate
from reasonrl.evaluate.diagnostics import diagnostic_metrics, find_citations, is_committed
from reasonrl.evaluate.metrics import distinct_correct, majority_answer, mean_with_ci, pass_at_k
from reasonrl.policy.hf import HFPolicy
from reasonrl.rollout.episodes import sample_problems
from reasonrl.problem import Problem

# "confidence: 0.8", "Confidence = 80%", "confidence 0.75" (case-insensitive; the last one wins)
_STATED = re.compile(r"confidence\s*[:=]?\s*([0-9]*\.?[0-9]+)\s*(%?)", re.IGNORECASE)


def stated_confidence(text: str) -> float | None:
    """The confidence a completion states about its own answer, in [0, 1], or None."""
    found = _STATED.findall(text)
    if not found:
        return None
    number, percent = found[-1]
    value = float(number) / (100.0 if percent or float(number) > 1.0 else 1.0)
    return value if 0.0 <= value <= 1.0 else None


def evaluate_sampling(policy: HFPolicy, problems: list[Problem], *, is_correct: Callable[[str, Problem], bool],
                      extract: Callable[[str, Problem], str | None], n: int, ks: list[int], max_new_tokens: int,
                      temperature: float = 1.0, seed: int = 0, stop: list[str] | None = None,
                      batch_size: int = 32, greedy: bool = True,
                      group_metrics: Callable[[Problem, list[str]], dict[str, float]] | None = None,
                      progress: Callable[[int, int], None] | None = None, task: Any = None,
                      proxy: Callable[[str, Problem, int], float] | None = None,
                      citation_validators: list[str] | None = None) -> dict[str, Any]:
    """Sample ``n`` completions per problem (and one greedy unless ``greedy=False``) and score them.

    Token entropy is estimated as the mean −log p of the sampled tokens (an unbiased
    estimate of the sampling distribution's entropy); format failures are completions
    from which no answer can be extracted. ``group_metrics`` (a task's own quality
    measures of a problem's n completions, e.g. witness recovery) are averaged over problems.
    ``task`` (optional) locates answer spans its own way (``evaluate.answer_spans.split_spans``).
    ``proxy(text, problem, num_tokens)`` is the surface reward of the reward-hacking
    diagnostics (default: ``proxy_length_keyword`` with ``max_len=max_new_tokens``);
    ``citation_validators`` the names they check citations with (default: all registered).
    """
    if proxy is None:
        from reasonrl.rewards.proxy import proxy_length_keyword

        def proxy(text, problem, num_tokens):
            return proxy_length_keyword(text, problem, num_tokens=num_tokens, max_len=max_new_tokens)
    if n < 1 or any(not 1 <= k <= n for k in ks):
        raise ValueError(f"need n >= 1 and every k in 1..n; got n={n}, k={ks}")
    generator = torch.Generator().manual_seed(seed)
    rows: list[dict[str, Any]] = []
    per_prompt = max(1, batch_size // n)
    for start in range(0, len(problems), per_prompt):
        chunk = problems[start:start + per_prompt]
        sampled = sample_problems(policy, chunk, n, max_new_tokens, temperature, generator, stop)
        greedy_texts = sample_problems(policy, chunk, 1, max_new_tokens, 0.0, stop=stop).texts if greedy else None
        lengths = sampled.completion_mask.sum(-1)
        logp = sampled.sample_logprobs.sum(-1)
        tokenizer = getattr(policy, "tokenizer", None)
        answer_conf = (answer_confidences(tokenizer, sampled.completion_ids, sampled.completion_mask,
                                          sampled.sample_logprobs, task) if tokenizer is not None else None)
        for i, problem in enumerate(chunk):
            span = slice(i * n, (i + 1) * n)
            texts = sampled.texts[span]
            answers = [extract(t, problem) for t in texts]
            correct = [bool(is_correct(t, problem)) for t in texts]
            winner = majority_answer(answers)
            cited = [find_citations(t, citation_validators) for t in texts]
            row = {
                "prompt": problem.prompt, "answer": problem.answer, "n": n, "correct": sum(correct),
                "sample_correct": correct,
                "completions": texts,  # what the model wrote, kept in eval.json (issue 35)
                "maj": {k: _majority_correct(answers[:k], correct[:k]) for k in ks},
                "majority_answer": winner,
                "majority_votes": answers.count(winner) if winner is not None else 0,
                "majority_correct": _majority_correct(answers, correct),
                "format_failures": sum(a is None for a in answers),
                "distinct_correct": distinct_correct(texts, correct),
                "tokens": int(lengths[span].sum()),
                "nll": float(-logp[span].sum()),
                # geometric-mean token probability of each sample: a confidence every model has
                "sequence_confidence": [round(math.exp(float(lp) / max(int(ln), 1)), 6)
                                        for lp, ln in zip(logp[span], lengths[span])],
                "stated_confidence": [stated_confidence(t) for t in texts],
                # geometric-mean token probability of the answer span alone (None: no answer found)
                "answer_confidence": answer_conf[span] if answer_conf is not None else [None] * n,
                # reward-hacking diagnostics (evaluate.diagnostics)
                "committed": [is_committed(t, a) for t, a in zip(texts, answers)],
                "proxy": [round(float(proxy(t, problem, int(ln))), 6) for t, ln in zip(texts, lengths[span])],
                "citations": sum(f for f, _ in cited), "plausible_citations": sum(p for _, p in cited),
            }
            if "form" in problem.meta:
                row["form"] = problem.meta["form"]
            if greedy_texts is not None:
                row["greedy"] = bool(is_correct(greedy_texts[i], problem))
                row["greedy_completion"] = greedy_texts[i]
            if group_metrics is not None:
                row["group_metrics"] = group_metrics(problem, texts)
            rows.append(row)
        if progress:
            progress(min(start + per_prompt, len(problems)), len(problems))
    return summarise(rows, ks)


def _majority_correct(answers, correct) -> bool:
    """Is the majority answer a correct one? Judged by a sample that gave that answer."""
    winner = majority_answer(answers)
    return winner is not None and next(c for a, c in zip(answers, correct) if a == winner)


def calibration_metrics(confidence: list[float], correct: list[bool]) -> dict[str, float]:
    return {"ece": expected_calibration_error(confidence, correct), "brier": brier_score(confidence, correct),
            "auroc": auroc(confidence, correct), "overconfidence": overconfidence_rate(confidence, correct)}


def summarise(rows: list[dict[str, Any]], ks: list[int]) -> dict[str, Any]:
    n = rows[0]["n"]
    metrics: dict[str, Any] = {f"avg@{n}": mean_with_ci([r["correct"] / n for r in rows])}
    if "greedy" in rows[0]:
        metrics["greedy"] = mean_with_ci([float(r["greedy"]) for r in rows])
    for k in ks:
        metrics[f"pass@{k}"] = mean_with_ci([pass_at_k(n, r["correct"], k) for r in rows])
        metrics[f"maj@{k}"] = mean_with_ci([float(r["maj"][k]) for r in rows])
    tokens = sum(r["tokens"] for r in rows)
    metrics["response_length"] = tokens / (n * len(rows))
    metrics["token_entropy"] = sum(r["nll"] for r in rows) / max(tokens, 1)
    if all("distinct_correct" in r for r in rows):  # rows saved before it existed lack it
        metrics[f"distinct_correct@{n}"] = sum(r["distinct_correct"] for r in rows) / len(rows)
    metrics["format_failure_rate"] = sum(r["format_failures"] for r in rows) / (n * len(rows))
    metrics.update(_calibration(rows))
    if "committed" in rows[0]:  # rows saved before the diagnostics existed lack them
        metrics.update(diagnostic_metrics(rows))
    if "group_metrics" in rows[0]:
        for key in rows[0]["group_metrics"]:
            metrics[key] = mean_with_ci([float(r["group_metrics"][key]) for r in rows])
    return {"num_problems": len(rows), "n": n, "metrics": metrics,
            "per_problem": [{k: v for k, v in r.items() if k != "nll"} for r in rows]}


def _calibration(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Four confidences: the sequence's token probability (every sample), the majority
    answer's vote share (one per problem, against maj correctness: self-consistency), a
    confidence the completion states itself (only samples that state one), and the answer
    span's token probability (only samples with an answer; RL-ARC's c_a)."""
    out: dict[str, float] = {}
    correct = [c for r in rows for c in r["sample_correct"]]
    sources = {
        "sequence": ([c for r in rows for c in r["sequence_confidence"]], correct),
        "consistency": ([r["majority_votes"] / r["n"] for r in rows], [r["majority_correct"] for r in rows]),
    }
    for name in ("stated", "answer"):
        given = [(c, ok) for r in rows for c, ok in zip(r.get(f"{name}_confidence") or [], r["sample_correct"])
                 if c is not None]
        if given:
            sources[name] = ([c for c, _ in given], [ok for _, ok in given])
            out[f"calibration/{name}/rate"] = len(given) / len(correct)
    for name, (conf, ok) in sources.items():
        for key, value in calibration_metrics(conf, ok).items():
            out[f"calibration/{name}/{key}"] = value
    return out

