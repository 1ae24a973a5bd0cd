"""What crosses the pipes between the scorer's process and a reward worker.

Both ends of :class:`~reasonrl.isolation.workers.Workers` speak it. The parent sends
a chunk of calls as one frame, a pickled list of ``(k, payload)``; the worker
says ``(STARTED, None)`` once it has read the chunk, then answers each call with one
frame, a pickled ``(status, value)``, as soon as that call is done, so the parent
knows which call is running and when it started. A call's timeout counts from then,
not from when the parent sent it: a worker just forked from a big process may take a
while to get there (:data:`START_GRACE_S` at most). A
frame is a 4-byte length (:data:`HEADER`, ``frames.HEADER_U32``) and then that many
bytes of pickle; writing and reading one is in :mod:`reasonrl.isolation.frames`,
shared with the timeout runner (whose header is 8 bytes).

Here too are the statuses a job ends with, what a :data:`Call` is and the parent's
record of one worker (:class:`Worker`), since both sides use them. How the worker processes are forked, watched, killed and reaped is
in ``worker_procs.py``; the scheduling of jobs onto them in ``workers.py``.
"""

from __future__ import annotations

import pickle
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from reasonrl.isolation.frames import HEADER_U32, read_frame, write_all
from reasonrl.isolation.frames import frame as _frame

__all__ = ["Worker", "Call", "OK", "ERROR", "FATAL", "TIMEOUT", "CRASH", "STARTED", "START_GRACE_S", "HEADER", "frame",
           "read_frames", "serve"]

OK, ERROR, FATAL = "ok", "error", "fatal"  # worker replies; fatal = error, then the worker exits
TIMEOUT, CRASH = "timeout", "crash"  # failures seen by the parent
STARTED = "started"  # the worker has read a chunk: the first call's clock starts
START_GRACE_S = 10.0
"""How long a worker may take to read a chunk, on top of its first call's timeout."""

Call = Callable[[int, tuple], "tuple[str, Any]"]
"""``call(k, payload) -> (status, value or error message)``, run in a worker: the status
is ``OK``, ``ERROR`` or ``FATAL`` (an error after which the worker exits and is replaced)."""

HEADER = HEADER_U32


@dataclass(eq=False)
class Worker:
    """One forked worker: its process and pipe ends, and the scheduler's state for it."""

    pid: int
    req_fd: int  # parent writes chunks of calls
    res_fd: int  # parent reads result frames
    pool: int
    jobs: deque = field(default_factory=deque)
    out: memoryview = field(default_factory=lambda: memoryview(b""))
    buf: bytearray = field(default_factory=bytearray)
    deadline: float = 0.0
    reaped: str | None = None  # how it ended, once waited for (its pid may then be reused)


def frame(blob: bytes) -> memoryview:
    """``blob`` behind its length header, ready to write to a pipe."""
    return _frame(blob, HEADER)


def read_frames(w: Worker, data: bytes) -> str | None:
    """Consume result frames; returns the fatal error when the worker said it exits."""
    w.buf += data
    fatal = None
    offset = 0
    while len(w.buf) - offset >= HEADER.size:
        (size,) = HEADER.unpack_from(w.buf, offset)
        if len(w.buf) - offset - HEADER.size < size:
            break
        status, value = pickle.loads(w.buf[offset + HEADER.size:offset + HEADER.size + size])
        offset += HEADER.size + size
        if status == STARTED:
            w.deadline = time.monotonic() + w.jobs[0].timeout
            continue
        job = w.jobs.popleft()
        if status == OK:
            job.status, job.value = OK, value
        elif status == FATAL:
            job.status, job.error = CRASH, value
            fatal = value
            break
        else:
            job.status, job.error = ERROR, value
        if w.jobs:
            w.deadline = time.monotonic() + w.jobs[0].timeout
    del w.buf[:offset]
    return fatal


def serve(req_fd: int, res_fd: int, call: Call) -> None:
    """The worker loop: read a chunk of calls, answer each with one frame, until EOF."""
    while True:
        blob = read_frame(req_fd, HEADER)
        if blob is None:
            return
        write_all(res_fd, frame(pickle.dumps((STARTED, None), protocol=pickle.HIGHEST_PROTOCOL)))
        for k, payload in pickle.loads(blob):
            status, value = call(k, payload)
            write_all(res_fd, frame(pickle.dumps((status, value), protocol=pickle.HIGHEST_PROTOCOL)))
            if status == FATAL:
                return
        for stream in (sys.stdout, sys.stderr):  # os._exit would drop what a reward printed
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
