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

Three calling conventions (``reasonrl.params.reward_style``): one call per completion; a
``@group_reward`` gets one prompt's G completions; a function whose parameters name
``completions`` (and no ``problem``) has TRL's batched signature and gets, per prompt group,
``prompts``, ``completions``, ``completion_ids`` (when the caller has them) and the problems'
columns ``answer``, ``solution`` and each ``problem.meta`` key as keyword lists; it returns one
value per completion, ``None`` for "not applicable" (scored 0, not a failure).

Fail fast: a reward that fails on more than ``rollout.reward_max_failure_share`` of a scoring
call's completions in ``rollout.reward_failure_patience`` calls in a row (one call per training
step, more with dynamic sampling or methods that score) stops the run with a
:class:`RewardFailedError` (a ``ConfigError``: exit 2) carrying its last error and the signature
it is called with: a reward that cannot read its arguments fails on every call, and the run would
otherwise train on zeros.

Metrics name a reward by :func:`reward_metric_names`: a file's function by its function's name.
"""

from __future__ import annotations

import inspect
import math
import numbers
import os
import reprlib
import traceback
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from reasonrl.params import TRL_ARGS, ConfigError, reward_call, reward_style
from reasonrl.registry import REWARDS, is_code_ref
from reasonrl.isolation.workers import ERROR, FATAL, OK, Job, Workers, shorten
from reasonrl.problem import Problem

if TYPE_CHECKING:
    from reasonrl.sections import Recipe

__all__ = ["RewardSpec", "Scores", "Scorer", "build_scorer", "group_reward", "reward_metric_names", "RewardFailedError",
           "DEFAULT_TIMEOUT_S", "DEFAULT_MEMORY_MB"]

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


class RewardFailedError(ConfigError):
    """A reward function failed on most of its calls in ``rollout.reward_failure_patience`` scoring
    calls in a row: the run stops (exit 2), naming its last error and the signature it is called with."""


RESERVED_METRICS = ("mean", "std", "env")
"""``reward/<x>`` metrics the trainer and episodes write themselves: never a reward function's name."""


def reward_metric_names(names: Sequence[str]) -> dict[str, str]:
    """The name each of a recipe's rewards ``names`` is reported under (``reward/<name>``,
    ``reward_failures/<name>``, warnings): a registered name as it is; a function of a file,
    ``path/to/file.py:fn`` (stored absolute), as ``fn``. Two such names that would clash, with
    each other, a registered one or ``RESERVED_METRICS``, become ``<file stem>.fn`` (then ``#2``, ``#3``... in recipe
    order): deterministic for a recipe."""
    short = {n: _short_name(n) for n in names}
    counts: dict[str, int] = {}
    for n in names:
        counts[short[n]] = counts.get(short[n], 0) + 1
    taken = {n for n in names if short[n] == n} | set(RESERVED_METRICS)  # registered names keep theirs
    out: dict[str, str] = {}
    for n in names:
        if short[n] == n:
            out[n] = n
            continue
        name = short[n]
        if counts[name] > 1 or name in taken:
            stem = os.path.splitext(os.path.basename(n.rpartition(":")[0]))[0]
            name = f"{stem}.{name}"
        base, k = name, 1
        while name in taken:
            k += 1
            name = f"{base}#{k}"
        taken.add(name)
        out[n] = name
    return out


def _short_name(name: str) -> str:
    """``fn`` of ``path/to/file.py:fn`` (``Class.method`` stays whole); any other name unchanged."""
    if not is_code_ref(name):
        return name
    target, _, symbol = name.rpartition(":")
    if not target.strip().endswith(".py") or not symbol.strip():
        return name
    return symbol.strip()


def build_scorer(recipe: "Recipe") -> "Scorer":
    """The scorer of a recipe: ``recipe.rewards`` with their ``timeout_s``/``workers``,
    ``rollout.reward_timeout_s`` as the default timeout, ``rollout.reward_max_failure_share`` and
    ``rollout.reward_failure_patience`` to stop on a failing reward. Close it when done."""
    ro = recipe.rollout
    default = ro.reward_timeout_s
    if not _valid_timeout(default):
        raise ConfigError(f"rollout.reward_timeout_s must be a number > 0, got {default!r}")
    specs = [RewardSpec(r.name, r.weight, dict(r.params), r.timeout_s, r.workers, r.worker_memory_mb)
             for r in recipe.rewards]
    try:
        return Scorer(specs, default_timeout_s=default, default_memory_mb=ro.reward_memory_mb,
                      max_failure_share=ro.reward_max_failure_share, failure_patience=ro.reward_failure_patience)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


class Scorer:
    """Scores completions with the weighted reward functions of ``specs``.

    Every call runs in a forked worker process under a timeout (see
    :mod:`reasonrl.isolation.workers`); failures score 0 and are counted per function in
    ``Scores.failures``. With ``failure_patience`` N > 0, a function failing on more than
    ``max_failure_share`` of the completions of N calls in a row raises ``RewardFailedError``
    (0, the default here: never; ``build_scorer`` takes the recipe's). Use it as a context
    manager or call :meth:`close` to stop its workers (they are also stopped when it is
    garbage-collected, and at exit).
    """

    def __init__(self, specs: list[RewardSpec], default_timeout_s: float = DEFAULT_TIMEOUT_S,
                 default_memory_mb: int = DEFAULT_MEMORY_MB, max_failure_share: float = 0.5,
                 failure_patience: int = 0) -> None:
        if isinstance(max_failure_share, bool) or not isinstance(max_failure_share, numbers.Real) \
                or not 0 <= max_failure_share <= 1:
            raise ValueError(f"rollout.reward_max_failure_share must be a number in [0, 1], got {max_failure_share!r}")
        if isinstance(failure_patience, bool) or not isinstance(failure_patience, int) or failure_patience < 0:
            raise ValueError(f"rollout.reward_failure_patience must be an integer >= 0, got {failure_patience!r}")
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
        self.styles = [reward_style(fn) for fn in self.fns]
        self.metric_names = reward_metric_names([s.name for s in specs])
        """Recipe name -> the name its metrics and messages use (:func:`reward_metric_names`)."""
        self.max_failure_share, self.failure_patience = float(max_failure_share), failure_patience
        self._streaks = [0] * len(specs)  # calls in a row on which a function failed past the share
        fns, styles = self.fns, self.styles  # the workers' call must not hold the scorer: its GC reaps them
        self._workers = Workers(lambda k, payload: _call(fns[k], styles[k], payload, specs[k].params),
                                [s.workers for s in specs], self.memory_mb)
        self._warned: set[tuple[str, str]] = set()

    # -- public API ---------------------------------------------------------------

    def __call__(self, completions: list[str], problems: list[Problem], num_tokens: list[int],
                 truncated: list[bool], group_size: int = 1,
                 completion_ids: list[list[int]] | None = None) -> Scores:
        """Rows ``[k·group_size, (k+1)·group_size)`` answer one problem (the sampler's layout).
        ``completion_ids``: each completion's token ids, for TRL-style rewards that read them.
        No reward functions (a task that scores its own rollouts): every total is 0."""
        n = min(len(completions), len(problems), len(num_tokens), len(truncated))
        if not self.specs:
            return Scores(total=[0.0] * n, per_function={}, failures={})
        jobs: list[list[Job]] = []
        bounds = [(s, min(s + max(1, group_size), n)) for s in range(0, n, max(1, group_size))]
        for k in range(len(self.specs)):
            if self.styles[k] == "group":
                jobs.append([Job(k, s, e, (completions[s:e], problems[s], num_tokens[s:e], truncated[s:e]),
                                 self.timeouts[k]) for s, e in bounds])
            elif self.styles[k] == "batched":
                jobs.append([Job(k, s, e, (completions[s:e], problems[s:e], num_tokens[s:e], truncated[s:e],
                                           None if completion_ids is None else completion_ids[s:e]),
                                 self.timeouts[k]) for s, e in bounds])
            else:
                jobs.append([Job(k, i, i + 1, (completions[i], problems[i], num_tokens[i], truncated[i]),
                                 self.timeouts[k]) for i in range(n)])
        self._workers.run([j for per_fn in jobs for j in per_fn])
        per_fn: dict[str, list[float]] = {}
        failures: dict[str, int] = {}
        last_error: dict[int, str] = {}
        for k, spec in enumerate(self.specs):
            values, failed = [0.0] * n, 0
            for job in jobs[k]:
                if job.status == OK:
                    values[job.start:job.end] = job.value if self.styles[k] != "completion" else [job.value]
                else:
                    failed += job.end - job.start
                    last_error[k] = job.error
                    self._warn(k, job.status, job.error,
                               what="that sample" if self.styles[k] == "completion" else "that group")
            per_fn[spec.name], failures[spec.name] = values, failed
        total = [self._total(i, per_fn, failures) for i in range(n)]
        self._fail_fast(n, failures, last_error)
        return Scores(total=total, per_function=per_fn, failures=failures)

    def _fail_fast(self, n: int, failures: dict[str, int], last_error: dict[int, str]) -> None:
        """Count each function's calls in a row that failed past the share; stop at the patience."""
        if not self.failure_patience or not n:
            return
        for k, spec in enumerate(self.specs):
            failed = failures[spec.name]
            if failed / n <= self.max_failure_share:
                self._streaks[k] = 0
                continue
            self._streaks[k] += 1
            if self._streaks[k] < self.failure_patience:
                continue
            name = self.metric_names[spec.name]
            ref = f" ({spec.name})" if name != spec.name else ""
            error = last_error.get(k, "its weighted value overflowed the float32 total")
            raise RewardFailedError(
                f"reward '{name}'{ref} failed on {failed} of {n} completions in the last of "
                f"{self._streaks[k]} scoring calls in a row that each failed on more than "
                f"rollout.reward_max_failure_share={self.max_failure_share:g} of them "
                f"(rollout.reward_failure_patience={self.failure_patience}); the run stops rather than train on "
                f"zeros. Last failure: {error}. {reward_call(self.fns[k])}")

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
        name = self.metric_names[self.specs[k].name]
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


def _call(fn: Callable, style: str | bool, payload: tuple, params: dict[str, Any]) -> tuple[str, Any]:
    """One reward call, as (status, value or error message), ``style`` as ``reward_style`` tells
    (True/False: group or not, as before TRL's signature). Shared by workers and the inline path."""
    if isinstance(style, bool):
        style = "group" if style else "completion"
    try:
        if style == "group":
            texts, problem, ns, truncs = payload
            return OK, _checked_list(fn(texts, problem, num_tokens=ns, truncated=truncs, **params), len(texts))
        if style == "batched":
            texts = payload[0]
            return OK, _checked_list(fn(**_batched_kwargs(fn, payload, params)), len(texts))
        text, problem, n, trunc = payload
        return OK, _checked(fn(text, problem, num_tokens=n, truncated=trunc, **params))
    except _Refused as exc:
        return ERROR, str(exc)
    except MemoryError as exc:
        # Its heap may be in pieces: report, then let the worker be replaced.
        return FATAL, shorten(f"raised MemoryError: {exc}; the worker was replaced")
    except BaseException as exc:  # noqa: BLE001 — isolation is the point (SystemExit included)
        return ERROR, shorten(f"raised {type(exc).__name__}: {exc}{_where(exc)}")


def _checked_list(out: Any, size: int) -> list[float]:
    try:
        rows = iter(out) if not isinstance(out, (str, bytes, dict)) else None
    except TypeError:
        rows = None
    if rows is None:
        raise _Refused(f"returned {type(out).__name__} {reprlib.repr(out)}, not a list of {size} rewards")
    out = list(rows)
    if len(out) != size:
        raise _Refused(f"returned {len(out)} rewards for a group of {size}")
    return [_checked(v) for v in out]


def _batched_kwargs(fn: Callable, payload: tuple, params: dict[str, Any]) -> dict[str, Any]:
    """TRL's keyword lists for one group: ``prompts``, ``completions``, ``completion_ids`` (when
    given), the problems' columns (``answer``, ``solution``, each ``meta`` key, None where a row
    lacks it), ``num_tokens`` and ``truncated`` where declared, then the recipe's ``params``.
    A function without ``**kwargs`` gets only the names it declares."""
    texts, problems, ns, truncs, ids = payload
    keys = list(dict.fromkeys(k for p in problems for k in p.meta))
    columns: dict[str, Any] = {"prompts": [p.prompt for p in problems], "completions": list(texts)}
    if ids is not None:
        columns["completion_ids"] = [list(i) for i in ids]
    columns["answer"] = [p.answer for p in problems]
    columns["solution"] = [p.solution for p in problems]
    for key in keys:
        if key not in columns and key not in TRL_ARGS:
            columns[key] = [p.meta.get(key) for p in problems]
    pars = inspect.signature(fn).parameters
    columns.update({k: v for k, v in (("num_tokens", list(ns)), ("truncated", list(truncs))) if k in pars})
    supplied = ", ".join(columns)
    columns.update(params)
    if not any(p.kind is p.VAR_KEYWORD for p in pars.values()):
        columns = {k: v for k, v in columns.items() if k in pars}
    missing = [n for n, p in pars.items() if p.default is p.empty and n not in columns
               and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if missing:
        raise TypeError(f"it needs {', '.join(repr(m) for m in missing)}, which the call does not supply "
                        f"(it supplies: {supplied}; completion_ids only where the caller has the token ids)")
    return columns


def _where(exc: BaseException) -> str:
    """`` (at file:line)`` of the frame that raised ``exc``, when that is the reward's code, not this module's."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames or frames[-1].filename == __file__:
        return ""
    return f" (at {frames[-1].filename}:{frames[-1].lineno})"
