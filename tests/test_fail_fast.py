"""Fail fast, and say why (issue 35, item 2; item 6's reward names): a reward that fails on most
calls stops the run with its own error and the signature it is called with; TRL's batched reward
signature is accepted; option values are checked at load; prompts the tokenizer cannot read are
refused; steps with no learning signal are warned about; a file's reward is named by its function."""

import json
import textwrap

import pytest

from reasonrl.cli import main
from reasonrl.config import ConfigError, recipe_from_dict
from reasonrl.metrics_log import read_metrics
from reasonrl.params import check_reward_signature, guarded_choices, reward_style
from reasonrl.problem import Problem
from reasonrl.rewards.scorer import RewardFailedError, RewardSpec, Scorer, build_scorer, reward_metric_names
from reasonrl.tasks.base import build_task
from reasonrl.train.guards import FlatSteps, check_prompt_characters, reward_metrics
from reasonrl.train.trainer import Trainer

from helpers import MINI_TINY, mini_policy, mini_recipe, registered

P = Problem("1+1;", "2", meta={"form": "a+b", "index": 7})


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def rows(texts, problem=P):
    return texts, [problem] * len(texts), [len(t) for t in texts], [False] * len(texts)


# --- a reward that fails on most calls stops the run -------------------------------------------

def fails_on_x(completion, problem, **_):
    if "x" in completion:
        raise LookupError("no gold field for this row")
    return 1.0


def test_the_run_stops_after_patience_calls_past_the_share():
    with registered(_fx=fails_on_x), Scorer([RewardSpec("_fx")], max_failure_share=0.5, failure_patience=3) as s:
        assert s(*rows(["x", "x", "1", "1"])).failures == {"_fx": 2}  # 2 of 4: not more than half
        assert s(*rows(["x", "x", "x", "1"])).failures == {"_fx": 3}  # 1st in a row
        assert s(*rows(["x", "x", "x", "x"])).failures == {"_fx": 4}  # 2nd
        s(*rows(["1", "1", "1", "1"]))  # a call that works resets the count
        s(*rows(["x", "x", "x", "1"]))
        s(*rows(["x", "x", "x", "1"]))
        with pytest.raises(RewardFailedError) as err:
            s(*rows(["x", "x", "x", "x"]))
    msg = str(err.value)
    assert isinstance(err.value, ConfigError)  # the CLI exits 2 on it
    assert "reward '_fx' failed on 4 of 4 completions in the last of 3 scoring calls in a row" in msg
    assert "rollout.reward_max_failure_share=0.5" in msg and "rollout.reward_failure_patience=3" in msg
    # The reward's own exception, raised in a worker process, and where it was raised.
    assert "raised LookupError: no gold field for this row (at " in msg and "test_fail_fast.py:" in msg
    assert "reasonrl calls it as fn(completion: str, problem: Problem, *, num_tokens: int" in msg
    assert "its signature is fails_on_x(completion, problem, **_)" in msg


def test_a_scorer_built_by_hand_never_stops_and_the_recipe_keys_are_checked():
    with registered(_fx=fails_on_x), Scorer([RewardSpec("_fx", workers=2)]) as s:
        for _ in range(4):
            assert s(*rows(["x"] * 3)).failures == {"_fx": 3}
    recipe = recipe_from_dict({"rollout": {"reward_max_failure_share": 0.25, "reward_failure_patience": 1}})
    with build_scorer(recipe) as scorer:
        assert (scorer.max_failure_share, scorer.failure_patience) == (0.25, 1)
    for key, value in (("reward_max_failure_share", 1.5), ("reward_failure_patience", -1)):
        with pytest.raises(ConfigError, match=f"rollout.{key} must be"):
            recipe_from_dict({"rollout": {key: value}})


def test_a_reward_failing_every_call_stops_training_with_exit_2(tmp_path, capsys):
    """Before: 32 of 32 calls failed on every step, the run trained on zeros to the end (exit 0)."""
    write(tmp_path / "gold.py", """
        def needs_gold(completions, gold, **kwargs):
            return [float(c == g) for c, g in zip(completions, gold)]
    """)
    raw = {"model": {"backend": "tiny", "tiny": MINI_TINY}, "rewards": [{"name": str(tmp_path / "gold.py:needs_gold")}],
           "rollout": {"num_generations": 4, "max_new_tokens": 8, "reward_failure_patience": 2},
           "train": {"steps": 5, "prompts_per_step": 4, "checkpoint_every": 10}, "eval": {"size": 0},
           "log": {"plots": False, "progress": False}}
    (tmp_path / "r.yaml").write_text(json.dumps(raw))
    assert main(["train", str(tmp_path / "r.yaml"), "-o", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "reasonrl: error: reward 'needs_gold'" in err and "Traceback" not in err
    assert "failed on 16 of 16 completions in the last of 2 scoring calls in a row" in err
    assert "raised TypeError: it needs 'gold', which the call does not supply (it supplies: prompts, completions, " in err
    assert "answer, solution, form, bracketed;" in err  # the arithmetic task's problem.meta keys
    assert "(TRL's reward-function signature" in err and "its signature is needs_gold(completions, gold, **kwargs)" in err
    assert [r["step"] for r in read_metrics(tmp_path / "run") if "loss" in r] == [1]  # stopped in step 2


# --- TRL's batched signature ------------------------------------------------------------------

def trl_reward(prompts, completions, answer, **kwargs):
    assert len(prompts) == len(completions) == len(answer) == len(kwargs["form"]) == len(kwargs["solution"])
    return [None if c == "skip" else len(c) + 10 * int(a) + kwargs["index"][0] for c, a in zip(completions, answer)]


def declared_only(completions, index):  # no **kwargs: only the names it declares
    return [float(i) for i in index]


def test_trl_style_rewards_get_keyword_lists_per_group():
    assert reward_style(trl_reward) == "batched" and reward_style(fails_on_x) == "completion"
    with registered(_trl=trl_reward, _decl=declared_only), \
            Scorer([RewardSpec("_trl"), RewardSpec("_decl", weight=0.5)]) as s:
        other = Problem("2+2;", "4", meta={"index": 3, "form": "a+b"})
        scores = s(["12", "skip", "1234", "1"], [P, P, other, other], [2, 4, 4, 1], [False] * 4, group_size=2)
    # Group 1: answer 2, index 7; group 2: answer 4, index 3. One call per group, lists of 2.
    assert scores.per_function["_trl"] == [2 + 20 + 7, 0.0, 4 + 40 + 3, 1 + 40 + 3]  # None: 0, not a failure
    assert scores.per_function["_decl"] == [7.0, 7.0, 3.0, 3.0]
    assert scores.failures == {"_trl": 0, "_decl": 0}
    assert scores.total == [29 + 3.5, 3.5, 47 + 1.5, 44 + 1.5]


def test_a_trl_reward_from_a_file_trains_named_by_its_function(tmp_path):
    path = write(tmp_path / "user" / "trl_rewards.py", """
        def r(prompts, completions, answer, **kwargs):
            assert len(kwargs["form"]) == len(completions)  # the arithmetic task's meta columns
            return [None if a.startswith("-") else len(a) + 0.01 * len(p) for p, a in zip(prompts, answer)]
    """)
    recipe = mini_recipe(rewards=[{"name": f"{path}:r"}], train={"steps": 2}, eval={"size": 0})
    Trainer(recipe, tmp_path / "run", log=lambda m: None).run()
    task, g = build_task(recipe), recipe.rollout.num_generations
    rows_ = [r for r in read_metrics(tmp_path / "run") if "loss" in r]
    for step, row in enumerate(rows_):
        problems = task.train_problems(step, recipe.train.prompts_per_step, recipe.train.seed)
        hand = [0.0 if p.answer.startswith("-") else len(p.answer) + 0.01 * len(p.prompt) for p in problems]
        assert row["reward/r"] == pytest.approx(sum(hand) * g / (len(hand) * g), abs=1e-6)
        assert row["reward/mean"] == pytest.approx(row["reward/r"], abs=1e-5)
        assert "reward_failures/r" not in row and not any("trl_rewards.py" in k for k in row)
    assert len(rows_) == 2


def test_a_trl_reward_reads_the_completion_token_ids(tmp_path):
    path = write(tmp_path / "ids.py", """
        def lengths(completions, completion_ids, **kwargs):
            return [float(len(ids)) for ids in completion_ids]
    """)
    recipe = mini_recipe(rewards=[{"name": f"{path}:lengths"}], train={"steps": 2}, eval={"size": 0})
    Trainer(recipe, tmp_path / "run", log=lambda m: None).run()
    rows_ = [r for r in read_metrics(tmp_path / "run") if "loss" in r]
    assert len(rows_) == 2 and all("reward_failures/lengths" not in r for r in rows_)
    for row in rows_:  # one reward per token the model wrote: the mean is the mean completion length
        assert row["reward/lengths"] == pytest.approx(row["response_length/mean"], abs=1e-5)


# --- reward signatures and names at load --------------------------------------------------------

def test_a_reward_that_cannot_be_called_is_refused_at_load(tmp_path):
    write(tmp_path / "bad.py", """
        def two(text, problem):
            return 1.0
        def grouped(completions, problem, **_):
            return [1.0] * len(completions)
        def needs(completion, problem, *, gold, **_):
            return 1.0
        def one(completion, **_):
            return 1.0
        def batch(completions, **kwargs):
            return [1.0] * len(completions)
    """)
    for fn, expected in (("two", r"unexpected keyword argument 'num_tokens'.*its signature is two\(text, problem\)"),
                         ("grouped", "must be marked @group_reward"),
                         ("one", r"too many positional arguments.*its signature is one\(completion, \*\*_\)")):
        with pytest.raises(ConfigError, match=expected):
            recipe_from_dict({"rewards": [{"name": str(tmp_path / f"bad.py:{fn}")}]})
    # A parameter of its own that the recipe can set is the call's business, as before.
    for raw in ({"name": str(tmp_path / "bad.py:needs"), "gold": "4"}, {"name": str(tmp_path / "bad.py:needs")}):
        assert recipe_from_dict({"rewards": [raw]}).rewards[0].params == {k: v for k, v in raw.items() if k != "name"}
    with pytest.raises(ConfigError, match="eval.reward .* scores groups or batches"):
        recipe_from_dict({"eval": {"reward": str(tmp_path / "bad.py:batch")}})


def test_metric_names_of_file_rewards():
    names = ["exact_answer", "/a/x/rew.py:score", "/a/y/other.py:score", "/a/z/rew.py:score", "/a/b.py:mean",
             "/a/c.py:Judge.call", "pkg.mod:fn", "/a/d.py:exact_answer"]
    assert reward_metric_names(names) == {
        "exact_answer": "exact_answer", "/a/x/rew.py:score": "rew.score", "/a/y/other.py:score": "other.score",
        "/a/z/rew.py:score": "rew.score#2", "/a/b.py:mean": "b.mean",  # reward/mean is the trainer's
        "/a/c.py:Judge.call": "Judge.call", "pkg.mod:fn": "pkg.mod:fn", "/a/d.py:exact_answer": "d.exact_answer"}
    assert reward_metric_names(["/a/x/rew.py:score"]) == {"/a/x/rew.py:score": "score"}
    meta = {"reward//a/x/rew.py:score": [1.0, 0.0], "reward/env": [2.0, 2.0], "prompt": ["a", "b"]}
    assert reward_metrics(meta, {"/a/x/rew.py:score": 3, "exact_answer": 0}, ["/a/x/rew.py:score", "exact_answer"]) \
        == {"reward/score": 0.5, "reward/env": 2.0, "reward_failures/score": 3}


# --- option values checked at load -----------------------------------------------------------

def test_a_bad_literal_exits_2_before_any_run_folder(tmp_path, capsys):
    """Before: `--set advantage.scale=groups` ran ~10 s, crashed with a ValueError traceback in
    the first advantage, and left a run folder with recipe.json and an empty metrics.jsonl."""
    from helpers import RECIPES

    code = main(["train", str(RECIPES / "grpo.yaml"), "--set", "advantage.scale=groups", "-o", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "'advantage.scale' must be one of group, batch, none; got 'groups'. Did you mean 'group'?" in err, err
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match="'off_policy.mode' must be one of mask, truncate; got 'clip'"):
        recipe_from_dict({"off_policy": {"name": "decoupled_ppo", "mode": "clip"}})


GUARDS = '''
import math
CHOICES = ("a", "b")
SCALE = ["x"]  # mutable: not trusted

def guarded(x, *, mode="a", level="p", other=1, late="q", renamed="A"):
    """doc"""
    math.sqrt(4)
    if mode not in CHOICES or other < 0:
        raise ValueError(mode)
    if level not in ("p", "q"):
        raise ValueError(level)
    renamed = renamed.lower()
    if renamed not in ("a",):
        raise ValueError(renamed)
    if other not in SCALE:
        raise ValueError(other)
    if x:
        return x
    if late not in ("q",):
        raise ValueError(late)
'''


def test_guarded_choices_are_read_only_where_every_call_runs_them(tmp_path):
    namespace: dict = {}
    path = write(tmp_path / "guards.py", GUARDS)
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    # `renamed` is rebound first, `late` follows a return, SCALE is a list: none of those is a choice.
    assert guarded_choices(namespace["guarded"]) == {"mode": ("a", "b"), "level": ("p", "q")}
    assert guarded_choices(len) == {} and guarded_choices(lambda v: v) == {}


# --- prompts the tokenizer cannot read ----------------------------------------------------------

def letters(tmp_path):
    out = []
    for split, n in (("train", 40), ("eval", 10)):
        path = tmp_path / f"{split}.jsonl"
        path.write_text("".join(json.dumps({"prompt": f"What is {i % 10} plus 1? Answer:", "answer": str(i % 10 + 1)})
                                + "\n" for i in range(n)))
        out.append(str(path))
    return out


def test_prompts_in_words_are_refused_on_the_embedded_model(tmp_path, capsys):
    """Before: every prompt became a row of <unk>, every group was flat, the run ended with exit 0."""
    train, held_out = letters(tmp_path)
    raw = {"model": {"backend": "tiny", "tiny": MINI_TINY}, "task": {"name": "dataset", "train_path": train,
                                                                     "eval_path": held_out},
           "rollout": {"num_generations": 2, "max_new_tokens": 8}, "train": {"steps": 1, "prompts_per_step": 2},
           "eval": {"size": 10}, "log": {"plots": False, "progress": False}}
    (tmp_path / "r.yaml").write_text(json.dumps(raw))
    assert main(["train", str(tmp_path / "r.yaml"), "-o", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    # 50 prompts of 25 characters, 2 of them digits: 23 / 25 = 92.0 % unknown.
    assert "the model's tokenizer maps 92.0% of the characters of 50 prompts (1,150 of 1,250; 17 distinct:" in err, err
    assert "(it knows 18 characters: '#()*+-0123456789;=')" in err and "model.max_unknown_chars=0.05" in err
    assert not (tmp_path / "run").exists()


def test_a_few_unknown_characters_are_a_warning_with_their_share(tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"prompt": p, "answer": "2"}) + "\n" for p in ["1+1= ", "2*3-4=", "(5+6)*7="]))
    train = str(train)
    recipe = mini_recipe(task={"name": "dataset", "params": {"train_path": train, "eval_path": train}},
                         eval={"size": 3}, model={"max_unknown_chars": 0.1})
    from reasonrl.evaluate.evaluator import Evaluator

    task, logged = build_task(recipe), []
    check_prompt_characters(recipe, mini_policy(), task, Evaluator(recipe, task), logged.append)
    # Training and held-out: the 3 prompts twice, 19 characters each time, one of them a space.
    assert len(logged) == 1 and logged[0].startswith(
        "warning: the model's tokenizer maps 5.3% of the characters of 6 prompts (2 of 38; 1 distinct: ' ')")
    recipe.model.max_unknown_chars = 0.05
    with pytest.raises(ConfigError, match=r"maps 5\.3% of the characters"):
        check_prompt_characters(recipe, mini_policy(), task, Evaluator(recipe, task), logged.append)


# --- steps with no learning signal ------------------------------------------------------------

def test_flat_steps_warn_after_n_in_a_row_and_every_n_after():
    logged = []
    watch = FlatSteps(mini_recipe(train={"warn_flat_steps": 2}, rollout={"temperature": 0.1}), logged.append)
    flat = {"zero_variance_group_fraction": 1.0, "reward/mean": 0.0, "reward_failures/r": 16}
    for step, row in enumerate([flat, flat, {"zero_variance_group_fraction": 0.5}, flat, flat, flat, flat]):
        watch.observe(step, row)
    assert [m.split(":")[0] for m in logged] == ["warning", "warning", "warning"]
    assert [m.split(": ")[1] for m in logged] == ["step 2", "step 5", "step 7"]
    assert "2 steps in a row with no learning signal" in logged[0] and "4 steps in a row" in logged[2]
    assert "(6 such steps in this session)" in logged[2]
    for cause in ("the reward function(s) r fail", "every reward is 0", "rollout.temperature=0.1"):
        assert cause in logged[0]


def test_a_run_with_a_constant_reward_warns_that_it_learns_nothing(tmp_path):
    path = write(tmp_path / "zero.py", """
        def zero(completion, problem, **_):
            return 0.0
    """)
    logged = []
    recipe = mini_recipe(rewards=[{"name": f"{path}:zero"}], train={"steps": 2, "warn_flat_steps": 2}, eval={"size": 0})
    Trainer(recipe, tmp_path / "run", log=logged.append).run()
    warned = [m for m in logged if "no learning signal" in m]
    assert len(warned) == 1 and warned[0].startswith("warning: step 2: 2 steps in a row with no learning signal")
    assert "every reward is 0" in warned[0]
    assert [r["reward/zero"] for r in read_metrics(tmp_path / "run") if "loss" in r] == [0.0, 0.0]


def test_signature_check_accepts_the_conventions():
    def per(completion, problem, *, scale=1.0, **_):
        return scale

    def batched(completions, **kwargs):
        return [1.0] * len(completions)

    for fn in (per, batched):
        check_reward_signature(fn, {"scale": 2.0} if fn is per else {}, "r", "rewards[0]")
