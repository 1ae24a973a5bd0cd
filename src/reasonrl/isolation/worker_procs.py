"""The forked processes that run a scorer's reward calls: start, watch, kill, reap.

:class:`~reasonrl.isolation.workers.Workers` schedules jobs onto these; this module
owns the processes themselves: :func:`fork_worker` forks one (its own process
group, ``PR_SET_PDEATHSIG`` and a parent watcher so that it dies with the parent,
one torch thread, stdin on ``/dev/null``; the watcher thread is
:func:`~reasonrl.isolation.parent_watch.watch_parent`, shared with the timeout
worker), :func:`kill_worker` kills it with its process group and reaps it, :func:`shutdown` does that for whole pools. The
bookkeeping that must survive a fork correctly lives here too: every live worker's
parent-side pipe ends, closed in any forked child so that a worker's death reads as
EOF. Why the workers are forked, and what that costs, is in the docstring of
:mod:`reasonrl.isolation.workers`; what they say over their pipes is in
:mod:`reasonrl.isolation.worker_protocol`.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import warnings
import weakref
from typing import Any

from reasonrl.isolation.parent_watch import watch_parent
from reasonrl.isolation.worker_protocol import Call, Worker, serve

__all__ = ["Pool", "Worker", "fork_worker", "exited", "kill_worker", "forget", "shutdown"]


class Pool:
    """``size`` workers at most, and the live ones (emptied in a forked child: they are the parent's)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.workers: list[Worker] = []
        _POOLS.add(self)


_POOLS: "weakref.WeakSet[Pool]" = weakref.WeakSet()
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


def fork_worker(call: Call, pool: int) -> Worker:
    """Fork a worker that serves ``call`` (for pool number ``pool``); the parent's handle on it."""
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
            _worker_main(req_r, res_w, call, parent, prctl if from_main_thread else None)
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
    return Worker(pid, req_w, res_r, pool)


def exited(w: Worker) -> bool:
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


def kill_worker(w: Worker) -> str:
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


def forget(pool: Pool, w: Worker) -> None:
    """Drop ``w`` from ``pool``'s workers, if it is still there."""
    if w in pool.workers:  # close() from another thread may have emptied the pool already
        pool.workers.remove(w)


def shutdown(pools: list[Pool], owner: int) -> None:
    if os.getpid() != owner:  # a forked copy of the scorer owns no workers
        return
    for pool in pools:
        workers, pool.workers = pool.workers, []
        for w in workers:
            kill_worker(w)


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


def _worker_main(req_fd: int, res_fd: int, call: Call, parent: int, prctl: Any) -> None:
    """The worker process: cut loose from the parent's signals and terminal, tie its life
    to the parent's, then :func:`~reasonrl.isolation.worker_protocol.serve` until EOF."""
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
    watch_parent(parent)  # for workers forked off the main thread, and where prctl is missing
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)  # the parent's OpenMP pool did not survive the fork
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # a reward reading stdin gets EOF, not the terminal
    os.close(devnull)

    serve(req_fd, res_fd, call)
