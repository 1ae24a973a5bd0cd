"""Which sandbox this process uses (probed once, cached) and :func:`run_python`, which runs a
program in it. Apart from ``backends`` (how each sandbox is built) and ``runner`` (running one
program in a given backend), because choosing means trying a trivial program in each.
"""

from __future__ import annotations

import os
import shutil
import threading
from typing import Callable

from reasonrl.isolation.sandbox.backends import BACKENDS, ENV_VAR, FIX, INNER_UID, INSTALL, SYSTEM_PYTHON
from reasonrl.isolation.sandbox.result import SandboxResult, SandboxUnavailable
from reasonrl.isolation.sandbox.runner import run_in

__all__ = ["probe", "choose_backend", "sandbox_backend", "run_python"]

_LOCK = threading.Lock()
_CHOICE: str | SandboxUnavailable | None = None


def _after_fork_in_child() -> None:  # a lock held by another thread at fork would never be released
    global _LOCK
    _LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _explain(backend: str, detail: str) -> str:
    low = detail.lower()
    if "uid map" in low or "user namespace" in low or "unshare failed" in low or "creating new namespace" in low \
            or ("operation not permitted" in low and "unshare" in low):
        return f"{detail} (the kernel refused to create a user namespace)"
    if "proc" in low and ("mount" in low or "permission" in low):
        return f"{detail} (mounting /proc for the new PID namespace was refused)"
    return detail


def probe(backend: str, find: Callable[[str], str | None] = shutil.which) -> str | None:
    """None when ``backend`` runs a trivial program correctly here, else why not."""
    tool = backend
    if find(tool) is None:
        return f"{tool} is not installed ({INSTALL[backend]})"
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return f"{SYSTEM_PYTHON} is missing: the sandbox runs programs with the system's Python 3"
    try:
        result = run_in(backend, "import os\nprint('sandbox-ok', os.getuid())", timeout_s=20.0)
    except OSError as exc:
        return f"could not start {tool}: {exc}"
    if result.ok and result.stdout.split() == ["sandbox-ok", str(INNER_UID)]:
        return None
    detail = next((line for line in result.stderr.splitlines() if line.strip()), "") or result.reason
    return _explain(backend, detail.strip())


def choose_backend(names: tuple[str, ...] = BACKENDS,
                   find: Callable[[str], str | None] = shutil.which) -> str:
    """The first of ``names`` that works here; :class:`SandboxUnavailable` naming each refusal if none."""
    failures = []
    for name in names:
        why = probe(name, find)
        if why is None:
            return name
        failures.append(f"{name}: {why}")
    raise SandboxUnavailable("no sandbox for model-written code works on this machine; "
                             + "; ".join(failures) + ". " + FIX)


def sandbox_backend(refresh: bool = False) -> str:
    """The backend this process uses (``"bwrap"`` or ``"unshare"``), probed on first use
    and cached (a failure too: it raises the same :class:`SandboxUnavailable` again).
    ``REASONRL_SANDBOX_BACKEND=bwrap|unshare`` forces one."""
    global _CHOICE
    with _LOCK:
        if _CHOICE is None or refresh:
            forced = os.environ.get(ENV_VAR, "").strip()
            if forced and forced not in BACKENDS:
                raise ValueError(f"{ENV_VAR}={forced!r}: expected one of {', '.join(BACKENDS)}")
            try:
                _CHOICE = choose_backend((forced,) if forced else BACKENDS)
            except SandboxUnavailable as exc:
                _CHOICE = exc
        choice = _CHOICE
    if isinstance(choice, SandboxUnavailable):
        raise SandboxUnavailable(str(choice))
    return choice


def run_python(code: str, *, timeout_s: float = 5.0, cpu_s: float | None = None, memory_mb: int = 256,
               max_procs: int = 16, max_output_bytes: int = 64_000, stdin: str = "",
               files: dict[str, str] | None = None, backend: str | None = None) -> SandboxResult:
    """Run the Python program ``code`` in a fresh sandbox and return how it ended.

    Limits: ``timeout_s`` wall seconds (then killed: status ``"timeout"``); ``cpu_s`` CPU
    seconds (RLIMIT_CPU, whole seconds, rounded up; default ``timeout_s`` rounded up);
    ``memory_mb`` of address space (RLIMIT_AS; also the size of its private ``/tmp`` and
    the largest file it may write); ``max_procs`` processes and threads of its own
    (RLIMIT_NPROC in its own user namespace, so per sandbox); ``max_output_bytes`` kept
    of each of stdout and stderr (the rest dropped, ``truncated_output`` set; killed past
    4x). ``stdin`` is its standard input; ``files`` (relative path -> text) are written
    into its working folder, the private ``/tmp``, beside ``main.py``.

    It runs with the system's ``/usr/bin/python3`` (standard library only; the project's
    virtualenv is not visible), without network, without the project, ``/root``,
    ``/home``, the host's ``/tmp`` or ``/etc/shadow``. ``backend`` forces ``"bwrap"`` or
    ``"unshare"``; by default the one :func:`sandbox_backend` chose (raises
    :class:`SandboxUnavailable` when none works)."""
    if backend is None:
        backend = sandbox_backend()
    elif backend not in BACKENDS:
        raise ValueError(f"unknown sandbox backend {backend!r}; known: {', '.join(BACKENDS)}")
    return run_in(backend, code, timeout_s=timeout_s, cpu_s=cpu_s, memory_mb=memory_mb, max_procs=max_procs,
                  max_output_bytes=max_output_bytes, stdin=stdin, files=files)
