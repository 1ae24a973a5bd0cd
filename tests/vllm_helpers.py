"""What the tests that run a real vLLM engine share: the engine's interpreter (skip with the
reason where there is none; under CI a missing engine fails, since `make test` installs it)
and SmolLM2 (the real tokenizer, pad == EOS)."""

import time
from pathlib import Path

import pytest

from reasonrl.rollout.vllm_engine import VLLM_INSTALL, engine_python

from helpers import require_interpreter


def require_vllm() -> str:
    return require_interpreter(engine_python(), "vLLM engine", VLLM_INSTALL, ".venv-vllm")


def require_smollm2() -> str:
    from reasonrl.policy.loading import resolve_model_path

    try:
        return resolve_model_path("smollm2-135m", None, "float32", None)
    except Exception as exc:  # noqa: BLE001 — no GGUF here: skip
        pytest.skip(f"SmolLM2 is not installed: {exc}")


def orphaned_engines(grace_s: float = 20.0) -> list[int]:
    """vLLM engine cores whose parent is gone (re-parented to init): a leak. Waits up to
    ``grace_s`` for ones still on their way out."""
    time.sleep(3.0)  # a client's exit (a Ray actor's) may orphan its engine only after the run returns
    deadline = time.monotonic() + grace_s
    while True:
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                text = stat.read_text()
            except OSError:
                continue
            name, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
            if "EngineCore" in name and rest[1] == "1" and rest[0] != "Z":
                found.append(int(stat.parent.name))
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)
