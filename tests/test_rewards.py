import math

import pytest

from reasonrl.registry import REWARDS
from reasonrl.rewards.basic import exact_answer, soft_overlong, worked_format
from reasonrl.rewards.scorer import RewardSpec, Scorer
from reasonrl.problem import Problem

P = Problem(prompt="2+3*4;", answer="14")


def test_exact_answer_and_format():
    assert exact_answer("3*4=12;2+12=14;####14", P) == 1.0
    assert exact_answer("####14.0", P) == 1.0
    assert exact_answer("####15", P) == 0.0
    assert exact_answer("14", P) == 0.0  # no answer marker
    assert worked_format("3*4=12;2+12=14;####14", P) == 1.0
    assert worked_format("3*4=12;2+12=14;####", P) == 0.0
    assert worked_format("####14", P) == 0.0


def test_soft_overlong_regions():
    # max_len 20, buffer 5: free up to 15, linear to -1 at 20, -1 beyond.
    kw = dict(completion="", problem=P, truncated=False, max_len=20, buffer_len=5)
    assert soft_overlong(num_tokens=15, **kw) == 0.0
    assert soft_overlong(num_tokens=17, **kw) == pytest.approx(-0.4)
    assert soft_overlong(num_tokens=21, **kw) == -1.0


@pytest.fixture
def broken_rewards():
    def boom(completion, problem, **_):
        if "x" in completion:
            raise RuntimeError("verifier crashed")
        return 1.0

    def nan(completion, problem, **_):
        return math.nan

    REWARDS._items["_boom"], REWARDS._items["_nan"] = boom, nan
    yield
    del REWARDS._items["_boom"], REWARDS._items["_nan"]


def test_scorer_weights_and_isolates_failures(broken_rewards):
    scorer = Scorer([RewardSpec("exact_answer", 2.0), RewardSpec("_boom", 0.5), RewardSpec("_nan", 1.0)])
    with pytest.warns(UserWarning) as caught:
        s = scorer(["####14", "x####14", "####1"], [P, P, P], [6, 7, 5], [False] * 3)
    # one warning per failing function, not one per failing sample
    assert sorted(str(w.message).split("'")[1] for w in caught) == ["_boom", "_nan"]
    assert s.total == [2.5, 2.0, 0.5]
    assert s.failures == {"exact_answer": 0, "_boom": 1, "_nan": 3}
    assert s.per_function["_boom"] == [1.0, 0.0, 1.0]
