"""``reasonrl eval``: n samples per problem → avg@k, pass@k, maj@k, greedy, with CIs.

Writes the per-problem correct counts beside the aggregates so that anyone can
recompute every number (pass@k from (n, c) alone).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from reasonrl.evaluate.metrics import bootstrap_ci, majority_answer, pass_at_k
from reasonrl.policy.hf import HFPolicy
from reasonrl.tasks.base import Problem


def evaluate_sampling(policy: HFPolicy, problems: list[Problem], *, is_correct: Callable[[str, Problem], bool],
                      extract: Callable[[str], str | None], n: int, ks: list[int], max_new_tokens: int,
                      temperature: float = 1.0, seed: int = 0, stop: list[str] | None = None,
                      batch_size: int = 32, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Sample ``n`` completions per problem (and one greedy) and score them.

    Token entropy is estimated as the mean −log p of the sampled tokens (an unbiased
    estimate of the sampling distribution's entropy); format failures are completions
    from which no answer can be extracted.
    """
    if n < 1 or any(not 1 <= k <= n for k in ks):
        raise ValueError(f"need n >= 1 and every k in 1..n; got n={n}, k={ks}")
    generator = torch.Generator().manual_seed(seed)
    rows: list[dict[str, Any]] = []
    per_prompt = max(1, batch_size // n)
    for start in range(0, len(problems), per_prompt):
        chunk = problems[start:start + per_prompt]
        prompts = [p.prompt for p in chunk]
        sampled = policy.sample(prompts, n, max_new_tokens, temperature, generator=generator, stop=stop)
        greedy = policy.sample(prompts, 1, max_new_tokens, 0.0, stop=stop).texts
        lengths = sampled.completion_mask.sum(-1)
        nll = -(sampled.sample_logprobs.sum(-1))
        for i, problem in enumerate(chunk):
            texts = sampled.texts[i * n:(i + 1) * n]
            answers = [extract(t) for t in texts]
            correct = [is_correct(t, problem) for t in texts]
            winner = majority_answer(answers)
            rows.append({
                "prompt": problem.prompt, "answer": problem.answer, "n": n, "correct": sum(correct),
                "greedy": is_correct(greedy[i], problem),
                "maj": {k: _majority_correct(answers[:k], texts[:k], correct[:k]) for k in ks},
                "majority_answer": winner,
                "format_failures": sum(a is None for a in answers),
                "tokens": int(lengths[i * n:(i + 1) * n].sum()),
                "nll": float(nll[i * n:(i + 1) * n].sum()),
            })
        if progress:
            progress(min(start + per_prompt, len(problems)), len(problems))
    return summarise(rows, ks)


def _majority_correct(answers, texts, correct) -> bool:
    """Is the majority answer a correct one? Judged by a sample that gave that answer."""
    winner = majority_answer(answers)
    return winner is not None and next(c for a, c in zip(answers, correct) if a == winner)


def summarise(rows: list[dict[str, Any]], ks: list[int]) -> dict[str, Any]:
    def with_ci(values: list[float]) -> dict[str, float]:
        lo, hi = bootstrap_ci(values)
        return {"mean": sum(values) / len(values), "ci_low": lo, "ci_high": hi}

    n = rows[0]["n"]
    metrics = {f"avg@{n}": with_ci([r["correct"] / n for r in rows]), "greedy": with_ci([float(r["greedy"]) for r in rows])}
    for k in ks:
        metrics[f"pass@{k}"] = with_ci([pass_at_k(n, r["correct"], k) for r in rows])
        metrics[f"maj@{k}"] = with_ci([float(r["maj"][k]) for r in rows])
    tokens = sum(r["tokens"] for r in rows)
    metrics["response_length"] = tokens / (n * len(rows))
    metrics["token_entropy"] = sum(r["nll"] for r in rows) / max(tokens, 1)
    metrics["format_failure_rate"] = sum(r["format_failures"] for r in rows) / (n * len(rows))
    return {"num_problems": len(rows), "n": n, "metrics": metrics,
            "per_problem": [{k: v for k, v in r.items() if k != "nll"} for r in rows]}
