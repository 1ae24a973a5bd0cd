"""BoT-GRPO's controls: ``grpo_dense`` (GRPO on the same dense reward, summed per response), the
recipes of the 2×2 comparison, and ``benchmarks/steps_to_threshold.py`` (first step at a held-out
accuracy, with intervals over seeds)."""

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from reasonrl.config import ConfigError, load_recipe
from reasonrl.methods.bot_grpo.advantage import bot_grpo, grpo_dense, sequence_dense_scores
from reasonrl.metrics_log import read_metrics
from reasonrl.registry import ADVANTAGES
from reasonrl.train.trainer import Trainer

from helpers import mini_recipe

ROOT = Path(__file__).resolve().parents[1]


def close(actual, expected, atol=1e-5):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


# The worked case of test_bot_grpo.test_dense_rewards_with_outcome_and_terminator: BoT's token
# rewards are r = [2, 2, 2] (right, finished) and [1, 0, 0] (wrong, finished) for rows 0, 1 (one
# group), and row 2 is a singleton group.
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 0, 0]])
OUTCOME = torch.tensor([[0, 0, 1.0, 0], [0, 0, 0, 0], [0.25, 0.25, 0, 0]])
DENSE = torch.tensor([[1.0, 1.0, 0, 0], [1.0, 0, 0, 0], [0, 1.0, 0, 0]])
BATCH = SimpleNamespace(dense_rewards=DENSE, truncated=torch.tensor([False, False, True]))
GROUPS = torch.tensor([0, 0, 3])


def test_grpo_dense_by_hand_sum_and_mean():
    # sum: s = 6, 1 → mean 3.5; population std 2.5 → A = ±1; unbiased std √12.5 → A = ±2.5/√12.5.
    adv = grpo_dense(OUTCOME, MASK, GROUPS, batch=BATCH, std="population")
    close(adv, [[1, 1, 1, 0], [-1, -1, -1, 0], [0, 0, 0, 0]])
    adv = grpo_dense(OUTCOME, MASK, GROUPS, batch=BATCH)  # default std: unbiased, as `grpo`
    a = 2.5 / (math.sqrt(12.5) + 1e-6)
    close(adv, [[a, a, a, 0], [-a, -a, -a, 0], [0, 0, 0, 0]])
    # mean: s = 2, 1/3 → mean 7/6, population std 5/6 → A = ±1 again (two responses).
    adv = grpo_dense(OUTCOME, MASK, GROUPS, batch=BATCH, reduce="mean", std="population")
    close(adv, [[1, 1, 1, 0], [-1, -1, -1, 0], [0, 0, 0, 0]])
    # Every token of a response gets one value, unlike bot_grpo's per-token credit on the same rewards.
    bot = bot_grpo(OUTCOME, MASK, GROUPS, batch=BATCH)
    assert not torch.allclose(bot[1, :3], bot[1, :1].expand(3))
    assert ADVANTAGES.get("grpo_dense") is grpo_dense


def test_sequence_dense_scores_by_hand():
    r = torch.tensor([[2.0, 2.0, 2.0, 99.0], [1.0, 0.0, 0.0, 99.0], [5.0, 99.0, 99.0, 99.0], [9.0, 9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    close(sequence_dense_scores(r, mask, "sum"), [6.0, 1.0, 5.0, 0.0])
    close(sequence_dense_scores(r, mask, "mean"), [2.0, 1 / 3, 5.0, 0.0])
    with pytest.raises(ValueError, match="reduction"):
        sequence_dense_scores(r, mask, "max")


def test_grpo_dense_with_a_per_response_constant_reward_is_bot_grpo():
    # Dense rewards constant along each response (ragged lengths, several groups): with reduce mean
    # and the same std, the sequence-level control and the token-level method coincide; they can
    # only differ where the reward varies inside a response.
    gen = torch.Generator().manual_seed(1)
    lengths = torch.randint(1, 7, (10,), generator=gen)
    mask = (torch.arange(6)[None, :] < lengths[:, None]).long()
    per_row = torch.randint(0, 4, (10,), generator=gen).float()
    dense = per_row[:, None] * mask
    outcome = torch.zeros(10, 6)
    batch = SimpleNamespace(dense_rewards=dense, truncated=torch.ones(10, dtype=torch.bool))  # no terminator rule
    groups = torch.tensor([0] * 4 + [1] * 3 + [2] * 3)
    for std in ("population", "unbiased"):
        control = grpo_dense(outcome, mask, groups, batch=batch, reduce="mean", std=std)
        torch.testing.assert_close(control, bot_grpo(outcome, mask, groups, batch=batch, std=std))
        assert control.abs().sum() > 0
    # With reduce sum and equal lengths the scores are T·r̄: the same advantages again (scale-free).
    same = torch.ones(10, 6, dtype=torch.long)
    torch.testing.assert_close(
        grpo_dense(outcome, same, groups, batch=SimpleNamespace(dense_rewards=per_row[:, None] * same,
                                                                  truncated=batch.truncated)),
        ADVANTAGES.get("grpo")(per_row[:, None] * same / 6, same, groups), atol=1e-5, rtol=1e-5)


def test_grpo_dense_needs_dense_rewards_and_names_bad_parameters():
    m = torch.ones(2, 2)
    g = torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match="needs dense rewards: add a token_reward"):
        grpo_dense(m, m, g, batch=SimpleNamespace(dense_rewards=None, truncated=None))
    with pytest.raises(ValueError, match="advantage.reduce"):
        grpo_dense(m, m, g, batch=BATCH, reduce="max")
    with pytest.raises(ValueError, match="advantage.std"):
        grpo_dense(m, m, g, batch=BATCH, std="bessel")
    with pytest.raises(ValueError, match="advantage.eps"):
        grpo_dense(m, m, g, batch=BATCH, eps=-1.0)
    with pytest.raises(ConfigError, match="grpo_dense' sums a token-level reward"):
        mini_recipe(advantage={"name": "grpo_dense"})


def test_the_four_recipes_differ_only_where_the_comparison_says():
    def load(name, *sets):
        return load_recipe(ROOT / "recipes" / name, list(sets)).to_dict()

    grpo = load("grpo.yaml", "eval.every=5")
    bot = load("bot_grpo.yaml")
    outcome = load("bot_grpo_outcome.yaml")
    dense = load("grpo_dense_sum.yaml")
    assert bot["eval"] == grpo["eval"] and bot["eval"]["every"] == 5  # the same, fine evaluation points

    def diff(a, b):
        return {k for k in set(a) | set(b) if a.get(k) != b.get(k)}

    assert diff(bot, grpo) == {"advantage", "token_reward"}
    assert diff(outcome, grpo) == {"advantage"}          # the advantage alone
    assert diff(bot, outcome) == {"token_reward"}        # the dense reward alone
    assert diff(dense, grpo) == {"advantage", "token_reward"}
    assert diff(bot, dense) == {"advantage"}             # the credit alone: per token vs per response
    assert dense["advantage"] == {"name": "grpo_dense", "reduce": "sum", "std": "population", "eps": 1e-6,
                                  "outcome_weight": 1.0}
    assert {k: v for k, v in dense["advantage"].items() if k not in ("name", "reduce")} == \
        {k: v for k, v in bot["advantage"].items() if k != "name"}


def test_short_training_run_of_the_dense_grpo_control(tmp_path):
    recipe = mini_recipe(token_reward={"name": "arithmetic_steps"}, advantage={"name": "grpo_dense"},
                         train={"steps": 2, "checkpoint_every": 2}, eval={"size": 0})
    summary = Trainer(recipe, tmp_path / "run", log=lambda m: None).run()
    assert summary["steps"] == 2
    rows = [r for r in read_metrics(tmp_path / "run") if "loss" in r]
    assert len(rows) == 2 and all(math.isfinite(r["loss"]) for r in rows)


# --------------------------------------------------------------------------- steps to a threshold

def _tool():
    spec = importlib.util.spec_from_file_location("steps_to_threshold", ROOT / "benchmarks" / "steps_to_threshold.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_first_step_reaching_with_and_without_sustain():
    tool = _tool()
    points = [(0, 0.52), (5, 0.70), (10, 0.81), (15, 0.79), (20, 0.80), (25, 0.85), (30, 0.82)]
    assert tool.first_step_reaching(points, 0.8) == 10
    assert tool.first_step_reaching(points, 0.8, sustain=2) == 20  # 10 is followed by 0.79
    assert tool.first_step_reaching(points, 0.8, sustain=3) == 20
    assert tool.first_step_reaching(points, 0.8, sustain=4) is None
    assert tool.first_step_reaching(points, 0.9) is None
    assert tool.first_step_reaching(points, 0.5) == 0  # the base evaluation counts
    with pytest.raises(ValueError, match="sustain"):
        tool.first_step_reaching(points, 0.8, sustain=0)
    # The final evaluation is written as a second row at the last step: the last one wins.
    rows = [{"step": 0, "eval/accuracy": 0.5}, {"step": 5, "loss": 1.0}, {"step": 10, "eval/accuracy": 0.7},
            {"step": 10, "eval/accuracy": 0.9}, {"step": 15, "eval/accuracy": float("nan")}]
    assert tool.evaluations(rows) == [(0, 0.5), (10, 0.9)]


def test_t_quantile_and_intervals_by_hand():
    tool = _tool()
    # scipy.stats.t.ppf(0.975, df) for df = 1, 2, 4 and 0.95 at df 10.
    for p, df, expected in ((0.975, 1, 12.706204736174707), (0.975, 2, 4.302652729749464),
                            (0.975, 4, 2.7764451051977934), (0.95, 10, 1.8124611228107335)):
        assert tool.t_quantile(p, df) == pytest.approx(expected, rel=1e-9)
    # Steps 150, 175, 75: mean 133.33, Σ(x − mean)² = 16250/3, sd = 52.04; half width 4.3027 · 52.04/√3 = 129.3.
    mean, sd, low, high = tool.mean_interval([150.0, 175.0, 75.0])
    assert mean == pytest.approx(400 / 3) and sd == pytest.approx(math.sqrt(16250 / 3 / 2), rel=1e-9)  # 52.04
    assert high - mean == pytest.approx(4.302652729749464 * 52.0416 / math.sqrt(3), rel=1e-4)
    assert math.isnan(tool.mean_interval([5.0])[2])
    # Welch: a = 150, 175, 75 against b = 200, 200, 200 (no spread): se² = s_a²/3, df = 2.
    diff, low, high, p = tool.welch_interval([150.0, 175.0, 75.0], [200.0, 200.0, 200.0])
    half = 4.302652729749464 * 52.0416 / math.sqrt(3)
    assert diff == pytest.approx(-200 / 3) and low == pytest.approx(diff - half, rel=1e-4)
    assert high == pytest.approx(diff + half, rel=1e-4) and 0 < p < 1


def _fake_run(path: Path, curve: dict[int, float]) -> None:
    path.mkdir(parents=True)
    lines = [json.dumps({"step": s, "eval/accuracy": v}) for s, v in curve.items()]
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_the_command_groups_seeds_and_compares_with_the_baseline(tmp_path, capsys):
    tool = _tool()
    curves = {"grpo-s1": {0: 0.5, 100: 0.7, 200: 0.8, 400: 0.85}, "grpo-s2": {0: 0.5, 100: 0.78, 300: 0.81, 400: 0.9},
              "grpo-s3": {0: 0.5, 200: 0.7, 400: 0.75},  # never: censored at 400
              "bot_grpo-s1": {0: 0.5, 50: 0.8, 400: 0.9}, "bot_grpo-s2": {0: 0.5, 100: 0.85, 400: 0.9},
              "bot_grpo-s3": {0: 0.5, 150: 0.81, 400: 0.9}}
    for name, curve in curves.items():
        _fake_run(tmp_path / name, curve)
    out = tmp_path / "steps.json"
    runs = [str(tmp_path / n) for n in curves]
    assert tool.main([*runs, "--baseline", "grpo", "--threshold", "0.8", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| grpo | 200 / 300 / never |" in printed and "| bot_grpo | 50 / 100 / 150 |" in printed
    assert "Censored" in printed and "grpo 1 of 3" in printed
    rows = {r["arm"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["grpo"]["censored"] == 1 and rows["grpo"]["mean"] == pytest.approx(300.0)  # 200, 300, 400
    bot = rows["bot_grpo"]
    assert bot["mean"] == pytest.approx(100.0) and bot["diff"] == pytest.approx(-200.0)
    assert bot["welch_low"] < bot["diff"] < bot["welch_high"] and bot["boot_low"] <= bot["diff"] <= bot["boot_high"]
    # Seeds only: the bootstrap's extreme resamples are all-min vs all-max: [50 − 400, 150 − 200].
    assert -350.0 <= bot["boot_low"] and bot["boot_high"] <= -50.0
    assert tool.main([*runs, "--baseline", "dapo"]) == 2
    assert "not an arm" in capsys.readouterr().err
