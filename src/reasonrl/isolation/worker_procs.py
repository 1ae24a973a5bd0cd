"""The forked processes that run a scorer's reward calls: start, watch, kill, reap.

:class:`~reasonrl.isolation.workers.Workers` schedules jobs onto these; this module
owns the processes themselves: :func:`fork_worker` forks one (its own process
group, ``PR_SET_PDEATHSIG`` and a parent watcher so that it dies with the parent,
``PR_SET_CHILD_SUBREAPER`` so that what it starts stays in its process tree, a
memory limit per call, one torch thread, stdin on ``/dev/null``; the watcher thread
is :func:`~reasonrl.isolation.parent_watch.watch_parent`, shared with the timeout
worker), :func:`kill_worker` kills it with every process descended from it and
reaps it, :func:`shutdown` does that for whole pools. The
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

try:
    import resource
except ImportError:  # Windows: no fork either, the scorer runs rewards in-process
    resource = None  # type: ignore[assignment]

from reasonrl.isolation.parent_watch import watch_parent
from reasonrl.isolation.worker_protocol import Call, Worker, serve

__all__ = ["Pool", "Worker", "fork_worker", "exited", "kill_worker", "forget", "shutdown", "overgrown"]


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
_PR_SET_CHILD_SUBREAPER = 36
_prctl: Any = None
_warned_no_subreaper = False
# Orphans of a reward's processes that exit become zombies of its worker (the subreaper)
# and only the worker could reap them, which it cannot do without stealing the exit
# status of a child a reward waits for: past this many, the idle worker is replaced.
_MAX_ZOMBIES = 100


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


def fork_worker(call: Call, pool: int, memory_mb: list[int]) -> Worker:
    """Fork a worker that serves ``call`` (for pool number ``pool``); the parent's handle on it.
    During call ``k`` the worker's address space may grow by ``memory_mb[k]`` MiB over what it
    was at the start (0: no limit): past it an allocation fails (``MemoryError``)."""
    global _warned_no_subreaper
    prctl = _load_prctl()
    if not prctl and not _warned_no_subreaper:
        _warned_no_subreaper = True
        warnings.warn("this platform lacks prctl(PR_SET_CHILD_SUBREAPER): a process that a reward function "
                      "starts in a session of its own may outlive its worker", stacklevel=3)
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
            _worker_main(req_r, res_w, call, parent, prctl, from_main_thread, memory_mb)
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
    """SIGKILL the worker, its process group and every process descended from it, reap the
    worker; returns how it ended.

    Descendants that left the group (``setsid``, ``start_new_session=True``, a double fork)
    are found in ``/proc`` by their parent links: the worker is a subreaper, so an orphan
    is re-parented to it, not to init. Every process found is stopped (SIGSTOP) before the
    tree is read again, until a read finds nothing new: a stopped process cannot fork, so
    no child is born after the last read. Then all are killed. Nothing here runs in the
    worker, which may be stuck anywhere. What escapes: the descendants of a worker that
    died on its own (``os._exit``, a segfault) before this ran, re-parented past it.
    """
    if w.reaped is None:
        stopped: list[int] = []
        found = [w.pid]
        while found:
            for pid in found:
                _signal(pid, signal.SIGSTOP)
            stopped += found
            seen = set(stopped)
            found = [pid for pid in _descendants(_proc_table(), w.pid) if pid not in seen]
        try:
            os.killpg(w.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in stopped:
            _signal(pid, signal.SIGKILL)
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


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):  # gone already, or became another user's (setuid)
        pass


def _proc_table() -> dict[int, tuple[int, str]]:
    """Every process's ``pid: (ppid, state)`` from ``/proc`` (empty where there is none)."""
    table: dict[int, tuple[int, str]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return table
    for name in names:
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = f.read()
            except OSError:  # it just exited
                continue
            fields = stat[stat.rindex(b")") + 2:].split()  # the name in (...) may hold spaces
            table[int(name)] = (int(fields[1]), fields[0].decode())
    return table


def _descendants(table: dict[int, tuple[int, str]], root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def overgrown(workers: list[Worker]) -> list[Worker]:
    """The workers holding more than ``_MAX_ZOMBIES`` zombie children (orphans of what a
    reward started, re-parented to the worker, that have exited): replace them."""
    if not workers:
        return []
    zombies: dict[int, int] = {}
    for ppid, state in _proc_table().values():
        if state == "Z":
            zombies[ppid] = zombies.get(ppid, 0) + 1
    return [w for w in workers if zombies.get(w.pid, 0) > _MAX_ZOMBIES]


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


def _worker_main(req_fd: int, res_fd: int, call: Call, parent: int, prctl: Any, from_main_thread: bool,
                 memory_mb: list[int]) -> None:
    """The worker process: cut loose from the parent's signals and terminal, tie its life
    to the parent's, adopt the orphans of what it starts, then
    :func:`~reasonrl.isolation.worker_protocol.serve` until EOF, under the memory limits."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        os.setpgid(0, 0)  # own process group: a kill takes whatever the reward started with it
    except OSError:
        pass
    if prctl:
        prctl(_PR_SET_CHILD_SUBREAPER, 1)  # see kill_worker: orphans stay in our tree
        if from_main_thread:  # the death signal follows the forking *thread*
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

    serve(req_fd, res_fd, _limit_memory(call, memory_mb))


def _limit_memory(call: Call, memory_mb: list[int]) -> Call:
    """``call``, with the soft ``RLIMIT_AS`` during call ``k`` set to the address space the
    worker has now plus ``memory_mb[k]`` MiB (0: the limit it started with). Relative, since
    a worker forked from a process that holds torch (or CUDA) starts with gigabytes of
    address space; the soft limit only, so that a sandbox a reward starts can set its own.
    Inherited by what the reward starts (each process on its own)."""
    if resource is None or not any(memory_mb):
        return call
    try:
        with open("/proc/self/statm") as f:
            base = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):  # no /proc (macOS, where RLIMIT_AS is not enforced anyway)
        return call
    start, hard = resource.getrlimit(resource.RLIMIT_AS)
    now = [start]

    def limited(k: int, payload: tuple) -> tuple[str, Any]:
        want = base + (memory_mb[k] << 20) if memory_mb[k] else start
        if hard != resource.RLIM_INFINITY:
            want = min(want, hard)
        if want != now[0]:
            resource.setrlimit(resource.RLIMIT_AS, (want, hard))
            now[0] = want
        return call(k, payload)

    return limited
