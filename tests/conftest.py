import pytest


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    # Mini models built by tests go to a per-session cache, never the user's.
    monkeypatch.setenv("REASONRL_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


# The files that take minutes, longest first (durations from a full `make test` on 2 cores). They
# are handed out first, so the two workers of `make test` (-n 2 --dist loadfile) finish together
# rather than one of them starting a long file when the rest is done (longest-first scheduling).
SLOW_FILES = ["test_vllm_train.py", "test_rollout_sources.py", "test_vllm_engine.py", "test_embedded_model.py",
              "test_fed_deploy.py", "test_ray_rollouts.py", "test_fsdp.py", "test_learning.py", "test_fsdp_resume.py", "test_fed_grpo.py"]


def pytest_collection_modifyitems(config, items):
    first = {name: i for i, name in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))  # stable: a file's own order is kept
