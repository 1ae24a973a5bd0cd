"""The training evaluation callback (``eval.n``/``k``/``task``) and calibration in eval."""

import json

import pytest

from reasonrl.config import ConfigError
from reasonrl.evaluate.evaluator import Evaluator
from reasonrl.evaluate.sampling_eval import stated_confidence, summarise
from reasonrl.metrics_log import read_metrics
from reasonrl.train.trainer import Trainer, build_task

from helpers import mini_recipe


def test_sampled_metrics_are_logged_during_training_with_intervals_in_the_summary(tmp_path):
    recipe = mini_recipe(eval={"size": 6, "n": 4, "k": [2], "every": 2})
    summary = Trainer(recipe, tmp_path / "run", log=lambda _: None).run()
    rows = read_metrics(tmp_path / "run")
    evals = [r for r in rows if "eval/avg@4" in r]
    # before training, at step 2 (every 2; step 4 is the last: the final evaluation covers it), and at the end
    assert [r["step"] for r in evals] == [0, 2, 4]
    for row in evals:
        assert {"eval/accuracy", "eval/pass@2", "eval/maj@2", "eval/token_entropy", "eval/response_length",
                "eval/format_failure_rate", "eval/calibration/sequence/ece",
                "eval/calibration/consistency/brier"} <= set(row)
        assert "eval/pass@1" not in row  # k = [2] only
        assert 0.0 <= row["eval/avg@4"] <= row["eval/pass@2"] <= 1.0  # pass@k ≥ pass@1 = avg@n
    final = summary["final_eval"]
    low, high = summary["final_eval_ci"]["pass@2"]
    assert low <= final["pass@2"] <= high
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["final_eval_ci"]["accuracy"]


def test_eval_task_can_differ_from_the_training_task():
    recipe = mini_recipe(eval={"size": 5, "task": {"name": "arithmetic", "max_operand": 3}})
    evaluator = Evaluator(recipe, build_task(recipe))
    assert len(evaluator.problems) == 5
    assert evaluator.task is not build_task(recipe)
    for problem in evaluator.problems:
        numbers = [int(x) for x in problem.prompt.replace("(", " ").replace(")", " ").replace("+", " ")
                   .replace("*", " ").replace(";", " ").split()]
        assert max(numbers[:2] + numbers[3:]) <= 9  # operands ≤ 3, the multiplier c ≤ 9


@pytest.mark.parametrize("eval_section, message", [
    ({"n": 4, "k": [8]}, "eval.k must lie in 1..eval.n"),
    ({"task": {"name": "arithmetc"}}, "Did you mean 'arithmetic'"),
    ({"task": {"name": "arithmetic", "max_operandd": 3}}, "Did you mean 'max_operand'"),
])
def test_bad_eval_sections_fail_at_load_time(eval_section, message):
    with pytest.raises(ConfigError, match=message):
        mini_recipe(eval=eval_section)


def test_k_may_be_a_single_number():
    assert mini_recipe(eval={"n": 8, "k": 4}).eval.k == [4]


@pytest.mark.parametrize("text, expected", [
    ("answer 7. confidence: 0.8", 0.8),
    ("Confidence = 80%", 0.8),
    ("confidence 75", 0.75),  # a number above 1 is a percentage
    ("confidence: 0.2 ... confidence: 0.9", 0.9),  # the last statement wins
    ("no statement", None),
    ("confidence: 250%", None),  # outside [0, 1]
])
def test_stated_confidence(text, expected):
    assert stated_confidence(text) == (pytest.approx(expected) if expected is not None else None)


def _row(correct, votes, majority_correct, seq_conf, stated):
    n = len(correct)
    return {"n": n, "correct": sum(correct), "sample_correct": correct, "maj": {n: majority_correct},
            "majority_votes": votes, "majority_correct": majority_correct, "format_failures": 0,
            "tokens": 3 * n, "nll": 1.0, "sequence_confidence": seq_conf, "stated_confidence": stated}


def test_calibration_from_hand_built_rows():
    rows = [
        _row([True, True], votes=2, majority_correct=True, seq_conf=[0.9, 0.7], stated=[0.9, None]),
        _row([False, True], votes=1, majority_correct=False, seq_conf=[0.4, 0.6], stated=[None, None]),
    ]
    m = summarise(rows, [2])["metrics"]
    # consistency: confidences (2/2, 1/2) = (1.0, 0.5) for outcomes (1, 0)
    #   ECE = ½·|1 − 1| + ½·|0 − 0.5| = 0.25; Brier = (0² + 0.5²)/2 = 0.125; AUROC = 1; no wrong answer ≥ 0.8
    assert m["calibration/consistency/ece"] == pytest.approx(0.25)
    assert m["calibration/consistency/brier"] == pytest.approx(0.125)
    assert m["calibration/consistency/auroc"] == 1.0
    assert m["calibration/consistency/overconfidence"] == 0.0
    # sequence: (0.9, 0.7, 0.4, 0.6) for (1, 1, 0, 1): Brier = (0.01 + 0.09 + 0.16 + 0.16)/4 = 0.105
    #   AUROC: correct {0.9, 0.7, 0.6} all above the wrong 0.4 → 1
    assert m["calibration/sequence/brier"] == pytest.approx(0.105)
    assert m["calibration/sequence/auroc"] == 1.0
    # stated: one of four samples states a confidence (0.9, correct): Brier 0.01
    assert m["calibration/stated/rate"] == 0.25
    assert m["calibration/stated/brier"] == pytest.approx(0.01)
