"""Rewards of the ``forecast`` task (``tasks.forecast``; macro2mind, arXiv 2610.07062, INFERRED;
``docs/methods/hindsight_regret.md``).

- ``forecast``: r = 1[sign(p̂ − p0) = sign(p1 − p0)] + η · max(0, 1 − |p̂ − p1| / scale)
  (``algos.regret.direction_magnitude_reward``), **format-gated**: 0 when the decomposition
  does not parse or the completion was truncated.
- ``forecast_direction``: 1 when it parses and the direction is right (the paper's headline
  "directional accuracy"), the 0/1 reward an evaluation counts (``eval.reward``).

A decomposition parses when it is ``g±d=price;`` per group judged relevant, then ``#p̂``
(prices 0..99), e.g. ``3+5=52;1+4=56;#56``, and its groups are distinct groups of the prompt,
in prompt order. Updates and running prices are the model's beliefs: only p̂ is scored. p0 and
the groups are read from the prompt, p1 from ``problem.answer``.
"""

from __future__ import annotations

from typing import Annotated

from reasonrl.methods.hindsight_regret.maths import direction_magnitude_reward
from reasonrl.params import Range
from reasonrl.registry import REWARDS
from reasonrl.problem import Problem
from reasonrl.methods.hindsight_regret.task import parse_event, parse_forecast

__all__ = ["forecast", "forecast_direction"]

def _outcome(problem: Problem) -> tuple[int, int]:
    _, p0, _ = parse_event(problem.prompt)
    try:
        return p0, int(problem.answer)
    except ValueError:
        raise ValueError(f"forecast rewards need the outcome price p1 as problem.answer, got {problem.answer!r}") from None


@REWARDS.register("forecast")
def forecast(completion: str, problem: Problem, *, num_tokens: int = 0, truncated: bool = False,
             eta: Annotated[float, Range(ge=0, why="the weight of the magnitude term")] = 1.0,
             scale: Annotated[float, Range(gt=0, why="the miss, in price points, that earns no magnitude")] = 10.0) -> float:
    """Direction + η · magnitude of the forecast p̂, 0 unless the decomposition parses."""
    p0, p1 = _outcome(problem)
    parsed = None if truncated else parse_forecast(completion, problem.prompt)
    return 0.0 if parsed is None else direction_magnitude_reward(parsed.forecast, p0, p1, eta, scale)


@REWARDS.register("forecast_direction")
def forecast_direction(completion: str, problem: Problem, *, num_tokens: int = 0, truncated: bool = False) -> float:
    """1 when the decomposition parses and sign(p̂ − p0) = sign(p1 − p0), else 0."""
    p0, p1 = _outcome(problem)
    parsed = None if truncated else parse_forecast(completion, problem.prompt)
    return 0.0 if parsed is None else direction_magnitude_reward(parsed.forecast, p0, p1, eta=0.0)
