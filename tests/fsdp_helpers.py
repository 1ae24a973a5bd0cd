"""What the FSDP2 tests share (``tests/test_fsdp*.py``, the Ray learner test)."""

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from reasonrl.config import recipe_from_dict
from reasonrl.metrics_log import read_metrics
from reasonrl.train.trainer import Trainer

from helpers import run_cli

# One torch thread in every process (torchrun gives each rank one; train.threads gives the single
# process one too), so both arms reduce floats in the same order where threads would split the work.
BASE = {
    "model": {"backend": "tiny"},
    "rollout": {"num_generations": 4, "max_new_tokens": 24},
    "train": {"steps": 3, "prompts_per_step": 4, "checkpoint_every": 1, "micro_batch_size": 8, "seed": 3,
              "threads": 1},
    "eval": {"size": 8},
    "log": {"plots": False, "progress": False},
}


def raw_recipe(**sections) -> dict:
    raw = json.loads(json.dumps(BASE))
    for key, value in sections.items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    return raw


def recipe_file(tmp_path: Path, name: str = "r.yaml", **sections) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw_recipe(**sections)))
    return path


def one_process(path: Path, run: Path) -> None:
    """The single-process run of a recipe file, in this process."""
    Trainer(recipe_from_dict(yaml.safe_load(path.read_text()), str(path)), run, log=lambda m: None).run()


def final(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(next((run / "final_model").glob("*.safetensors"))))


def max_relative_diff(a: Path, b: Path, elementwise: bool = False) -> float:
    """The largest per-tensor relative difference of two runs' final weights, ‖a − b‖ / ‖a‖
    (``elementwise``: max |a − b| / max |a|, which Adam's first steps make noisier: an element
    whose gradient is rounding-sized, e.g. of a LoRA B matrix that starts at 0, moves by about
    ±lr whatever its sign's origin)."""
    wa, wb = final(a), final(b)
    assert set(wa) == set(wb)
    if elementwise:
        return max(float((wa[k] - wb[k]).abs().max() / wa[k].abs().max().clamp(min=1e-12)) for k in wa)
    return max(float((wa[k] - wb[k]).norm() / wa[k].norm().clamp(min=1e-12)) for k in wa)


def cli(*args, cwd):
    done = run_cli(*args, cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def close_metrics(a: Path, b: Path, keys=("loss", "reward/mean", "grad_norm", "entropy")) -> None:
    ra, rb = read_metrics(a), read_metrics(b)
    assert [r["step"] for r in ra] == [r["step"] for r in rb]
    for x, y in zip(ra, rb):
        for k in keys:
            if k in x:
                assert y[k] == pytest.approx(x[k], rel=1e-5, abs=1e-7), (x["step"], k)
