"""Built-in rewards: exact final answer, answer format, soft overlong punishment."""

from __future__ import annotations

import re

import torch

from reasonrl.algos.overlong import soft_overlong_punishment
from reasonrl.registry import REWARDS
from reasonrl.problem import Problem

ANSWER_RE = re.compile(r"####\s*(-?[\d,]*\.?\d+)")
# One or more `x op y = z` steps separated by ';', then the final answer.
WORKED_FORMAT_RE = re.compile(r"^(?:[\d()+\-*/ ]+=-?\d+;)+####-?\d+$")


def extract_answer(completion: str) -> str | None:
    """The number after the last ``####`` marker, without thousands separators."""
    found = ANSWER_RE.findall(completion)
    return found[-1].replace(",", "") if found else None


def _numeric_equal(a: str, b: str) -> bool:
    try:
        return float(a) == float(b)
    except ValueError:
        return a.strip() == b.strip()


@REWARDS.register("exact_answer")
def exact_answer(completion: str, problem: Problem, **_) -> float:
    """1.0 when the ``####`` answer equals the reference answer numerically, else 0.0."""
    answer = extract_answer(completion)
    return float(answer is not None and _numeric_equal(answer, problem.answer))


@REWARDS.register("format")
def worked_format(completion: str, problem: Problem, **_) -> float:
    """1.0 when the completion is a sequence of ``a op b=c;`` steps followed by ``####N``."""
    return float(bool(WORKED_FORMAT_RE.match(completion.strip())))


@REWARDS.register("soft_overlong")
def soft_overlong(completion: str, problem: Problem, *, num_tokens: int, truncated: bool,
                  max_len: int, buffer_len: int, penalty_factor: float = 1.0, **_) -> float:
    """DAPO's soft overlong punishment of the completion length (see ``algos.overlong``)."""
    lengths = torch.tensor([float(num_tokens)])
    return float(soft_overlong_punishment(lengths, max_len, buffer_len, penalty_factor)[0])
