"""What one sandboxed run returns, and how its status and reason are decided."""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

__all__ = ["SandboxResult", "SandboxUnavailable", "STATUSES", "classify"]

STATUSES = ("ok", "timeout", "memory", "error", "killed")


class SandboxUnavailable(RuntimeError):
    """No sandbox backend works on this machine; the message says what the kernel (or the
    missing tool) refused, for each backend tried, and how to fix it."""


@dataclass(frozen=True)
class SandboxResult:
    """How one program ran in the sandbox.

    ``status``: ``"ok"`` iff it ran to completion with exit code 0; ``"timeout"`` (wall or
    CPU time limit), ``"memory"`` (it ran out of its address-space limit: MemoryError),
    ``"error"`` (a non-zero exit code, or the sandbox could not be set up), ``"killed"``
    (a signal, or killed by the sandbox for writing far past the output bound).
    ``reason``: one human sentence, e.g. ``"exit code 1: ZeroDivisionError: division by
    zero"``. ``returncode``: the exit code, ``-N`` for signal N, None when the sandbox
    killed it before it ended. ``stdout``/``stderr``: decoded (UTF-8, bad bytes replaced),
    each cut to ``max_output_bytes``; ``truncated_output`` says whether anything was cut.
    ``wall_s``: seconds from start to end as the host saw them; ``cpu_s``: the program's
    user + system CPU seconds (its waited-for children included), None when it could not
    be measured (the program was killed with its supervisor). ``backend``: which mechanism
    ran it (``"bwrap"`` or ``"unshare"``).
    """

    status: str
    reason: str
    returncode: int | None
    stdout: str
    stderr: str
    truncated_output: bool
    wall_s: float
    cpu_s: float | None = None
    backend: str = ""

    @property
    def ok(self) -> bool:
        """True when the program ran to completion with exit code 0."""
        return self.status == "ok"


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# A traceback's closing line: a (dotted) exception name, then ":" or the line's end.
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)(:|$)")


def last_line(text: str, limit: int = 200) -> str:
    """The last exception line of ``text`` (a traceback's closing line), else its last
    non-empty line, shortened.

    The exception line is preferred because a program that forked may leave its children's
    half-written tracebacks after its own (they are killed mid-write when it ends), and the
    reason must name what ended the program, not a child's stray ``File ...`` line.
    """
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = next((x for x in reversed(lines) if _EXCEPTION_LINE.match(x)), lines[-1] if lines else "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def classify(*, exit_code: int | None, report: dict | None, killed_for: str | None, timeout_s: float,
             cpu_limit_s: int, memory_mb: int, stderr: str, output_bound: int) -> tuple[str, str, int | None]:
    """``(status, reason, returncode)`` of one run.

    ``exit_code``: what the host's child (bwrap / unshare) exited with, the truth; the
    supervisor's ``report`` refines it (signal or exit code, CPU time) only when the two
    agree. ``killed_for``: ``"wall"`` or ``"output"`` when the host killed the sandbox.
    """
    if killed_for == "wall":
        return "timeout", f"wall time {timeout_s:g} s exceeded", None
    if killed_for == "output":
        return "killed", f"output limit exceeded: more than {4 * output_bound} bytes written " \
                         f"(bound {output_bound} per stream), killed", None
    if report is not None and "setup_error" in report:
        return "error", f"sandbox setup failed: {report['setup_error']}", exit_code
    if exit_code is None:
        return "killed", "the sandbox ended without an exit status", None
    sig, code = None, exit_code
    if report is not None and "code" in report:
        if report.get("signal") and exit_code == 128 + report["signal"]:
            sig = report["signal"]
    elif exit_code > 128:  # no report: the supervisor itself was killed, with the program
        sig = exit_code - 128
    if sig is not None:
        cpu = (report or {}).get("cpu_s")
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu is not None and cpu >= cpu_limit_s):
            return "timeout", f"CPU time {cpu_limit_s} s exceeded ({signal_name(sig)})", -sig
        if sig == signal.SIGXFSZ:
            return "killed", f"file size limit {memory_mb} MB exceeded (SIGXFSZ)", -sig
        if report is None:
            return "killed", f"killed by signal {sig} ({signal_name(sig)}) with its supervisor", -sig
        return "killed", f"killed by signal {sig} ({signal_name(sig)})", -sig
    if code == 0:
        return "ok", "exit code 0", 0
    line = last_line(stderr)
    if "MemoryError" in line or "Cannot allocate memory" in line:
        return "memory", f"memory limit {memory_mb} MB exceeded ({line.split(':')[0] or 'MemoryError'})", code
    return "error", f"exit code {code}: {line}" if line else f"exit code {code}", code
