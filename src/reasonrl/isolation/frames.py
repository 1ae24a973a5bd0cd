"""Length-prefixed frames over a pipe: what both kinds of isolated worker speak with their parent.

A frame is a big-endian unsigned length (the header) and then that many bytes. The two
protocols differ only in the header's width, and each keeps its own, so the bytes on
their pipes are what they always were:

- :data:`HEADER_U32` (4 bytes): the scorer's reward workers (``worker_protocol``);
- :data:`HEADER_U64` (8 bytes): :class:`~reasonrl.isolation.timeout.TimeoutRunner` and
  its worker (``timeout`` / ``timeout_worker``).

Here too is :func:`read_exact`, the one loop that reads a frame's pieces, in both of
its uses: a blocking read (a worker waiting for its next request) and a read polled
against a deadline (the runner waiting for a reply, which must be able to give up).

Standard library only, and no import of ``reasonrl``: the timeout worker loads this
file *by path* (see ``timeout_worker.py``), in a process that must not import the
package.
"""

from __future__ import annotations

import os
import struct
import time
from typing import Any

__all__ = ["HEADER_U32", "HEADER_U64", "ReadTimeout", "frame", "write_all", "read_exact", "read_frame"]

HEADER_U32 = struct.Struct("!I")
"""The reward workers' header: a 4-byte length."""
HEADER_U64 = struct.Struct("!Q")
"""The timeout runner's header: an 8-byte length."""


class ReadTimeout(Exception):
    """A polled :func:`read_exact` reached its deadline before it had all its bytes."""


def frame(blob: bytes, header: struct.Struct) -> memoryview:
    """``blob`` behind its ``header``, ready to write to a pipe (whole, or piecewise by a
    caller that writes without blocking)."""
    return memoryview(header.pack(len(blob)) + blob)


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write all of ``data`` to the blocking ``fd`` (``os.write`` may write only part)."""
    data = memoryview(data)
    while data:
        data = data[os.write(fd, data):]


def read_exact(fd: int, n: int, *, poll: Any = None, deadline: float | None = None,
               max_chunk: int | None = None) -> bytes | None:
    """Exactly ``n`` bytes from ``fd``, or None at EOF (the other end closed or died).

    Without ``poll`` the read blocks as long as it takes (a worker waiting for work).
    With ``poll`` (a ``select.poll`` object on which ``fd`` is registered for reading)
    it waits on that instead, and raises :class:`ReadTimeout` once the monotonic
    ``deadline`` has passed (None: no deadline), so a caller can stop waiting for a
    process that hangs. ``max_chunk`` caps one ``os.read``, so a huge frame is not
    read into one huge buffer at once."""
    buf = bytearray()
    while len(buf) < n:
        if poll is not None:
            if deadline is None:
                wait_ms = None
            else:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ReadTimeout
                wait_ms = max(1, int(remaining * 1000 + 1))
            if not poll.poll(wait_ms):
                continue
        want = n - len(buf)
        chunk = os.read(fd, want if max_chunk is None else min(want, max_chunk))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def read_frame(fd: int, header: struct.Struct, **how: Any) -> bytes | None:
    """The body of the next frame on ``fd``, or None at EOF (in the header or the body).
    ``how``: :func:`read_exact`'s ``poll``, ``deadline`` and ``max_chunk``."""
    head = read_exact(fd, header.size, **how)
    return None if head is None else read_exact(fd, header.unpack(head)[0], **how)
