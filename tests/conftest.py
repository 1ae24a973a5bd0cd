import pytest


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    # Mini models built by tests go to a per-session cache, never the user's.
    monkeypatch.setenv("REASONRL_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
