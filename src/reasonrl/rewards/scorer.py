"""The scoring stage: weighted sum of reward functions, with failures isolated.

r_i = Σ_k w_k · R_k(o_i)  (TRL's convention). A reward function that raises or
returns anything but a finite real number gives that sample 0 for that function and
increments a per-function failure count; ``None`` counts as "no opinion" (0, not a failure).
So does a call that runs past its timeout or whose process dies (segfault,
``os._exit``, MemoryError): no reward function can hang or kill a run.

Rewards enter the batch as float32, so "finite" means finite in float32: a reward of
1e300 is a failure like NaN (|R| > 3.4e38 would become inf there, and every advantage
of its group NaN). It is refused rather than clipped: a clipped 3.4e38 still overflows
the group's mean and std, and a value that large is a broken verifier, not a signal.
A weighted total Σ_k w_k·R_k that overflows float32 although each R_k does not scores 0
for every function with a non-zero term on that sample (each is counted), so the total
is always the weighted sum of the per-function values. A "real number" is an int, a float,
or a numpy real scalar (``numbers.Real``); ``bool``, ``str`` ("1.0") and tensors are refused
with the type in the message, never coerced.

Every call runs in a worker process forked from this one, under its timeout
(``rewards[i].timeout_s``, default ``rollout.reward_timeout_s``) and memory limit
(``rewards[i].worker_memory_mb``, default ``rollout.reward_memory_mb``); ``workers: N``
gives a function N workers of its own. A worker is killed with every process it
started. How calls are isolated, and what that
costs, is in the docstring of :mod:`reasonrl.isolation.workers`.
"""

from __future__ import annotations

import math
import numbers
import reprlib
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from reasonrl.registry import REWARDS
from reasonrl.isolation.workers import ERROR, FATAL, OK, Job, Workers, shorten
from reasonrl.problem import Problem

if TYPE_CHECKING:
    from reasonrl.sections import Recipe

__all__ = ["RewardSpec", "Scores", "Scorer", "build_scorer", "group_reward", "DEFAULT_TIMEOUT_S", "DEFAULT_MEMORY_MB"]

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MEMORY_MB = 4096
F32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max: the batch stores rewards as float32


@dataclass
class RewardSpec:
    name: str
    weight: float = 1.0
    params: dict[str, Any] = field(default_factory=dict)
    timeout_s: float | None = None
    """Seconds one call may take before it scores 0 (None: the scorer's default)."""
    workers: int = 0
    """Worker processes scoring this function in parallel (0: the shared worker)."""
    worker_memory_mb: int | None = None
    """MiB its worker's address space may grow by during one call (0: no limit; None: the
    scorer's default). Not ``memory_mb``: ``python_tests`` has a parameter of that name."""


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
    specs = [RewardSpec(r.name, r.weight, dict(r.params), r.timeout_s, r.workers, r.worker_memory_mb)
             for r in recipe.rewards]
    try:
        return Scorer(specs, default_timeout_s=default, default_memory_mb=recipe.rollout.reward_memory_mb)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


class Scorer:
    """Scores completions with the weighted reward functions of ``specs``.

    Every call runs in a forked worker process under a timeout (see
    :mod:`reasonrl.isolation.workers`); failures score 0 and are counted per function in
    ``Scores.failures``. Use it as a context manager or call :meth:`close` to stop
    its workers (they are also stopped when it is garbage-collected, and at exit).
    """

    def __init__(self, specs: list[RewardSpec], default_timeout_s: float = DEFAULT_TIMEOUT_S,
                 default_memory_mb: int = DEFAULT_MEMORY_MB) -> None:
        if not _valid_timeout(default_timeout_s):
            raise ValueError(f"rollout.reward_timeout_s must be a number > 0, got {default_timeout_s!r}")
        if not _valid_memory(default_memory_mb):
            raise ValueError(f"rollout.reward_memory_mb must be an integer >= 0 (0: no limit), got {default_memory_mb!r}")
        for s in specs:
            if s.timeout_s is not None and not _valid_timeout(s.timeout_s):
                raise ValueError(f"rewards: 'timeout_s' of reward '{s.name}' must be a number > 0 "
                                 f"(or null for rollout.reward_timeout_s), got {s.timeout_s!r}")
            if isinstance(s.weight, bool) or not isinstance(s.weight, numbers.Real) or not abs(s.weight) <= F32_MAX:
                raise ValueError(f"rewards: 'weight' of reward '{s.name}' must be a number finite in float32, "
                                 f"got {s.weight!r}")
            if isinstance(s.workers, bool) or not isinstance(s.workers, int) or s.workers < 0:
                raise ValueError(f"rewards: 'workers' of reward '{s.name}' must be an integer >= 0, got {s.workers!r}")
            if s.worker_memory_mb is not None and not _valid_memory(s.worker_memory_mb):
                raise ValueError(f"rewards: 'worker_memory_mb' of reward '{s.name}' must be an integer >= 0 "
                                 f"(0: no limit; null for rollout.reward_memory_mb), got {s.worker_memory_mb!r}")
        self.specs = specs
        self.fns: list[Callable] = [REWARDS.get(s.name) for s in specs]
        self.timeouts = [float(s.timeout_s if s.timeout_s is not None else default_timeout_s) for s in specs]
        self.memory_mb = [s.worker_memory_mb if s.worker_memory_mb is not None else default_memory_mb for s in specs]
        self._group = [bool(getattr(fn, "group_reward", False)) for fn in self.fns]
        fns, group = self.fns, self._group  # the workers' call must not hold the scorer: its GC reaps them
        self._workers = Workers(lambda k, payload: _call(fns[k], group[k], payload, specs[k].params),
                                [s.workers for s in specs], self.memory_mb)
        self._warned: set[tuple[str, str]] = set()

    # -- public API ---------------------------------------------------------------

    def __call__(self, completions: list[str], problems: list[Problem], num_tokens: list[int],
                 truncated: list[bool], group_size: int = 1) -> Scores:
        """Rows ``[k·group_size, (k+1)·group_size)`` answer one problem (the sampler's layout).
        No reward functions (a task that scores its own rollouts): every total is 0."""
        n = min(len(completions), len(problems), len(num_tokens), len(truncated))
        if not self.specs:
            return Scores(total=[0.0] * n, per_function={}, failures={})
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
                    self._warn(k, job.status, job.error, what="that group" if self._group[k] else "that sample")
            per_fn[spec.name], failures[spec.name] = values, failed
        total = [self._total(i, per_fn, failures) for i in range(n)]
        return Scores(total=total, per_function=per_fn, failures=failures)

    def _total(self, i: int, per_fn: dict[str, list[float]], failures: dict[str, int]) -> float:
        """Σ_k w_k·R_k of row ``i``; one that overflows float32 zeroes (and counts) each non-zero term."""
        total = sum(s.weight * per_fn[s.name][i] for s in self.specs)
        if abs(total) <= F32_MAX:  # each term is finite (≤ F32_MAX²) in float64; only the float32 cast can overflow
            return total
        for k, spec in enumerate(self.specs):
            if spec.weight * per_fn[spec.name][i] != 0:
                per_fn[spec.name][i] = 0.0
                failures[spec.name] += 1
                self._warn(k, "overflow", f"the weighted total Σ w·R ({total:g}) overflows float32", "that sample")
        return 0.0

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

    def _warn(self, k: int, kind: str, error: str, what: str) -> None:
        name = self.specs[k].name
        if (name, kind) in self._warned:
            return
        self._warned.add((name, kind))
        warnings.warn(f"reward '{name}' failed ({error}); scoring 0 for {what} and counting failures in "
                      f"reward_failures/{name} (timeout_s={self.timeouts[k]:g}, workers={self.specs[k].workers})",
                      stacklevel=3)


def _valid_timeout(value: Any) -> bool:
    return (not isinstance(value, bool) and isinstance(value, (int, float))
            and math.isfinite(value) and value > 0)


def _valid_memory(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= 0


class _Refused(ValueError):
    """A returned value that is not a reward: the call scores 0 and counts as a failure."""


def _checked(value: Any) -> float:
    """``value`` as a float that is finite in float32 (the batch's dtype); None is 0.0."""
    if value is None:
        return 0.0
    # bool is an int subclass and numpy's bool_ is not Real; both are refused, as are str and tensors.
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _Refused(f"returned {type(value).__name__} {reprlib.repr(value)}, not a number")
    if not abs(value) <= F32_MAX:  # before float(): an int of 400 digits compares exactly; NaN fails too
        raise _Refused(f"returned a reward that is not finite in float32 ({reprlib.repr(value)})")
    return float(value)


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
    except _Refused as exc:
        return ERROR, str(exc)
    except MemoryError as exc:
        # Its heap may be in pieces: report, then let the worker be replaced.
        return FATAL, shorten(f"raised MemoryError: {exc}; the worker was replaced")
    except BaseException as exc:  # noqa: BLE001 — isolation is the point (SystemExit included)
        return ERROR, shorten(f"raised {type(exc).__name__}: {exc}")

