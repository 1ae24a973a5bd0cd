"""Run a picklable function call under a wall-clock timeout that works anywhere.

Why not ``signal.alarm``: it only works in the main thread of the main
interpreter. math-verify's built-in timeout uses it, so from a worker thread it
raises (Math-Verify#50), and in Ray worker processes it silently scored every
sample 0 (verl PR #5635). A thread-based timeout cannot help either: the
pathological inputs (``9^{9^{9}}`` and friends) spin inside C big-integer code
that holds the GIL and cannot be interrupted.

So the call runs in a separate, persistent worker *process*, started with
``subprocess.Popen([sys.executable, ...])`` and spoken to over its stdin/stdout
pipes with pickle. That works (a) in the main thread, (b) in any other thread,
and (c) inside daemonic processes such as ``multiprocessing.Pool`` workers,
which may not start ``multiprocessing.Process`` children but may start plain
subprocesses. On timeout the worker is killed (and reaped), and the next call
starts a fresh one; the timed-out call returns ``Status.TIMEOUT`` instead of
raising, so a training run never dies of a slow verification.

The worker is reused across calls (a round trip costs ~0.1 ms, a fresh process
hundreds of ms), and a lock serialises callers, so one runner is safe to share
between threads; concurrent calls queue rather than run in parallel.

This module is the calling side (:class:`TimeoutRunner` and the shared default
runner); what runs in the worker is in ``timeout_worker.py``, and the frame format
both ends speak (an 8-byte length, :data:`~reasonrl.isolation.frames.HEADER_U64`,
then a pickle) with the reads and writes of one frame in ``frames.py``.
"""

from __future__ import annotations

import atexit
import enum
import os
import pickle
import select
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterable

__all__ = ["Status", "CallResult", "TimeoutRunner", "run_with_timeout", "default_runner"]

# The worker is started from timeout_worker.py by path, not with ``-m``, so that starting
# it imports no package ``__init__`` (``reasonrl.rewards/__init__`` once pulled in torch: ~2 s, ~200 MB).
# ``-P`` keeps the current directory off sys.path until the parent's sys.path arrives,
# so a stray ``pickle.py`` in the working directory cannot shadow the stdlib.
_WORKER_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "timeout_worker.py")
_BOOTSTRAP = (
    "import sys, importlib.util as u; "
    "s = u.spec_from_file_location('_reasonrl_timeout_worker', sys.argv[1]); "
    "m = u.module_from_spec(s); sys.modules[s.name] = m; s.loader.exec_module(m); m.worker_main()"
)

if __package__:
    from reasonrl.isolation.frames import HEADER_U64, ReadTimeout, frame, read_frame, write_all
else:
    # Loaded by path, outside the package (as a test does, to keep torch out): importing
    # the package would run its __init__, so load the sibling by path too.
    import importlib.util

    _spec = importlib.util.spec_from_file_location(
        "_reasonrl_isolation_frames", os.path.join(os.path.dirname(os.path.abspath(__file__)), "frames.py"))
    _frames = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_frames)
    HEADER_U64, ReadTimeout, frame, read_frame, write_all = (
        _frames.HEADER_U64, _frames.ReadTimeout, _frames.frame, _frames.read_frame, _frames.write_all)

# A reply is read in pieces of at most this many bytes (a huge one is not read into one huge buffer).
_MAX_CHUNK = 1 << 20


class Status(enum.Enum):
    """How a call ended: ``OK`` (value is the return value), ``TIMEOUT`` (the worker
    was killed), ``ERROR`` (the function raised, or the call could not be made)."""

    OK = "ok"
    TIMEOUT = "timeout"
    ERROR = "error"


@dataclass(frozen=True)
class CallResult:
    """The outcome of one call: ``status``, the return ``value`` (``OK`` only), a
    one-line ``error`` message (``TIMEOUT``/``ERROR``), the worker-side ``traceback``
    when the function itself raised, and ``elapsed`` seconds spent in the call."""

    status: Status
    value: Any = None
    error: str | None = None
    traceback: str | None = None
    elapsed: float = 0.0

    @property
    def ok(self) -> bool:
        """True when the function returned normally (``status is Status.OK``)."""
        return self.status is Status.OK


class _WorkerGone(Exception):
    pass


_RUNNERS: "weakref.WeakSet[TimeoutRunner]" = weakref.WeakSet()
# Popen handles inherited across fork belong to the parent's worker; keeping them
# alive here stops their destructors from trying to reap a process we don't own.
_INHERITED: list[subprocess.Popen] = []


class TimeoutRunner:
    """A persistent worker process that runs ``fn(*args, **kwargs)`` with a timeout.

    Use it instead of ``signal.alarm``-based timeouts (math-verify's own), which
    break outside the main thread (Math-Verify#50) and silently scored 0 in Ray
    workers (verl PR #5635). Works from any thread and inside daemonic processes.

    ``fn`` must be picklable by reference: a module-level function or builtin of an
    importable module (not a lambda, a closure, or something defined in
    ``__main__``). Arguments and the return value must be picklable.

    ``preload``: modules the worker imports before reporting ready, so the first
    call is not charged their import time. ``skip_package_init``: packages whose
    ``__init__`` the worker must not run when importing their submodules (the
    worker sees them as bare namespace packages); use it to keep heavy package
    imports out of the worker. ``startup_timeout`` bounds the worker start and the
    first import of each function's module, which are not charged to ``timeout``.

    The worker starts lazily on the first call, is killed on timeout and restarted
    on the next call, and is killed at interpreter exit (or by :meth:`close`).
    """

    def __init__(self, preload: Iterable[str] = (), skip_package_init: Iterable[str] = (),
                 startup_timeout: float = 120.0) -> None:
        self.preload = tuple(preload)
        self.skip_package_init = tuple(skip_package_init)
        self.startup_timeout = startup_timeout
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._poll: Any = None
        self._loaded: set[bytes] = set()
        self.starts = 0
        _RUNNERS.add(self)

    # -- public API ---------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The worker's process id, or None when no worker is running."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def call(self, fn: Callable, args: tuple = (), kwargs: dict | None = None, *,
             timeout: float | None) -> CallResult:
        """Run ``fn(*args, **kwargs)`` in the worker; give up after ``timeout`` seconds.

        Never raises for a slow, failing or crashing function: the result's status
        says what happened (a killed worker is restarted by the next call). The
        timeout covers sending the arguments, running ``fn`` and receiving the result;
        waiting for the lock (other threads' calls) and starting the worker are not
        counted. ``timeout=None`` waits forever.
        """
        start = time.monotonic()
        kwargs = kwargs or {}
        if getattr(fn, "__module__", None) == "__main__":
            return CallResult(Status.ERROR, error=(
                f"cannot run {getattr(fn, '__qualname__', fn)!r} in the worker: functions "
                "defined in __main__ are not importable there; move it to a module"),
                elapsed=time.monotonic() - start)
        try:
            fn_blob = pickle.dumps(fn, protocol=pickle.HIGHEST_PROTOCOL)
            call_blob = pickle.dumps(("call", fn_blob, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001 — report, don't raise
            return CallResult(Status.ERROR, error=f"cannot pickle the call: {type(exc).__name__}: {exc}",
                              elapsed=time.monotonic() - start)
        with self._lock:
            result = self._call_locked(fn_blob, call_blob, timeout)
        return CallResult(result[0], *result[1:], elapsed=time.monotonic() - start)

    def close(self) -> None:
        """Kill and reap the worker (a later call starts a new one)."""
        # At interpreter exit another (daemon) thread may be stuck mid-call holding the
        # lock; killing the worker anyway is what unblocks it.
        acquired = self._lock.acquire(timeout=1.0)
        try:
            self._kill()
        finally:
            if acquired:
                self._lock.release()

    def __enter__(self) -> "TimeoutRunner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------

    def _call_locked(self, fn_blob: bytes, call_blob: bytes, timeout: float | None) -> tuple:
        try:
            if self._proc is None or self._proc.poll() is not None:
                self._kill()
                self._start()
            if fn_blob not in self._loaded:
                # Importing fn's module is a one-off start-up cost, not the call's.
                self._send(pickle.dumps(("load", fn_blob, list(sys.path))))
                reply = self._recv(self._deadline(self.startup_timeout))
                if reply[0] != "loaded":
                    return Status.ERROR, None, f"cannot load the function in the worker: {reply[1]}", reply[2]
                self._loaded.add(fn_blob)
            self._send(call_blob)
            reply = self._recv(self._deadline(timeout))
        except ReadTimeout:
            self._kill()
            return Status.TIMEOUT, None, f"timed out after {timeout} s; worker killed", None
        except _WorkerGone as exc:
            self._kill()
            return Status.ERROR, None, str(exc), None
        except BaseException:
            # KeyboardInterrupt etc. mid-protocol: the pipe is out of step; drop the worker.
            self._kill()
            raise
        if reply[0] == "ok":
            return Status.OK, reply[1], None, None
        return Status.ERROR, None, reply[1], reply[2]

    @staticmethod
    def _deadline(seconds: float | None) -> float | None:
        return None if seconds is None else time.monotonic() + seconds

    def _start(self) -> None:
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-P", "-c", _BOOTSTRAP, _WORKER_FILE],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, bufsize=0, close_fds=True)
        except OSError as exc:
            raise _WorkerGone(f"cannot start the worker: {exc}") from None
        self.starts += 1
        self._poll = select.poll()  # not select.select: fds above 1024 are common in big jobs
        self._poll.register(self._proc.stdout.fileno(), select.POLLIN)
        self._loaded = set()
        self._send(pickle.dumps({"sys_path": list(sys.path), "preload": self.preload,
                                 "skip_package_init": self.skip_package_init,
                                 "parent_pid": os.getpid()}))
        try:
            reply = self._recv(self._deadline(self.startup_timeout))
        except ReadTimeout:
            raise _WorkerGone(f"worker did not start within {self.startup_timeout} s") from None
        if reply[0] != "ready":
            raise _WorkerGone(f"worker failed to start: {reply[1]}")

    def _kill(self) -> None:
        proc, self._proc, self._poll, self._loaded = self._proc, None, None, set()
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait()  # reap: no zombies
        for stream in (proc.stdin, proc.stdout):
            try:
                stream.close()
            except OSError:
                pass

    def _send(self, payload: bytes) -> None:
        data = frame(payload, HEADER_U64)
        fd = self._proc.stdin.fileno()
        try:
            write_all(fd, data)
        except (BrokenPipeError, OSError) as exc:
            raise _WorkerGone(self._death_message(f"cannot write to worker ({exc})")) from None

    def _recv(self, deadline: float | None) -> tuple:
        """The next reply; :class:`ReadTimeout` past ``deadline``, :class:`_WorkerGone` at EOF."""
        blob = read_frame(self._proc.stdout.fileno(), HEADER_U64, poll=self._poll, deadline=deadline,
                          max_chunk=_MAX_CHUNK)
        if blob is None:
            raise _WorkerGone(self._death_message("worker exited unexpectedly"))
        return pickle.loads(blob)

    def _death_message(self, what: str) -> str:
        try:
            code = self._proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return what
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        return f"{what} ({how}); it will be restarted on the next call"

    def _after_fork_in_child(self) -> None:
        # The forked child shares the parent's pipes: talking to that worker would
        # corrupt the parent's conversation, and the lock may have been held by a
        # parent thread that does not exist here. Start over with our own.
        self._lock = threading.Lock()
        if self._proc is not None:
            for stream in (self._proc.stdin, self._proc.stdout):
                try:
                    stream.close()  # our copies only; the parent's stay open
                except OSError:
                    pass
            _INHERITED.append(self._proc)
        self._proc, self._poll, self._loaded = None, None, set()


_DEFAULT: TimeoutRunner | None = None
_DEFAULT_LOCK = threading.Lock()


def default_runner() -> TimeoutRunner:
    """The process-wide shared runner used by :func:`run_with_timeout` (one worker per
    process, created lazily; a forked child gets its own, never its parent's)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = TimeoutRunner()
        return _DEFAULT


def run_with_timeout(fn: Callable, *args: Any, timeout: float | None, **kwargs: Any) -> CallResult:
    """Run ``fn(*args, **kwargs)`` on the shared worker with a wall-clock ``timeout``.

    A drop-in for ``signal.alarm``-style timeouts, which fail outside the main thread
    (Math-Verify#50; silent zero rewards in Ray workers, verl PR #5635). Works in any
    thread and inside daemonic pool workers; returns a :class:`CallResult` and never
    raises for a slow or failing function. See :class:`TimeoutRunner` for the rules.
    """
    return default_runner().call(fn, args, kwargs, timeout=timeout)


def _after_fork_in_child() -> None:
    global _DEFAULT_LOCK
    _DEFAULT_LOCK = threading.Lock()
    for runner in list(_RUNNERS):
        runner._after_fork_in_child()


def _shutdown_all() -> None:
    for runner in list(_RUNNERS):
        runner.close()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_shutdown_all)
