"""Reward functions and verifiers, registered in ``REWARDS``.

A reward function is called once per completion::

    fn(completion: str, problem: Problem, *, num_tokens: int, truncated: bool, **params) -> float

It may return ``None`` (no opinion) or raise: the scorer isolates failures
(see ``reasonrl.rewards.scorer``), so a broken reward never kills a run.
"""

from reasonrl.rewards import basic  # noqa: F401  (registers the built-in rewards)
from reasonrl.rewards import math  # noqa: F401  (registers "math_verify"; math-verify itself is imported lazily)
from reasonrl.rewards import reasoning_gym  # noqa: F401  (registers "reasoning_gym"; the package itself is imported lazily)
from reasonrl.rewards import coverage  # noqa: F401  (registers "coverage" and "label_hit")
from reasonrl.rewards import arithmetic_steps  # noqa: F401  (registers the "arithmetic_steps" token reward)
