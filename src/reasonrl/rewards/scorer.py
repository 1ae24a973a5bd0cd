"""The scoring stage: weighted sum of reward functions, with failures isolated.

r_i = Σ_k w_k · R_k(o_i)  (TRL's convention). A reward function that raises or
returns NaN/inf gives that sample 0 for that function and increments a
per-function failure count; ``None`` counts as "no opinion" (0, not a failure).
So does a call that runs past its timeout or whose process dies (segfault,
``os._exit``, MemoryError): no reward function can hang or kill a run.

How calls are isolated
----------------------
Every call runs in a worker process forked from the scorer's process
(``os.fork``; Linux), never in the scorer's own:

* **Any callable works.** A forked worker inherits the function *object*, so a
  lambda, a closure, a function defined in a user's ``__main__`` or one loaded
  with importlib from ``path/to/file.py`` works as is. ``TimeoutRunner``
  (``timeout.py``) pickles functions by reference and cannot run those; a
  ``spawn``/``forkserver`` pool could not either. Only the rows (text, Problem,
  token count, truncation flag) and the float results cross the pipe.
* **Timeouts that always work.** The parent enforces a per-call deadline
  (``rewards[i].timeout_s``, default ``rollout.reward_timeout_s``); a worker past
  it is killed with SIGKILL — with its whole process group, so whatever it
  started (a sandbox) goes too — and reaped, the call scores 0 and the remaining
  rows go to a fresh worker. ``signal.alarm`` only works in the main thread and a
  thread cannot be interrupted in C code holding the GIL (see ``timeout.py``).
* **Small overhead for cheap rewards.** A worker gets a chunk of calls in one
  pickle (a group's rows share one Problem, pickled once) and streams one small
  result frame back per call, so the parent knows which call is running and when
  it started. Measured on exact_answer, 128 completions, 2 CPU cores: 0.5 ms
  in-process before, ~1.5 ms now (medians), against seconds of sampling per step.
  A worker is started lazily (one fork, ~12 ms), or by :meth:`Scorer.start`, and
  reused across steps; 0.2 s calls × 16 take 3.2 s with one worker, 1.6 s with 2.
* ``workers: 0`` (default): the calls of every such function share one worker,
  one call at a time (as in-process scoring was). ``workers: N``: that function
  has N workers of its own that score its calls in parallel, chunks handed out
  as workers free up. All workers run at the same time within one scorer call.
* **Torch.** The parent holds torch and its OpenMP pool, which does not survive
  a fork: a torch op in the child deadlocks (checked on this machine: a forked
  child hangs on its first parallel op unless it first calls
  ``torch.set_num_threads(1)``). Workers set one intra-op thread, as PyTorch's
  DataLoader workers do. A forked worker cannot use CUDA either (rewards do not).
* **Reaping.** Workers are killed and reaped by :meth:`Scorer.close`, by the
  context manager, when the scorer is garbage-collected and at interpreter exit
  (``weakref.finalize``). If the parent is killed outright, a worker dies with
  it: ``PR_SET_PDEATHSIG`` (Linux, when forked from the main thread) plus a
  watcher thread polling ``getppid`` (as in ``TimeoutRunner``), and EOF on its
  request pipe.
* **Memory.** A forked worker shares its parent's pages copy-on-write, and keeps
  the old copy of every page the parent writes afterwards: a worker forked after
  a CPU model was loaded ends up holding a private copy of its weights once the
  optimizer has updated them (measured: 518 MB for a 540 MB tensor updated in
  place). GPU weights are not in host memory and cost nothing. Hence
  :meth:`Scorer.start`: forked before the model exists (the Trainer builds its
  scorer first), workers pin only what was there then. A worker that replaces a
  killed one is forked from the current process. (Alternative not taken: a
  fork server forked early that forks the workers, relaying fds with SCM_RIGHTS;
  more moving parts, for a cost that only CPU-trained models pay after a timeout.)
* **math_verify** keeps its own ``TimeoutRunner`` subprocess: a forked worker
  drops the parent's runner (``timeout._after_fork_in_child``) and starts its
  own on first use, so with ``workers: N`` math verification runs N-wide; it is
  killed with the worker's process group or notices its parent is gone.

What crosses the process boundary: a worker's side effects (a cache it fills, a
counter it bumps, a module-level list it appends to) stay in that worker and are
lost when it is replaced; rows and results must pickle. Where ``os.fork`` does
not exist (Windows) the scorer falls back to in-process calls without timeouts
and warns once.
"""

from __future__ import annotations

import math
import os
import pickle
import select
import signal
import struct
import sys
import threading
import time
import warnings
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from reasonrl.registry import REWARDS
from reasonrl.tasks.base import Problem

if TYPE_CHECKING:
    from reasonrl.config import Recipe

__all__ = ["RewardSpec", "Scores", "Scorer", "build_scorer", "group_reward", "DEFAULT_TIMEOUT_S"]

DEFAULT_TIMEOUT_S = 30.0
_CAN_FORK = hasattr(os, "fork")
_HEADER = struct.Struct("!I")
_MAX_ERROR_CHARS = 500
_PARENT_POLL_S = 0.5
# With N > 1 workers, a function's calls go out in about 4·N chunks: big enough to
# keep the per-chunk round trip negligible, small enough to balance uneven calls.
_CHUNKS_PER_WORKER = 4

_OK, _ERROR, _FATAL = "ok", "error", "fatal"  # worker replies; fatal = error, then the worker exits
_TIMEOUT, _CRASH = "timeout", "crash"  # failures seen by the parent


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
    from reasonrl.config import ConfigError

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

    Every call runs in a forked worker process under a timeout (see the module
    docstring); failures score 0 and are counted per function in
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
        # Pool 0 is shared by the workers: 0 functions; each workers: N function has its own.
        self._pools: list[_Pool] = []
        self._pool_of: list[int] = []
        shared: int | None = None
        for s in specs:
            if s.workers == 0:
                if shared is None:
                    shared = len(self._pools)
                    self._pools.append(_Pool(1))
                self._pool_of.append(shared)
            else:
                self._pool_of.append(len(self._pools))
                self._pools.append(_Pool(s.workers))
        self._lock = threading.Lock()
        self._warned: set[tuple[str, str]] = set()
        self._finalizer = weakref.finalize(self, _shutdown, self._pools, os.getpid())

    # -- public API ---------------------------------------------------------------

    def __call__(self, completions: list[str], problems: list[Problem], num_tokens: list[int],
                 truncated: list[bool], group_size: int = 1) -> Scores:
        """Rows ``[k·group_size, (k+1)·group_size)`` answer one problem (the sampler's layout)."""
        n = min(len(completions), len(problems), len(num_tokens), len(truncated))
        jobs: list[list[_Job]] = []
        for k in range(len(self.specs)):
            if self._group[k]:
                bounds = [(s, min(s + max(1, group_size), n)) for s in range(0, n, max(1, group_size))]
                jobs.append([_Job(k, s, e, (completions[s:e], problems[s], num_tokens[s:e], truncated[s:e]))
                             for s, e in bounds])
            else:
                jobs.append([_Job(k, i, i + 1, (completions[i], problems[i], num_tokens[i], truncated[i]))
                             for i in range(n)])
        with self._lock:
            if _CAN_FORK:
                self._run([j for per_fn in jobs for j in per_fn])
            else:
                self._run_inline([j for per_fn in jobs for j in per_fn])
        per_fn: dict[str, list[float]] = {}
        failures: dict[str, int] = {}
        for k, spec in enumerate(self.specs):
            values, failed = [0.0] * n, 0
            for job in jobs[k]:
                if job.status == _OK:
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
        if not _CAN_FORK:
            return self
        with self._lock:
            for p, pool in enumerate(self._pools):
                while len(pool.workers) < pool.size:
                    pool.workers.append(_fork_worker(self.fns, [s.params for s in self.specs], self._group, p))
        return self

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the live worker processes (started lazily by the first call)."""
        return [w.pid for pool in self._pools for w in pool.workers]

    def close(self) -> None:
        """Kill and reap every worker (a later call starts new ones)."""
        # At interpreter exit another thread may be stuck mid-call holding the lock;
        # killing the workers anyway is what unblocks it.
        acquired = self._lock.acquire(timeout=1.0)
        try:
            _shutdown(self._pools, os.getpid())
        finally:
            if acquired:
                self._lock.release()

    def __enter__(self) -> "Scorer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- scheduling (parent side) ---------------------------------------------------

    def _run(self, jobs: list["_Job"]) -> None:
        """Run every job in its pool's workers; each job ends with a status."""
        queues: list[deque[_Job]] = [deque() for _ in self._pools]
        for job in jobs:
            job.timeout = self.timeouts[job.k]
            queues[self._pool_of[job.k]].append(job)
        chunk = [len(q) if pool.size == 1 else -(-len(q) // (pool.size * _CHUNKS_PER_WORKER))
                 for pool, q in zip(self._pools, queues)]
        poller = select.poll()  # not select.select: fds above 1024 are common in big jobs
        by_fd: dict[int, _Worker] = {}
        busy: list[_Worker] = []

        def retire(w: _Worker, status: str | None, error: str) -> None:
            # w is dead or must die: its current call gets ``status``, the rest go back to the queue.
            for fd in (w.res_fd, w.req_fd):
                if by_fd.pop(fd, None) is not None:
                    poller.unregister(fd)
            busy.remove(w)
            how = _kill(w)
            _forget(self._pools[w.pool], w)
            if w.jobs and status is not None:
                job = w.jobs.popleft()
                job.status, job.error = status, error.replace("{how}", how)
            queues[w.pool].extendleft(reversed(w.jobs))
            w.jobs.clear()

        try:
            while True:
                now = time.monotonic()
                for p, pool in enumerate(self._pools):
                    q = queues[p]
                    while q:
                        w = self._idle_worker(pool, p, busy, q)
                        if w is None:
                            break
                        take = [q.popleft() for _ in range(min(max(chunk[p], 1), len(q)))]
                        try:
                            blob = pickle.dumps([(j.k, j.payload) for j in take], protocol=pickle.HIGHEST_PROTOCOL)
                        except Exception as exc:  # noqa: BLE001 — an unpicklable row fails its calls, loudly
                            for j in take:
                                j.status, j.error = _ERROR, _short(f"cannot send the rows to the worker: "
                                                                   f"{type(exc).__name__}: {exc}")
                            continue
                        w.jobs.extend(take)
                        w.out = memoryview(_HEADER.pack(len(blob)) + blob)
                        w.deadline = now + take[0].timeout
                        busy.append(w)
                        by_fd[w.res_fd] = w
                        by_fd[w.req_fd] = w
                        poller.register(w.res_fd, select.POLLIN)
                        poller.register(w.req_fd, select.POLLOUT)
                if not busy:
                    return
                wait = min(w.deadline for w in busy) - time.monotonic()
                events = poller.poll(max(0, math.ceil(wait * 1000)))
                for fd, event in events:
                    w = by_fd.get(fd)
                    if w is None:
                        continue
                    if fd == w.req_fd:
                        try:
                            sent = os.write(fd, w.out)
                        except BlockingIOError:
                            continue
                        except OSError:
                            sent = len(w.out)  # the worker is gone; its EOF on res_fd says how
                        w.out = w.out[sent:]
                        if not len(w.out):
                            poller.unregister(fd)
                            del by_fd[fd]
                        continue
                    try:
                        data = os.read(fd, 1 << 16)
                    except OSError:
                        data = b""
                    if not data:
                        retire(w, _CRASH, "the worker process died ({how})")
                        continue
                    try:
                        fatal = self._read_frames(w, data)
                    except Exception as exc:  # noqa: BLE001 — e.g. a reward that forked and kept running our loop
                        retire(w, _CRASH, f"the worker broke the result protocol ({type(exc).__name__}); killed")
                        continue
                    if fatal is not None:
                        retire(w, None, "")
                    elif not w.jobs:  # chunk done: the worker is idle again
                        busy.remove(w)
                        poller.unregister(w.res_fd)
                        del by_fd[w.res_fd]
                        if by_fd.pop(w.req_fd, None) is not None:
                            poller.unregister(w.req_fd)
                now = time.monotonic()
                for w in [w for w in busy if now >= w.deadline]:
                    retire(w, _TIMEOUT, f"timed out: the call took longer than timeout_s={w.jobs[0].timeout:g}; "
                                        "its worker was killed and replaced")
        except BaseException:
            # Interrupted mid-protocol (KeyboardInterrupt...): the busy workers are out of step.
            for w in list(busy):
                _kill(w)
                _forget(self._pools[w.pool], w)
            raise

    def _idle_worker(self, pool: "_Pool", p: int, busy: list["_Worker"], q: deque) -> "_Worker | None":
        for w in list(pool.workers):
            if w in busy:
                continue
            if _exited(w):  # died while idle (nothing of ours was running): just replace it
                _kill(w)
                pool.workers.remove(w)
                continue
            return w
        if len(pool.workers) >= pool.size:
            return None
        try:
            w = _fork_worker(self.fns, [s.params for s in self.specs], self._group, p)
        except OSError as exc:
            if pool.workers:
                return None  # the live ones carry on with the queue
            for job in q:
                job.status, job.error = _CRASH, f"cannot start a worker process ({type(exc).__name__}: {exc})"
            q.clear()
            return None
        pool.workers.append(w)
        return w

    @staticmethod
    def _read_frames(w: "_Worker", data: bytes) -> str | None:
        """Consume result frames; returns the fatal error when the worker said it exits."""
        w.buf += data
        fatal = None
        offset = 0
        while len(w.buf) - offset >= _HEADER.size:
            (size,) = _HEADER.unpack_from(w.buf, offset)
            if len(w.buf) - offset - _HEADER.size < size:
                break
            status, value = pickle.loads(w.buf[offset + _HEADER.size:offset + _HEADER.size + size])
            offset += _HEADER.size + size
            job = w.jobs.popleft()
            if status == _OK:
                job.status, job.value = _OK, value
            elif status == _FATAL:
                job.status, job.error = _CRASH, value
                fatal = value
                break
            else:
                job.status, job.error = _ERROR, value
            if w.jobs:
                w.deadline = time.monotonic() + w.jobs[0].timeout
        del w.buf[:offset]
        return fatal

    def _run_inline(self, jobs: list["_Job"]) -> None:
        if "inline" not in {kind for _, kind in self._warned}:
            self._warned.add(("", "inline"))
            warnings.warn("reward timeouts need os.fork, which this platform lacks: reward functions run "
                          "in-process without a timeout", stacklevel=3)
        for job in jobs:
            status, value = _call(self.fns[job.k], self._group[job.k], job.payload, self.specs[job.k].params)
            if status == _OK:
                job.status, job.value = _OK, value
            else:
                job.status, job.error = _ERROR, value

    def _warn(self, k: int, job: "_Job") -> None:
        name, kind = self.specs[k].name, job.status
        if (name, kind) in self._warned:
            return
        self._warned.add((name, kind))
        what = "that group" if self._group[k] else "that sample"
        warnings.warn(f"reward '{name}' failed ({job.error}); scoring 0 for {what} and counting failures in "
                      f"reward_failures/{name} (timeout_s={self.timeouts[k]:g}, workers={self.specs[k].workers})",
                      stacklevel=3)


def _forget(pool: "_Pool", w: "_Worker") -> None:
    if w in pool.workers:  # close() from another thread may have emptied the pool already
        pool.workers.remove(w)


def _valid_timeout(value: Any) -> bool:
    return (not isinstance(value, bool) and isinstance(value, (int, float))
            and math.isfinite(value) and value > 0)


def _short(text: str) -> str:
    return text if len(text) <= _MAX_ERROR_CHARS else text[:_MAX_ERROR_CHARS] + "…"


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
            return _OK, [_checked(v) for v in out]
        text, problem, n, trunc = payload
        return _OK, _checked(fn(text, problem, num_tokens=n, truncated=trunc, **params))
    except _NonFinite as exc:
        return _ERROR, str(exc)
    except MemoryError as exc:
        # Its heap may be in pieces: report, then let the worker be replaced.
        return _FATAL, _short(f"raised MemoryError: {exc}; the worker was replaced")
    except BaseException as exc:  # noqa: BLE001 — isolation is the point (SystemExit included)
        return _ERROR, _short(f"raised {type(exc).__name__}: {exc}")


# -- worker processes ----------------------------------------------------------------


@dataclass(eq=False)
class _Job:
    k: int  # index of the reward function
    start: int  # rows [start, end)
    end: int
    payload: tuple
    timeout: float = 0.0
    status: str | None = None
    value: Any = None
    error: str = ""


class _Pool:
    def __init__(self, size: int) -> None:
        self.size = size
        self.workers: list[_Worker] = []
        _POOLS.add(self)


@dataclass(eq=False)
class _Worker:
    pid: int
    req_fd: int  # parent writes chunks of calls
    res_fd: int  # parent reads result frames
    pool: int
    jobs: deque = field(default_factory=deque)
    out: memoryview = field(default_factory=lambda: memoryview(b""))
    buf: bytearray = field(default_factory=bytearray)
    deadline: float = 0.0
    reaped: str | None = None  # how it ended, once waited for (its pid may then be reused)


_POOLS: "weakref.WeakSet[_Pool]" = weakref.WeakSet()
# Parent-side pipe ends of every live worker: a forked child closes them all, so that
# a worker's death is seen as EOF and no child can talk to another's worker.
_PARENT_FDS: set[int] = set()
_FORK_LOCK = threading.Lock()
_PR_SET_PDEATHSIG = 1
_prctl: Any = None


def _load_prctl() -> Any:
    # Resolved in the parent: dlopen in a freshly forked child can deadlock on the loader lock.
    global _prctl
    if _prctl is None:
        _prctl = False
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                _prctl = ctypes.CDLL(None, use_errno=True).prctl
            except (OSError, AttributeError):
                pass
    return _prctl


def _fork_worker(fns: list[Callable], params: list[dict], group: list[bool], pool: int) -> _Worker:
    prctl = _load_prctl()
    from_main_thread = threading.current_thread() is threading.main_thread()
    parent = os.getpid()
    for stream in (sys.stdout, sys.stderr):  # else the child would print the parent's buffered text again
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    with _FORK_LOCK:  # no other thread's fork may copy these pipes before they are in _PARENT_FDS
        req_r, req_w = os.pipe()
        res_r, res_w = os.pipe()
        _PARENT_FDS.update((req_w, res_r))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: "fork() in a multi-threaded process"
                pid = os.fork()
        except OSError:
            _PARENT_FDS.difference_update((req_w, res_r))
            for fd in (req_r, req_w, res_r, res_w):
                os.close(fd)
            raise
    if pid == 0:  # the worker; the at-fork hook has closed the parent-side fds
        code = 70
        try:
            _worker_main(req_r, res_w, fns, params, group, parent, prctl if from_main_thread else None)
            code = 0
        except BaseException:  # noqa: BLE001
            pass
        finally:
            os._exit(code)
    os.close(req_r)
    os.close(res_w)
    os.set_blocking(req_w, False)  # a worker that stops reading must not block the parent
    try:
        os.setpgid(pid, pid)  # also done by the child; whichever runs first wins the race
    except OSError:
        pass
    return _Worker(pid, req_w, res_r, pool)


def _exited(w: _Worker) -> bool:
    """Whether the worker has exited (reaping it if so)."""
    if w.reaped is None:
        try:
            pid, status = os.waitpid(w.pid, os.WNOHANG)
        except ChildProcessError:
            pid, status = w.pid, None
        if pid:
            w.reaped = _how(status)
    return w.reaped is not None


def _how(status: int | None) -> str:
    if status is None:
        return "exit status unknown"
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"killed by signal {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def _kill(w: _Worker) -> str:
    """SIGKILL the worker and its process group, reap it; returns how it ended."""
    if w.reaped is None:
        for kill in (os.killpg, os.kill):
            try:
                kill(w.pid, signal.SIGKILL)
                break
            except (ProcessLookupError, PermissionError):
                continue
        try:
            w.reaped = _how(os.waitpid(w.pid, 0)[1])
        except ChildProcessError:
            w.reaped = _how(None)
    for fd in (w.req_fd, w.res_fd):
        _PARENT_FDS.discard(fd)
        try:
            os.close(fd)
        except OSError:
            pass
    w.req_fd = w.res_fd = -1
    return w.reaped


def _shutdown(pools: list[_Pool], owner: int) -> None:
    if os.getpid() != owner:  # a forked copy of the scorer owns no workers
        return
    for pool in pools:
        workers, pool.workers = pool.workers, []
        for w in workers:
            _kill(w)


def _after_fork_in_child() -> None:
    # Whatever forked us (our own worker start, a DataLoader, a user's Pool), the
    # workers belong to the parent: forget them and close our copies of their pipes.
    global _FORK_LOCK
    _FORK_LOCK = threading.Lock()  # it was held by the forking thread
    for fd in list(_PARENT_FDS):
        try:
            os.close(fd)
        except OSError:
            pass
    _PARENT_FDS.clear()
    for pool in list(_POOLS):
        pool.workers = []


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _worker_main(req_fd: int, res_fd: int, fns: list[Callable], params: list[dict], group: list[bool],
                 parent: int, prctl: Any) -> None:
    """The worker loop: read a chunk of calls, answer each with one frame, until EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        os.setpgid(0, 0)  # own process group: a kill takes whatever the reward started with it
    except OSError:
        pass
    if prctl:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before PDEATHSIG was set
        return

    def watch_parent() -> None:  # for calls made off the main thread, and where prctl is missing
        while True:
            time.sleep(_PARENT_POLL_S)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch_parent, daemon=True, name="parent-watch").start()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)  # the parent's OpenMP pool did not survive the fork
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # a reward reading stdin gets EOF, not the terminal
    os.close(devnull)

    def read_exact(n: int) -> bytes | None:
        buf = bytearray()
        while len(buf) < n:
            chunk = os.read(req_fd, n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)

    while True:
        header = read_exact(_HEADER.size)
        if header is None:
            return
        blob = read_exact(_HEADER.unpack(header)[0])
        if blob is None:
            return
        for k, payload in pickle.loads(blob):
            status, value = _call(fns[k], group[k], payload, params[k])
            reply = pickle.dumps((status, value), protocol=pickle.HIGHEST_PROTOCOL)
            data = memoryview(_HEADER.pack(len(reply)) + reply)
            while data:
                data = data[os.write(res_fd, data):]
            if status == _FATAL:
                return
        for stream in (sys.stdout, sys.stderr):  # os._exit would drop what a reward printed
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
