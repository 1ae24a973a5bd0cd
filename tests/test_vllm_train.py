"""``recipes/smollm2_grpo.yaml`` with ``rollout.engine: vllm`` trains end to end through the CLI,
in the ``sync`` source and in the ``async`` one (its sampler process drives the engine), with
the behaviour–learner mismatch logged every step and the staleness bound kept; a verifiers
environment's endpoint is served by the engine too."""

import json
import os
import subprocess
import sys
from pathlib import Path

from reasonrl.envs.verifiers import VERIFIERS_INSTALL, verifiers_python

from helpers import require_interpreter
from vllm_helpers import orphaned_engines, require_smollm2, require_vllm

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["rollout.engine=vllm", "model.device=cpu", "train.steps=3", "train.prompts_per_step=2",
         "rollout.num_generations=4", "rollout.max_new_tokens=8", "eval.size=0", "eval.every=0"]


def train(tmp_path, *overrides, recipe=ROOT / "recipes" / "smollm2_grpo.yaml", cwd=None) -> tuple[list[dict], str]:
    require_vllm()
    require_smollm2()
    run = tmp_path / "run"
    args = [x for kv in [*SMALL, *overrides] for x in ("--set", kv)]
    proc = subprocess.run([sys.executable, "-m", "reasonrl.cli", "train", str(recipe), "-o", str(run), *args],
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, cwd=cwd,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert orphaned_engines() == []  # every engine ended with its run, however its client ended
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "perf/step_s" in r], proc.stderr


def test_sync_source_trains_on_the_engine_and_measures_the_mismatch(tmp_path):
    steps, log = train(tmp_path)
    assert "vLLM" in log and "engine started" in log
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        # the engine held the weights of the step before (synced after every step and at the start)
        assert r["vllm/version"] == r["step"] - 1 and r["offpolicy/staleness_max"] == 0
        assert 0 <= r["offpolicy/max_abs_logp_diff"] < 1e-3 and abs(r["offpolicy/kl_behaviour"]) < 1e-5
        assert r["vllm/sync_s"] > 0


def test_async_source_drives_the_engine_within_its_staleness_bound(tmp_path):
    steps, _ = train(tmp_path, "rollout.source=async", "rollout.partial=false", "rollout.max_staleness=1")
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(r["offpolicy/staleness_max"] <= 1 for r in steps)
    assert all("offpolicy/max_abs_logp_diff" in r for r in steps)


def test_a_ray_actor_starts_its_own_engine(tmp_path):
    steps, _ = train(tmp_path, "rollout.source=async", "rollout.engine=ray", "rollout.actor_engine=vllm",
                  "rollout.partial=false", "rollout.max_staleness=1")
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(r["offpolicy/staleness_max"] <= 1 and "offpolicy/max_abs_logp_diff" in r for r in steps)


def test_a_verifiers_environment_samples_on_the_engine_through_the_endpoint(tmp_path):
    """``task: verifiers`` with ``rollout.engine: vllm``: the environment's agent asks the endpoint,
    the engine samples, and the learner trains on the engine's ids (its log-probs of them are
    the engine's within the mismatch bound: a re-tokenised row would be far off)."""
    require_interpreter(verifiers_python(), "verifiers", VERIFIERS_INSTALL, ".venv-verifiers")
    steps, log = train(tmp_path, "model.backend=hf", "model.path=smollm2-135m", "rollout.max_new_tokens=16",
                       recipe=ROOT / "recipes" / "verifiers_arith.yaml", cwd=ROOT)
    assert "engine started" in log
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        assert r["vllm/version"] == r["step"] - 1 and r["verifiers/errors"] == 0 and "reward/env" in r
        assert 0 <= r["offpolicy/max_abs_logp_diff"] < 1e-3
