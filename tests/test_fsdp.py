"""The FSDP2 learner (``reasonrl.train.fsdp``): 2 learner ranks under torchrun on CPU with gloo
(each test starts and stops them through ``reasonrl train --nproc 2``) take the single-process step."""

import json

import pytest

from reasonrl import train
from reasonrl.config import ConfigError
from reasonrl.metrics_log import read_metrics
from reasonrl.policy.tiny import write_smollm2_architecture

from fsdp_helpers import BASE, cli, close_metrics, max_relative_diff, one_process, recipe_file
from helpers import run_cli


@pytest.mark.parametrize("model", ["smollm2_architecture", "smollm2_architecture_lora", "critic"])
def test_two_ranks_take_the_single_process_step(tmp_path, model):
    """2 ranks vs 1 process, same recipe and seed: the weights after 3 steps agree within 1e-5
    relative, and so do the logged loss, rewards and gradient norms. ``critic``: a method that
    owns and trains a model of its own (PPO's value model), which lives on rank 0, on the embedded
    model (which tests/test_fsdp_resume.py and the Ray test also compare with one process)."""
    sections = {"train": {"checkpoint_every": 3}}
    if model.startswith("smollm2_architecture"):  # SmolLM2-135M's layout (GQA 3:1, tied, RoPE 1e5), 2 narrow layers
        folder = write_smollm2_architecture(tmp_path / "smol", num_hidden_layers=2, hidden_size=192,
                                            num_attention_heads=3, num_key_value_heads=1, intermediate_size=512)
        # A random model earns no reward: the entropy bonus is what gives it a gradient.
        sections.update(model={"backend": "hf", "path": str(folder)}, eval={"size": 0}, loss={"entropy_coef": 0.05})
        if model.endswith("lora"):  # only the adapters train (and are sharded, beside the frozen base)
            sections["model"]["lora"] = {"r": 4, "alpha": 8}
            sections["optim"] = {"lr": 1e-3}
            # ... through the packed training forward (reasonrl.policy.packed) on both sides.
            sections["train"]["length_buckets"] = 0
    elif model == "critic":
        sections.update(advantage={"name": "gae", "gamma": 1.0, "lam": 0.95},
                        methods=[{"name": "critic", "lr": 1e-4, "warmup_steps": 1}])
    path = recipe_file(tmp_path, **sections)
    one_process(path, tmp_path / "one")
    cli("train", str(path), "-o", str(tmp_path / "two"), "--nproc", "2", cwd=tmp_path)
    assert max_relative_diff(tmp_path / "one", tmp_path / "two") < 1e-5
    assert max_relative_diff(tmp_path / "one", tmp_path / "two", elementwise=True) < 1e-4
    close_metrics(tmp_path / "one", tmp_path / "two")
    # Every step moved the weights: the equality is not that of two untrained copies.
    assert all(r["grad_norm"] > 0 for r in read_metrics(tmp_path / "two") if "grad_norm" in r)
    last = tmp_path / "two" / "checkpoints" / "step_000003"
    assert sorted(p.name for p in (last / "learner").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert json.loads((tmp_path / "two" / "recipe.json").read_text())["train"]["nproc"] == 2


def test_what_two_ranks_cannot_run_is_refused_before_the_run_starts(tmp_path):
    path = recipe_file(tmp_path, methods=[{"name": "srd"}])
    done = run_cli("train", str(path), "-o", str(tmp_path / "x"), "--nproc", "2", cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "method(s) srd add a loss term" in done.stderr
    assert not (tmp_path / "x").exists()
    assert run_cli("train", str(path), "--nproc", "0", cwd=tmp_path).returncode == 2
    with pytest.raises(ConfigError, match="reasonrl train RECIPE --nproc N"):  # torchrun starts from the CLI
        train({**BASE, "train": {**BASE["train"], "nproc": 2}}, tmp_path / "api")
