"""train.retain_memory: freed memory stays in the process, so a repeated step faults no pages in."""

import subprocess
import sys

import pytest

from reasonrl.train import trainer as trainer_module
from reasonrl.train.trainer import Trainer
from helpers import mini_recipe

# A 64 MiB block from malloc, written and freed, six times; prints the minor page faults of the
# last five. glibc maps a block this size on its own and unmaps it when freed, so each write faults
# its 16,384 pages in again, unless the allocator keeps freed memory: then each reuses the first.
FAULTS = """
import ctypes, resource, sys
from reasonrl.train.allocator import retain_freed_memory
if sys.argv[1] == "retain":
    assert retain_freed_memory()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
def touch():
    block = libc.malloc(64 << 20)
    ctypes.memset(block, 1, 64 << 20)
    libc.free(block)
touch()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    touch()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""

PAGES = (64 << 20) // 4096


def minor_faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", FAULTS, mode], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="glibc's allocator: Linux only")
def test_retained_memory_is_reused_without_page_faults():
    default, retained = minor_faults("default"), minor_faults("retain")
    assert default > 4 * PAGES, default  # every write faulted its pages in again
    assert retained < PAGES // 8, retained  # the freed block was reused


@pytest.mark.parametrize("retain", [True, False])
def test_the_trainer_applies_train_retain_memory(tmp_path, monkeypatch, retain):
    calls, logs = [], []
    monkeypatch.setattr(trainer_module, "retain_freed_memory", lambda: calls.append(1) or True)
    trainer = Trainer(mini_recipe(train={"steps": 1, "retain_memory": retain}, eval={"size": 0}), tmp_path, log=logs.append)
    trainer.setup()
    trainer.close()
    assert calls == ([1] if retain else [])
    # The reward workers (memory limit 4096 MiB by default) were forked before; later ones are told of.
    assert any("retain_memory" in line and "memory limit" in line for line in logs) == retain
