"""RL-ARC: span split, confidences, the regulariser and penalty by hand, the method's reward
adjustment, the evaluation's answer-confidence family, a short run and its exact resume."""

import math

import pytest
import torch

from reasonrl.evaluate.answer_spans import Spans, answer_confidences, span_confidences, split_spans
from reasonrl.methods.rl_arc.maths import arc_adjustment, arc_reward
from reasonrl.batch import RolloutBatch
from reasonrl.config import ConfigError
from reasonrl.evaluate.sampling_eval import summarise
from reasonrl.hooks import MethodContext
from reasonrl.methods.rl_arc.method import RLARC

from helpers import mini_policy, mini_recipe, recipe_diff, scripted_samples, straight_and_resumed

LN = math.log


# -- spans -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, reasoning, answer", [
    ("3+4=7;7*5=35;####35", (0, 13), (17, 19)),          # the embedded task: the number after ####
    ("1+1=2;####2;####-12", (0, 12), (16, 19)),          # the last marker, a negative number
    ("a ####  1,234 b", (0, 2), (8, 13)),                 # spaces after the marker are neither
    ("x=2, so \\boxed{\\frac{1}{2}} ok", (0, 8), (15, 26)),  # balanced braces, the boxed content
    ("<think>2+2=4</think> ####4", (7, 12), (25, 26)),    # reasoning: the think block's content only
    ("####abc", (0, 0), (4, 7)),                          # no number: the rest of the line
    ("1+1=2;####", (0, 10), None),                        # a marker with nothing after it: no answer
    ("1+1=2;", (0, 6), None),
    ("\\boxed{12", (0, 9), None),                         # unclosed box, no marker: no answer
    # answer tags (reasoning-gym): the stripped content of the last pair; the tags are neither
    ("7 + 4 = 11, 11 - 2 = 9. <answer>9</answer>", (0, 24), (32, 33)),
    ("<answer>1</answer> no, <answer> -28 </answer>", (0, 23), (32, 35)),
    ("<think>9-4=5</think><answer>5</answer>", (7, 12), (28, 29)),
    ("x <answer> </answer> ####3", (0, 21), (25, 26)),     # empty tags: the marker's number
    ("x <answer>3", (0, 11), None),                        # unclosed tag: no answer
])
def test_split_spans(text, reasoning, answer):
    assert split_spans(text) == Spans(reasoning, answer)


def test_a_task_may_split_its_own_spans():
    class Task:
        def answer_spans(self, text):
            return Spans((0, 1), (2, 3))

    assert split_spans("1;####2", Task()) == Spans((0, 1), (2, 3))


# -- confidences on hand-built rows ------------------------------------------------------------------

def _row_logprobs(tok, text, reasoning, marker, answer, eos, width):
    """Token ids and log-probs of ``text`` + EOS, with the given log-prob per part of the text."""
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    mark = text.find("####")
    lp = []
    for k in range(len(text)):
        if mark < 0 or k < mark:
            lp.append(reasoning[k] if isinstance(reasoning, list) else reasoning)
        elif k < mark + 4:
            lp.append(marker)
        else:
            lp.append(answer[k - mark - 4] if isinstance(answer, list) else answer)
    lp.append(eos)
    pad = width - len(ids)
    return ids + [tok.pad_token_id] * pad, [1] * len(ids) + [0] * pad, lp + [float("nan")] * pad


def test_confidences_are_geometric_means_over_each_span():
    tok = mini_policy().tokenizer
    rows = [
        # reasoning "1+2=3;" at (½, ½, 1, 1, ¼, 1): c_r = (½·½·¼)^(1/6) = ½^(4/6); answer "3" at 0.9
        _row_logprobs(tok, "1+2=3;####3", [LN(.5), LN(.5), 0.0, 0.0, LN(.25), 0.0], LN(.1), LN(.9), LN(.01), 14),
        # a two-token answer "12" at (0.8, 0.5): c_a = √0.4; the marker and EOS never count
        _row_logprobs(tok, "1+2=3;####12", LN(.7), LN(.1), [LN(.8), LN(.5)], LN(.01), 14),
        # no answer: both spans empty of answers; reasoning is the whole text
        _row_logprobs(tok, "1+2", LN(.5), 0.0, 0.0, LN(.01), 14),
    ]
    ids, mask, lp = (torch.tensor([r[k] for r in rows]) for k in range(3))
    c_a, has_a, c_r, has_r = span_confidences(tok, ids, mask, lp)
    assert has_a.tolist() == [True, True, False] and has_r.tolist() == [True, True, True]
    assert c_a[0] == pytest.approx(0.9) and c_a[1] == pytest.approx(math.sqrt(0.4)) and c_a[2] == 0.0
    assert c_r[0] == pytest.approx(0.5 ** (4 / 6)) and c_r[1] == pytest.approx(0.7) and c_r[2] == pytest.approx(0.5)
    assert answer_confidences(tok, ids, mask, lp) == [pytest.approx(0.9, abs=1e-6),
                                                      pytest.approx(math.sqrt(0.4), abs=1e-6), None]


# -- the reward ----------------------------------------------------------------------------------------

def test_regulariser_and_penalty_by_hand():
    correct = torch.tensor([True, True, False, False])
    c_a = torch.tensor([0.9, 0.4, 0.8, 0.3])
    c_r = torch.tensor([0.6, 0.6, 0.9, 0.1])
    # correct: 1 − λ1 (c_a − c_r)_+ − λ2 ((c_a − c_r)_−)²; wrong: −λ3 c_a²
    r = arc_reward(correct, c_a, c_r, lambda1=0.5, lambda2=1.0, lambda3=0.5)
    assert r.tolist() == pytest.approx([1 - 0.5 * 0.3, 1 - 1.0 * 0.2 ** 2, -0.5 * 0.64, -0.5 * 0.09])
    # the spec's defaults (λ2 = 0): an under-confident correct answer is not penalised
    assert arc_reward(correct, c_a, c_r)[1] == pytest.approx(1.0)
    assert arc_reward(correct, c_a, c_r, regulariser="abs").tolist()[:2] == pytest.approx([0.85, 0.9])
    assert arc_reward(correct, c_a, c_r, lambda3=1.0, penalty="linear").tolist()[2:] == pytest.approx([-0.8, -0.3])
    assert arc_reward(correct, c_a, c_r, penalty="max_brier").tolist()[2:] == pytest.approx([-0.405, -0.045])
    # what the method adds to a 0/1 correctness reward: r − R
    assert arc_adjustment(correct, c_a, c_r).tolist() == pytest.approx([-0.15, 0.0, -0.32, -0.045])


# -- the method ------------------------------------------------------------------------------------------

ROWS = [  # text, correct, (reasoning, marker, answer, eos) log-probs
    ("1+2=3;####3", 1.0, ([LN(.5), LN(.5), 0.0, 0.0, LN(.25), 0.0], LN(.1), LN(.9), LN(.01))),
    ("1+2=4;####4", 0.0, ([LN(.5), LN(.5), 0.0, 0.0, LN(.25), 0.0], LN(.1), LN(.8), LN(.01))),
    ("1+2", 0.0, (LN(.5), 0.0, 0.0, 0.0)),   # no answer: c_a = c_r = the sequence's ½^(3/4)
    ("####3", 1.0, (0.0, LN(.2), LN(.6), 0.0)),  # no reasoning: c_r = c_a, no regulariser
]


def _batch(policy, texts=None):
    tok = policy.tokenizer
    rows = [_row_logprobs(tok, text, *lps, width=14) for text, _, lps in ROWS]
    ids, mask, lp = (torch.tensor([r[k] for r in rows]) for k in range(3))
    prompt_ids, prompt_mask = policy.encode_prompts(["1+2;"] * len(ROWS))
    correct = [c for _, c, _ in ROWS]
    return RolloutBatch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=ids, completion_mask=mask,
                        group_ids=torch.zeros(len(ROWS), dtype=torch.long), rewards=torch.tensor(correct),
                        truncated=torch.zeros(len(ROWS), dtype=torch.bool), sample_logprobs=lp.float(),
                        meta={"completion": texts or [t for t, _, _ in ROWS], "reward/exact_answer": correct})


def _method(policy, **params):
    method = RLARC(**params)
    method.setup(MethodContext(recipe=None, policy=policy, run_dir=None, log=print))
    return method


def test_annotate_adds_r_minus_R_to_the_rewards():
    policy = mini_policy()
    batch = _batch(policy)
    metrics = _method(policy, no_answer="sequence").annotate(batch, 0)
    c_r = 0.5 ** (4 / 6)
    expected = [1 - 0.5 * (0.9 - c_r), -0.5 * 0.8 ** 2, -0.5 * (0.5 ** 0.75) ** 2, 1.0]
    assert batch.rewards.tolist() == pytest.approx(expected)
    assert metrics["rl_arc/no_answer"] == 0.25 and metrics["rl_arc/no_reasoning"] == 0.25
    assert metrics["rl_arc/c_answer_correct"] == pytest.approx((0.9 + 0.6) / 2)
    assert metrics["rl_arc/c_answer_wrong"] == pytest.approx((0.8 + 0.5 ** 0.75) / 2)
    # c_a = (0.9, 0.8, 0.595, 0.6) for (1, 0, 0, 1): the correct 0.9 beats both wrong, 0.6 beats one: ¾
    assert metrics["rl_arc/auroc"] == pytest.approx(0.75)
    assert metrics["rl_arc/brier"] == pytest.approx((0.01 + 0.64 + 0.5 ** 1.5 + 0.16) / 4)
    # The default: a row without an answer is taken as certain, so it gets the full penalty and an
    # unconfident non-answer (0.5 ** 0.75 here) can never beat a confident wrong answer.
    batch = _batch(policy)
    metrics = _method(policy).annotate(batch, 0)
    assert batch.rewards.tolist() == pytest.approx([expected[0], expected[1], -0.5, 1.0])
    assert metrics["rl_arc/c_answer_wrong"] == pytest.approx((0.8 + 1.0) / 2)


def test_stated_confidence_replaces_the_answer_tokens_and_a_missing_one_counts_as_certain():
    policy = mini_policy()
    texts = ["1+2=3;####3", "1+2=4;####4 confidence: 0.3", "1+2", "####3"]
    batch = _batch(policy, texts)
    metrics = _method(policy, answer_confidence="stated").annotate(batch, 0)
    c_r = 0.5 ** (4 / 6)
    # row 1 states 0.3; the others state none → c_a = 1 (row 4 has no reasoning: c_r = c_a, no term)
    assert batch.rewards.tolist() == pytest.approx([1 - 0.5 * (1 - c_r), -0.5 * 0.09, -0.5, 1.0])
    assert metrics["rl_arc/stated_rate"] == 0.25
    batch = _batch(policy, texts)
    _method(policy, answer_confidence="stated_or_tokens").annotate(batch, 0)
    # the row without an answer (row 3) is certain whatever its tokens say
    assert batch.rewards.tolist() == pytest.approx([1 - 0.5 * (0.9 - c_r), -0.045, -0.5, 1.0])


def test_bad_parameters_and_a_missing_correctness_reward_fail_at_load():
    with pytest.raises(ConfigError, match="lambda3 must be >= 0"):
        mini_recipe(methods=[{"name": "rl_arc", "lambda3": -1.0}])
    with pytest.raises(ConfigError, match="penalty' must be one of brier, linear, max_brier"):
        mini_recipe(methods=[{"name": "rl_arc", "penalty": "squared"}])
    with pytest.raises(ConfigError, match="correct_reward 'math_verify'"):
        mini_recipe(methods=[{"name": "rl_arc", "correct_reward": "math_verify"}])


# -- evaluation ---------------------------------------------------------------------------------------------

def test_answer_confidence_is_a_calibration_family_of_the_evaluation():
    def row(correct, answer_conf):
        n = len(correct)
        return {"n": n, "correct": sum(correct), "sample_correct": correct, "maj": {n: correct[0]},
                "majority_votes": 1, "majority_correct": correct[0], "format_failures": 0, "tokens": n,
                "nll": 1.0, "sequence_confidence": [0.5] * n, "stated_confidence": [None] * n,
                "answer_confidence": answer_conf}

    m = summarise([row([True, False], [0.9, 0.6]), row([False, True], [None, 0.7])], [2])["metrics"]
    # three of four samples have an answer: (0.9, 0.6, 0.7) for (1, 0, 1)
    assert m["calibration/answer/rate"] == 0.75
    assert m["calibration/answer/brier"] == pytest.approx((0.01 + 0.36 + 0.09) / 3)
    assert m["calibration/answer/auroc"] == 1.0
    # rows saved before the family existed still summarise
    old = row([True, False], [0.9, 0.6])
    del old["answer_confidence"]
    assert "calibration/answer/rate" not in summarise([old], [2])["metrics"]


# -- runs ----------------------------------------------------------------------------------------------------

def test_short_run_logs_the_confidences_and_resumes_exactly(tmp_path, monkeypatch):
    recipe = mini_recipe(methods=[{"name": "rl_arc", "lambda3": 1.0}], eval={"size": 4, "n": 2},
                         train={"steps": 3, "checkpoint_every": 1})
    rows = straight_and_resumed(recipe, tmp_path, monkeypatch)
    steps = [r for r in rows if "rl_arc/c_answer" in r]
    assert len(steps) == 3
    for r in steps:
        assert 0.0 <= r["rl_arc/c_answer"] <= 1.0 and 0.0 <= r["rl_arc/c_reasoning"] <= 1.0
        assert r["rl_arc/adjustment"] <= 0.0  # both terms only ever take away
    evals = [r for r in rows if "eval/avg@2" in r]
    assert evals, "eval/avg@2 was never logged"
    assert all("eval/calibration/sequence/ece" in r for r in evals)


def test_evaluation_reads_the_answer_confidence_of_each_sample(monkeypatch):
    """Sampling scripted: every token at log-prob −½, so a sample with an answer has c_a = e^−½;
    one without (no ####) has none."""
    from reasonrl.evaluate import sampling_eval
    from reasonrl.tasks.arithmetic import ArithmeticTask

    policy = mini_policy()
    tok = policy.tokenizer
    texts = ["3+4=7;####7", "3+4=7;"]

    def scripted(sampler, problems, n, *args, **kwargs):
        rows = [tok(texts[i % 2], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
                for _ in problems for i in range(n)]
        ids, mask = policy.encode_prompts([p.prompt for p in problems for _ in range(n)])
        return scripted_samples(ids, mask, rows, tok)

    monkeypatch.setattr(sampling_eval, "sample_problems", scripted)
    problems = ArithmeticTask().eval_problems(3)
    out = sampling_eval.evaluate_sampling(policy, problems, is_correct=lambda t, p: "####" in t,
                                          extract=lambda t, p: t.split("####")[-1] if "####" in t else None,
                                          n=2, ks=[1], max_new_tokens=8, greedy=False)
    assert [r["answer_confidence"] for r in out["per_problem"]] == [[pytest.approx(math.exp(-0.5)), None]] * 3
    m = out["metrics"]
    assert m["calibration/answer/rate"] == 0.5
    # only correct samples have an answer here: Brier = (1 − e^−½)²
    assert m["calibration/answer/brier"] == pytest.approx((1 - math.exp(-0.5)) ** 2, abs=1e-5)


# -- recipes: the method isolated from the advantage scaling -------------------------------------------------

@pytest.mark.parametrize("arm, baseline", [("rl_arc", "rl_arc_scale_only"),
                                           ("rl_arc_gym_smollm2", "rl_arc_gym_smollm2_scale_only")])
def test_each_rl_arc_arm_differs_from_its_baseline_in_the_method_alone(arm, baseline):
    from reasonrl.recipe import load_recipe

    assert recipe_diff(arm, baseline) == {"methods"}
    r = load_recipe(f"recipes/{baseline}.yaml")
    assert r.methods == [] and r.advantage.params["scale"] == "none" and r.eval.n == 8
    # each arm's scaling change against its GRPO recipe is what the scale-only arm carries (plus eval.n for calibration)
    grpo = {"rl_arc": "grpo", "rl_arc_gym_smollm2": "smollm2_grpo"}[arm]
    assert recipe_diff(grpo, baseline) == {"advantage.scale", "eval.n"}


def test_the_gym_prompt_answers_where_the_span_split_and_the_reward_both_read():
    """The few-shot answers of recipes/rl_arc_gym_smollm2.yaml (" <answer>19</answer>") must be read
    as the answer span by RL-ARC and as the answer by the reasoning_gym reward, or the method would
    take every row for a non-answer (c_a = 1)."""
    from reasonrl.recipe import load_recipe
    from reasonrl.rewards.reasoning_gym import extract_answer

    template = load_recipe("recipes/rl_arc_gym_smollm2.yaml").task.params["template"]
    assert template.count("<answer>") == 2 and template.endswith("Answer:")
    completion = " <answer>61</answer>"  # what the 2-shot prompt elicits (one line: rollout.stop at "\n")
    assert split_spans(completion) == Spans((0, 1), (9, 11))  # reasoning: the space before the tag
    assert completion[9:11] == extract_answer(completion) == "61"
