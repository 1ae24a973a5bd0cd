import os

import pytest

# Under `make test` (2 pytest workers on 2 cores) torch in each worker, and in every process a test
# starts, would run one thread per core: 4 busy threads on 2 cores, where OpenMP's parallel regions
# wait at their barriers for a thread the OS has set aside. One thread per worker's share of the
# cores instead (before any test imports torch; inherited by the processes tests start). A test that
# needs more threads sets them itself (torch.set_num_threads, train.threads).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    # Mini models built by tests go to a per-session cache, never the user's.
    monkeypatch.setenv("REASONRL_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


# The files that take minutes, longest first (durations from a full `make test` on 2 cores). They
# are handed out first, so the two workers of `make test` (-n 2 --dist loadfile) finish together
# rather than one of them starting a long file when the rest is done (longest-first scheduling).
SLOW_FILES = ["test_vllm_train.py", "test_rollout_sources.py", "test_vllm_engine.py", "test_embedded_model.py",
              "test_fed_deploy.py", "test_ray_rollouts.py", "test_fsdp.py", "test_learning.py", "test_fsdp_resume.py", "test_fed_grpo.py"]


def pytest_configure(config):
    # pytest-xdist hands loadfile's files out by their number of tests, most first, unless told not
    # to (an option since 3.8): the slow files above hold few tests each, so they went out last and
    # one worker ran test_vllm_train.py's minutes alone at the end. Set here rather than as the
    # --no-loadscope-reorder flag, which the releases before 3.8 (pyproject allows >= 3.5) refuse.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    first = {name: i for i, name in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))  # stable: a file's own order is kept
