"""Run one program in a sandbox: validate the limits, start it, read its output with a
bound, enforce the wall time, kill it, and classify how it ended.

The host side of a run is one child process (``bwrap``, or ``setpriv``/``unshare``)
started with ``subprocess.Popen`` in the calling thread, as uid 65534 when this process
is root (see :mod:`.backends` for why), in a new session. Everything the program starts
lives in the sandbox's PID namespace, whose init dies with that child (bwrap
``--die-with-parent`` / ``unshare --kill-child``), and a PID namespace whose init dies
is emptied by the kernel: so killing the one host-side child (``SIGKILL`` to its process
group) ends every process of the sandbox, a detached ``setsid`` + double-fork grandchild
included, and a run that returns has nothing left running.
"""

from __future__ import annotations

import json
import marshal
import math
import os
import posixpath
import selectors
import signal
import subprocess
import time

from reasonrl.isolation.sandbox.backends import (
    ENV, INNER_UID, WORKDIR, _memfd, command, host_uid, layout,
)
from reasonrl.isolation.sandbox.result import SandboxResult, classify
from reasonrl.isolation.sandbox.supervisor import MAIN

__all__ = ["run_in"]

MIN_MEMORY_MB = 32  # the system Python itself maps ~20 MB before running a line
SHM_BYTES = 16 << 20
KILL_FACTOR = 4  # a program that writes this many times the output bound is killed
GRACE_S = 2.0  # after a kill, how long to wait for the pipes to close


def _positive(name: str, value, *, integer: bool = False, minimum: float = 0.0):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        kind = "an integer" if integer else "a number"
        raise TypeError(f"{name} must be {kind}, got {value!r}")
    if not math.isfinite(value) or value <= 0 or value < minimum:
        raise ValueError(f"{name} must be {'>= ' + str(minimum) if minimum else '> 0'}, got {value!r}")
    return value


def _check_files(files) -> dict[str, str]:
    if files is None:
        return {}
    if not isinstance(files, dict):
        raise TypeError(f"files must be a dict of relative path -> text, got {type(files).__name__}")
    for name, text in files.items():
        if not isinstance(name, str) or not isinstance(text, str):
            raise TypeError(f"files: each entry must be str -> str, got {name!r}: {type(text).__name__}")
        normal = posixpath.normpath(name) if name else ""
        if not name or "\0" in name or name.startswith("/") or normal != name or normal.split("/")[0] == "..":
            raise ValueError(f"files: {name!r} is not a plain relative path inside the sandbox's working folder")
        if name == MAIN:
            raise ValueError(f"files: {MAIN!r} is the program itself; pass it as the code")
    return files


def run_in(backend: str, code: str, *, timeout_s: float = 5.0, cpu_s: float | None = None, memory_mb: int = 256,
           max_procs: int = 16, max_output_bytes: int = 64_000, stdin: str = "",
           files: dict[str, str] | None = None) -> SandboxResult:
    """:func:`run_python` with a given backend, not probed first (the probe itself uses it)."""
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, got {type(code).__name__}")
    if not isinstance(stdin, str):
        raise TypeError(f"stdin must be a str, got {type(stdin).__name__}")
    _positive("timeout_s", timeout_s)
    cpu_limit = math.ceil(_positive("cpu_s", cpu_s) if cpu_s is not None else timeout_s)
    _positive("memory_mb", memory_mb, integer=True, minimum=MIN_MEMORY_MB)
    _positive("max_procs", max_procs, integer=True)
    bound = _positive("max_output_bytes", max_output_bytes, integer=True)
    files = _check_files(files)
    payload = {"mode": backend, "code": code, "files": files, "workdir": WORKDIR, "uid": INNER_UID,
               "helpers": 2 if backend == "bwrap" else 1,  # bwrap's init + the supervisor, or the supervisor
               "limits": {"cpu_s": cpu_limit, "memory_mb": memory_mb, "file_mb": memory_mb, "max_procs": max_procs},
               "tmp_bytes": memory_mb << 20, "shm_bytes": SHM_BYTES,
               "layout": layout() if backend == "unshare" else []}
    uid = host_uid()
    as_user = {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}
    payload_fd = _memfd(marshal.dumps(payload, 4))  # the supervisor reads it with marshal (no imports)
    report_r, report_w = os.pipe2(os.O_CLOEXEC)
    stdin_fd = _memfd(stdin) if stdin else subprocess.DEVNULL
    extra: list[int] = []
    start = time.monotonic()
    try:
        argv, extra = command(backend, payload_fd, report_w, tmp_bytes=payload["tmp_bytes"], shm_bytes=SHM_BYTES)
        proc = subprocess.Popen(argv, stdin=stdin_fd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV,
                                cwd="/", start_new_session=True, pass_fds=(payload_fd, report_w, *extra), **as_user)
    except BaseException:
        os.close(report_r)
        raise
    finally:
        for fd in (payload_fd, report_w, *extra, *([stdin_fd] if stdin else [])):
            os.close(fd)
    try:
        out, err, truncated, killed_for = _collect(proc, start + timeout_s, bound)
    finally:
        if proc.poll() is None:
            _kill(proc)
        proc.wait()
    wall = time.monotonic() - start
    report = _read_report(report_r)
    exit_code = proc.returncode if proc.returncode >= 0 else None
    stderr = err.decode("utf-8", "replace")
    status, reason, returncode = classify(exit_code=exit_code, report=report, killed_for=killed_for,
                                          timeout_s=timeout_s, cpu_limit_s=cpu_limit, memory_mb=memory_mb,
                                          stderr=stderr, output_bound=bound)
    return SandboxResult(status, reason, returncode, out.decode("utf-8", "replace"), stderr, truncated,
                         round(wall, 4), (report or {}).get("cpu_s"), backend)


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL the host-side child's process group; the sandbox's PID namespace goes with it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            proc.kill()
        except ProcessLookupError:
            pass


def _collect(proc: subprocess.Popen, deadline: float, bound: int) -> tuple[bytes, bytes, bool, str | None]:
    """Read stdout and stderr until both close: at most ``bound`` bytes of each are kept.
    Kills the sandbox at ``deadline`` (``"wall"``) or past ``KILL_FACTOR * bound`` bytes
    written in all (``"output"``); after a kill, waits ``GRACE_S`` at most for the pipes."""
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    streams = {out_fd: bytearray(), err_fd: bytearray()}
    written, truncated, killed_for, stop_at = 0, False, None, None
    with selectors.DefaultSelector() as sel:
        for fd in streams:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            now = time.monotonic()
            if stop_at is not None and now >= stop_at:
                break
            if stop_at is None and now >= deadline:
                if proc.poll() is None:
                    killed_for = "wall"
                    _kill(proc)
                stop_at = now + GRACE_S
            for key, _ in sel.select(max(0.0, min((stop_at or deadline) - now, 1.0))):
                try:
                    data = os.read(key.fd, 1 << 16)
                except BlockingIOError:
                    continue
                if not data:
                    sel.unregister(key.fd)
                    continue
                written += len(data)
                buf = streams[key.fd]
                room = bound - len(buf)
                if room > 0:
                    buf += data[:room]
                if len(data) > max(room, 0):
                    truncated = True
                if written > KILL_FACTOR * bound and killed_for is None and stop_at is None:
                    killed_for = "output"
                    _kill(proc)
                    stop_at = time.monotonic() + GRACE_S
    proc.stdout.close()
    proc.stderr.close()
    if killed_for is None:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.0) + 0.5)
        except subprocess.TimeoutExpired:
            killed_for = "wall"
            _kill(proc)
    return bytes(streams[out_fd]), bytes(streams[err_fd]), truncated, killed_for


def _read_report(fd: int) -> dict | None:
    """The supervisor's last report line, or None (it was killed, or wrote nothing)."""
    chunks = []
    os.set_blocking(fd, False)
    try:
        while True:
            try:
                data = os.read(fd, 1 << 16)
            except BlockingIOError:
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(fd)
    for line in reversed(b"".join(chunks).decode("utf-8", "replace").splitlines()):
        try:
            report = json.loads(line)
        except ValueError:
            continue
        if isinstance(report, dict):
            return report
    return None
