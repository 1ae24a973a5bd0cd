"""A worker process's watcher thread: exit as soon as the parent that started it is gone.

Both kinds of worker run one. EOF on the request pipe tells a worker that its parent
died only while the worker is idle, reading; ``PR_SET_PDEATHSIG`` (the reward workers)
fires only when the parent was forked from the main thread and where ``prctl`` exists.
A worker busy in a long call (a pathological sympy input, a reward that hangs) would
outlive its parent without this. When the parent dies the worker is re-parented, so
``os.getppid()`` changes; the thread polls it.

(The sandbox needs no such thread: ``bwrap --die-with-parent`` or ``setpriv --pdeathsig``
ties it to its caller in the kernel, see ``sandbox/backends.py``.)

Standard library only, and no import of ``reasonrl``: the timeout worker loads this
file *by path* (see ``timeout_worker.py``), in a process that must not import the
package.
"""

from __future__ import annotations

import os
import threading
import time

__all__ = ["PARENT_POLL_S", "watch_parent"]

PARENT_POLL_S = 0.5
"""How often the watcher looks: a dead parent's worker lingers this long at most."""


def watch_parent(parent_pid: int, poll_s: float = PARENT_POLL_S) -> threading.Thread:
    """Start (and return) a daemon thread that ends this process with ``os._exit(0)`` once
    its parent is no longer ``parent_pid``. ``os._exit`` because nothing else run from a
    thread ends the process (``sys.exit`` would end only the thread) while the main thread
    is busy, possibly in C code that never returns to the interpreter."""
    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent_pid:
                os._exit(0)

    thread = threading.Thread(target=watch, daemon=True, name="parent-watch")
    thread.start()
    return thread
