"""CERO (arXiv 2606.05606, INFERRED forms): the posterior value and target exposure by hand, the
dual updates on a hand-worked two-prompt case, admission order, the budget never exceeded over a
real run, steps with fewer groups than prompts_per_step training sanely, exact resume, metrics."""

import math

import pytest
import torch

from reasonrl.methods.cero.maths import (admission_order, admitted_count, beta_update, posterior_value, price_step,
                                 saturating_utility, slope_step, target_exposure)
from reasonrl.config import ConfigError
from reasonrl.rollout import collect as collect_mod
from reasonrl.methods.cero.sampler import CERO, PoolSampler, finite_pool
from reasonrl.tasks.arithmetic import ArithmeticTask
from reasonrl.metrics_log import read_metrics
from reasonrl.train.trainer import Trainer

from helpers import mini_recipe, straight_and_resumed


def t(*xs):
    return torch.tensor(xs, dtype=torch.float64)


def test_posterior_value_utility_and_target_exposure_by_hand():
    # v = αβ/((α+β)(α+β+1)): Beta(1,1) → 1/(2·3); Beta(3,2) → 6/(5·6); Beta(9,1) → 9/(10·11).
    assert posterior_value(t(1, 3, 9), t(1, 2, 1)).tolist() == pytest.approx([1 / 6, 0.2, 9 / 110])
    # U(N) = v c (1 − e^{−N/c}): v 0.2, c 2, N 2 → 0.4 (1 − e^{−1}) = 0.252848.
    assert float(saturating_utility(t(0.2), t(2.0), 2.0)) == pytest.approx(0.4 * (1 - math.exp(-1)))
    # N*(λ) = c log(v/λ)₊: v 0.2, λ 0.1, c 2 → 2 ln 2; λ ≥ v → 0; λ = 0 → the cap.
    got = target_exposure(t(0.2, 0.2, 0.2, 0.2), t(0.1, 0.2, 0.3, 0.0), 2.0, cap=10.0)
    assert got.tolist() == pytest.approx([2 * math.log(2), 0.0, 0.0, 10.0])
    assert float(target_exposure(t(0.2), t(1e-300), 2.0, cap=10.0)) == 10.0  # capped, not inf


def test_beta_update_discounts_the_evidence_not_the_prior():
    # α = 1 + γ(α − 1) + s: α 3, β 2, γ ½, 3 successes of 4 → 1 + 1 + 3 = 5 and 1 + 0.5 + 1 = 2.5.
    a, b = beta_update(t(3.0), t(2.0), t(3.0), t(4.0), discount=0.5)
    assert (float(a), float(b)) == (5.0, 2.5)
    with pytest.raises(ValueError, match="successes"):
        beta_update(t(1.0), t(1.0), t(5.0), t(4.0))


def test_dual_steps_on_a_two_prompt_case_by_hand():
    # v = 0.2 for both, λ = 0.15, c = 2, K = 4, η = 0.1: N* = 2 ln(0.2/0.15) = 0.575364, pace N*/K = 0.143841.
    # Prompt 0 served one group: 0.15 − 0.1 (1 − 0.143841) = 0.064384 (over-served: loses slope);
    # prompt 1 left out: 0.15 + 0.1 · 0.143841 = 0.164384 (gains, below its cap v = 0.2).
    v, lam = t(0.2, 0.2), t(0.15, 0.15)
    new = slope_step(lam, t(1, 0), target_exposure(v, lam, 2.0, cap=4), 4, 0.1, upper=v)
    assert new.tolist() == pytest.approx([0.0643841, 0.1643841], abs=1e-7)
    # Projection: the cap v and the floor 0.
    assert slope_step(t(0.19), t(0), t(4.0), 4, 0.1, upper=t(0.2)).item() == pytest.approx(0.2)
    assert slope_step(t(0.05), t(1), t(0.0), 4, 0.1, upper=t(0.2)).item() == 0.0
    # The price rises when spend runs ahead of pace (2 groups vs 1.5), falls when behind, never below 0.
    assert price_step(0.0, 2.0, 1.5, 0.1) == pytest.approx(0.1 * 0.5 / 1.5)
    assert price_step(0.05, 1.0, 2.0, 0.1) == pytest.approx(0.0)
    assert price_step(0.0, 1.0, 2.0, 0.1) == 0.0


def test_admission_ranks_by_slope_minus_price_and_counts_by_the_implicit_price():
    ranked, positive = admission_order(t(0.1, 0.3, 0.2, 0.3), 0.15, torch.tensor([3, 2, 1, 0]))
    assert ranked.tolist() == [3, 1, 2, 0] and positive == 3  # the tie 1/3 broken by the tiebreak order
    # μ_j = 0.15 + 0.1 (j − 2)/2 = 0.10, 0.15, 0.20, 0.25 against 0.3, 0.3, 0.2, 0.1: two beat theirs.
    s = t(0.3, 0.3, 0.2, 0.1)
    assert admitted_count(s, 0.15, 2.0, 0.1, low=1, high=4) == 2
    assert admitted_count(s, 0.15, 2.0, 0.1, low=3, high=4) == 3
    assert admitted_count(s, 0.15, 2.0, 0.1, low=1, high=1) == 1
    assert admitted_count(s, 0.5, 2.0, 0.1, low=1, high=4) == 1  # nothing beats: the floor


def test_the_sampler_on_a_hand_worked_two_prompt_pool():
    # K = 4 steps, G = 4, B = 24 rows: pace 1.5 groups; η_λ = η_μ = 0.2/√4 = 0.1; c = 2.
    s = CERO(task=ArithmeticTask(), seed=0, total_steps=4, group_size=4, total_rollouts=24, pool_size=2,
             slope_lr=0.2, price_lr=0.2, saturation=2.0)
    a_, b_ = s.pool
    # Step 0: both at λ = 1/6 > running prices 0 and 0.0333: both admitted (a_0 = (24 − 12)/4 = 3).
    assert {p.prompt for p in s.problems(0, 2)} == {a_.prompt, b_.prompt}
    s.observe([a_, b_], [[1, 1, 1, 1], [1, 0, 0, 0]], 0)
    # Price: 2 groups vs pace 1.5 → 0.1 · 0.5/1.5. Slopes: a Beta(5,1), v = 5/42 < 1/6 so N* = 0:
    # 1/6 − 0.1 = 0.0666667; b Beta(2,4), v = 8/42, N* = 2 ln((8/42)/(1/6)) = 0.267063:
    # 1/6 − 0.1 (1 − 0.267063/4) = 0.0733432.
    assert s.price == pytest.approx(0.0333333, abs=1e-6)
    assert s.slope.tolist() == pytest.approx([0.0666667, 0.0733432], abs=1e-6)
    # Step 1: pace (24 − 8)/(4 · 3) = 4/3 groups; running prices 0.00833, 0.08333: only b (0.0733) beats.
    assert [p.prompt for p in s.problems(1, 2)] == [b_.prompt]
    s.observe([b_], [[0, 0, 0, 0]], 1)
    # Behind pace (1 vs 4/3): the price falls to 0.0333 − 0.1 · (1/3)/(4/3) = 0.00833. a was left out:
    # λ_a = 0.0666667 + 0.1 · 2 ln((5/42)/0.0666667)/4 = 0.0956576.
    assert s.price == pytest.approx(0.0083333, abs=1e-6)
    assert float(s.slope[0]) == pytest.approx(0.0956576, abs=1e-6)
    assert s.metrics()["cero/revisited"] == 1.0 and s.metrics()["cero/distinct_seen"] == 2.0


def test_the_pool_is_shared_and_the_uniform_sampler_covers_it_each_epoch():
    task = ArithmeticTask()
    cero = CERO(task=task, seed=1, total_steps=2, group_size=4, total_rollouts=8, pool_size=12)
    pool = PoolSampler(task=task, seed=3, pool_size=12)
    assert [p.prompt for p in cero.pool] == [p.prompt for p in pool.pool]
    assert len({p.prompt for p in pool.pool}) == 12
    first = [p.prompt for step in range(3) for p in pool.problems(step, 4)]  # 12 = one epoch
    assert sorted(first) == sorted(p.prompt for p in pool.pool)
    second = [p.prompt for step in range(3, 6) for p in pool.problems(step, 4)]
    assert sorted(second) == sorted(first) and second != first  # a fresh order
    small = ArithmeticTask(max_operand=2)  # 268 distinct training problems
    assert len(finite_pool(small, 268, 0)) == 268
    with pytest.raises(ValueError, match="pool_size=269: the task yielded only 268 distinct"):
        finite_pool(small, 269, 0)


def test_recipe_errors_name_the_key():
    for sampler, rollout, match in (
            ({"name": "cero", "total_rollouts": 10}, {}, "total_rollouts=10 is below one group per step"),
            ({"name": "cero"}, {}, "needs total_rollouts"),
            ({"name": "cero", "total_rollouts": 64}, {"dynamic_sampling": True}, "dynamic_sampling: false"),
            ({"name": "cero", "total_rollouts": 64, "slope_lr": 0}, {}, "slope_lr must be > 0")):
        with pytest.raises(ConfigError, match=match):
            mini_recipe(sampler=sampler, rollout=rollout)


METRICS = ["cero/budget_spent", "cero/budget_pace", "cero/budget_left", "cero/groups", "cero/eligible", "cero/price",
           "cero/slope_admitted", "cero/revisited", "cero/distinct_seen", "cero/contrast_admitted",
           "cero/value_admitted", "cero/value_rest"]


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_a_run_never_exceeds_its_budget_and_trains_on_fewer_groups(tmp_path, monkeypatch, agg):
    # K = 5 steps, G = 4, cap 4 groups, B = 48 rows: pace 2.4 groups, below the cap, so steps differ.
    sampled = []
    original = collect_mod.sample_and_score

    def counting(*args, **kwargs):
        batch, failures = original(*args, **kwargs)
        sampled.append(len(batch))
        return batch, failures

    monkeypatch.setattr(collect_mod, "sample_and_score", counting)
    recipe = mini_recipe(sampler={"name": "cero", "total_rollouts": 48, "pool_size": 8},
                         rewards=[{"name": "exact_answer"}, {"name": "soft_overlong", "max_len": 24, "buffer_len": 20}],
                         loss={"agg": agg}, train={"steps": 5, "checkpoint_every": 5}, eval={"size": 0})
    Trainer(recipe, tmp_path / "r", log=lambda m: None).run()
    assert len(sampled) == 5 and sum(sampled) <= 48
    rows = [r for r in read_metrics(tmp_path / "r") if "cero/groups" in r]
    assert len(rows) == 5
    for name in METRICS:  # every metric logged, finite
        assert all(name in r and math.isfinite(r[name]) for r in rows), name
    assert [r["cero/budget_spent"] for r in rows] == [float(sum(sampled[:i + 1])) for i in range(5)]
    groups = [int(r["cero/groups"]) for r in rows]
    assert sampled == [4 * g for g in groups] and min(groups) < 4  # some step trained on fewer than the cap
    for r in rows:  # a step with fewer groups trains like any other
        assert r["train/rows"] == 4 * r["cero/groups"]
        assert math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0
    assert rows[-1]["cero/budget_pace"] == 48.0 and rows[-1]["cero/distinct_seen"] <= 8


def test_cero_resumes_exactly(tmp_path, monkeypatch):
    recipe = mini_recipe(sampler={"name": "cero", "total_rollouts": 48, "pool_size": 8, "discount": 0.9},
                         rewards=[{"name": "exact_answer"}, {"name": "soft_overlong", "max_len": 24, "buffer_len": 20}],
                         train={"steps": 5, "checkpoint_every": 2}, eval={"size": 0})
    rows = straight_and_resumed(recipe, tmp_path, monkeypatch)
    assert sum("cero/price" in r for r in rows) == 5


def test_pool_sampler_resumes_exactly_with_dynamic_sampling(tmp_path, monkeypatch):
    recipe = mini_recipe(sampler={"name": "pool", "pool_size": 6},
                         rollout={"dynamic_sampling": True, "max_sampling_rounds": 2},
                         rewards=[{"name": "exact_answer"}, {"name": "soft_overlong", "max_len": 24, "buffer_len": 20}],
                         train={"steps": 4, "checkpoint_every": 2}, eval={"size": 0})
    rows = straight_and_resumed(recipe, tmp_path, monkeypatch)
    logged = [r for r in rows if "pool/epochs" in r]
    assert len(logged) == 4 and all(0.0 <= r["pool/contrast"] <= 1.0 for r in logged)
    # Every round's rows count: 4 groups of 4 per round, 1 or 2 rounds a step.
    assert [r["pool/rollouts"] for r in logged] == [16.0 * sum(x["sampling_rounds"] for x in logged[:i + 1])
                                                    for i in range(4)]


def test_cero_in_an_async_sampler_is_the_sync_run(tmp_path):
    # The async source builds the prompt sampler in its own process (rollout.samplers.build_sampler,
    # with K and G); at staleness 0 it must choose and log exactly what the in-process one does.
    def recipe(source):
        return mini_recipe(sampler={"name": "cero", "total_rollouts": 32, "pool_size": 8},
                           rollout={"source": source, "max_staleness": 0, "sampler_threads": 1},
                           train={"steps": 3, "threads": 1, "checkpoint_every": 3}, eval={"size": 0})
    for source in ("sync", "async"):
        Trainer(recipe(source), tmp_path / source, log=lambda m: None).run()
    rows = {s: [{k: v for k, v in r.items() if k.startswith("cero/")} for r in read_metrics(tmp_path / s)]
            for s in ("sync", "async")}
    assert rows["sync"] == rows["async"] and sum("cero/groups" in r for r in rows["sync"]) == 3
