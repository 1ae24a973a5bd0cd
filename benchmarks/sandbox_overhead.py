"""Cost of the code sandbox: wall time per call of a trivial program, against a plain
``subprocess.run([python3, -c, ...])`` measured in the same run (the peer baseline: no
isolation at all), and throughput in programs/s with 1, 2 and 4 pool workers.

    .venv/bin/python benchmarks/sandbox_overhead.py [--calls 30] [--programs 24] [--backends bwrap unshare]

Each backend is measured in turn, calls interleaved with the baseline's so that load
from elsewhere on the machine hits both alike. The last line is machine-readable (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import types

import reasonrl

# Skip reasonrl.rewards' __init__ (it imports torch): only the sandbox is measured.
_pkg = types.ModuleType("reasonrl.rewards")
_pkg.__path__ = [os.path.join(os.path.dirname(reasonrl.__file__), "rewards")]
sys.modules.setdefault("reasonrl.rewards", _pkg)

from reasonrl.isolation.sandbox import SYSTEM_PYTHON, SandboxPool, run_python  # noqa: E402
from reasonrl.isolation.sandbox.choice import probe  # noqa: E402

PROGRAM = "print(1)"


def mean_sd(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def per_call(backend: str, calls: int) -> dict:
    sandboxed, plain = [], []
    run_python(PROGRAM, backend=backend)  # warm-up (page cache)
    subprocess.run([SYSTEM_PYTHON, "-c", PROGRAM], capture_output=True, check=True)
    for _ in range(calls):
        start = time.perf_counter()
        result = run_python(PROGRAM, backend=backend)
        sandboxed.append(time.perf_counter() - start)
        assert result.ok and result.stdout == "1\n", result
        start = time.perf_counter()
        subprocess.run([SYSTEM_PYTHON, "-c", PROGRAM], capture_output=True, check=True)
        plain.append(time.perf_counter() - start)
    (s_mean, s_sd), (p_mean, p_sd) = mean_sd(sandboxed), mean_sd(plain)
    return {"sandbox_ms": [round(1e3 * s_mean, 1), round(1e3 * s_sd, 1)],
            "plain_subprocess_ms": [round(1e3 * p_mean, 1), round(1e3 * p_sd, 1)],
            "overhead_ms": round(1e3 * (s_mean - p_mean), 1), "ratio": round(s_mean / p_mean, 2)}


def throughput(backend: str, workers: int, programs: int) -> float:
    with SandboxPool(workers=workers, backend=backend) as pool:
        pool.map([PROGRAM] * workers)  # warm-up
        start = time.perf_counter()
        results = pool.map([PROGRAM] * programs)
        seconds = time.perf_counter() - start
    assert all(r.ok for r in results)
    return round(programs / seconds, 1)


def plain_throughput(workers: int, programs: int) -> float:
    from concurrent.futures import ThreadPoolExecutor

    def one(_: int) -> None:
        subprocess.run([SYSTEM_PYTHON, "-c", PROGRAM], capture_output=True, check=True)

    with ThreadPoolExecutor(workers) as ex:
        start = time.perf_counter()
        list(ex.map(one, range(programs)))
        return round(programs / (time.perf_counter() - start), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--programs", type=int, default=24)
    parser.add_argument("--backends", nargs="+", default=["bwrap", "unshare"])
    args = parser.parse_args()
    load = os.getloadavg()[0]
    out: dict = {"cpus": os.cpu_count(), "load_avg_1min": round(load, 2), "calls": args.calls,
                 "programs": args.programs, "backends": {}}
    print(f"{os.cpu_count()} CPUs, load average {load:.2f}; program: {PROGRAM!r}")
    for backend in args.backends:
        why = probe(backend)
        if why is not None:
            print(f"{backend}: unavailable: {why}")
            continue
        row = per_call(backend, args.calls)
        row["programs_per_s"] = {w: throughput(backend, w, args.programs) for w in (1, 2, 4)}
        out["backends"][backend] = row
        s, p = row["sandbox_ms"], row["plain_subprocess_ms"]
        print(f"{backend:8s} per call {s[0]:.1f} ± {s[1]:.1f} ms vs plain subprocess {p[0]:.1f} ± {p[1]:.1f} ms "
              f"(+{row['overhead_ms']:.1f} ms, x{row['ratio']}); programs/s with 1/2/4 workers: "
              + " / ".join(str(v) for v in row["programs_per_s"].values()))
    out["plain_programs_per_s"] = {w: plain_throughput(w, args.programs) for w in (1, 2, 4)}
    print("plain subprocess programs/s with 1/2/4 threads: "
          + " / ".join(str(v) for v in out["plain_programs_per_s"].values()))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
