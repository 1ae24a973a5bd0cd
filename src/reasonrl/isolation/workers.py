"""The forked worker processes that run the scorer's reward calls (``scorer.py``).

:class:`Workers` runs ``call(k, payload)`` for each :class:`Job` in a worker process
forked from its own, under the job's timeout, and leaves each job with a status:
``OK`` and a value, or ``ERROR``, ``TIMEOUT`` or ``CRASH`` and a message. What a call
is (a reward function's signature, the checks on what it returns) is the scorer's.

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
  (``rewards[i].timeout_s``, default ``rollout.reward_timeout_s``), counted from
  when the worker has read the call (``worker_protocol.py``); a worker past it is
  killed with SIGKILL, with everything it started (below), and reaped, the call
  scores 0 and the remaining rows go to a fresh worker. ``signal.alarm`` only
  works in the main thread and a thread cannot be interrupted in C code holding
  the GIL (see ``timeout.py``).
* **Hanging calls time out side by side.** One after another, B hanging calls
  would cost B·timeout_s. Once a call of a function has timed out in a run, that
  function's other calls of the run go out one per worker, to its own pool and to
  up to ``max(4, cores)`` (at most 16) extra workers forked for the rest of the
  run: about ``ceil(B / (extra + pool size))`` timeouts (8 calls that sleep
  forever at ``timeout_s=1``: 8.5 s before, 3.4 s now, 2 cores). More extras
  than cores: a hanging call mostly waits. Values, positions and failure counts
  are the same whichever worker ran a call. The workers a run killed are
  replaced at its end, and its extra workers killed.
* **What a reward starts dies with its worker** — on a timeout, at
  :meth:`Scorer.close`, when the scorer is collected and at interpreter exit —
  even a process in a session of its own (``setsid``,
  ``start_new_session=True``, a double fork), which leaves the process group.
  Each worker is a child subreaper (``PR_SET_CHILD_SUBREAPER``, Linux 3.4+, no
  privileges), so an orphan among its descendants is re-parented to it, not to
  init; the parent kills the worker's whole tree, read from ``/proc`` (stop,
  re-read until nothing new, kill: ``worker_procs.kill_worker``), with no code
  running in the worker. Not taken: a cgroup (``cgroup.kill``) needs a writable
  delegated cgroup v2, which an unprivileged run rarely has; a PID namespace
  needs privileges or a user namespace (changes file ownership as the reward sees
  it). Limits: if the worker dies on its own (``os._exit``, a segfault) its
  descendants are re-parented past it and live on; so they do if the training
  process itself is SIGKILLed (the worker dies by ``PR_SET_PDEATHSIG``). An
  orphan that exits stays a zombie of the worker (reaping it could steal the exit
  status of a child a reward waits for); a worker holding over 100 is replaced.
  Without prctl (not Linux) only the process group is killed, with a warning.
* **Memory.** During a call of a function the worker's address space may grow by
  ``rewards[i].worker_memory_mb`` MiB (default ``rollout.reward_memory_mb``,
  4096; 0: no limit) over what it had when forked: a soft ``RLIMIT_AS``, relative
  because a worker forked from a torch (or CUDA) process starts with gigabytes
  of address space. An allocation past it raises ``MemoryError``: the call scores
  0, is counted, and the worker is replaced. Address space counts threads'
  reservations (glibc: 64 MiB per malloc arena), so a reward that starts many
  threads needs a larger budget. Inherited by what the reward starts, each
  process on its own; a sandbox sets its own, lower, limit.
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
  (``weakref.finalize``), each with its process tree. If the parent is killed
  outright, a worker dies with it: ``PR_SET_PDEATHSIG`` (Linux, when forked from
  the main thread) plus a watcher thread polling ``getppid`` (``parent_watch.py``,
  the same one ``TimeoutRunner``'s worker runs), and EOF on its request pipe.
* **Copy-on-write.** A forked worker shares its parent's pages copy-on-write, and
  keeps the old copy of every page the parent writes afterwards: a worker forked
  after a CPU model was loaded ends up holding a private copy of its weights once
  the optimizer has updated them (measured: 518 MB for a 540 MB tensor updated in
  place). GPU weights are not in host memory and cost nothing. Hence
  :meth:`Scorer.start`: forked before the model exists (the Trainer builds its
  scorer first), workers pin only what was there then. A worker that replaces a
  killed one is forked from the current process. (Alternative not taken: a
  fork server forked early that forks the workers, relaying fds with SCM_RIGHTS;
  more moving parts, for a cost that only CPU-trained models pay after a timeout.)
* **math_verify** keeps its own ``TimeoutRunner`` subprocess: a forked worker
  drops the parent's runner (``timeout._after_fork_in_child``) and starts its
  own on first use, so with ``workers: N`` math verification runs N-wide; it is
  killed with the worker's process tree or notices its parent is gone.

What crosses the process boundary: a worker's side effects (a cache it fills, a
counter it bumps, a module-level list it appends to) stay in that worker and are
lost when it is replaced; rows and results must pickle. Where ``os.fork`` does
not exist (Windows) the scorer falls back to in-process calls without timeouts
and warns once.

Where it lives: this module is the scorer's entry point, :class:`Workers` and
:class:`Job`, and schedules jobs onto the workers; what crosses the pipes (the
frames, the statuses, :data:`Call`) is in :mod:`reasonrl.isolation.worker_protocol`;
forking, watching, killing and reaping the processes in
:mod:`reasonrl.isolation.worker_procs`.
"""

from __future__ import annotations

import math
import os
import pickle
import select
import threading
import time
import warnings
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any

from reasonrl.isolation.worker_procs import (Pool, Worker, exited, forget, fork_worker, kill_worker, overgrown,
                                             shutdown)
from reasonrl.isolation.worker_protocol import (CRASH, ERROR, FATAL, OK, START_GRACE_S, TIMEOUT, Call, frame,
                                                read_frames)

__all__ = ["Call", "Job", "Workers", "OK", "ERROR", "FATAL", "TIMEOUT", "CRASH", "shorten"]

_CAN_FORK = hasattr(os, "fork")
_MAX_ERROR_CHARS = 500
# With N > 1 workers, a function's calls go out in about 4·N chunks: big enough to
# keep the per-chunk round trip negligible, small enough to balance uneven calls.
_CHUNKS_PER_WORKER = 4
# After a call of function k times out, k's other calls in that run go out one per
# worker: to k's own pool and to up to this many extra workers, forked for the rest of
# the run. B hanging calls then take about ceil(B / (this + pool size)) timeouts, not B.
# More than the cores: a hanging call mostly waits (a lock, a server, a sleep).
_EXTRA_WORKERS = min(16, max(4, os.cpu_count() or 1))


@dataclass(eq=False)
class Job:
    """One call: ``call(k, payload)`` for rows ``[start, end)``, and how it went."""

    k: int  # which call (the scorer's index of the reward function)
    start: int  # rows [start, end)
    end: int
    payload: tuple
    timeout: float = 0.0
    status: str | None = None
    value: Any = None
    error: str = ""


class Workers:
    """The worker processes of one scorer, running ``call`` (see the module docstring).

    ``sizes[k]`` is how many workers call ``k`` has in a pool of its own, 0 for the one
    pool, of one worker, that all such calls share; ``memory_mb[k]`` the MiB its worker's
    address space may grow by during call ``k`` (0 or missing: no limit). Workers start
    lazily (or at :meth:`start`) and are reused across :meth:`run` s; :meth:`close` (or
    garbage collection, or interpreter exit) kills and reaps them, with every process
    they started.
    """

    def __init__(self, call: Call, sizes: list[int], memory_mb: list[int] | None = None) -> None:
        self._call = call
        self._memory = list(memory_mb or [0] * len(sizes))
        self._pools: list[Pool] = []
        self._pool_of: list[int] = []
        shared: int | None = None
        for size in sizes:
            if size == 0:
                if shared is None:
                    shared = len(self._pools)
                    self._pools.append(Pool(1))
                self._pool_of.append(shared)
            else:
                self._pool_of.append(len(self._pools))
                self._pools.append(Pool(size))
        self._extra = len(self._pools)  # the last pool: the extra workers of one run (see _EXTRA_WORKERS)
        self._pools.append(Pool(_EXTRA_WORKERS))
        self._lock = threading.Lock()
        self._warned_inline = False
        self._finalizer = weakref.finalize(self, shutdown, self._pools, os.getpid())

    def run(self, jobs: list[Job]) -> None:
        """Run every job in its pool's workers (in-process where ``os.fork`` is missing);
        each job ends with a status."""
        with self._lock:
            if _CAN_FORK:
                self._schedule(jobs)
            else:
                self._run_inline(jobs)

    def start(self) -> None:
        """Fork every worker now rather than on the first :meth:`run`."""
        if not _CAN_FORK:
            return
        with self._lock:
            for p, pool in enumerate(self._pools[:self._extra]):
                while len(pool.workers) < pool.size:
                    pool.workers.append(fork_worker(self._call, p, self._memory))

    @property
    def pids(self) -> list[int]:
        """Process ids of the live worker processes."""
        return [w.pid for pool in self._pools for w in pool.workers]

    def close(self) -> None:
        """Kill and reap every worker (a later run starts new ones)."""
        # At interpreter exit another thread may be stuck mid-call holding the lock;
        # killing the workers anyway is what unblocks it.
        acquired = self._lock.acquire(timeout=1.0)
        try:
            shutdown(self._pools, os.getpid())
        finally:
            if acquired:
                self._lock.release()

    # -- scheduling (parent side) ---------------------------------------------------

    def _schedule(self, jobs: list[Job]) -> None:
        """Run every job in its pool's workers; each job ends with a status."""
        extra = self._extra
        peak = [len(pool.workers) for pool in self._pools]  # what each pool had: restored at the end
        for w in overgrown([w for pool in self._pools for w in pool.workers]):
            kill_worker(w)
            forget(self._pools[w.pool], w)
        queues: list[deque[Job]] = [deque() for _ in self._pools]
        for job in jobs:
            queues[self._pool_of[job.k]].append(job)
        chunk = [len(q) if pool.size == 1 else -(-len(q) // (pool.size * _CHUNKS_PER_WORKER))
                 for pool, q in zip(self._pools, queues)]
        hung: set[int] = set()  # functions with a call timed out in this run: one call per worker
        singles: list[deque[Job]] = [deque() for _ in self._pools]  # their calls, by home pool
        poller = select.poll()  # not select.select: fds above 1024 are common in big jobs
        by_fd: dict[int, Worker] = {}
        busy: list[Worker] = []
        failed_fork = ""

        def next_calls(p: int) -> list[Job]:
            if p == extra:
                return next(([q.popleft()] for q in singles if q), [])
            if queues[p]:
                return [queues[p].popleft() for _ in range(min(max(chunk[p], 1), len(queues[p])))]
            return [singles[p].popleft()] if singles[p] else []

        def retire(w: Worker, status: str | None, error: str) -> None:
            # w is dead or must die: its current call gets ``status``, the rest go back to the queues.
            for fd in (w.res_fd, w.req_fd):
                if by_fd.pop(fd, None) is not None:
                    poller.unregister(fd)
            busy.remove(w)
            how = kill_worker(w)
            forget(self._pools[w.pool], w)
            if w.jobs and status is not None:
                job = w.jobs.popleft()
                job.status, job.error = status, error.replace("{how}", how)
                if status == TIMEOUT and job.k not in hung:
                    hung.add(job.k)
                    home = self._pool_of[job.k]
                    singles[home].extend(j for j in queues[home] if j.k == job.k)
                    queues[home] = deque(j for j in queues[home] if j.k != job.k)
            for j in reversed(w.jobs):
                (singles if j.k in hung else queues)[self._pool_of[j.k]].appendleft(j)
            w.jobs.clear()

        try:
            while True:
                for p, pool in enumerate(self._pools):
                    while queues[p] or singles[p] or (p == extra and any(singles)):
                        w = self._idle_worker(pool, p, busy)
                        if isinstance(w, str):
                            failed_fork = w
                            break
                        if w is None:
                            break
                        peak[p] = max(peak[p], len(pool.workers))
                        take = next_calls(p)
                        try:
                            blob = pickle.dumps([(j.k, j.payload) for j in take], protocol=pickle.HIGHEST_PROTOCOL)
                        except Exception as exc:  # noqa: BLE001 — an unpicklable row fails its calls, loudly
                            for j in take:
                                j.status, j.error = ERROR, shorten(f"cannot send the rows to the worker: "
                                                                   f"{type(exc).__name__}: {exc}")
                            continue
                        w.jobs.extend(take)
                        w.out = frame(blob)
                        w.deadline = time.monotonic() + START_GRACE_S + take[0].timeout  # until it says STARTED
                        busy.append(w)
                        by_fd[w.res_fd] = w
                        by_fd[w.req_fd] = w
                        poller.register(w.res_fd, select.POLLIN)
                        poller.register(w.req_fd, select.POLLOUT)
                if not busy:
                    for q in queues + singles:  # no worker could be started for these
                        for job in q:
                            job.status, job.error = CRASH, f"cannot start a worker process ({failed_fork})"
                        q.clear()
                    for p, pool in enumerate(self._pools[:extra]):  # replace the workers this run killed
                        while len(pool.workers) < peak[p] and not failed_fork:
                            try:
                                pool.workers.append(fork_worker(self._call, p, self._memory))
                            except OSError as exc:
                                failed_fork = str(exc)
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
                        retire(w, CRASH, "the worker process died ({how})")
                        continue
                    try:
                        fatal = read_frames(w, data)
                    except Exception as exc:  # noqa: BLE001 — e.g. a reward that forked and kept running our loop
                        retire(w, CRASH, f"the worker broke the result protocol ({type(exc).__name__}); killed")
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
                    retire(w, TIMEOUT, f"timed out: the call took longer than timeout_s={w.jobs[0].timeout:g}; "
                                        "its worker was killed and replaced")
        except BaseException:
            # Interrupted mid-protocol (KeyboardInterrupt...): the busy workers are out of step.
            for w in list(busy):
                kill_worker(w)
                forget(self._pools[w.pool], w)
            raise
        finally:
            shutdown([self._pools[extra]], os.getpid())  # the extra workers last one run

    def _idle_worker(self, pool: Pool, p: int, busy: list[Worker]) -> Worker | str | None:
        """An idle worker of ``pool`` (forked if it has room), None if all are busy, or why
        a fork failed."""
        for w in list(pool.workers):
            if w in busy:
                continue
            if exited(w):  # died while idle (nothing of ours was running): just replace it
                kill_worker(w)
                pool.workers.remove(w)
                continue
            return w
        if len(pool.workers) >= pool.size:
            return None
        try:
            w = fork_worker(self._call, p, self._memory)
        except OSError as exc:  # the live workers carry on with the queue; with none, its calls fail
            return f"{type(exc).__name__}: {exc}"
        pool.workers.append(w)
        return w

    def _run_inline(self, jobs: list[Job]) -> None:
        if not self._warned_inline:
            self._warned_inline = True
            warnings.warn("reward timeouts need os.fork, which this platform lacks: reward functions run "
                          "in-process without a timeout", stacklevel=4)
        for job in jobs:
            status, value = self._call(job.k, job.payload)
            if status == OK:
                job.status, job.value = OK, value
            else:
                job.status, job.error = ERROR, value


def shorten(text: str) -> str:
    """An error message cut to a length fit for a warning."""
    return text if len(text) <= _MAX_ERROR_CHARS else text[:_MAX_ERROR_CHARS] + "…"
