"""The CERO comparison at equal rollouts: the ``pool`` sampler's hard budget (``total_rollouts``)
that caps the DAPO dynamic-sampling arm, by hand, as an invariant over random runs, at load time,
in a real run, and the three arms' recipes."""

import random
from pathlib import Path

import pytest

from reasonrl.config import ConfigError, load_recipe
from reasonrl.methods.cero.sampler import PoolSampler
from reasonrl.metrics_log import read_metrics
from reasonrl.rollout import collect as collect_mod
from reasonrl.tasks.arithmetic import ArithmeticTask
from reasonrl.train.trainer import Trainer

from helpers import mini_recipe

ROOT = Path(__file__).resolve().parents[1]
TASK = ArithmeticTask()


def serve(sampler, step, count, round_, g):
    """One round: ask for ``count``, observe the served problems with G zero rewards each."""
    problems = sampler.problems(step, count, round_)
    sampler.observe(problems, [[0.0] * g for _ in problems], step)
    return len(problems)


def test_the_cap_by_hand():
    # K = 3 steps, G = 4, R = 2 rounds, B = 40 rows (≥ G·R·K = 24). Each round keeps one group
    # for every round still to come: step 0 round 0 reserves (1 + 2·2)·4 = 20 → ⌊(40 − 20)/4⌋ = 5 ≥ 4.
    s = PoolSampler(TASK, seed=0, pool_size=16, total_steps=3, group_size=4, total_rollouts=40, rounds_per_step=2)
    assert s.affordable(0, 0) == 5 and serve(s, 0, 4, 0, 4) == 4          # spent 16
    assert s.affordable(0, 1) == 2 and serve(s, 0, 3, 1, 4) == 2          # (40 − 16 − 4·4)/4: capped, spent 24
    assert s.affordable(1, 0) == 1 and serve(s, 1, 4, 0, 4) == 1          # (40 − 24 − 3·4)/4, spent 28
    assert serve(s, 1, 3, 1, 4) == 1 and serve(s, 2, 4, 0, 4) == 1        # spent 32, 36
    assert s.affordable(2, 1) == 1 and serve(s, 2, 3, 1, 4) == 1          # the last round: spent 40 = B
    m = s.metrics()
    assert m["pool/rollouts"] == 40.0 and m["pool/budget_left"] == 0.0 and m["pool/capped_rounds"] == 5.0
    with pytest.raises(ValueError, match="sampling round 3 of step 2 but rounds_per_step is 2"):
        s.problems(2, 1, 2)
    # The uncapped sampler serves what it is asked and logs no budget.
    free = PoolSampler(TASK, seed=0, pool_size=16)
    assert serve(free, 0, 4, 0, 4) == 4 and "pool/budget_left" not in free.metrics()
    # The capped sampler draws the same prompts, in the same order, as the uncapped one.
    capped = PoolSampler(TASK, seed=0, pool_size=16, total_steps=3, group_size=4, total_rollouts=40, rounds_per_step=2)
    again = PoolSampler(TASK, seed=0, pool_size=16)
    assert [p.prompt for p in capped.problems(0, 4, 0)] == [p.prompt for p in again.problems(0, 4, 0)]


@pytest.mark.parametrize("seed", range(6))
def test_the_budget_is_never_exceeded_and_every_round_gets_a_group(seed):
    rng = random.Random(seed)
    K, G, R, n = rng.randint(3, 12), rng.choice([2, 4, 8]), rng.randint(1, 3), rng.randint(2, 8)

    def run(budget):
        s = PoolSampler(TASK, seed=seed, pool_size=32, total_steps=K, group_size=G, total_rollouts=budget,
                        rounds_per_step=R)
        keep = random.Random(seed + 100)  # the same flat/kept pattern for both budgets
        spent = asked = 0
        for step in range(K):
            kept = 0
            for round_ in range(R):
                count = n - kept if round_ else n
                got = serve(s, step, count, round_, G)
                assert 1 <= got <= count
                spent += G * got
                asked += G * count
                kept += sum(keep.random() < 0.5 for _ in range(got))  # the groups dynamic sampling keeps
                if kept >= n:
                    break
        assert spent == s.rollouts <= budget
        return spent, asked, s.capped

    run(rng.randint(G * R * K, G * R * K * n))  # any budget the load-time check accepts
    spent, asked, capped = run(G * R * K * n)  # the most any run can ask for: never binds
    assert spent == asked and capped == 0
    tight = run(G * R * K)  # one group a round: every round capped to exactly one group
    assert tight[0] <= G * R * K and (tight[2] > 0 or n == 1)


def test_load_time_rules_name_the_key():
    for sampler, rollout, train, match in (
            ({"name": "pool", "pool_size": 8, "total_rollouts": 64, "rounds_per_step": 2},
             {"dynamic_sampling": True, "max_sampling_rounds": 3}, {}, "rounds_per_step must be .*: 3"),
            ({"name": "pool", "pool_size": 8, "total_rollouts": 64, "rounds_per_step": 3}, {}, {},
             r"rounds_per_step must be .*: 1 \(rollout.dynamic_sampling=false"),
            ({"name": "pool", "pool_size": 8, "total_rollouts": 40, "rounds_per_step": 3},
             {"dynamic_sampling": True, "max_sampling_rounds": 3}, {"steps": 4},
             r"total_rollouts=40 cannot keep one group for every sampling round: .* = 48"),
            ({"name": "pool", "pool_size": 8, "rounds_per_step": 2}, {}, {}, "only applies with total_rollouts"),
            ({"name": "pool", "pool_size": 8, "total_rollouts": 0}, {}, {}, "total_rollouts must be >= 1")):
        with pytest.raises(ConfigError, match=match):
            mini_recipe(sampler=sampler, rollout=rollout, train=train)


def test_a_capped_dynamic_sampling_run_spends_at_most_its_budget(tmp_path, monkeypatch):
    # K = 3, G = 4, 4 groups a step, up to 2 rounds: uncapped, 48 to 96 rows; B = 40 must bind.
    sampled = []
    original = collect_mod.sample_and_score

    def counting(*args, **kwargs):
        batch, failures = original(*args, **kwargs)
        sampled.append(len(batch))
        return batch, failures

    monkeypatch.setattr(collect_mod, "sample_and_score", counting)
    recipe = mini_recipe(sampler={"name": "pool", "pool_size": 8, "total_rollouts": 40, "rounds_per_step": 2},
                         rollout={"dynamic_sampling": True, "max_sampling_rounds": 2},
                         rewards=[{"name": "exact_answer"}, {"name": "soft_overlong", "max_len": 24, "buffer_len": 20}],
                         train={"steps": 3, "checkpoint_every": 3}, eval={"size": 0})
    Trainer(recipe, tmp_path / "r", log=lambda m: None).run()
    rows = [r for r in read_metrics(tmp_path / "r") if "pool/rollouts" in r]
    assert len(rows) == 3 and sum(sampled) <= 40 and all(n >= 4 for n in sampled)  # ≥ one group a round
    assert rows[-1]["pool/rollouts"] == float(sum(sampled)) and rows[-1]["pool/budget_left"] == 40.0 - sum(sampled)
    assert rows[-1]["pool/capped_rounds"] >= 1  # the cap bound: 3 × 4 groups × 4 rows alone is 48


def test_the_three_arms_spend_the_same_budget_and_differ_in_the_sampler_alone():
    def load(name):
        return load_recipe(ROOT / "recipes" / name).to_dict()

    cero, uniform, dapo = load("cero.yaml"), load("cero_uniform.yaml"), load("cero_dapo.yaml")
    g = uniform["rollout"]["num_generations"]
    budget = uniform["train"]["steps"] * uniform["train"]["prompts_per_step"] * g  # 200 × 8 × 8
    assert budget == cero["sampler"]["total_rollouts"] == dapo["sampler"]["total_rollouts"] == 12800
    assert dapo["sampler"]["rounds_per_step"] == dapo["rollout"]["max_sampling_rounds"]
    for arm in (cero, dapo):
        for key in ("model", "task", "rewards", "advantage", "loss", "optim", "eval"):
            assert arm[key] == uniform[key], key
        assert {k: v for k, v in arm["rollout"].items() if k not in ("dynamic_sampling", "max_sampling_rounds")} == \
            {k: v for k, v in uniform["rollout"].items() if k not in ("dynamic_sampling", "max_sampling_rounds")}
        assert (arm["sampler"]["pool_size"], arm["sampler"]["pool_seed"]) == (uniform["sampler"]["pool_size"],
                                                                          uniform["sampler"]["pool_seed"]) == (256, 0)
