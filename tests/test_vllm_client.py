"""The vLLM rollout engine's client without vLLM (``reasonrl.rollout.vllm_engine``), against a
stand-in engine that speaks the same protocol (tests/fake_vllm_engine.py): every call has a
deadline, a dying or failing engine is a clear error, prompts go out as token ids and the
answers become exactly the Samples the trainer trains on (SmolLM2's tokenizer: pad == EOS)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from reasonrl.config import ConfigError, load_recipe
from reasonrl.rollout.vllm_engine import VLLM_PYTHON_ENV, EngineError, EngineProcess, VLLMSampler, tied_aliases

ROOT = Path(__file__).resolve().parents[1]
FAKE = Path(__file__).with_name("fake_vllm_engine.py")
RECIPE = ROOT / "recipes" / "smollm2_grpo.yaml"


def fake_python(tmp_path: Path) -> Path:
    """An executable that stands where the engine's interpreter stands: it drops the worker's
    path and runs the fake engine with the pipes' descriptors."""
    wrapper = tmp_path / "fake-python"
    wrapper.write_text(f'#!/bin/sh\nshift\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def engine(tmp_path, mode="ok", timeout=5.0) -> EngineProcess:
    return EngineProcess(tmp_path / "engine.log", timeout, [sys.executable, str(FAKE)], {"FAKE_VLLM": mode})


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


def logged_pid(log: Path) -> int:
    for _ in range(100):
        text = log.read_text() if log.exists() else ""
        if "pid=" in text:
            return int(text.split("pid=")[1].split()[0])
        time.sleep(0.05)
    raise AssertionError(f"the fake engine never started: {text!r}")


def test_a_hanging_call_ends_at_its_deadline_with_the_log_and_kills_the_engine(tmp_path):
    e = engine(tmp_path, "hang_generate", timeout=1.5)
    assert e.call("start", model="m", args={}, lora_rank=None) == {"vllm": "fake"}
    pid = logged_pid(tmp_path / "engine.log")
    started = time.monotonic()
    with pytest.raises(EngineError) as err:
        e.call("generate", prompts=[[1]], n=[1], seed=[0], max_tokens=[1], temperature=1.0, stop=[])
    took = time.monotonic() - started
    assert 1.4 <= took < 10, took
    msg = str(err.value)
    assert "did not answer 'generate' within 1.5 s (rollout.engine_timeout_s)" in msg
    assert "fake engine: hanging in generate" in msg and str(tmp_path / "engine.log") in msg
    assert e.failed and not e.alive() and not pid_alive(pid)


def test_start_has_a_deadline_too(tmp_path):
    e = engine(tmp_path, "hang_start", timeout=1.0)
    with pytest.raises(EngineError, match="did not answer 'start' within 1 s"):
        e.call("start", model="m", args={}, lora_rank=None)


def test_an_engine_that_dies_or_raises_is_a_clear_error(tmp_path):
    e = engine(tmp_path, "die_generate")
    e.call("start", model="m", args={}, lora_rank=None)
    with pytest.raises(EngineError, match=r"the vLLM engine exited \(status 3\) during 'generate'"):
        e.call("generate", prompts=[[1]], n=[1], seed=[0], max_tokens=[1], temperature=1.0, stop=[])
    (tmp_path / "second").mkdir()
    e = engine(tmp_path / "second", "raise_reload")
    e.call("start", model="m", args={}, lora_rank=None)
    with pytest.raises(EngineError, match="the vLLM engine failed in 'reload': ValueError: fake failure"):
        e.call("reload", path="p")
    e.close()
    assert not e.alive()


def test_close_stops_a_healthy_engine(tmp_path):
    e = engine(tmp_path)
    e.call("start", model="m", args={}, lora_rank=None)
    pid = logged_pid(tmp_path / "engine.log")
    e.close()
    assert not e.failed and not pid_alive(pid)


@pytest.fixture(scope="module")
def smollm2_policy():
    from reasonrl.policy.loading import resolve_model_path

    try:
        resolve_model_path("smollm2-135m", None, "float32", None)
    except Exception as exc:  # noqa: BLE001 — no GGUF here: skip
        pytest.skip(f"SmolLM2 is not installed: {exc}")
    from reasonrl.policy.factory import build_policy

    recipe = load_recipe(str(RECIPE), ["model.device=cpu"])
    return build_policy(recipe.model, log=lambda m: None)


def vllm_recipe(tmp_path, monkeypatch, *overrides):
    monkeypatch.setenv(VLLM_PYTHON_ENV, str(fake_python(tmp_path)))
    return load_recipe(str(RECIPE), ["rollout.engine=vllm", "model.device=cpu", *overrides])


def test_answers_become_the_samples_the_learner_trains_on(tmp_path, monkeypatch, smollm2_policy):
    """Token ids out as the engine sampled them: an EOS kept and masked in although pad == EOS, a
    stop string's token kept and its text cut, a budget-ended row truncated; ids in as the
    learner's own tokenisation without padding; one seed per prompt from the run's stream."""
    tok = smollm2_policy.tokenizer
    assert tok.pad_token_id == tok.eos_token_id == 2
    newline, seven, four = tok("\n")["input_ids"][0], tok("7")["input_ids"][0], tok("4")["input_ids"][0]
    reply = [[[seven, 2], [-0.5, -0.25], "stop"],
             [[four, newline], [-1.0, -0.125], "stop"],
             [[four, four, four], [-0.1, -0.2, -0.3], "length"]]
    monkeypatch.setenv("FAKE_VLLM_REPLY", json.dumps(reply))
    monkeypatch.setenv("FAKE_VLLM_LOG", str(tmp_path / "requests.jsonl"))
    sampler = VLLMSampler(smollm2_policy, vllm_recipe(tmp_path, monkeypatch), log=lambda m: None)
    try:
        prompts = ["Question: What is 3 + 4?\nAnswer:", "Hi"]
        out = sampler.sample(prompts, 3, 8, 0.7, torch.Generator().manual_seed(5), ["\n"])
    finally:
        sampler.close()
    requests = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    generate = next(r for r in requests if r["op"] == "generate")
    assert generate["prompts"] == [tok(p)["input_ids"] for p in prompts]
    assert generate["n"] == [3, 3] and generate["max_tokens"] == [8, 8]
    assert generate["seed"] == torch.randint(0, 2**31 - 1, (2,), generator=torch.Generator().manual_seed(5)).tolist()
    assert generate["temperature"] == 0.7 and generate["stop"] == ["\n"]
    assert out.completion_ids.tolist() == [[seven, 2, 2], [four, newline, 2], [four, four, four]] * 2
    assert out.completion_mask.tolist() == [[1, 1, 0], [1, 1, 0], [1, 1, 1]] * 2
    assert torch.equal(out.sample_logprobs, torch.tensor([[-0.5, -0.25, 0.0], [-1.0, -0.125, 0.0],
                                                          [-0.1, -0.2, -0.3]] * 2))
    assert out.truncated.tolist() == [False, False, True] * 2
    assert out.texts == ["7", "4", "444"] * 2
    ids, mask = smollm2_policy.encode_prompts(prompts)
    assert torch.equal(out.prompt_ids, ids.repeat_interleave(3, 0)) and torch.equal(out.prompt_mask, mask.repeat_interleave(3, 0))


def test_weights_reach_the_engine_under_every_name_it_holds(tmp_path, monkeypatch, smollm2_policy):
    """SmolLM2 ties its LM head to the embedding: ``weights()`` names it once, but an engine that
    holds both keeps the one it is not sent (a 2e-3 log-prob drift after a sync, measured)."""
    from safetensors.torch import load_file

    assert ("model.embed_tokens.weight", "lm_head.weight") in tied_aliases(smollm2_policy.model)
    monkeypatch.setenv("FAKE_VLLM_LOG", str(tmp_path / "requests.jsonl"))
    sampler = VLLMSampler(smollm2_policy, vllm_recipe(tmp_path, monkeypatch), log=lambda m: None)
    try:
        weights = smollm2_policy.weights()
        assert "lm_head.weight" not in weights
        sampler.set_weights(weights, 4)
        reload = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()][-1]
        assert reload["op"] == "reload"
        written = load_file(str(Path(reload["path"]) / "model.safetensors"))
        assert torch.equal(written["lm_head.weight"], weights["model.embed_tokens.weight"])
        assert set(written) == set(weights) | {"lm_head.weight"}
        assert sampler.version == 4 and sampler.metrics()["vllm/version"] == 4.0
        sampler.set_weights(weights, 5)
        assert not Path(reload["path"]).exists()  # the previous sync's folder is gone
    finally:
        sampler.close()
    assert not sampler.dir.exists()


def test_recipes_the_engine_cannot_serve_are_refused_at_load(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="needs model.backend: hf"):
        monkeypatch.setenv(VLLM_PYTHON_ENV, str(fake_python(tmp_path)))
        load_recipe(None, ["rollout.engine=vllm"])
    with pytest.raises(ConfigError, match="set rollout.partial: false"):
        vllm_recipe(tmp_path, monkeypatch, "rollout.source=async")
    with pytest.raises(ConfigError, match="leave rollout.decoder at hf"):
        vllm_recipe(tmp_path, monkeypatch, "rollout.decoder=fused")
    monkeypatch.delenv(VLLM_PYTHON_ENV)
    monkeypatch.setattr("reasonrl.rollout.vllm_engine.find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="make vllm-env"):
        load_recipe(str(RECIPE), ["rollout.engine=vllm"])


def test_a_run_whose_engine_hangs_ends_with_a_clear_error(tmp_path):
    """The whole CLI: the engine answers its start and the first sync, then hangs in its first
    generation; the run exits 1 within the deadline, names the call, shows the engine's log and
    leaves no engine behind."""
    env = {**os.environ, VLLM_PYTHON_ENV: str(fake_python(tmp_path)), "FAKE_VLLM": "hang_generate",
           "PYTHONPATH": str(ROOT / "src")}
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "reasonrl.cli", "train", str(RECIPE), "-o", str(tmp_path / "run"),
         "--set", "rollout.engine=vllm", "--set", "rollout.engine_timeout_s=4", "--set", "model.device=cpu",
         "--set", "train.steps=2", "--set", "eval.size=0", "--set", "eval.every=0"],
        env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "reasonrl: error: the vLLM engine did not answer 'generate' within 4 s" in proc.stderr
    assert "fake engine: hanging in generate" in proc.stderr and "Traceback" not in proc.stderr
    assert time.monotonic() - started < 300
    pid = int(proc.stderr.split("pid=")[1].split()[0])
    assert not pid_alive(pid)


def session_members(sid: int) -> list[int]:
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def test_an_engine_killed_without_clean_up_takes_its_session_and_weights_with_it(tmp_path):
    """What a Ray actor's exit does to the engine's process (SIGKILL, no clean-up): its guard
    removes the synced weights and kills the rest of the session (vLLM's engine core, here
    the guard itself). The real worker, run by this interpreter, which has no vLLM."""
    from reasonrl.rollout.vllm_engine import WORKER
    from reasonrl.rollout.vllm_worker import SCRATCH_ENV

    scratch = tmp_path / "scratch"
    (scratch / "sync-3").mkdir(parents=True)
    (scratch / "sync-3" / "model.safetensors").write_bytes(b"x" * 1000)
    e = EngineProcess(tmp_path / "engine.log", 30, [sys.executable, str(WORKER)], {SCRATCH_ENV: str(scratch)})
    with pytest.raises(EngineError, match="failed in 'reload'"):  # no engine started: an error, not a hang
        e.call("reload", path="p")
    sid = e.proc.pid
    assert len(session_members(sid)) == 2  # the worker and its guard
    os.kill(sid, 9)
    deadline = time.monotonic() + 10
    while (session_members(sid) or (scratch / "sync-3").exists()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert session_members(sid) == [] and not (scratch / "sync-3").exists()
    e.kill()
