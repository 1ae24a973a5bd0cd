"""State files never run code when loaded (issue 29, item 2): a checkpoint's ``state.pt``, a
federated client's ``client_state.pt`` and the server's ``server_state.pt`` are read with
``torch.load(weights_only=True)`` (``reasonrl.train.checkpoint.load_state``). A crafted pickle
whose unpickling would create a file is refused with an error naming the file, and the file is
not created; ``save_state`` refuses, at the first save, any state a safe load could not read."""

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors import SafetensorError

from reasonrl.cli import main
from reasonrl.params import ConfigError
from reasonrl.policy.hf import HFPolicy
from reasonrl.train import checkpoint as ckpt
from reasonrl.train.trainer import Trainer

from helpers import MINI_TINY, QUIET, mini_recipe, run_cli

ROOT = Path(__file__).resolve().parents[1]


class _CreatesAFile:
    """Unpickling this calls ``open(path, "w")``: a stand-in for any code a crafted pickle runs."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def craft(path: Path, marker: Path, **plain) -> None:
    """Write a state file that creates ``marker`` when unpickled the unsafe way (checked)."""
    torch.save({**plain, "rng": _CreatesAFile(marker)}, path)
    torch.load(path, weights_only=False)  # the probe is real: the old loader ran it
    assert marker.exists()
    marker.unlink()


def test_train_resume_refuses_a_crafted_state_file_exit_2(tmp_path):
    run, marker = tmp_path / "run", tmp_path / "pwned"
    Trainer(mini_recipe(train={"steps": 1, "checkpoint_every": 1}, eval={"size": 2}), run, **QUIET).run()
    state = run / "checkpoints" / "step_000001" / "state.pt"
    craft(state, marker, train_state={"step": 1})
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*")}
    proc = run_cli("train", "--resume", str(run), cwd=ROOT)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"reasonrl: error: {state}: refusing to load: it holds objects other than tensors and plain data " \
           "(io.open)" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not marker.exists()
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*")} == before  # nothing written


def test_fed_client_and_server_refuse_crafted_state_files(tmp_path):
    pytest.importorskip("flwr")
    from reasonrl.config import load_recipe
    from reasonrl.methods.fed_grpo.apps import SERVER_STATE, run_server
    from reasonrl.methods.fed_grpo.client import STATE_FILE, FedClient

    sets = [f"model.tiny.{k}={v}" for k, v in MINI_TINY.items()] + ["eval.size=2", "log.progress=false"]
    recipe = load_recipe(ROOT / "recipes" / "fed_grpo.yaml", sets)
    marker = tmp_path / "pwned"
    (tmp_path / "c0").mkdir()
    craft(tmp_path / "c0" / STATE_FILE, marker, round=1)
    with pytest.raises(ConfigError, match=re.escape(f"{tmp_path / 'c0' / STATE_FILE}: refusing to load")):
        FedClient(recipe, 0, tmp_path / "c0")
    (tmp_path / "out").mkdir()
    craft(tmp_path / "out" / SERVER_STATE, marker, round=1)
    with pytest.raises(ConfigError, match=re.escape(f"{tmp_path / 'out' / SERVER_STATE}: refusing to load")):
        run_server(None, recipe, tmp_path / "out", log=lambda m: None)  # refused before any grid is used
    assert not marker.exists()


def test_every_random_stream_round_trips_through_a_safe_load(tmp_path):
    """``rng_state`` is plain data and tensors (NumPy's key array as a list of ints): saved,
    safely loaded and restored, every stream continues exactly (the resume tests check whole runs)."""
    gen = torch.Generator().manual_seed(7)
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    np.random.standard_normal()  # a cached Gaussian: NumPy's state has has_gauss = 1 now
    ckpt.save_state(tmp_path / "s.pt", {"rng": ckpt.rng_state(gen)})

    def draws():
        return (random.random(), float(np.random.standard_normal()), float(np.random.rand()),
                float(torch.rand(1)), float(torch.rand(1, generator=gen)))

    first = draws()
    for reseed in (random.seed, np.random.seed, torch.manual_seed, gen.manual_seed):
        reseed(9)
    ckpt.restore_rng(ckpt.load_state(tmp_path / "s.pt")["rng"], gen)
    assert draws() == first


@dataclass
class _Opaque:
    x: int = 1


@pytest.mark.parametrize("value, named", [
    (np.zeros(3), "state['methods']['m']['buf'] is a numpy.ndarray"),
    (np.float64(0.5), "state['methods']['m']['buf'] is a numpy.float64"),  # a float subclass: pickled as numpy's
    ([1, _Opaque()], "state['methods']['m']['buf'][1] is a test_checkpoint_safety._Opaque"),
    ({np.int64(3): 1.0}, "state['methods']['m']['buf'] key np.int64(3) is a numpy.int64"),
])
def test_save_state_refuses_what_a_safe_load_cannot_read(tmp_path, value, named):
    with pytest.raises(TypeError, match=re.escape(named)):
        ckpt.save_state(tmp_path / "s.pt", {"step": 1, "methods": {"m": {"buf": value}}})
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_plain_state_round_trips_and_garbage_is_named(tmp_path):
    state = {"w": torch.arange(3.0), "betas": (0.9, 0.99), "ids": {1, 2}, "none": None, "s": "x", "b": b"\x00",
             "dtype": torch.bfloat16, "size": torch.Size([2, 3]), "nested": [{"k": [1, 2.5, True]}]}
    ckpt.save_state(tmp_path / "s.pt", state)
    loaded = ckpt.load_state(tmp_path / "s.pt")
    assert torch.equal(loaded.pop("w"), state.pop("w")) and loaded == state
    (tmp_path / "bad.pt").write_bytes(b"not a state file")
    with pytest.raises(ConfigError, match=re.escape(f"{tmp_path / 'bad.pt'}: not a readable state file")):
        ckpt.load_state(tmp_path / "bad.pt")


# A checkpoint that cannot be written (a full disk, seen on a SmolLM2 run: safetensors raised its own
# SafetensorError) stops the run with one line naming the step, the free space and the resume command;
# the partial folder is removed and the last complete checkpoint resumes.

class _Policy:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error

    def save(self, path: Path) -> None:
        path.mkdir(parents=True)
        (path / "model.safetensors").write_bytes(b"half")
        if self.error is not None:
            raise self.error


@pytest.mark.parametrize("error, reason", [
    (OSError(28, "No space left on device"), "no space left on device"),
    (SafetensorError(
        "Error while serializing: I/O error: No space left on device (os error 28)"), "no space left on device"),
    (PermissionError(13, "Permission denied"), "Permission denied"),
])
def test_a_failed_checkpoint_write_is_named_and_leaves_the_last_one_intact(tmp_path, error, reason):
    ckpt.save_checkpoint(tmp_path, 1, _Policy(), {"step": 1}, keep=2)
    with pytest.raises(ckpt.CheckpointWriteError) as caught:
        ckpt.save_checkpoint(tmp_path, 2, _Policy(error), {"step": 2}, keep=2)
    assert re.fullmatch(rf"could not write the checkpoint of step 2 in {tmp_path / 'checkpoints'}: {reason} "
                        rf"\(\d+ MiB free\); the last complete checkpoint, step_000001, is intact: free space, "
                        rf"then `reasonrl train --resume {tmp_path}`", str(caught.value))
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_000001"]  # no .tmp- left
    assert ckpt.load_state(tmp_path / "checkpoints" / "step_000001" / "state.pt") == {"step": 1}


def test_an_error_that_is_not_a_write_failure_passes_through(tmp_path):
    with pytest.raises(ValueError, match="a bug"):
        ckpt.save_checkpoint(tmp_path, 1, _Policy(ValueError("a bug")), {}, keep=2)
    assert list((tmp_path / "checkpoints").iterdir()) == []


def _two_step_recipe(tmp_path: Path) -> Path:
    """A 2-step tiny run that checkpoints every step, written as a recipe file for the CLI."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"model": {"backend": "tiny", "tiny": dict(MINI_TINY)},
                                      "rollout": {"num_generations": 4, "max_new_tokens": 16},
                                      "train": {"steps": 2, "prompts_per_step": 2, "checkpoint_every": 1},
                                      "eval": {"size": 2}, "log": {"plots": False, "progress": False}}))
    return recipe


def test_cli_reports_a_full_disk_in_one_line_exit_1_and_the_run_resumes(tmp_path, monkeypatch, capsys):
    recipe, run = _two_step_recipe(tmp_path), tmp_path / "run"
    real = ckpt.save_state

    def disk_full_at_step_2(path, state):
        if state["train_state"]["step"] == 2:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing "
                               "file data/3: file write failed")
        real(path, state)

    monkeypatch.setattr(ckpt, "save_state", disk_full_at_step_2)
    assert main(["train", str(recipe), "-o", str(run)]) == 1
    err = capsys.readouterr().err
    assert f"reasonrl: error: could not write the checkpoint of step 2 in {run / 'checkpoints'}: the state file " \
           "could not be written (disk full?)" in err and f"`reasonrl train --resume {run}`" in err
    assert "Traceback" not in err
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_000001"]
    monkeypatch.setattr(ckpt, "save_state", real)
    assert main(["train", "--resume", str(run)]) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == 2


def test_a_failed_final_model_write_leaves_no_half_folder_and_resume_writes_it(tmp_path, monkeypatch, capsys):
    """final_model/ is written like a checkpoint: atomically, a full disk named in one line (exit 1),
    and `--resume` of the finished run writes it again from the last checkpoint."""
    recipe, run = _two_step_recipe(tmp_path), tmp_path / "run"
    real = HFPolicy.save

    def disk_full_outside_checkpoints(self, path):
        real(self, path)
        if "checkpoints" not in Path(path).parts:
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(HFPolicy, "save", disk_full_outside_checkpoints)
    assert main(["train", str(recipe), "-o", str(run)]) == 1
    err = capsys.readouterr().err
    assert f"reasonrl: error: could not write final_model in {run}: no space left on device (" in err
    assert f"the last complete checkpoint, step_000002, is intact: free space, then `reasonrl train --resume {run}`" in err
    assert "Traceback" not in err
    assert not (run / "final_model").exists() and not list(run.glob(".tmp-*"))  # nothing half-written
    assert not (run / "summary.json").exists()
    monkeypatch.setattr(HFPolicy, "save", real)
    assert main(["train", "--resume", str(run)]) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == 2
    assert {"config.json", "model.safetensors"} <= {p.name for p in (run / "final_model").iterdir()}
