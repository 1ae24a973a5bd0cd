"""A hardened sandbox for model-written Python: :func:`run_python`, :class:`SandboxPool`.

Each program runs in a fresh set of Linux namespaces (user, PID, mount, network, IPC,
UTS) built by bubblewrap, or by util-linux ``unshare`` where bwrap is missing or
refused (:func:`sandbox_backend` probes once per process and caches the choice), with
the system's ``/usr/bin/python3`` and the standard library only:

- file system: a tmpfs root holding read-only ``/usr`` (and the ``/lib*``, ``/bin``
  beside it), a handful of ``/etc`` files (no ``/etc/shadow``), a fresh ``/proc``, a
  minimal ``/dev`` and a private, size-bounded ``/tmp`` (its working folder, the only
  writable place); the project, ``/root``, ``/home`` and the host's ``/tmp`` are absent;
- no network (an empty network namespace), no capabilities, no further user namespaces;
- limits: wall time (killed), CPU time (RLIMIT_CPU), address space (RLIMIT_AS),
  processes + threads (RLIMIT_NPROC, per sandbox), file size, output (bounded reads;
  killed past 4x the bound);
- nothing left running: the PID namespace dies with the run, detached children too.

A reward that runs model code never lets it grade itself: the program gets only the inputs and
writes each value back as data (``values``: strict JSON by exact type), and the caller compares
them with the expected values in its own process.

``docs/sandbox.md`` has the details, the benchmark and what it does not protect against.
"""

from reasonrl.isolation.sandbox.backends import BACKENDS, SYSTEM_PYTHON
from reasonrl.isolation.sandbox.choice import choose_backend, run_python, sandbox_backend
from reasonrl.isolation.sandbox.pool import SandboxPool
from reasonrl.isolation.sandbox.result import STATUSES, SandboxResult, SandboxUnavailable

__all__ = ["run_python", "SandboxResult", "SandboxUnavailable", "SandboxPool", "sandbox_backend",
           "choose_backend", "BACKENDS", "STATUSES", "SYSTEM_PYTHON"]
