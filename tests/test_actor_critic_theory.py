"""The actor-critic theory simulation (``benchmarks/actor_critic_theory.py``): its exact parts
against hand-computed numbers, and its quick mode end to end."""

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "actor_critic_theory.py"


@pytest.fixture(scope="module")
def act():
    spec = importlib.util.spec_from_file_location("actor_critic_theory", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_space_and_weights(act):
    space = act.enumerate_space(3, 4)
    assert space.shape == (64, 3)
    assert torch.unique(space, dim=0).shape[0] == 64
    assert act.level_weights(3).tolist() == [0.5, 0.25, 0.125]


def test_hand_computed_reward_and_objective(act):
    # L = 2, |V| = 2, y* = (1, 0), w = (1/2, 1/4): r = 0 for (0,*), 3/4 for (1,0), 1/2 for (1,1).
    space = act.enumerate_space(2, 2)
    assert space.tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]]
    r = act.hierarchical_reward(space, torch.tensor([1, 0]), act.level_weights(2))
    assert r.tolist() == [0.0, 0.0, 0.75, 0.5]

    beta, probs = 0.1, [0.1, 0.2, 0.3, 0.4]
    log_ref = act.uniform_log_ref(4)
    log_pi = torch.tensor(probs, dtype=torch.float64).log()
    kl = sum(p * math.log(p / 0.25) for p in probs)
    expected_j = 0.3 * 0.75 + 0.4 * 0.5 - beta * kl
    assert act.objective(log_pi, log_ref, r, beta) == pytest.approx(expected_j, abs=1e-12)

    # J(pi*) = beta log E_ref exp(r / beta) = beta log((2 + e^7.5 + e^5) / 4).
    j_opt = beta * math.log((2 + math.exp(7.5) + math.exp(5.0)) / 4)
    assert act.optimal_objective(log_ref, r, beta) == pytest.approx(j_opt, abs=1e-12)
    assert act.regret(log_pi, log_ref, r, beta) == pytest.approx(j_opt - expected_j, abs=1e-12)
    # pi* itself: the tilted policy of the true reward, and its objective is the closed form.
    log_opt = act.tilted_log_policy(log_ref, r, beta)
    assert act.objective(log_opt, log_ref, r, beta) == pytest.approx(j_opt, abs=1e-12)


@pytest.mark.parametrize("beta", [0.05, 0.1, 0.2])
def test_regret_zero_at_optimum_and_nonnegative(act, beta):
    space = act.enumerate_space(6, 4)
    r = act.hierarchical_reward(space, torch.tensor([3, 1, 0, 2, 2, 1]), act.level_weights(6))
    log_ref = act.uniform_log_ref(space.shape[0])
    assert abs(act.regret(act.tilted_log_policy(log_ref, r, beta), log_ref, r, beta)) < 1e-12
    j_opt = act.optimal_objective(log_ref, r, beta)
    g = torch.Generator().manual_seed(0)
    for scale in (0.1, 1.0, 10.0):
        logits = scale * torch.randn(space.shape[0], generator=g, dtype=torch.float64)
        log_pi = logits - torch.logsumexp(logits, 0)
        reg = act.regret(log_pi, log_ref, r, beta)
        assert reg > 0
        # the beta KL(pi || pi*) form equals the definition J(pi*) - J(pi)
        assert reg == pytest.approx(j_opt - act.objective(log_pi, log_ref, r, beta), rel=1e-9, abs=1e-12)
    # a mis-estimated critic gives positive regret; the exact one none
    noisy = r + 0.05 * torch.randn(r.shape, generator=g, dtype=torch.float64)
    assert act.regret(act.tilted_log_policy(log_ref, noisy, beta), log_ref, r, beta) > 0


def test_slope_of_a_power_law(act):
    ns = [64, 128, 256, 512]
    assert act.fitted_slope(ns, [3.0 * n ** -0.7 for n in ns]) == pytest.approx(-0.7)


def test_quick_mode_end_to_end(act, tmp_path, capsys):
    result = act.main(["--quick", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "actor_critic_theory_quick.json").read_text())
    assert (tmp_path / "actor_critic_theory_quick.png").stat().st_size > 0
    assert {"config", "slopes", "rows", "coverage_heuristic", "runtime_s"} <= set(data)
    cfg = data["config"]
    expected = 2 * len(cfg["betas"]) * len(cfg["log2_ns"]) * len(cfg["seeds"])
    assert len(data["rows"]) == expected
    for row in data["rows"]:
        assert {"arm", "beta", "n", "seed", "regret"} <= set(row)
        assert row["arm"] in ("onpolicy", "offline") and row["regret"] > 0
    assert set(data["slopes"]) == {f"slope_{a}_b{b:g}" for a in ("onpolicy", "offline") for b in cfg["betas"]}
    assert data["rows"] == result["rows"]
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("theory slope_onpolicy_b")
    assert all("=" in tok for tok in last.split()[1:])
