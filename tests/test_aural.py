"""AURAL-RL's concise-reasoning reward and mixed-quality group filter (methods/aural/reward.py)."""

import math

import pytest
import torch

from reasonrl.batch import RolloutBatch
from reasonrl.config import ConfigError
from reasonrl.registry import REWARDS, SELECTORS
from reasonrl.methods.aural.reward import (aural_reward, length_by_difficulty, mixed_quality, normalised_length,
                                    reasoning_steps)
from reasonrl.problem import Problem
from reasonrl.metrics_log import read_metrics
from reasonrl.train.trainer import Trainer

from helpers import mini_recipe

PROBLEM = Problem(prompt="(3+4)*5;", answer="35", meta={"form": "(a+b)*c"})


def test_normalised_length_by_hand():
    assert normalised_length(1, 64) == 0.0
    assert normalised_length(64, 64) == 1.0
    assert normalised_length(33, 64) == pytest.approx(32 / 63)
    assert normalised_length(0, 8) == 0.0  # a direct answer: clipped, not negative
    assert normalised_length(100, 64) == 1.0  # a run-on trace: clipped
    with pytest.raises(ValueError, match="l_max"):
        normalised_length(3, 1)


def test_reasoning_steps_count_segments_before_the_marker():
    assert reasoning_steps("3+4=7;7*5=35;####35") == 2
    assert reasoning_steps("####35") == 0
    assert reasoning_steps("3+4=7;7*5=35") == 2  # no marker: all of it is reasoning
    assert reasoning_steps(";;3+4=7;####7;9=9;") == 1  # empty segments and text after the marker do not count


def test_reward_by_hand():
    r = lambda text, **kw: aural_reward(text, PROBLEM, num_tokens=len(text), **{"l_max": 8, **kw})  # noqa: E731
    # Right, 2 steps: 1·[1 + 0.5·(1 − (2−1)/7)] = 1 + 0.5·6/7.
    assert r("3+4=7;7*5=35;####35") == pytest.approx(1 + 0.5 * 6 / 7)
    # Right with no steps: the whole bonus, 1.5; with 9 steps: ℓ clipped to 1, no bonus.
    assert r("####35") == pytest.approx(1.5)
    assert r("1+1=2;" * 9 + "####35") == pytest.approx(1.0)
    # Wrong: q = 0, so the shorter wrong answer earns no more than the longer one.
    assert r("####7") == 0.0 and r("3+4=7;####7") == 0.0 and r("3+4=7;7*5=36;####36") == 0.0
    # No end of reasoning (and so no answer): −α − β; the marker but no answer: −β.
    assert r("3+4=7;7*5=35") == pytest.approx(-0.12)
    assert r("3+4=7;####") == pytest.approx(-0.02)
    # Tokens as the length unit: L = num_tokens = 19, L_max = 32.
    assert aural_reward("3+4=7;7*5=35;####35", PROBLEM, num_tokens=19, unit="tokens", l_max=32) == \
        pytest.approx(1 + 0.5 * (1 - 18 / 31))
    # The paper's defaults: λ = 0.5, α = 0.10, β = 0.02, L_max = 64.
    assert aural_reward("junk", PROBLEM, num_tokens=4) == pytest.approx(-0.12)
    assert REWARDS.get("aural") is aural_reward


@pytest.mark.parametrize("params, key", [({"lam": -1.0}, "lam"), ({"l_max": 1}, "l_max"),
                                         ({"unit": "chars"}, "unit"), ({"lamda": 0.5}, "lamda")])
def test_bad_parameters_fail_at_load(params, key):
    with pytest.raises(ConfigError, match=key):
        mini_recipe(rewards=[{"name": "aural", **params}])


def _batch(quality, completions, answers, forms):
    n = len(quality)
    return RolloutBatch(
        prompt_ids=torch.ones(n, 2, dtype=torch.long), prompt_mask=torch.ones(n, 2, dtype=torch.long),
        completion_ids=torch.ones(n, 3, dtype=torch.long), completion_mask=torch.ones(n, 3, dtype=torch.long),
        group_ids=torch.arange(n) // 2, rewards=torch.tensor(quality, dtype=torch.float32),
        truncated=torch.zeros(n, dtype=torch.bool),
        meta={"reward/exact_answer": list(quality), "completion": completions, "answer": answers,
              "problem": [Problem(prompt="x", answer=a, meta={"form": f}) for a, f in zip(answers, forms)]})


def test_mixed_quality_keeps_only_groups_with_right_and_wrong_answers():
    batch = _batch([1.0, 0.0, 1.0, 1.0, 0.0, 0.0],
                   ["1+2=3;3*4=12;####12", "####7", "3+4=7;####7", "####7", "####1", "1+1=2;####5"],
                   ["12", "12", "7", "7", "130", "130"],
                   ["a+b*c", "a+b*c", "(a+b)*c", "(a+b)*c", "c*b+a", "c*b+a"])
    out, metrics = mixed_quality(batch)
    assert out.group_ids.tolist() == [0, 0]  # the all-right and the all-wrong group are dropped
    assert out.meta["completion"] == ["1+2=3;3*4=12;####12", "####7"]
    assert metrics["kept_fraction"] == pytest.approx(2 / 6)
    # Reasoning length per form over every sampled row, by hand.
    assert metrics["steps/a+b*c"] == pytest.approx(1.0) and metrics["steps/(a+b)*c"] == pytest.approx(0.5)
    assert metrics["chars/a+b*c"] == pytest.approx(len("1+2=3;3*4=12;") / 2)
    assert metrics["steps/c*b+a"] == pytest.approx(0.5)
    _, by_digits = mixed_quality(batch, difficulty="answer_digits")
    assert by_digits["steps/2digit"] == pytest.approx(1.0) and by_digits["steps/3digit"] == pytest.approx(0.5)
    # A graded quality with its own threshold: 0.7 > 0.6 counts as good, 0.5 does not.
    graded = _batch([0.7, 0.5, 0.7, 0.7], ["a", "b", "c", "d"], ["1", "1", "1", "1"], ["f"] * 4)
    kept, _ = mixed_quality(graded, threshold=0.6)
    assert kept.group_ids.tolist() == [0, 0]
    assert SELECTORS.get("mixed_quality") is mixed_quality


def test_mixed_quality_names_a_missing_quality_reward():
    batch = _batch([1.0, 0.0], ["####1", "####2"], ["1", "1"], ["f", "f"])
    with pytest.raises(ValueError, match="reward/format"):
        mixed_quality(batch, quality="format")


def test_length_by_difficulty_by_hand():
    got = length_by_difficulty(["1+1=2;2*3=6;####6", "####6", "9*9=81;####81"], ["easy", "easy", "hard"])
    assert got == {"steps/easy": 1.0, "chars/easy": 6.0, "steps/hard": 1.0, "chars/hard": 7.0}


def test_a_short_aural_run_logs_its_filter_and_lengths(tmp_path):
    # The shipped embedded model answers some problems right: an untrained one never does, so its
    # groups all agree, mixed_quality keeps none of them and no step trains (or logs train/rows).
    recipe = mini_recipe(
        model={"backend": "tiny", "tiny": {}},
        rewards=[{"name": "aural", "l_max": 8}, {"name": "exact_answer", "weight": 0.0}],
        selection=[{"name": "mixed_quality"}], train={"steps": 2, "prompts_per_step": 4, "checkpoint_every": 2,
                                                      "micro_batch_size": 8})
    Trainer(recipe, tmp_path / "run", log=lambda m: None).run()
    rows = [r for r in read_metrics(tmp_path / "run") if "reward/mean" in r]
    assert len(rows) == 2
    assert any("train/rows" in row for row in rows), "no step trained on any row"
    for row in rows:
        kept = row["selection/mixed_quality/kept_fraction"]
        assert 0.0 <= kept <= 1.0
        if "train/rows" in row:  # a step whose groups all agreed trains on nothing and logs no rows
            assert row["train/rows"] == pytest.approx(kept * 16)
        assert any(k.startswith("selection/mixed_quality/steps/") for k in row)
        # reward/aural is the weighted total's only part; exact_answer has weight 0.
        assert row["reward/mean"] == pytest.approx(row["reward/aural"], abs=1e-6)
        assert math.isfinite(row["reward/exact_answer"])
