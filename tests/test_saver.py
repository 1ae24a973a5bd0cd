"""SAVER: the grounding task's views, the grounding rewards, the gated reference reward and the
method on the Trainer (docs/methods/saver.md)."""

import random

import pytest
import torch

from reasonrl.methods.saver.maths import pair_reference, span_iou
from reasonrl.batch import RolloutBatch
from reasonrl.config import ConfigError
from reasonrl.methods.saver.method import SaverReference
from reasonrl.registry import REWARDS
from reasonrl.methods.saver.reward import parse_grounding
from reasonrl.problem import Problem
from reasonrl.methods.saver.task import GroundingTask, sparse_indices

from helpers import MINI_TINY, mini_recipe, straight_and_resumed


# -- IoU and the rewards, by hand -------------------------------------------------------------

def test_span_iou_by_hand():
    assert span_iou((3, 7), (5, 9)) == pytest.approx(3 / 7)  # ∩ = {5,6,7}, ∪ = 5 + 5 − 3 frames
    assert span_iou((4, 5), (3, 8)) == pytest.approx(2 / 6)  # contained
    assert span_iou((2, 2), (2, 2)) == 1.0  # one frame each, the same one
    assert span_iou((0, 3), (4, 9)) == 0.0  # adjacent, no overlap
    assert span_iou(None, (4, 9)) == 0.0
    with pytest.raises(ValueError, match="start <= end"):
        span_iou((5, 3), (1, 2))


def test_grounding_rewards_by_hand():
    gold = Problem("...;", "11-19=7")
    r = REWARDS.get("grounding")
    assert r("13-19=7", gold) == pytest.approx(7 / 9 + 1 + 0.1)  # ∩ 13..19 = 7, ∪ 11..19 = 9
    assert r("11-19=6", gold) == pytest.approx(1 + 0 + 0.1)  # span right, class wrong
    assert r("11-19=7", gold, iou_weight=2.0, answer_weight=0.5, format_weight=0.0) == pytest.approx(2.5)
    assert r("11-19", gold) == 0.0 and r("19-11=7", gold) == 0.0  # no answer; reversed span
    assert r("11-19=7", gold, truncated=True) == 0.0
    hit = REWARDS.get("grounding_hit")
    assert hit("13-19=7", gold) == 1.0  # IoU 0.78 and the class
    assert hit("16-25=7", gold) == 0.0  # ∩ 16..19 = 4, ∪ 11..25 = 15: IoU 0.27
    assert hit("16-25=7", gold, iou_threshold=0.25) == 1.0
    assert hit("11-19=8", gold) == 0.0
    assert parse_grounding(" 3-12=5 ") == (3, 12, "5") and parse_grounding("3-12=5;") is None
    with pytest.raises(ValueError, match="s-e=c"):
        r("1-2=3", Problem("x", "42"))


# -- the reliability gate, by hand ------------------------------------------------------------

GOLD = (11, 19, "7")


def test_gate_open_rewards_agreement_with_the_best_dense_rollout():
    ref = pair_reference([1.2, 2.1, 0.5], [(0, 3, "5"), (11, 19, "7"), None],
                         [(13, 19, "7"), (11, 19, "6"), None], GOLD, coef=0.5, tau=0.5)
    assert ref.best == 1 and ref.reliability == 1.0 and ref.gate == 1.0
    assert ref.similarity == pytest.approx([7 / 9 + 1, 1 + 0, 0])
    assert ref.bonus == pytest.approx([0.5 * (7 / 9 + 1), 0.5, 0.0])


def test_gate_closed_when_the_best_dense_rollout_is_unreliable():
    # The best-rewarded dense rollout has IoU 4/15 < τ = 0.5 with the gold: no reference reward.
    dense = [(16, 25, "7"), (0, 2, "5")]
    sparse = [(16, 25, "7"), (11, 19, "7")]
    hard = pair_reference([1.0, 0.1], dense, sparse, GOLD, coef=0.5, tau=0.5)
    assert hard.best == 0 and hard.reliability == pytest.approx(4 / 15) and hard.gate == 0.0
    assert hard.bonus == [0.0, 0.0]
    assert pair_reference([1.0, 0.1], dense, sparse, GOLD, tau=0.25).gate == 1.0  # a lower τ trusts it
    # soft: g = ρ = 4/15; sim = IoU + agreement = (1 + 1, 4/15 + 1)
    soft = pair_reference([1.0, 0.1], dense, sparse, GOLD, coef=0.5, soft=True)
    assert soft.bonus == pytest.approx([0.5 * 4 / 15 * 2, 0.5 * 4 / 15 * (4 / 15 + 1)])


def test_gate_ties_and_unparsable_reference():
    # Ties go to the first rollout; an unparsable best dense rollout gives no reference.
    assert pair_reference([1.0, 1.0], [(11, 19, "7"), (0, 1, "5")], [(11, 19, "7")], GOLD).best == 0
    ref = pair_reference([0.0, 0.0], [None, (11, 19, "7")], [(11, 19, "7")], GOLD)
    assert ref.best == 0 and ref.gate == 0.0 and ref.bonus == [0.0]
    with pytest.raises(ValueError, match="one prediction per dense reward"):
        pair_reference([], [], [(1, 2, "5")], GOLD)


# -- the task's views --------------------------------------------------------------------------

def test_paired_views_share_input_pair_id_and_answer():
    task = GroundingTask(length=32, budget=4)
    problems = task.train_problems(3, 6, seed=1)
    assert [p.meta["view"] for p in problems] == ["dense", "sparse"] * 3
    assert len({p.meta["pair"] for p in problems}) == 3
    for dense, sparse in zip(problems[::2], problems[1::2]):
        assert dense.meta["pair"] == sparse.meta["pair"] and dense.answer == sparse.answer
        frames, shown = dense.prompt[:-1], sparse.prompt[:-1]
        assert "." not in frames and len(shown) == len(frames) == 32
        assert all(c == "." or c == f for c, f in zip(shown, frames))  # every kept frame at its own index
        s, e, c = parse_grounding(dense.answer)
        assert set(frames[s:e + 1]) == {c} and c in "56789" and set(frames[:s] + frames[e + 1:]) <= set("01234")
    assert task.train_problems(3, 6, seed=1) == problems  # a pure function of (step, count, seed)
    assert [p.meta["view"] for p in task.train_problems(0, 3, 0)] == ["dense", "sparse", "dense"]
    assert {p.meta["view"] for p in GroundingTask(views="sparse").train_problems(0, 4, 0)} == {"sparse"}
    assert len({p.meta["pair"] for p in GroundingTask(views="sparse").train_problems(0, 4, 0)}) == 4


@pytest.mark.parametrize("budget", [32, 16, 8, 4, 2, 1, 5])
def test_sparse_view_keeps_exactly_the_budget(budget):
    task = GroundingTask(length=32, budget=budget)
    for p in task.eval_problems(20):
        kept = [i for i, ch in enumerate(p.prompt[:-1]) if ch != "."]
        assert len(kept) == budget and p.meta["budget"] == budget
        gaps = {b - a for a, b in zip(kept, kept[1:])}
        assert gaps <= {32 // budget, -(-32 // budget)}  # a uniform stride N/b (floor or ceil)
        assert p.meta["view"] == ("dense" if budget == 32 else "sparse")
    rng = random.Random(0)
    assert sparse_indices(32, 32, rng) == list(range(32))
    offsets = {sparse_indices(32, 4, rng)[0] for _ in range(200)}
    assert offsets == set(range(8))  # training draws every offset in [0, N/b)
    # The same held-out inputs at every budget (the sweep compares like with like).
    assert [p.answer for p in task.eval_problems(20)] == [p.answer for p in GroundingTask().eval_problems(20)]


def test_train_and_eval_inputs_differ_and_bad_parameters_are_named():
    task = GroundingTask()
    train = {p.prompt for p in task.train_problems(0, 400, 0) if p.meta["view"] == "dense"}
    held = {p.prompt for p in GroundingTask(budget=32).eval_problems(100)}
    assert not train & held
    with pytest.raises(ValueError, match="task.budget"):
        GroundingTask(length=16, budget=17)
    with pytest.raises(ValueError, match="min_event"):
        GroundingTask(min_event=8, max_event=4)


def test_decoys_are_shorter_runs_of_other_classes_and_off_by_default():
    import re

    # without decoys the inputs are those the docs page shows (the same random stream as before)
    assert GroundingTask().train_problems(0, 1, 0)[0].prompt == "21334403240010440028888888888020;"
    task = GroundingTask(decoys=2)
    problems = [p for p in task.train_problems(0, 200, 0) if p.meta["view"] == "dense"]
    problems += GroundingTask(decoys=2, budget=32).eval_problems(50)
    for p in problems:
        s, e = p.meta["span"]
        runs = [(m.start(), m.end() - 1, m.group()[0]) for m in re.finditer(r"5+|6+|7+|8+|9+", p.prompt)]
        event = [r for r in runs if r[:2] == (s, e)]
        assert event and event[0][2] == p.meta["label"], p.prompt
        others = [r for r in runs if r[:2] != (s, e)]
        # two decoys (runs never merge), each shorter than the event, of another class, apart from it
        assert len(others) == 2, p.prompt
        assert all(b - a < e - s and c != p.meta["label"] and (b < s - 1 or a > e + 1) for a, b, c in others)
    with pytest.raises(ValueError, match="task.decoys"):
        GroundingTask(decoys=4)
    with pytest.raises(ValueError, match="task.decoys"):
        GroundingTask(decoys=1, min_event=1)


def test_warmup_jitters_a_share_of_the_spans():
    task = GroundingTask(careless_fraction=0.5, jitter=2)
    problems = task.warmup_problems(0, 400, 0)
    exact = [p.solution == p.answer for p in problems]
    assert 0.45 < sum(exact) / len(exact) < 0.75  # half careless, some of those jitter by 0
    for p in problems:
        (s, e, c), (ws, we, wc) = parse_grounding(p.answer), parse_grounding(p.solution)
        assert wc == c and abs(ws - s) <= 2 and abs(we - e) <= 2 and ws <= we
    assert {p.meta["budget"] for p in problems} == {32, 16, 8, 4}
    assert set("".join(p.prompt + p.solution for p in problems)) <= set(task.alphabet)


# -- the method: annotate on a hand-built batch ----------------------------------------------

def scored_batch(rows):
    """rows: (pair, view, completion, reward); every input's gold is 11-19=7."""
    n = len(rows)
    problem = Problem("x;", "11-19=7")
    zeros = torch.zeros(n, 1, dtype=torch.long)
    return RolloutBatch(prompt_ids=zeros, prompt_mask=zeros + 1, completion_ids=zeros, completion_mask=zeros + 1,
                        group_ids=torch.arange(n), rewards=torch.tensor([r[3] for r in rows]),
                        truncated=torch.zeros(n, dtype=torch.bool),
                        meta={"meta/pair": [r[0] for r in rows], "meta/view": [r[1] for r in rows],
                              "completion": [r[2] for r in rows], "problem": [problem] * n})


def test_annotate_adds_the_gated_reference_to_sparse_rows_only():
    batch = scored_batch([
        ("a", "dense", "11-19=7", 2.1), ("a", "dense", "0-3=5", 0.1),  # reliable: ρ = 1
        ("a", "sparse", "13-19=7", 1.88), ("a", "sparse", "11-19=6", 1.1),
        ("b", "dense", "16-25=7", 1.37), ("b", "sparse", "16-25=7", 1.37),  # unreliable: ρ = 4/15
        ("c", "sparse", "11-19=7", 2.1),  # its dense group was dropped: left alone
    ])
    before = batch.rewards.clone()
    m = SaverReference(coef=0.5, tau=0.5).annotate(batch, step=0)
    bonus = batch.rewards - before
    assert bonus.tolist() == pytest.approx([0, 0, 0.5 * (7 / 9 + 1), 0.5 * 1, 0, 0, 0])
    assert m["saver/pairs"] == 2 and m["saver/gate"] == 0.5 and m["saver/unpaired"] == 1
    assert m["saver/reliability"] == pytest.approx((1 + 4 / 15) / 2)
    assert m["saver/iou_dense"] == pytest.approx((1 + 0 + 4 / 15) / 3)
    assert m["saver/iou_sparse"] == pytest.approx((7 / 9 + 1 + 4 / 15 + 1) / 4)
    truncated = scored_batch([("a", "dense", "11-19=7", 2.1), ("a", "sparse", "11-19=7", 2.1)])
    truncated.truncated[1] = True  # a truncated rollout earns no reference reward
    SaverReference().annotate(truncated, 0)
    assert truncated.rewards.tolist() == pytest.approx([2.1, 2.1])
    with pytest.raises(ValueError, match="paired views"):
        SaverReference().annotate(RolloutBatch(**{**vars(batch), "meta": {}}), 0)


# -- recipes and the Trainer -------------------------------------------------------------------

def saver_recipe(**over):
    tiny = {**MINI_TINY, "task": "grounding", "task_params": {"length": 16, "min_event": 3, "max_event": 6}}
    sections = dict(model={"backend": "tiny", "tiny": tiny},
                    task={"name": "grounding", "length": 16, "min_event": 3, "max_event": 6, "budget": 4},
                    rollout={"num_generations": 4, "max_new_tokens": 8},
                    rewards=[{"name": "grounding"}], methods=[{"name": "saver", "coef": 0.5}],
                    eval={"size": 8, "reward": "grounding_hit"})
    sections.update(over)
    return mini_recipe(**sections)


def test_recipe_rules_name_what_is_wrong():
    with pytest.raises(ConfigError, match="views: paired"):
        saver_recipe(task={"name": "grounding", "views": "sparse"})
    with pytest.raises(ConfigError, match="must be even"):
        saver_recipe(train={"prompts_per_step": 3})
    with pytest.raises(ConfigError, match="sampler: stream"):
        saver_recipe(sampler={"name": "learnability"})
    with pytest.raises(ConfigError, match="tau"):
        saver_recipe(methods=[{"name": "saver", "tau": 1.5}])
    with pytest.raises(ConfigError, match="budget"):
        saver_recipe(task={"name": "grounding", "length": 16, "budget": 40})


def test_short_run_pairs_groups_and_resumes_exactly(tmp_path, monkeypatch):
    seen = []
    original = SaverReference.annotate

    def spy(self, batch, step):
        seen.append((batch.group_ids.tolist(), list(batch.meta["meta/pair"]), list(batch.meta["meta/view"]),
                     batch.rewards.clone()))
        out = original(self, batch, step)
        seen[-1] += (batch.rewards.clone(),)
        return out

    monkeypatch.setattr(SaverReference, "annotate", spy)
    rows = straight_and_resumed(saver_recipe(), tmp_path, monkeypatch)
    groups, pairs, views, before, after = seen[0]
    g = 4
    assert views == ["dense"] * g + ["sparse"] * g + ["dense"] * g + ["sparse"] * g  # 2 inputs × 2 views
    assert pairs[:2 * g] == [pairs[0]] * 2 * g and pairs[2 * g] != pairs[0]
    assert len(set(groups)) == 4 and groups[0] != groups[g]  # each view its own GRPO group
    dense = [i for i, v in enumerate(views) if v == "dense"]
    assert torch.equal(after[dense], before[dense]) and bool((after >= before).all())
    trained = [r for r in rows if "saver/pairs" in r]
    assert len(trained) == 4 and all(r["saver/pairs"] == 2 and r["saver/unpaired"] == 0 for r in trained)
