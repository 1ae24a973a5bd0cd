"""Pinned regression: short GRPO, RA and CoRA runs reproduce the numbers recorded before the
engine redesign (issue 9), from starting weights shipped in ``tests/data/pinned/``.

A refactor of the Trainer, the objective, the hooks or the optimisation loop must leave these
metrics and final weights unchanged. The tolerance only absorbs float reduction-order
differences between machines (on the machine that recorded them the runs are bit-identical);
a real change to the maths moves them by orders of magnitude more. Regenerate the pins with
``tests/data/pinned/make_pins.py`` only for a change that is meant to alter training numbers.
"""

import json

import pytest
import torch
from safetensors.torch import load_file

from pinned import DATA, PIN_RUNS, run_pinned

EXPECTED = json.loads((DATA / "expected_metrics.json").read_text())


@pytest.mark.parametrize("name", sorted(PIN_RUNS))
def test_pinned_run_reproduces_recorded_metrics_and_weights(name, tmp_path):
    rows, weights = run_pinned(name, tmp_path / name)
    expected = EXPECTED[name]
    assert [r["step"] for r in rows] == [r["step"] for r in expected]
    for got, want in zip(rows, expected):
        assert set(got) == set(want), f"step {want['step']}: metric keys changed"
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-6), f"step {want['step']}: {key}"
    pinned = load_file(str(DATA / f"{name}_final.safetensors"))
    assert set(weights) == set(pinned)
    for key, value in pinned.items():
        # atol 1e-5: on an AMD EPYC machine the RA/CoRA finals differ from the recorded ones by up
        # to 2.9e-6 (the metrics still agree to 1e-5), while the runs move weights by ~2.5e-3.
        torch.testing.assert_close(weights[key], value, atol=1e-5, rtol=1e-5, msg=f"final weight {key}")
    # The pins are not trivial: rewards vary, the policy moved, and the runs differ from each other.
    assert any(r.get("reward/mean", 0) > 0 for r in expected)
    start = load_file(str(DATA / "student" / "model.safetensors"))
    assert any(not torch.equal(start[k], pinned[k]) for k in pinned if k in start)


def test_pinned_runs_differ_from_each_other():
    finals = {name: load_file(str(DATA / f"{name}_final.safetensors")) for name in PIN_RUNS}
    key = next(iter(finals["grpo"]))
    assert not torch.equal(finals["grpo"][key], finals["ra"][key])
    assert not torch.equal(finals["ra"][key], finals["cora"][key])  # the teacher's update matters
    assert any("teacher/loss" in r for r in EXPECTED["cora"]) and not any("teacher/loss" in r for r in EXPECTED["ra"])
