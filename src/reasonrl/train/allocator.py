"""Keep the memory a training process frees for its next step (``train.retain_memory``).

A CPU training step allocates and frees the same large tensors every step: on SmolLM2 the
learner's activations, the logits, the tied embedding's [49152, 576] gradient, the sampler's
re-laid-out weights — 0.6–1.6 GB of fresh pages. glibc's allocator hands every block over
its mmap threshold (32 MiB at most) back to the OS when it is freed and trims the heap's top, so
the next step faults every page in again: 150–410 thousand minor page faults and 1.3–1.5 s of
system time a step on this project's 2-core VM. With mmap for single blocks off and the heap never
trimmed, freed blocks stay in the process and later steps reuse them: tens of faults and ~0.1 s of
system time a step once settled, the step 0.82x as long (``benchmarks/allocator.py``,
docs/scaling.md). The process's resident memory then stays at its high-water mark, as a GPU
caching allocator's reserved memory does.

Off by default: a reward worker forked from the process later (after a timeout) inherits the free
memory, which its relative ``RLIMIT_AS`` cannot see (``reasonrl.isolation.worker_procs``).

glibc only (Linux); elsewhere, or with another allocator preloaded, :func:`retain_freed_memory`
changes nothing and returns False. The setting holds for the rest of the process (glibc has no scope).
"""

from __future__ import annotations

import ctypes
import platform

# mallopt's parameters (glibc's malloc.h).
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4
# The largest value mallopt takes (an int): the heap is never trimmed below ~2 GiB of free top.
NEVER_TRIM = 2**31 - 1
TOP_PAD = 256 << 20  # grow the heap in 256 MiB strides: fewer brk calls while a step first grows it


def retain_freed_memory() -> bool:
    """Tell glibc's allocator to keep freed memory in this process: no mmap for single blocks,
    no trimming, heap growth in 256 MiB strides. True when it took effect; False where this is
    not glibc (musl, macOS) or mallopt refused."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        # The process's own symbols (as the sandbox and worker processes load prctl): the malloc
        # that serves this process, whatever libc file name find_library would guess.
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # mallopt returns 1 on success, 0 on error.
    return all(mallopt(param, value) == 1 for param, value in
               ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, NEVER_TRIM), (M_TOP_PAD, TOP_PAD)))
