"""A helper process spoken to in JSON lines over two pipes, every call under a deadline: the
client side of the vLLM engine (``rollout.vllm_worker``) and of the verifiers worker
(``rollout.verifiers_worker``). Both workers run by path, in an interpreter of their own (their
packages pin what ours cannot share), and import nothing of reasonrl.

A call past its deadline kills the worker's whole session (it leads one) and raises the
subclass's error naming the call and showing the end of the worker's log; so does a worker that
dies or answers ``{"ok": false, "error": traceback}``.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

__all__ = ["WorkerError", "WorkerProcess", "log_tail"]

LOG_TAIL_LINES = 20


class WorkerError(RuntimeError):
    """A worker failed, died or did not answer in time; the message says which call."""


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:]) or "(empty log)"


class WorkerProcess:
    """One worker process and its request pipe; every call has a deadline.

    ``command`` is run with the pipes' descriptors appended. The process leads a session of its
    own, so ending it ends whatever it started. ``who`` names it in errors, ``timeout_key`` the
    recipe key of its deadline, ``error`` the exception raised."""

    who = "the worker"
    timeout_key = "timeout_s"
    error: type[RuntimeError] = WorkerError

    def __init__(self, log_path: Path, timeout_s: float, command: list[str],
                 env: dict[str, str] | None = None) -> None:
        self.log_path, self.timeout_s = Path(log_path), timeout_s
        req_r, self.req_w = os.pipe()
        self.rep_r, rep_w = os.pipe()
        self.log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen([*command, str(req_r), str(rep_w)], pass_fds=(req_r, rep_w),
                                         stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                         start_new_session=True, env={**os.environ, **(env or {})})
        finally:
            os.close(req_r)
            os.close(rep_w)
        os.set_blocking(self.req_w, False)
        self.buffer = b""
        self.failed = False  # it hung, died or raised: its log explains why, keep it

    def call(self, op: str, timeout: float | None = None, **payload) -> dict[str, Any]:
        """Send one request and wait for its answer, at most ``timeout`` (default: the worker's)
        seconds; past it the worker is killed and ``error`` raised."""
        timeout = self.timeout_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        self._write((json.dumps({"op": op, **payload}) + "\n").encode(), deadline, op, timeout)
        reply = json.loads(self._readline(deadline, op, timeout))
        if not reply.pop("ok"):
            self.failed = True
            error = reply["error"].strip()
            raise self.error(f"{self.who} failed in '{op}': {error.splitlines()[-1]}\n{error}")
        return reply

    def _write(self, data: bytes, deadline: float, op: str, timeout: float) -> None:
        while data:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [self.req_w], [], left)[1]:
                self._hung(op, timeout)
            try:
                data = data[os.write(self.req_w, data):]
            except BrokenPipeError:
                self._died(op)

    def _readline(self, deadline: float, op: str, timeout: float) -> bytes:
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.rep_r], [], [], left)[0]:
                self._hung(op, timeout)
            chunk = os.read(self.rep_r, 1 << 20)
            if not chunk:
                self._died(op)
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def _hung(self, op: str, timeout: float):
        self.failed = True
        self.kill()
        raise self.error(f"{self.who} did not answer '{op}' within {timeout:g} s ({self.timeout_key}) "
                         f"and was stopped; the end of its log ({self.log_path}):\n{log_tail(self.log_path)}")

    def _died(self, op: str):
        self.failed = True
        status = self.proc.wait(timeout=30)
        self.kill()
        raise self.error(f"{self.who} exited (status {status}) during '{op}'; the end of its log "
                         f"({self.log_path}):\n{log_tail(self.log_path)}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """End the worker and everything it started (its session), now."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self._close_fds()

    def close(self, timeout: float = 30.0) -> None:
        """Ask the worker to stop; kill it if it does not within ``timeout`` seconds."""
        if self.alive() and self.req_w >= 0:
            try:
                self.call("stop", timeout=timeout)
                self.proc.wait(timeout=timeout)
            except (self.error, subprocess.TimeoutExpired):
                pass
        self.kill()

    def _close_fds(self) -> None:
        for fd in (self.req_w, self.rep_r):
            if fd >= 0:
                os.close(fd)
        self.req_w = self.rep_r = -1
        self.log.close()
