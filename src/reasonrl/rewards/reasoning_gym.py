"""The ``reasoning_gym`` reward: a reasoning-gym dataset's own scorer.

The problem's meta (set by the ``reasoning_gym`` task) names the dataset, the
keyword arguments it was built with, and the generated entry; the scorer is the
dataset object rebuilt from those and cached, never stored per problem, so meta
stays small and picklable. reasoning-gym is imported lazily: importing this
module works without it.

Answer extraction: the text of the last ``<answer>...</answer>`` in the
completion (reasoning-gym's convention), else the rest of the line after the
last ``####`` (this library's convention), stripped. No answer scores 0.
"""

from __future__ import annotations

import json
import re
from typing import Any

from reasonrl.registry import REWARDS, closest_match_hint
from reasonrl.problem import Problem

TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
MARK_RE = re.compile(r"####[ \t]*([^\n]*)")
INSTALL = "pip install reasoning-gym"

_GENERATORS: dict[str, Any] = {}


def generator(dataset: str, kwargs: dict[str, Any]) -> Any:
    """The reasoning-gym dataset ``dataset`` built with ``kwargs``, cached by value."""
    key = json.dumps([dataset, kwargs], sort_keys=True, default=repr)
    if key not in _GENERATORS:
        try:
            import reasoning_gym
            from reasoning_gym.factory import DATASETS
        except ImportError:
            raise ImportError(f"the reasoning_gym task and reward need the reasoning-gym package: {INSTALL}") from None
        if dataset not in DATASETS:
            known = sorted(DATASETS)
            raise ValueError(f"unknown reasoning-gym dataset '{dataset}'; {len(known)} are known, "
                             f"e.g. {', '.join(known[:8])}.{closest_match_hint(dataset, known)}")
        try:
            _GENERATORS[key] = reasoning_gym.create_dataset(dataset, **kwargs)
        except (TypeError, AssertionError, ValueError) as exc:
            # reasoning-gym validates configs with assert; surface it as a recipe error
            raise ValueError(f"reasoning-gym dataset '{dataset}' rejected its config {kwargs}: "
                             f"{type(exc).__name__}: {exc}") from None
    return _GENERATORS[key]


def extract_answer(completion: str) -> str | None:
    tagged = TAG_RE.findall(completion)
    if tagged:
        return tagged[-1].strip()
    marked = MARK_RE.findall(completion)
    return marked[-1].strip() if marked else None


@REWARDS.register("reasoning_gym")
def reasoning_gym_score(completion: str, problem: Problem, **_) -> float:
    """reasoning-gym's ``score_answer`` for the extracted answer (usually 0..1)."""
    meta = problem.meta
    if "rg_dataset" not in meta:
        raise ValueError("reward 'reasoning_gym' needs problems from the 'reasoning_gym' task")
    answer = extract_answer(completion)
    if not answer:
        return 0.0
    scorer = generator(meta["rg_dataset"], meta["rg_kwargs"])
    return float(scorer.score_answer(answer, meta["entry"]))
