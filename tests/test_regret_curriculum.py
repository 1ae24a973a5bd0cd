"""macro2mind's hindsight-regret curriculum (arXiv 2610.07062, INFERRED): the pure maths by hand,
the forecast task and its reward, the method's regrets, the sampler's draws, a short run and an
exact resume."""

from types import SimpleNamespace

import pytest
import torch

from reasonrl.methods.hindsight_regret.maths import (curriculum_weight, difficulty_weight, direction_magnitude_reward,
                                   hindsight_regret, success_rate)
from reasonrl.batch import RolloutBatch
from reasonrl.config import ConfigError
from reasonrl.hooks import MethodContext
from reasonrl.methods.hindsight_regret.method import HindsightRegret
from reasonrl.registry import REWARDS
from reasonrl.methods.hindsight_regret.task import parse_forecast
from reasonrl.methods.hindsight_regret.sampler import RegretCurriculum
from reasonrl.problem import Problem
from reasonrl.methods.hindsight_regret.task import ForecastTask, parse_event, render_solution

from helpers import MINI_TINY, mini_recipe, straight_and_resumed

# t=2, p0=47; groups 3,6,1,8: the odd ones (3: +5, 1: +4) matter, so p1 = 47 + 5 + 4 = 56.
PROMPT = "2#47;3+5;6-2;1+4;8-3;"
EVENT = Problem(PROMPT, "56", meta={"hindsight_prompt": PROMPT + "(31);"})
# No group matters (0 and 6 are even, like t): p1 = p0.
FLAT = Problem("2#47;0+5;6-2;", "47", meta={"hindsight_prompt": "2#47;0+5;6-2;();"})


# -- the pure maths --------------------------------------------------------------------------
def test_curriculum_weights_by_hand():
    regret = torch.tensor([0.5, 0.2, -0.3, 0.4, 0.9])
    p = torch.tensor([0.5, 0.25, 0.5, 1.0, 0.0])
    # ([r]+ + 0.01) · 4p(1−p): 0.51·1, 0.21·0.75, 0.01·1 (negative regret clipped), dropped, dropped
    expected = torch.tensor([0.51, 0.1575, 0.01, 0.0, 0.0])
    assert torch.allclose(curriculum_weight(regret, p, floor=0.01), expected)
    assert torch.allclose(curriculum_weight(regret, p), torch.tensor([0.5, 0.15, 0.0, 0.0, 0.0]))
    assert torch.allclose(difficulty_weight(torch.tensor([0.0, 0.25, 0.5, 1.0])), torch.tensor([0.0, 0.75, 1.0, 0.0]))
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        difficulty_weight(torch.tensor([1.5]))
    with pytest.raises(ValueError, match="floor"):
        curriculum_weight(regret, p, floor=-1.0)


def test_hindsight_regret_and_success_rate_by_hand():
    policy = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])  # the second group has two rows
    hind = torch.tensor([[1.0, 1.0], [0.0, 2.0]])
    # ℓ = 1 − r: row 0: (1 − 0.5) − (1 − 1) = 0.5; row 1: (1 − 2) − (1 − 1) = −1
    assert torch.allclose(hindsight_regret(policy, hind, policy_mask=mask), torch.tensor([0.5, -1.0]))
    assert torch.allclose(success_rate(policy, 1.0, mask), torch.tensor([0.5, 1.0]))
    assert torch.allclose(success_rate(policy, 2.0), torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="same n"):
        hindsight_regret(policy, hind[:1])
    with pytest.raises(ValueError, match="at least one"):
        hindsight_regret(policy, hind, hindsight_mask=torch.tensor([[1, 1], [0, 0]]))


# -- the reward ------------------------------------------------------------------------------
@pytest.mark.parametrize("completion, expected", [
    ("3+5=52;1+4=56;#56", 2.0),                 # right direction, exact: 1 + 1
    ("3+5=52;6-2=50;1+4=54;8-3=51;#51", 1.5),   # every group counted: right direction, 5 off: 1 + 0.5
    ("#47", 0.1),                               # "no move": wrong direction, 9 off: 0 + 0.1
    ("#40", 0.0),                               # wrong direction, 16 off (clipped): 0
    (" 1+4=51;#60 ", 1.6),                      # whitespace around is fine; 4 off: 1 + 0.6
    ("1+4=51;3+5=56;#56", 0.0),                 # groups out of prompt order: format gate
    ("9+1=48;#48", 0.0),                        # a group the prompt does not have
    ("3+5=52;3+5=57;#57", 0.0),                 # a repeated group
    ("3+5=52;1+4=56;", 0.0),                    # no aggregate
    ("3+5=52;1+4=56;#156", 0.0),                # a price outside 0..99
    ("56", 0.0),
])
def test_forecast_reward_by_hand(completion, expected):
    assert REWARDS.get("forecast")(completion, EVENT) == pytest.approx(expected)


def test_forecast_reward_parameters_truncation_and_flat_outcome():
    forecast, direction = REWARDS.get("forecast"), REWARDS.get("forecast_direction")
    assert forecast("#51", EVENT, eta=0.5, scale=20.0) == pytest.approx(1 + 0.5 * (1 - 5 / 20))
    assert forecast("3+5=52;1+4=56;#56", EVENT, truncated=True) == 0.0
    assert direction("#51", EVENT) == 1.0 and direction("#47", EVENT) == 0.0 and direction("x", EVENT) == 0.0
    # p1 = p0: only "no move" has the right direction (sign 0)
    assert forecast("#47", FLAT) == 2.0 and forecast("#48", FLAT) == pytest.approx(0.9)
    assert direction_magnitude_reward(47, 47, 47) == 2.0
    with pytest.raises(ValueError, match="p1"):
        forecast("#50", Problem(PROMPT, "up"))
    with pytest.raises(ValueError, match="not a forecast prompt"):
        forecast("#50", Problem("1+2;", "3"))


def test_decomposition_parser():
    d = parse_forecast("3+5=52;1+4=56;#56", PROMPT + "(31);")  # a hindsight prompt parses too
    assert d.steps == ((3, 5, 52), (1, 4, 56)) and d.forecast == 56
    assert parse_forecast("#7", PROMPT).steps == () and parse_forecast("#7", PROMPT).forecast == 7
    assert parse_forecast("3+5=52;1+4=56#56", PROMPT) is None
    assert parse_event(PROMPT) == (2, 47, [3, 6, 1, 8])
    assert parse_event("2#47;0+5;6-2;();") == (2, 47, [0, 6])


# -- the task --------------------------------------------------------------------------------
def test_task_hindsight_only_in_training_problems():
    task = ForecastTask()
    train, held_out = task.train_problems(0, 64, 3), task.eval_problems(100)
    assert all("hindsight_prompt" not in p.meta and "relevant" not in p.meta and "(" not in p.prompt
               for p in held_out)
    assert not {p.prompt for p in held_out} & {p.prompt for p in task.train_problems(5, 500, 0)}
    assert [p.prompt for p in held_out] == [p.prompt for p in ForecastTask().eval_problems(100)]  # fixed
    forecast = REWARDS.get("forecast")
    for p in train:
        topic, p0, groups = parse_event(p.prompt)
        rel = [g for g in groups if (g + topic) % 2 == 1]
        assert p.meta["hindsight_prompt"] == p.prompt + "(" + "".join(map(str, rel)) + ");"
        assert p.meta["relevant"] == "".join(map(str, rel)) and p.meta["form"] == ("hard" if topic >= 5 else "easy")
        # the rule's solution is exact unless the event had a shock nobody could read
        assert (forecast(p.solution, p) == 2.0) == (p.meta["shock"] == 0)
    assert len({p.prompt for p in task.train_problems(0, 2000, 0)}) == task.pool_size  # a fixed pool


def test_warmup_is_careless_only_on_hard_topics():
    task = ForecastTask(careless_fraction=0.7, hindsight_share=0.25)
    problems = task.warmup_problems(0, 400, 0)
    careless = {"easy": 0, "hard": 0}
    hindsight = 0
    for p in problems:
        topic, p0, _ = parse_event(p.prompt)
        ids = [int(c) for c in p.prompt[p.prompt.index("(") + 1:p.prompt.index(")")]] if "(" in p.prompt else None
        chunks = p.prompt.split("(")[0].split(";")[1:-1]
        groups = tuple((int(c[0]), int(c[1:])) for c in chunks)
        right = render_solution(p0, tuple((g, s) for g, s in groups if (g + topic) % 2))
        if ids is not None:
            hindsight += 1
            assert p.solution == right
        elif p.solution != right:
            assert p.solution == render_solution(p0, groups)  # every voice counted
            careless["hard" if topic >= 5 else "easy"] += 1
    assert careless["easy"] == 0 and careless["hard"] > 60 and 60 < hindsight < 140


# -- the sampler -----------------------------------------------------------------------------
class ListTask:
    """The same candidates every step and round: prompts ``names`` in order."""

    def __init__(self, names):
        self.names = names

    def train_problems(self, step, count, seed):
        return [Problem(self.names[i % len(self.names)], "0") for i in range(count)]


def test_sampler_weights_draws_and_metrics_by_hand():
    s = RegretCurriculum(ListTask(list("abcd")), seed=0, pool=2, floor=0.0)
    s.observe([Problem(x, "0") for x in "abc"], [[1, 0], [1, 1], [0, 0]], step=0)  # p̂ = ½, 1, 0
    s.record_regrets({"a": 0.6, "b": 0.9, "c": 0.9})
    # d is unseen: p̂ = ½ and the mean known regret (0.6 + 0.9 + 0.9) / 3 = 0.8
    cands = [Problem(x, "0") for x in "abcd"]
    assert torch.allclose(s.weights(cands), torch.tensor([0.6, 0.0, 0.0, 0.8], dtype=torch.float64))
    for step in range(1, 30):  # b and c are dropped: never chosen while a and d survive
        assert [p.prompt for p in s.problems(step, 2)] == ["a", "d"]
        m = s.metrics()
        assert m == pytest.approx({"regret/mean": 0.8, "regret/known": 3.0, "regret/dropped": 0.5,
                                   "regret/unseen": 0.25, "regret/weight_candidates": 0.35,
                                   "regret/weight_chosen": 0.7})
    s3 = RegretCurriculum(ListTask(list("abcdef")), seed=0, pool=2, floor=0.01)
    s3.observe([Problem(x, "0") for x in "bcef"], [[1.0], [0.0], [2.0], [0.5]], step=0)  # all at p̂ ∈ {0, 1}
    s3.record_regrets({})
    chosen = [p.prompt for p in s3.problems(1, 3)]  # a and d survive; one dropped candidate fills the step
    assert len(chosen) == 3 and {"a", "d"} <= set(chosen)


def test_sampler_resumes_exactly_and_refuses_a_run_without_regrets():
    task = ForecastTask(pool_size=16)
    a = RegretCurriculum(task, seed=1, pool=4)
    first = a.problems(0, 4)
    a.observe(first, [[2.0, 0.0], [1.5, 1.5], [0.0, 0.0], [1.0, 0.5]], step=0)
    a.record_regrets({first[0].prompt: 0.7, first[1].prompt: -0.2})
    b = RegretCurriculum(task, seed=1, pool=4)
    b.load_state_dict(a.state_dict())
    for step in range(1, 6):
        assert [p.prompt for p in a.problems(step, 4)] == [p.prompt for p in b.problems(step, 4)]
        assert a.metrics() == b.metrics()
    lonely = RegretCurriculum(task, seed=1)
    lonely.observe(first, [[1.0]] * 4, step=0)
    with pytest.raises(ValueError, match="hindsight_regret"):
        lonely.problems(1, 4)


def test_recipe_without_the_method_is_refused():
    with pytest.raises(ConfigError, match="hindsight_regret"):
        mini_recipe(task={"name": "forecast"}, rewards=[{"name": "forecast"}], sampler={"name": "regret_curriculum"})


# -- the method ------------------------------------------------------------------------------
class ScriptedPolicy:
    """Answers each hindsight prompt with the scripted texts (H of them)."""

    def __init__(self, texts):
        self.texts, self.prompts = texts, []

    def sample(self, prompts, n, max_new_tokens, temperature, generator, stop):
        self.prompts += prompts
        texts = [t for p in prompts for t in self.texts[p]]
        assert all(len(self.texts[p]) == n for p in prompts)
        return SimpleNamespace(texts=texts, completion_mask=torch.ones(len(texts), 3, dtype=torch.long),
                               truncated=torch.zeros(len(texts), dtype=torch.bool))


def forecast_scorer(texts, problems, num_tokens, truncated, group_size):
    fn = REWARDS.get("forecast")
    return SimpleNamespace(total=[fn(t, p, truncated=tr) for t, p, tr in zip(texts, problems, truncated)])


def test_method_regrets_by_hand():
    recipe = mini_recipe(task={"name": "forecast"}, rewards=[{"name": "forecast"}],
                         methods=[{"name": "hindsight_regret", "num_hindsight": 2}])
    plain = Problem("3#50;2+1;", "51")  # no hindsight: skipped
    problems = [EVENT] * 4 + [FLAT] * 2 + [plain] * 2
    n = len(problems)
    batch = RolloutBatch(prompt_ids=torch.ones(n, 1, dtype=torch.long), prompt_mask=torch.ones(n, 1, dtype=torch.long),
                         completion_ids=torch.ones(n, 1, dtype=torch.long),
                         completion_mask=torch.ones(n, 1, dtype=torch.long),
                         group_ids=torch.tensor([0, 0, 0, 0, 1, 1, 2, 2]),
                         rewards=torch.tensor([2.0, 1.5, 0.0, 0.1, 2.0, 2.0, 1.0, 1.0]),
                         truncated=torch.zeros(n, dtype=torch.bool), meta={"problem": problems})
    policy = ScriptedPolicy({EVENT.meta["hindsight_prompt"]: ["3+5=52;1+4=56;#56", "#51"],  # 2.0, 1.5
                             FLAT.meta["hindsight_prompt"]: ["#47", "#48"]})  # 2.0, 0.9
    sampler = RegretCurriculum(ForecastTask(pool_size=4))
    method = HindsightRegret(num_hindsight=2)
    method.setup(MethodContext(recipe=recipe, policy=policy, run_dir=None, log=print, scorer=forecast_scorer,
                               task=ForecastTask(pool_size=4), generator=torch.Generator(), sampler=sampler))
    m = method.annotate(batch, step=0)
    # EVENT: 1.75 − mean(2, 1.5, 0, 0.1) = 0.85; FLAT: 1.45 − 2 = −0.55
    assert sampler.regrets == pytest.approx({PROMPT: 0.85, FLAT.prompt: -0.55})
    assert m["hindsight/regret"] == pytest.approx(0.15) and m["hindsight/regret_positive"] == 0.5
    assert m["hindsight/reward"] == pytest.approx((1.75 + 1.45) / 2)
    assert m["hindsight/policy_reward"] == pytest.approx((3.6 + 4.0) / 6)
    assert m["hindsight/covered"] == pytest.approx(2 / 3) and m["hindsight/samples"] == 4.0
    assert m["hindsight/tokens"] == 12.0 and policy.prompts == [EVENT.meta["hindsight_prompt"], FLAT.meta["hindsight_prompt"]]
    assert torch.equal(batch.rewards, torch.tensor([2.0, 1.5, 0.0, 0.1, 2.0, 2.0, 1.0, 1.0]))  # never trained on
    with pytest.raises(ValueError, match="hindsight_prompt"):
        method.annotate(batch.select([6, 7]), step=1)


# -- runs ------------------------------------------------------------------------------------
def curriculum_recipe(**extra):
    return mini_recipe(model={"backend": "tiny", "tiny": {**MINI_TINY, "task": "forecast"}},
                       task={"name": "forecast", "pool_size": 16}, rewards=[{"name": "forecast"}],
                       sampler={"name": "regret_curriculum", "pool": 2},
                       methods=[{"name": "hindsight_regret", "num_hindsight": 2}],
                       rollout={"num_generations": 4, "max_new_tokens": 32},
                       eval={"size": 8, "reward": "forecast_direction"}, **extra)


def test_short_run_logs_regret_metrics_and_resumes_exactly(tmp_path, monkeypatch):
    rows = straight_and_resumed(curriculum_recipe(), tmp_path, monkeypatch)
    steps = [r for r in rows if r["step"] > 0 and "reward/mean" in r]
    assert len(steps) == 4
    for r in steps:
        assert r["hindsight/samples"] == 4 * 2 and r["hindsight/covered"] == 1.0
        assert {"regret/mean", "regret/known", "regret/dropped", "regret/weight_chosen",
                "regret/weight_candidates", "hindsight/regret", "hindsight/tokens"} <= set(r)
    assert steps[-1]["regret/known"] >= 1  # regrets reached the sampler
