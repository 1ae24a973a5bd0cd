"""Greedy accuracy on a task's held-out problems."""

from __future__ import annotations

from collections import defaultdict
from typing import Callable

from reasonrl.policy.hf import HFPolicy
from reasonrl.policy.sampling import Samples
from reasonrl.rewards.basic import exact_answer
from reasonrl.rollout.episodes import sample_problems
from reasonrl.problem import Problem


def greedy_samples(policy: HFPolicy, problems: list[Problem], max_new_tokens: int,
                   batch_size: int = 256, stop: list[str] | None = None) -> list[Samples]:
    """The greedy ``Samples`` of every problem, one per ``batch_size`` prompts, in order."""
    return [sample_problems(policy, problems[i:i + batch_size], 1, max_new_tokens, 0.0, stop=stop)
            for i in range(0, len(problems), batch_size)]


def greedy_texts(policy: HFPolicy, problems: list[Problem], max_new_tokens: int,
                 batch_size: int = 256, stop: list[str] | None = None) -> list[str]:
    """The greedy completion of every problem, sampled ``batch_size`` prompts at a time."""
    return [t for s in greedy_samples(policy, problems, max_new_tokens, batch_size, stop) for t in s.texts]


def greedy_outcomes(policy: HFPolicy, problems: list[Problem], max_new_tokens: int,
                    batch_size: int = 256, stop: list[str] | None = None,
                    reward: Callable[..., float] = exact_answer) -> list[bool]:
    """Per problem: does the greedy completion earn ``reward`` 1 (default: the exact ``####`` answer)?"""
    texts = greedy_texts(policy, problems, max_new_tokens, batch_size, stop)
    return [reward(t, p) == 1.0 for t, p in zip(texts, problems)]


def greedy_accuracy(policy: HFPolicy, problems: list[Problem], max_new_tokens: int,
                    batch_size: int = 256, stop: list[str] | None = None,
                    reward: Callable[..., float] = exact_answer) -> dict[str, float]:
    """Fraction of problems whose greedy completion is correct, overall and per ``form``
    when the task labels its problems."""
    return accuracy_by_form(greedy_outcomes(policy, problems, max_new_tokens, batch_size, stop, reward), problems)


def accuracy_by_form(correct: list[bool], problems: list[Problem]) -> dict[str, float]:
    result = {"accuracy": sum(correct) / max(len(correct), 1)}
    by_form: dict[str, list[bool]] = defaultdict(list)
    for ok, p in zip(correct, problems):
        if "form" in p.meta:
            by_form[p.meta["form"]].append(ok)
    for form, oks in sorted(by_form.items()):
        result[f"accuracy[{form}]"] = sum(oks) / len(oks)
    return result
