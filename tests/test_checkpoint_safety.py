"""State files never run code when loaded (issue 29, item 2): a checkpoint's ``state.pt``, a
federated client's ``client_state.pt`` and the server's ``server_state.pt`` are read with
``torch.load(weights_only=True)`` (``reasonrl.train.checkpoint.load_state``). A crafted pickle
whose unpickling would create a file is refused with an error naming the file, and the file is
not created; ``save_state`` refuses, at the first save, any state a safe load could not read."""

import random
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from reasonrl.params import ConfigError
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
