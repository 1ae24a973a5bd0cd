"""CARing's coverage reward (reasonrl.methods.caring.reward) and the multi-label task."""


import pytest
import yaml

from reasonrl.policy.char_tokenizer import build_char_tokenizer
from reasonrl.registry import REWARDS, TASKS
from reasonrl.methods.caring.reward import (
    coverage,
    label_hit,
    marginal_coverage,
    normalised_coverage,
    parse_label_list,
    set_coverage,
)
from reasonrl.rewards.scorer import RewardSpec, Scorer
from reasonrl.problem import Problem
from reasonrl.methods.caring.task import MultiLabelTask, parse_label
from reasonrl.metrics_log import read_metrics
from reasonrl.train.trainer import Trainer

from helpers import MINI_TINY, RECIPES, mini_recipe

P = Problem(prompt="7:13,17,28,44,57,60,87,92;", answer="17,57,87", meta={"labels": ("17", "57", "87")})


def group(texts, problem=P, **params):
    n = len(texts)
    return coverage(texts, problem, num_tokens=[2] * n, truncated=[False] * n, **params)


# --- the pure functions ------------------------------------------------------

def test_marginal_shares_a_repeated_label_and_skips_wrong_and_malformed():
    # Y={a,b,c}; a named 3 times -> 1/3 each; b once -> 1; x wrong -> 0; None malformed -> 0.
    r = marginal_coverage(["a", "a", "b", "x", None, "a"], {"a", "b", "c"})
    assert r == pytest.approx([1 / 3, 1 / 3, 1.0, 0.0, 0.0, 1 / 3])
    assert sum(r) == pytest.approx(2.0)  # |{a,b,x} ∩ Y| = 2


def test_marginal_wrong_label_repeats_do_not_dilute_correct_ones():
    # x is wrong and repeated: n(x)=2 matters to nobody; a alone keeps 1.
    assert marginal_coverage(["x", "x", "a"], {"a"}) == [0.0, 0.0, 1.0]


@pytest.mark.parametrize("preds,gold", [
    (["a", "a", "b", "x", None, "a"], {"a", "b", "c"}),
    (["a", "b", "c", "d"], {"a", "b"}),
    (["a"] * 8, {"a", "b", "c", "d", "e", "f"}),
    ([None, None], {"a"}),
    (["c", "b", "a", "b", "z", "c", "a", "q"], {"a", "b", "c", "d"}),
])
def test_sum_of_marginal_rewards_is_the_coverage_count(preds, gold):
    assert sum(marginal_coverage(preds, gold)) == pytest.approx(len({p for p in preds if p} & gold))


def test_normalised_when_y_is_smaller_than_g():
    # G=4, |Y|=2: scale G/min(G,|Y|) = 4/2 = 2; a thrice -> 2/3, b once -> 2; full coverage sums to G.
    r = normalised_coverage(["a", "a", "a", "b"], {"a", "b"})
    assert r == pytest.approx([2 / 3, 2 / 3, 2 / 3, 2.0])
    assert sum(r) == pytest.approx(4.0)


def test_normalised_when_y_is_larger_than_g():
    # G=4, |Y|=5: scale 4/min(4,5) = 1, so it equals the marginal reward: [1, 1/2, 1/2, 1].
    gold = {"a", "b", "c", "d", "e"}
    r = normalised_coverage(["a", "b", "b", "e"], gold)
    assert r == pytest.approx([1.0, 0.5, 0.5, 1.0])
    assert r == pytest.approx(marginal_coverage(["a", "b", "b", "e"], gold))


def test_normalised_with_repeats_wrong_and_malformed():
    # G=6, |Y|=3: scale 6/3 = 2 on top of [1/3, 1/3, 1, 0, 0, 1/3].
    r = normalised_coverage(["a", "a", "b", "x", None, "a"], {"a", "b", "c"})
    assert r == pytest.approx([2 / 3, 2 / 3, 2.0, 0.0, 0.0, 2 / 3])


def test_set_variant_worked_group():
    # Y={a,b,c}, |Y|=3, β=2 (β²=4), γ=1. Only the top-3 of each ranked list counts.
    # L1=[a,b]: P=1, R=2/3, F2 = 5·(2/3)/(4+2/3) = 5/7.
    # L2=[a,x,c,b] -> [a,x,c]: P=R=2/3, F2 = 5·(4/9)/(8/3+2/3) = 2/3 (b at rank 4 earns nothing).
    # m(a)=2, m(b)=1, m(c)=1: c1 = (1/2+1)/3 = 1/2, c2 = (1/2+1)/3 = 1/2.
    preds = [["a", "b"], ["a", "x", "c", "b"], None, ["x"]]
    r = set_coverage(preds, {"a", "b", "c"}, gamma=1.0, beta=2.0)
    assert r == pytest.approx([5 / 7 + 1 / 2, 2 / 3 + 1 / 2, 0.0, 0.0])
    assert set_coverage(preds, {"a", "b", "c"}, gamma=0.0) == pytest.approx([5 / 7, 2 / 3, 0.0, 0.0])
    # Σ_i c_i = recall of the union of the top-3 lists: {a,b,c} -> 1 = (sum(r) - sum of F2) / γ.
    assert sum(r) - (5 / 7 + 2 / 3) == pytest.approx(1.0)


def test_set_variant_with_one_label_each_is_marginal_over_y():
    # Single correct label: P=1, R=1/3, F2 = 5·(1/3)/(4+1/3) = 5/13; c = marginal/|Y| = [1/6, 1/6, 1/3].
    r = set_coverage([["a"], ["a"], ["b"]], {"a", "b", "c"}, gamma=1.0, beta=2.0)
    assert r == pytest.approx([5 / 13 + 1 / 6, 5 / 13 + 1 / 6, 5 / 13 + 1 / 3])
    # β=1 is F1: 2·1·(1/3)/(1+1/3) = 1/2.
    assert set_coverage([["a"]], {"a", "b", "c"}, gamma=0.0, beta=1.0) == pytest.approx([0.5])


def test_bad_parameters_name_themselves():
    with pytest.raises(ValueError, match="gamma"):
        set_coverage([["a"]], {"a"}, gamma=-1.0)
    with pytest.raises(ValueError, match="beta"):
        set_coverage([["a"]], {"a"}, beta=0.0)
    with pytest.raises(ValueError, match="empty"):
        marginal_coverage(["a"], set())
    with pytest.raises(ValueError, match="variant"):
        group(["17"], variant="greedy")
    with pytest.raises(ValueError, match="gamma and beta apply only to variant 'set'"):
        group(["17"], gamma=0.5)
    with pytest.raises(ValueError, match="label_pattern"):
        group(["17"], label_pattern="[")
    # The same checks, callable at recipe-load time without a group.
    with pytest.raises(ValueError, match="coverage: gamma must be >= 0"):
        coverage.check_params(variant="set", gamma=-0.5)
    with pytest.raises(ValueError, match="coverage: beta must be > 0"):
        coverage.check_params(variant="set", beta=0)
    coverage.check_params(variant="set", gamma=0.5, beta=1.0)  # accepted


def test_parse_label_list():
    assert parse_label_list("17, 57,17,87") == ["17", "57", "87"]  # repeats dropped, rank kept
    assert parse_label_list("17,,57") is None
    assert parse_label_list("17,") is None
    assert parse_label_list("") is None


# --- the registered rewards ------------------------------------------------------

def test_registered_coverage_on_texts():
    # Y={17,57,87}: "17" ×2 share 1; " 57\n" alone -> 1; "18" wrong; "17 57" and "" malformed.
    texts = ["17", "17", " 57\n", "18", "17 57", ""]
    assert group(texts) == pytest.approx([0.5, 0.5, 1.0, 0.0, 0.0, 0.0])
    # normalised: G=6, |Y|=3 -> ×2.
    assert group(texts, variant="normalised") == pytest.approx([1.0, 1.0, 2.0, 0.0, 0.0, 0.0])
    # set: "17,57" and "87,18": m(17)=1, m(57)=1, m(87)=1.
    # "17,57": P=1, R=2/3, F2=5/7; c=(1+1)/3. "87,18": P=1/2, R=1/3, F2=5·(1/6)/(2+1/3)=5/14; c=1/3.
    assert group(["17,57", "87,18", "17,,57"], variant="set") == pytest.approx(
        [5 / 7 + 2 / 3, 5 / 14 + 1 / 3, 0.0])
    assert REWARDS.get("coverage") is coverage and coverage.group_reward


def test_truncated_completions_score_zero_and_do_not_count():
    # The truncated "17" is a partial label: 0, and the other "17" keeps the full unit.
    r = coverage(["17", "17", "57"], P, num_tokens=[2, 2, 2], truncated=[True, False, False])
    assert r == [0.0, 1.0, 1.0]


def test_label_hit_is_the_per_rollout_baseline():
    assert label_hit("17", P) == 1.0
    assert label_hit(" 87\n", P, num_tokens=3, truncated=False) == 1.0
    assert label_hit("18", P) == 0.0
    assert label_hit("17,57", P) == 0.0  # several labels
    assert label_hit("", P) == 0.0
    assert label_hit("17", P, truncated=True) == 0.0
    # Without meta["labels"] the comma-separated answer is Y.
    assert label_hit("57", Problem(prompt="x", answer="17,57")) == 1.0


def test_scorer_groups_rows_and_isolates_a_failing_group():
    # Two groups of G=3. Group 1: Y={17,57,87}, "17","17","57" -> [1/2, 1/2, 1].
    # Group 2 has an empty label set: the reward raises, that group scores 0 and counts 3 failures.
    broken = Problem(prompt="0:11;", answer="", meta={"labels": ()})
    scorer = Scorer([RewardSpec("coverage", 1.0, {}), RewardSpec("label_hit", 0.5, {})])
    with pytest.warns(UserWarning) as caught:
        scores = scorer(["17", "17", "57", "11", "11", "12"], [P] * 3 + [broken] * 3,
                        [2] * 6, [False] * 6, group_size=3)
    assert sorted(str(w.message).split(" failed")[0] for w in caught) == ["reward 'coverage'", "reward 'label_hit'"]
    assert scores.per_function["coverage"] == pytest.approx([0.5, 0.5, 1.0, 0.0, 0.0, 0.0])
    assert scores.failures == {"coverage": 3, "label_hit": 3}
    # total = coverage + 0.5 · label_hit
    assert scores.total == pytest.approx([1.0, 1.0, 1.5, 0.0, 0.0, 0.0])


def test_scorer_with_coverage_params_and_a_bad_variant():
    # Normalised, G=4, |Y|=3: scale 4/3; "17" ×2 -> 2/3 each, "57" -> 4/3, "87" -> 4/3.
    scorer = Scorer([RewardSpec("coverage", 1.0, {"variant": "normalised"})])
    scores = scorer(["17", "17", "57", "87"], [P] * 4, [2] * 4, [False] * 4, group_size=4)
    assert scores.total == pytest.approx([2 / 3, 2 / 3, 4 / 3, 4 / 3])
    bad = Scorer([RewardSpec("coverage", 1.0, {"variant": "nope"})])
    with pytest.warns(UserWarning, match="variant must be one of"):
        scores = bad(["17", "57"], [P] * 2, [2] * 2, [False] * 2, group_size=2)
    assert scores.total == [0.0, 0.0] and scores.failures == {"coverage": 2}


# --- the multi-label task ------------------------------------------------------

def test_task_problems_are_well_formed():
    task = MultiLabelTask()
    problems = task.train_problems(0, 200, seed=0)
    for p in problems:
        r, listed = p.prompt.rstrip(";").split(":")
        numbers = [int(x) for x in listed.split(",")]
        assert numbers == sorted(set(numbers)) and len(numbers) == 8
        gold = [int(x) for x in p.meta["labels"]]
        assert gold == [x for x in numbers if x % 10 == int(r)]
        assert 2 <= len(gold) <= 6
        assert p.answer == ",".join(p.meta["labels"])
        assert set(p.prompt + p.answer) <= set(MultiLabelTask.alphabet)
    assert {len(p.meta["labels"]) for p in problems} == {2, 3, 4, 5, 6}


def test_task_stream_is_deterministic_and_split():
    task = MultiLabelTask()
    assert task.train_problems(5, 8, seed=1) == task.train_problems(5, 8, seed=1)
    assert task.train_problems(5, 8, seed=1) != task.train_problems(5, 8, seed=2)
    assert task.train_problems(5, 8, seed=1) != task.train_problems(6, 8, seed=1)
    held_out = task.eval_problems(100)
    assert held_out == MultiLabelTask().eval_problems(100) and len({p.prompt for p in held_out}) == 100
    train = {p.prompt for step in range(50) for p in task.train_problems(step, 16, seed=0)}
    assert not train & {p.prompt for p in held_out}


def test_warmup_collapses_onto_the_smallest_label():
    # Each solution is labels[0] with probability 0.85, else another gold label.
    problems = [p for s in range(40) for p in MultiLabelTask().warmup_problems(s, 50, seed=0)]
    assert all(p.solution in p.meta["labels"] for p in problems)
    easy = sum(p.solution == p.meta["labels"][0] for p in problems) / len(problems)
    assert easy == pytest.approx(0.85, abs=0.03)  # 2000 draws: std ≈ 0.008
    full = MultiLabelTask(collapse=1.0).warmup_problems(0, 100, seed=0)
    assert all(p.solution == p.meta["labels"][0] for p in full)


def test_task_rejects_bad_parameters():
    with pytest.raises(ValueError, match="task.modulus"):
        MultiLabelTask(modulus=11)
    with pytest.raises(ValueError, match="task.max_labels"):
        MultiLabelTask(min_labels=3, max_labels=2)
    with pytest.raises(ValueError, match="task.list_size"):
        MultiLabelTask(list_size=4)
    with pytest.raises(ValueError, match="task.collapse"):
        MultiLabelTask(collapse=1.5)


def test_task_with_another_modulus():
    for p in MultiLabelTask(modulus=3, list_size=10).train_problems(0, 50, seed=0):
        r, listed = p.prompt.rstrip(";").split(":")
        assert [int(x) for x in p.meta["labels"]] == [int(x) for x in listed.split(",") if int(x) % 3 == int(r)]


def test_parser():
    assert parse_label("17") == "17"
    assert parse_label(" 17\n") == "17"
    for bad in ("017", "17,57", "1 7", "", "x", "17;", "-17"):
        assert parse_label(bad) is None, bad


def test_group_metrics_worked_example():
    # Y={17,57,87}; parsed [17,17,57,18,None,17,87,57]: 6 correct of k=8, distinct {17,57,87}.
    texts = ["17", "17", "57", "18", "zz", "17", "87 ", "57"]
    m = MultiLabelTask().group_metrics(P, texts)
    assert m == pytest.approx({"recall_at_k": 1.0, "hit_rate": 0.75, "distinct_correct": 3.0,
                               "easy_rate": 3 / 8, "parse_rate": 7 / 8})
    m = MultiLabelTask().group_metrics(P, ["17", "17", "57", "18"])
    assert m["recall_at_k"] == pytest.approx(2 / 3) and m["hit_rate"] == pytest.approx(3 / 4)


def test_registered_task_and_tokenizer_alphabet():
    assert TASKS.get("multilabel") is MultiLabelTask
    tok = build_char_tokenizer(MultiLabelTask.alphabet)
    p = MultiLabelTask().train_problems(0, 1, seed=0)[0]
    assert tok.unk_token_id not in tok(p.prompt + p.solution)["input_ids"]


# --- end to end: each recipe, on the mini model ------------------------------------

def recipe_on_mini_model(name: str):
    raw = yaml.safe_load((RECIPES / name).read_text())
    evaluation = dict(raw["eval"], size=8, every=0)
    return mini_recipe(
        model={"backend": "tiny", "tiny": {**MINI_TINY, **raw["model"]["tiny"], "warmup_steps": 30}},
        task=raw["task"], rewards=raw["rewards"], advantage=raw["advantage"],
        rollout={**raw["rollout"], "num_generations": 4},
        train={"steps": 2, "prompts_per_step": 4, "checkpoint_every": 2, "micro_batch_size": 16},
        eval=evaluation,
    )


@pytest.mark.parametrize("name,reward", [("coverage.yaml", "coverage"), ("coverage_baseline.yaml", "label_hit")])
def test_recipe_runs_end_to_end(name, reward, tmp_path):
    recipe = recipe_on_mini_model(name)
    assert recipe.task.name == "multilabel" and [r.name for r in recipe.rewards] == [reward]
    summary = Trainer(recipe, tmp_path / "run", log=lambda m: None).run()
    assert summary["steps"] == 2
    rows = [r for r in read_metrics(tmp_path / "run") if "loss" in r]
    assert len(rows) == 2
    for row in rows:
        assert f"reward_failures/{reward}" not in row  # the reward ran on every group
        assert 0.0 <= row[f"reward/{reward}"] <= 1.0
    final = summary["final_eval"]  # the task's group_metrics, averaged over the eval.n samples
    assert 0.0 <= final["recall_at_k"] <= 1.0 and 0.0 <= final["hit_rate"] <= 1.0
