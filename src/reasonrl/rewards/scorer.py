"""The scoring stage: weighted sum of reward functions, with failures isolated.

r_i = Σ_k w_k · R_k(o_i)  (TRL's convention). A reward function that raises or
returns NaN/inf gives that sample 0 for that function and increments a
per-function failure count; ``None`` counts as "no opinion" (0, not a failure).
So does a call that runs past its timeout or whose process dies (segfault,
``os._exit``, MemoryError): no reward function can hang or kill a run.

Every call runs in a worker process forked from this one, under its timeout
(``rewards[i].timeout_s``, default ``rollout.reward_timeout_s``); ``workers: N``
gives a function N workers of its own. How calls are isolated, and what that
costs, is in the docstring of :mod:`reasonrl.isolation.workers`.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from reasonrl.registry import REWARDS
from reasonrl.isolation.workers import ERROR, FATAL, OK, Job, Workers, shorten
from reasonrl.problem import Problem

if TYPE_CHECKING:
    from reasonrl.sections import Recipe

__all__ = ["RewardSpec", "Scores", "Scorer", "build_scorer", "group_reward", "DEFAULT_TIMEOUT_S"]

DEFAULT_TIMEOUT_S = 30.0


@dataclass
class RewardSpec:
    name: str
    weight: float = 1.0
    params: dict[str, Any] = field(default_factory=dict)
    timeout_s: float | None = None
    """Seconds one call may take before it scores 0 (None: the scorer's default)."""
    workers: int = 0
    """Worker processes scoring this function in parallel (0: the shared worker)."""


@dataclass
class Scores:
    total: list[float]
    per_function: dict[str, list[float]]
    failures: dict[str, int]


def group_reward(fn: Callable) -> Callable:
    """Mark a reward function as group-level: it scores all G completions of one prompt
    together (e.g. a coverage reward that pays for distinct correct answers)::

        fn(completions: list[str], problem: Problem, *, num_tokens: list[int],
           truncated: list[bool], **params) -> list[float]
    """
    fn.group_reward = True
    return fn


def build_scorer(recipe: "Recipe") -> "Scorer":
    """The scorer of a recipe: ``recipe.rewards`` with their ``timeout_s``/``workers``,
    ``rollout.reward_timeout_s`` as the default timeout. Close it when done."""
    from reasonrl.params import ConfigError

    default = recipe.rollout.reward_timeout_s
    if not _valid_timeout(default):
        raise ConfigError(f"rollout.reward_timeout_s must be a number > 0, got {default!r}")
    specs = [RewardSpec(r.name, r.weight, dict(r.params), r.timeout_s, r.workers) for r in recipe.rewards]
    try:
        return Scorer(specs, default_timeout_s=default)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


class Scorer:
    """Scores completions with the weighted reward functions of ``specs``.

    Every call runs in a forked worker process under a timeout (see
    :mod:`reasonrl.isolation.workers`); failures score 0 and are counted per function in
    ``Scores.failures``. Use it as a context manager or call :meth:`close` to stop
    its workers (they are also stopped when it is garbage-collected, and at exit).
    """

    def __init__(self, specs: list[RewardSpec], default_timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if not specs:
            raise ValueError("rewards: at least one reward function is required")
        if not _valid_timeout(default_timeout_s):
            raise ValueError(f"rollout.reward_timeout_s must be a number > 0, got {default_timeout_s!r}")
        for s in specs:
            if s.timeout_s is not None and not _valid_timeout(s.timeout_s):
                raise ValueError(f"rewards: 'timeout_s' of reward '{s.name}' must be a number > 0 "
                                 f"(or null for rollout.reward_timeout_s), got {s.timeout_s!r}")
            if isinstance(s.workers, bool) or not isinstance(s.workers, int) or s.workers < 0:
                raise ValueError(f"rewards: 'workers' of reward '{s.name}' must be an integer >= 0, got {s.workers!r}")
        self.specs = specs
        self.fns: list[Callable] = [REWARDS.get(s.name) for s in specs]
        self.timeouts = [float(s.timeout_s if s.timeout_s is not None else default_timeout_s) for s in specs]
        self._group = [bool(getattr(fn, "group_reward", False)) for fn in self.fns]
        fns, group = self.fns, self._group  # the workers' call must not hold the scorer: its GC reaps them
        self._workers = Workers(lambda k, payload: _call(fns[k], group[k], payload, specs[k].params),
                                [s.workers for s in specs])
        self._warned: set[tuple[str, str]] = set()

    # -- public API ---------------------------------------------------------------

    def __call__(self, completions: list[str], problems: list[Problem], num_tokens: list[int],
                 truncated: list[bool], group_size: int = 1) -> Scores:
        """Rows ``[k·group_size, (k+1)·group_size)`` answer one problem (the sampler's layout)."""
        n = min(len(completions), len(problems), len(num_tokens), len(truncated))
        jobs: list[list[Job]] = []
        for k in range(len(self.specs)):
            if self._group[k]:
                bounds = [(s, min(s + max(1, group_size), n)) for s in range(0, n, max(1, group_size))]
                jobs.append([Job(k, s, e, (completions[s:e], problems[s], num_tokens[s:e], truncated[s:e]),
                                 self.timeouts[k]) for s, e in bounds])
            else:
                jobs.append([Job(k, i, i + 1, (completions[i], problems[i], num_tokens[i], truncated[i]),
                                 self.timeouts[k]) for i in range(n)])
        self._workers.run([j for per_fn in jobs for j in per_fn])
        per_fn: dict[str, list[float]] = {}
        failures: dict[str, int] = {}
        for k, spec in enumerate(self.specs):
            values, failed = [0.0] * n, 0
            for job in jobs[k]:
                if job.status == OK:
                    values[job.start:job.end] = job.value if self._group[k] else [job.value]
                else:
                    failed += job.end - job.start
                    self._warn(k, job)
            per_fn[spec.name], failures[spec.name] = values, failed
        total = [sum(s.weight * per_fn[s.name][i] for s in self.specs) for i in range(n)]
        return Scores(total=total, per_function=per_fn, failures=failures)

    def start(self) -> "Scorer":
        """Start every worker now rather than on the first call. A worker shares the memory
        its parent had when it was forked, and keeps the old copy of every page the parent
        later writes (copy-on-write): forked before a CPU model is loaded, it pins none of
        the model's weights or optimizer state. Returns the scorer."""
        self._workers.start()
        return self

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the live worker processes (started lazily by the first call)."""
        return self._workers.pids

    def close(self) -> None:
        """Kill and reap every worker (a later call starts new ones)."""
        self._workers.close()

    def __enter__(self) -> "Scorer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _warn(self, k: int, job: Job) -> None:
        name, kind = self.specs[k].name, job.status
        if (name, kind) in self._warned:
            return
        self._warned.add((name, kind))
        what = "that group" if self._group[k] else "that sample"
        warnings.warn(f"reward '{name}' failed ({job.error}); scoring 0 for {what} and counting failures in "
                      f"reward_failures/{name} (timeout_s={self.timeouts[k]:g}, workers={self.specs[k].workers})",
                      stacklevel=3)


def _valid_timeout(value: Any) -> bool:
    return (not isinstance(value, bool) and isinstance(value, (int, float))
            and math.isfinite(value) and value > 0)


class _NonFinite(ValueError):
    pass


def _checked(value: Any) -> float:
    value = 0.0 if value is None else float(value)
    if not math.isfinite(value):
        raise _NonFinite(f"returned a non-finite reward ({value})")
    return value


def _call(fn: Callable, group: bool, payload: tuple, params: dict[str, Any]) -> tuple[str, Any]:
    """One reward call, as (status, value or error message). Shared by workers and the inline path."""
    try:
        if group:
            texts, problem, ns, truncs = payload
            out = list(fn(texts, problem, num_tokens=ns, truncated=truncs, **params))
            if len(out) != len(texts):
                raise ValueError(f"returned {len(out)} rewards for a group of {len(texts)}")
            return OK, [_checked(v) for v in out]
        text, problem, n, trunc = payload
        return OK, _checked(fn(text, problem, num_tokens=n, truncated=trunc, **params))
    except _NonFinite as exc:
        return ERROR, str(exc)
    except MemoryError as exc:
        # Its heap may be in pieces: report, then let the worker be replaced.
        return FATAL, shorten(f"raised MemoryError: {exc}; the worker was replaced")
    except BaseException as exc:  # noqa: BLE001 — isolation is the point (SystemExit included)
        return ERROR, shorten(f"raised {type(exc).__name__}: {exc}")

