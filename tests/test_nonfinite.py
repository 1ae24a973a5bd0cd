"""Issue 29, items 5 and 8: a reward that is huge, or not a number, scores 0 and is counted
(it never reaches the batch as inf); an update whose loss or gradient is not finite is skipped
(no weight or optimiser state changes), logged, and N such steps in a row stop the run with a
clear error while its checkpoints stay loadable."""

from __future__ import annotations

import json
import math
import textwrap

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from helpers import MINI_TINY, mini_policy, mini_recipe, registered, weights
from reasonrl.cli import main
from reasonrl.metrics_log import read_metrics
from reasonrl.problem import Problem
from reasonrl.rewards.scorer import RewardSpec, Scorer, _call, build_scorer
from reasonrl.config import ConfigError, recipe_from_dict
from reasonrl.sections import OptimConfig
from reasonrl.train import checkpoint as ckpt
from reasonrl.train.optim import Learner
from reasonrl.train.trainer import NonFiniteError, Trainer

P = Problem(prompt="2+3*4;", answer="14")
PROXY = [{"name": "proxy_length_keyword", "max_len": 24}]  # rewards that differ inside groups of an untrained model




def rows(texts):
    return texts, [P] * len(texts), [1] * len(texts), [False] * len(texts)


# -- rewards: numbers only, finite in float32 -------------------------------------------------------------

RETURNS = {"str": "1.0", "bool": True, "npbool": np.bool_(True), "tensor": torch.tensor(1.0), "list": [1.0],
           "huge": 1e300, "bigint": 10 ** 400, "f32over": 3.5e38, "nan": math.nan,
           "int": 2, "float": 0.25, "np32": np.float32(0.5), "np64": np.float64(-1.5), "npint": np.int64(3),
           "f32max": 3.4e38, "none": None}


def returns(completion, problem, **_):
    return RETURNS[completion]


@pytest.mark.parametrize("key, message", [
    ("str", "returned str '1.0', not a number"), ("bool", "returned bool True, not a number"),
    ("npbool", "returned bool np.True_, not a number"), ("tensor", "returned Tensor tensor(1.), not a number"),
    ("list", "returned list [1.0], not a number"),
    ("huge", "returned a reward that is not finite in float32 (1e+300)"),
    ("bigint", "returned a reward that is not finite in float32 (1000"),
    ("f32over", "not finite in float32 (3.5e+38)"), ("nan", "not finite in float32 (nan)")])
def test_a_reward_that_is_not_a_float32_number_is_refused_with_its_type(key, message):
    status, error = _call(returns, False, (key, P, 1, False), {})
    assert status == "error" and message in error


def test_refused_rewards_score_zero_and_are_counted():
    texts = list(RETURNS)
    with registered(_returns=returns), Scorer([RewardSpec("_returns")]) as scorer:
        with pytest.warns(UserWarning, match="reward '_returns' failed \\(returned str '1.0', not a number\\)"):
            scores = scorer(*rows(texts))
    got = dict(zip(texts, scores.per_function["_returns"]))
    assert got == {"str": 0.0, "bool": 0.0, "npbool": 0.0, "tensor": 0.0, "list": 0.0, "huge": 0.0, "bigint": 0.0,
                   "f32over": 0.0, "nan": 0.0, "int": 2.0, "float": 0.25, "np32": 0.5, "np64": -1.5, "npint": 3.0,
                   "f32max": 3.4e38, "none": 0.0}
    assert all(type(v) is float for v in scores.per_function["_returns"])
    assert scores.failures == {"_returns": 9}  # None is "no opinion", not a failure
    assert scores.total == scores.per_function["_returns"]


def test_a_group_reward_with_one_refused_value_fails_its_group():
    def group(completions, problem, **_):
        return ["1.0" if c == "s" else 1.0 for c in completions]
    group.group_reward = True
    with registered(_group=group), Scorer([RewardSpec("_group")]) as scorer:
        with pytest.warns(UserWarning, match="str '1.0', not a number.*that group"):
            scores = scorer(*rows(["a", "s", "b", "c"]), group_size=2)
    assert scores.per_function["_group"] == [0.0, 0.0, 1.0, 1.0] and scores.failures == {"_group": 2}


def test_a_weighted_total_that_overflows_float32_zeroes_and_counts_its_terms():
    def big(completion, problem, **_):
        return 3e38 if completion == "big" else 1.0

    def small(completion, problem, **_):
        return 0.0 if completion == "zero" else 1.0

    specs = [RewardSpec("_big", weight=1.0), RewardSpec("_big2", weight=0.5), RewardSpec("_small", weight=2.0)]
    with registered(_big=big, _big2=big, _small=small), Scorer(specs) as scorer:
        with pytest.warns(UserWarning, match=r"the weighted total Σ w·R \(4.5e\+38\) overflows float32"):
            scores = scorer(*rows(["ok", "big"]))
    # 3e38 + 0.5·3e38 + 2 overflows float32 though each term does not: every non-zero term fails.
    assert scores.per_function == {"_big": [1.0, 0.0], "_big2": [1.0, 0.0], "_small": [1.0, 0.0]}
    assert scores.failures == {"_big": 1, "_big2": 1, "_small": 1}
    assert scores.total == [3.5, 0.0]
    assert torch.tensor(scores.total, dtype=torch.float32).isfinite().all()


@pytest.mark.parametrize("weight", [math.inf, math.nan, 1e39, True, "1"])
def test_a_reward_weight_must_be_finite_in_float32(weight):
    with pytest.raises(ValueError, match="'weight' of reward 'format' must be a number finite in float32"):
        Scorer([RewardSpec("format", weight=weight)])
    if isinstance(weight, float):
        with pytest.raises(ConfigError, match="weight"):
            build_scorer(mini_recipe(rewards=[{"name": "format", "weight": weight}]))


def huge_on_odd(completion, problem, **_):
    return 1e300 if len(completion) % 2 else 1.0


def test_a_huge_reward_no_longer_poisons_the_run(tmp_path):
    """The issue's probe: before, 1e300 became inf in the batch, the weights NaN, and the next
    sampling step crashed ("probability tensor contains either inf, nan")."""
    with registered(_huge=huge_on_odd):
        recipe = mini_recipe(rewards=[{"name": "_huge"}], train={"threads": 1, "steps": 2}, eval={"size": 0})
        with pytest.warns(UserWarning, match="'_huge' failed \\(returned a reward that is not finite in float32"):
            Trainer(recipe, tmp_path / "run", log=lambda m: None).run()
    train = [r for r in read_metrics(tmp_path / "run") if "loss" in r]
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        failed = r.get("reward_failures/_huge", 0)
        assert 0 < failed < 16  # some completions had odd lengths, not all (4 prompts × 4 samples)
        assert r["reward/mean"] == pytest.approx((16 - failed) / 16)  # the huge ones scored 0, the rest 1
        assert math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) and "train/nonfinite_updates" not in r
    assert all(w.isfinite().all() for w in weights(tmp_path / "run").values())


# -- the update guard: the Learner -----------------------------------------------------------------------

class Rows:
    """A batch of feature rows, as far as ``Learner.optimise`` needs one."""

    def __init__(self, x):
        self.x = x

    def __len__(self):
        return len(self.x)

    def split(self, size):
        return [Rows(part) for part in self.x.split(size)]


def adam_state(learner):
    (state,) = learner.optimizer.state.values()
    return {k: v.clone() for k, v in state.items()}


def test_the_learner_skips_a_nonfinite_loss_or_gradient_without_touching_weights_or_adam():
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5]))
    learner = Learner([w], OptimConfig(lr=0.1, warmup_steps=0), total_steps=10)

    def linear(micro, mini, _p, _j):
        return (micro.x @ w).sum(), {"loss": 1.0}

    def sqrt_of_zero(micro, mini, _p, _j):  # a finite loss (0) whose gradient is NaN
        return torch.sqrt((micro.x @ w).sum() * 0.0), {}

    good = Rows(torch.ones(4, 3))
    learner.optimise(good, linear, micro_batch_size=2)
    assert learner.skipped == []
    before_w, before_adam = w.detach().clone(), adam_state(learner)
    assert before_adam["step"].item() == 1

    # A NaN in the second micro-batch spoils the whole accumulated mini-batch.
    poisoned = Rows(torch.tensor([[1.0, 1, 1], [1, 1, 1], [1, float("nan"), 1], [1, 1, 1]]))
    sums, norms = learner.optimise(poisoned, linear, micro_batch_size=2)
    assert learner.skipped == ["pass 0, mini-batch 0: non-finite loss nan (micro-batch 1)"]
    assert math.isnan(norms[0]) and sums == {"loss": 2.0}
    sums, norms = learner.optimise(good, sqrt_of_zero, micro_batch_size=4)
    assert learner.skipped == ["pass 0, mini-batch 0: non-finite gradient norm nan"] and math.isnan(norms[0])
    assert torch.equal(w.detach(), before_w) and w.grad is None
    after = adam_state(learner)
    assert all(torch.equal(after[k], before_adam[k]) for k in before_adam)

    # Two mini-batches and two passes: only the poisoned mini-batch is skipped, each time.
    mixed = Rows(torch.tensor([[1.0, 1, 1], [1, 1, 1], [float("inf"), 0, 0], [float("inf"), 0, 0]]))
    _, norms = learner.optimise(mixed, linear, passes=2, mini_batch_size=2, micro_batch_size=2)
    assert learner.skipped == ["pass 0, mini-batch 1: non-finite loss inf (micro-batch 0)",
                               "pass 1, mini-batch 1: non-finite loss inf (micro-batch 0)"]
    assert [math.isfinite(n) for n in norms] == [True, False, True, False]
    assert adam_state(learner)["step"].item() == 3 and w.isfinite().all()


# -- the update guard: a run -----------------------------------------------------------------------------

NAN_ADVANTAGE = textwrap.dedent("""
    from reasonrl.registry import ADVANTAGES

    def nan_on_steps(token_rewards, response_mask, group_ids, *, step, steps=()):
        '''GRPO's advantages, NaN on the (0-based) training steps in ``steps``.'''
        adv = ADVANTAGES.get("grpo")(token_rewards, response_mask, group_ids)
        return adv * float("nan") if step in steps else adv
""")


@pytest.fixture
def nan_advantage(tmp_path):
    path = tmp_path / "nanadv.py"
    path.write_text(NAN_ADVANTAGE)
    return f"{path}:nan_on_steps"


def ckpt_weights(run, step):
    return load_file(str(run / "checkpoints" / f"step_{step:06d}" / "model" / "model.safetensors"))


def same(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


def test_a_nonfinite_step_is_skipped_and_logged_and_the_run_goes_on(tmp_path, nan_advantage):
    run, lines = tmp_path / "run", []
    recipe = mini_recipe(rewards=PROXY, advantage={"name": nan_advantage, "params": {"steps": [1]}},
                         train={"threads": 1, "steps": 3, "checkpoint_every": 1, "keep_checkpoints": 5}, eval={"size": 0})
    Trainer(recipe, run, log=lines.append).run()
    train = {r["step"]: r for r in read_metrics(run) if "lr" in r}
    assert train[2]["train/nonfinite_updates"] == 1 and train[2]["loss"] is None and train[2]["grad_norm"] is None
    assert all("train/nonfinite_updates" not in train[s] and train[s]["grad_norm"] > 0 for s in (1, 3))
    assert [line for line in lines if "skipped" in line] == [
        "warning: step 2: skipped 1 update(s) (pass 0, mini-batch 0: non-finite loss nan (micro-batch 0)); "
        "1 such step(s) in a row, the run stops at train.max_nonfinite_steps=3"]
    # The skipped step changed no weight; the steps around it did.
    assert same(ckpt_weights(run, 1), ckpt_weights(run, 2)) and not same(ckpt_weights(run, 2), ckpt_weights(run, 3))
    # ... and no optimiser state: Adam took 2 steps in 3 training steps.
    state, _ = ckpt.load_latest(run, mini_policy())
    assert {int(s["step"]) for s in state["optimizer"]["state"].values()} == {2}
    assert state["train_state"]["nonfinite_streak"] == 0


def test_logra_skips_a_nonfinite_step_too(tmp_path, nan_advantage):
    run = tmp_path / "run"
    recipe = mini_recipe(rewards=PROXY, optim={"name": "logra", "params": {"rank": 4, "update_ratio": 1e-3}},
                         advantage={"name": nan_advantage, "params": {"steps": [1]}},
                         train={"threads": 1, "steps": 3, "checkpoint_every": 1, "keep_checkpoints": 5}, eval={"size": 0})
    Trainer(recipe, run, log=lambda m: None).run()
    assert [r.get("train/nonfinite_updates") for r in read_metrics(run) if "lr" in r] == [None, 1, None]
    assert same(ckpt_weights(run, 1), ckpt_weights(run, 2)) and not same(ckpt_weights(run, 2), ckpt_weights(run, 3))
    state = ckpt.load_latest(run, mini_policy())[0]["logra"]
    assert state["k"] == 2 and all(v.isfinite().all() for v in state["v"].values())  # two updates, v untouched by NaN


def test_nonfinite_steps_in_a_row_stop_the_run_and_its_checkpoint_resumes(tmp_path, nan_advantage, capsys):
    run = tmp_path / "run"
    raw = {"model": {"backend": "tiny", "tiny": dict(MINI_TINY)}, "rollout": {"num_generations": 4},
           "rewards": PROXY, "train": {"threads": 1, "steps": 5, "prompts_per_step": 4, "micro_batch_size": 8,
                                       "checkpoint_every": 1, "keep_checkpoints": 9, "max_nonfinite_steps": 2},
           "eval": {"size": 0}, "log": {"plots": False, "progress": False}}
    (tmp_path / "r.yaml").write_text(json.dumps({**raw, "advantage": {"name": nan_advantage,
                                                                       "params": {"steps": [1, 2]}}}))
    assert main(["train", str(tmp_path / "r.yaml"), "-o", str(run)]) == 1
    err = capsys.readouterr().err
    assert ("reasonrl: error: step 3: 2 training steps in a row (train.max_nonfinite_steps=2) had a non-finite "
            "loss or gradient; last: pass 0, mini-batch 0: non-finite loss nan (micro-batch 0).") in err
    assert f"the last checkpoint, {run / 'checkpoints' / 'step_000002'}, is intact" in err
    assert err.count("warning: step") == 2 and "Traceback" not in err
    # Stopped in step 3, before its checkpoint; step 2 (skipped) holds the weights of step 1.
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000001", "step_000002"]
    assert same(ckpt_weights(run, 1), ckpt_weights(run, 2))
    assert not (run / "final_model").exists()
    # The last checkpoint loads, and the run continues from it (here with the NaN gone).
    Trainer(recipe_from_dict(raw), run, resume=True, log=lambda m: None).run()
    assert all(w.isfinite().all() for w in weights(run).values())
    assert [r["step"] for r in read_metrics(run) if "lr" in r] == [1, 2, 3, 4, 5]


def test_a_run_that_never_checkpointed_says_so(tmp_path, nan_advantage):
    recipe = mini_recipe(advantage={"name": nan_advantage, "params": {"steps": [0]}}, rollout={"max_new_tokens": 4},
                         train={"threads": 1, "steps": 2, "prompts_per_step": 2, "max_nonfinite_steps": 1}, eval={"size": 0})
    with pytest.raises(NonFiniteError, match="^step 1: 1 training steps in a row .*no checkpoint was written yet"):
        Trainer(recipe, tmp_path / "run", log=lambda m: None).run()


def test_max_nonfinite_steps_is_checked():
    with pytest.raises(ConfigError, match="max_nonfinite_steps must be >= 1"):
        mini_recipe(train={"max_nonfinite_steps": 0})
