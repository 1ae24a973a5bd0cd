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

from helpers import mini_recipe, recipe_diff

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


# -- recipes/aural_smollm2.yaml: the real-model arm against the multistep GRPO baseline -------------------

def test_the_smollm2_arm_differs_from_the_multistep_grpo_baseline_in_the_method_alone():
    from reasonrl.recipe import load_recipe

    assert recipe_diff("aural_smollm2", "smollm2_multistep") == {"rewards", "selection"}
    arm, base = load_recipe("recipes/aural_smollm2.yaml"), load_recipe("recipes/smollm2_multistep.yaml")
    assert [(r.name, r.weight, r.params) for r in base.rewards] == [("reasoning_gym", 1.0, {})]
    assert base.selection == []
    # The method's reward carries the weight; the baseline's reward, unchanged, is its q and only gates.
    assert [(r.name, r.weight) for r in arm.rewards] == [("aural", 1.0), ("reasoning_gym", 0.0)]
    assert arm.rewards[0].params == {"lam": 0.5, "alpha": 0.10, "beta": 0.02, "l_max": 3, "unit": "steps",
                                     "marker": "<answer>", "separator": ",", "quality": "reasoning_gym"}
    assert arm.rewards[1].params == {}
    assert [(s.name, s.params) for s in arm.selection] == [
        ("mixed_quality", {"quality": "reasoning_gym", "threshold": 0.99, "difficulty": "answer_digits",
                           "marker": "<answer>", "separator": ","})]


def _multistep_problem(question: str, answer: str) -> Problem:
    """A problem as recipes/aural_smollm2.yaml's reasoning_gym task makes it (the reward reads the meta)."""
    from reasonrl.recipe import load_recipe

    task = load_recipe("recipes/aural_smollm2.yaml").task.params
    kwargs = {**task["config"], "seed": 0, "size": task["size"] + task["eval_size"]}
    return Problem(prompt=f"Question: {question}\nAnswer:", answer=answer,
                   meta={"rg_dataset": "basic_arithmetic", "rg_kwargs": kwargs,
                         "entry": {"question": question, "answer": answer, "metadata": {}}})


# The multistep format (the 2-shot prompt of recipes/smollm2_multistep.yaml), for "Calculate 7 + 4 - 2." = 9:
RIGHT = " 7 + 4 = 11, 11 - 2 = 9. <answer>9</answer>"       # L = 2, q = 1
ONE_STEP = " 7 + 4 - 2 = 9. <answer>9</answer>"               # L = 1, q = 1
WRONG = " 7 + 4 = 11, 11 - 2 = 10. <answer>10</answer>"     # L = 2, q = 0
NO_ANSWER = " 7 + 4 = 11, 11 - 2 = 9."                        # L = 2, q = 0, no <answer>: −α − β
EMPTY_TAG = " 7 + 4 = 11, 11 - 2 = 9. <answer></answer>"      # L = 2, q = 0, the tag but no number: −β


def _recipe_aural():
    from reasonrl.recipe import load_recipe

    return load_recipe("recipes/aural_smollm2.yaml").rewards[0].params


def test_the_smollm2_recipe_counts_worked_steps_and_judges_by_reasoning_gym():
    pytest.importorskip("reasoning_gym")
    params = _recipe_aural()
    steps = lambda text: reasoning_steps(text, params["marker"], params["separator"])  # noqa: E731
    assert [steps(t) for t in (RIGHT, ONE_STEP, WRONG, NO_ANSWER, EMPTY_TAG)] == [2, 1, 2, 2, 2]
    assert steps(" <answer>9</answer>") == 0
    # The few-shot answers of the prompt itself: two worked steps each.
    assert steps(" 12 + 7 = 19, 19 - 5 = 14. <answer>14</answer>") == 2
    assert steps(" 9 - 40 = -31, -31 + 3 = -28. <answer>-28</answer>") == 2
    # q as the baseline judges it: reasoning_gym's score (partial credit for an answer containing the right one).
    q = REWARDS.get("reasoning_gym")
    problem = _multistep_problem("Calculate 7 + 4 - 2.", "9")
    assert [q(t, problem) for t in (RIGHT, ONE_STEP, WRONG, NO_ANSWER, EMPTY_TAG)] == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert q(" 7 + 4 = 11, 11 - 2 = -9. <answer>-9</answer>", problem) == 0.5  # below the filter's 0.99
    # The penalties of the recipe's params, which do not depend on q: no tag −α − β, a tag with no number −β.
    r = lambda text: aural_reward(text, problem, num_tokens=0, **params)  # noqa: E731
    assert r(WRONG) == 0.0
    assert r(NO_ANSWER) == pytest.approx(-0.12)
    assert r(EMPTY_TAG) == pytest.approx(-0.02)


def test_the_smollm2_recipe_rewards_right_answers_by_hand():
    pytest.importorskip("reasoning_gym")
    params = _recipe_aural()
    problem = _multistep_problem("Calculate 7 + 4 - 2.", "9")
    r = lambda text: aural_reward(text, problem, num_tokens=0, **params)  # noqa: E731
    # L_max = 3, λ = 0.5: ℓ(2) = 1/2 → 1 + 0.5·(1 − 1/2) = 1.25; ℓ(1) = 0 → 1.5; ℓ(0) clipped to 0 → 1.5.
    assert r(RIGHT) == pytest.approx(1.25)
    assert r(ONE_STEP) == pytest.approx(1.5)
    assert r(" <answer>9</answer>") == pytest.approx(1.5)
    # Three steps: ℓ(3) = 1, no bonus.
    assert r(" 7 + 4 = 11, 11 - 2 = 9, 9 = 9. <answer>9</answer>") == pytest.approx(1.0)


def test_quality_names_a_registered_reward_other_than_aural():
    problem = _multistep_problem("Calculate 7 + 4 - 2.", "9")
    for bad in ("no_such_reward", "aural"):
        with pytest.raises(ValueError, match=f"quality '{bad}' is not a registered reward"):
            aural_reward(RIGHT, problem, num_tokens=0, quality=bad)


def test_mixed_quality_reads_steps_with_the_recipes_marker_and_separator():
    # The recipe's selection gives the reward's marker and separator, so its steps/<bucket> count the
    # worked steps (2, 1, 2, 2 here) instead of the whole text as one '####'-less step.
    from reasonrl.recipe import load_recipe

    sel = load_recipe("recipes/aural_smollm2.yaml").selection[0].params
    batch = _batch([1.0, 1.0, 0.0, 0.0], [RIGHT, ONE_STEP, WRONG, NO_ANSWER], ["9", "9", "9", "9"], ["f"] * 4)
    _, metrics = mixed_quality(batch, **sel | {"quality": "exact_answer"})
    assert metrics["steps/1digit"] == pytest.approx((2 + 1 + 2 + 2) / 4)
    assert metrics["chars/1digit"] == pytest.approx(sum(len(t.split("<answer>")[0]) for t in
                                                        (RIGHT, ONE_STEP, WRONG, NO_ANSWER)) / 4)
    _, default = mixed_quality(batch)
    assert default["steps/f"] == 1.0  # by form; no ';' and no '####': each text is one step
