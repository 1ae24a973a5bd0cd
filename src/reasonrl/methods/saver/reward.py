"""Grounding rewards for completions ``s-e=c`` (an inclusive span of frames and an answer): the
``grounding`` task's (``tasks.grounding``) and SAVER's (``docs/methods/saver.md``).

- ``grounding``: r_g = w_iou · IoU + w_ans · 1[â = a] + w_fmt · 1[parses] (``algos.saver``;
  INFERRED from SAVER's abstract (paper not located): temporal IoU plus answer
  correctness plus a format term; the weights are tunable defaults).
- ``grounding_hit``: 1 when IoU ≥ ``iou_threshold`` and the answer is right (temporal
  grounding's R@1 at an IoU threshold), the greedy accuracy ``eval.reward`` counts.

The gold is read from ``problem.answer`` (same format), so any task that writes its answers as
``s-e=c`` can use them.
"""

from __future__ import annotations

import re
from typing import Annotated

from reasonrl.methods.saver.maths import Prediction, grounding_score, span_iou
from reasonrl.params import Range
from reasonrl.registry import REWARDS
from reasonrl.problem import Problem

__all__ = ["parse_grounding", "extract_grounding", "grounding", "grounding_hit"]

GROUNDING_RE = re.compile(r"(\d{1,3})-(\d{1,3})=(\d)")


def parse_grounding(text: str) -> Prediction | None:
    """(start, end, answer) of a text that is exactly ``s-e=c`` (whitespace around ignored), or
    None (also for a reversed span, s > e)."""
    m = GROUNDING_RE.fullmatch(text.strip())
    if m is None:
        return None
    s, e = int(m.group(1)), int(m.group(2))
    return (s, e, m.group(3)) if s <= e else None


def _gold(problem: Problem) -> Prediction:
    gold = parse_grounding(problem.answer)
    if gold is None:
        raise ValueError(f"grounding rewards need answers written 's-e=c', got {problem.answer!r}")
    return gold


@REWARDS.register("grounding")
def grounding(completion: str, problem: Problem, *, num_tokens: int = 0, truncated: bool = False,
              iou_weight: Annotated[float, Range(ge=0)] = 1.0,
              answer_weight: Annotated[float, Range(ge=0)] = 1.0,
              format_weight: Annotated[float, Range(ge=0)] = 0.1) -> float:
    """r_g = iou_weight · IoU(span, gold span) + answer_weight · 1[answer right] + format_weight
    · 1[parses]; an unparsable or truncated completion scores 0."""
    pred = None if truncated else parse_grounding(completion)
    return grounding_score(pred, _gold(problem), iou_weight, answer_weight, format_weight)


@REWARDS.register("grounding_hit")
def grounding_hit(completion: str, problem: Problem, *, num_tokens: int = 0, truncated: bool = False,
                  iou_threshold: Annotated[float, Range(gt=0, le=1)] = 0.5) -> float:
    """1 when the span's IoU with the gold span is ≥ ``iou_threshold`` and the answer is right."""
    pred = None if truncated else parse_grounding(completion)
    gold = _gold(problem)
    return float(pred is not None and pred[2] == gold[2] and span_iou(pred[:2], gold[:2]) >= iou_threshold)


def extract_grounding(text: str) -> str | None:
    """The normalised ``s-e=c`` of a completion, or None when it does not parse."""
    pred = parse_grounding(text)
    return None if pred is None else f"{pred[0]}-{pred[1]}={pred[2]}"


# How an evaluation reads a completion's answer (majority voting, format failures).
grounding.extract = extract_grounding
grounding_hit.extract = extract_grounding
