"""Run many sandboxed programs in parallel: a fixed number of threads, each driving one
sandbox (a subprocess) at a time; results come back in the order of the programs."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Iterable, Sequence

from reasonrl.isolation.sandbox.choice import run_python, sandbox_backend
from reasonrl.isolation.sandbox.result import SandboxResult

__all__ = ["SandboxPool"]


class SandboxPool:
    """``workers`` sandboxes at once. Threads suffice: each only waits on its subprocess.

    ``limits`` given here (``timeout_s``, ``memory_mb``, ...: those of
    :func:`run_python`) are the defaults of every call; a call's own override them.
    Use it as a context manager, or call :meth:`close`; a closed pool refuses work.
    The backend (``backend``, else :func:`sandbox_backend`'s choice) is settled when the
    pool is made, so :class:`SandboxUnavailable` is raised here rather than per program."""

    def __init__(self, workers: int = 4, *, backend: str | None = None, **limits: Any) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
        self.backend = backend or sandbox_backend()
        self.workers = workers
        self.limits = limits
        self._executor: ThreadPoolExecutor | None = ThreadPoolExecutor(workers, thread_name_prefix="sandbox")

    def submit(self, code: str, **limits: Any) -> "Future[SandboxResult]":
        """Start ``code`` when a worker is free; its future's result is the :class:`SandboxResult`."""
        if self._executor is None:
            raise RuntimeError("this SandboxPool is closed")
        return self._executor.submit(run_python, code, **{"backend": self.backend, **self.limits, **limits})

    def map(self, codes: Iterable[str], *, stdins: Sequence[str] | None = None, **limits: Any) -> list[SandboxResult]:
        """Run every program of ``codes`` (with ``stdins[i]`` as the i-th one's input, if
        given) under the same limits; the results in the order of ``codes``."""
        codes = list(codes)
        if stdins is not None and len(stdins) != len(codes):
            raise ValueError(f"stdins has {len(stdins)} entries for {len(codes)} programs")
        futures = [self.submit(code, **({"stdin": stdins[i]} if stdins is not None else {}), **limits)
                   for i, code in enumerate(codes)]
        return [f.result() for f in futures]

    def close(self, cancel_pending: bool = False) -> None:
        """Wait for the running programs (each ends by its own time limit), then stop the
        threads; ``cancel_pending`` drops the programs not started yet. Idempotent."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=cancel_pending)

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(cancel_pending=exc[0] is not None)

    def __repr__(self) -> str:
        state = "closed" if self._executor is None else "open"
        return f"SandboxPool(workers={self.workers}, backend={self.backend!r}, {state})"
