"""Multi-turn episodes (``env:``): the loss-mask layout, no re-tokenisation, the calculator,
and training on episodes with exact resume."""


import pytest
import torch
from tokenizers import Tokenizer, decoders, models, trainers
from transformers import PreTrainedTokenizerFast

import reasonrl.policy.hf as hf_policy  # the module whose sample_completions an episode turn calls
from reasonrl.config import ConfigError
from reasonrl.envs.base import Environment, Step
from reasonrl.envs.calculator import ArithmeticToolsTask, Calculator, evaluate_expression
from reasonrl.policy.char_tokenizer import build_char_tokenizer
from reasonrl.policy.hf import HFPolicy
from reasonrl.policy.tiny import TinySpec, new_tiny_model
from reasonrl.registry import ENVIRONMENTS
from reasonrl.rollout.episodes import EpisodeRollout, sample_problems
from reasonrl.problem import Problem
from reasonrl.metrics_log import read_metrics
from reasonrl.train.trainer import Trainer

from helpers import (MINI_TINY, assert_trained_ids_were_sampled, mini_recipe, scripted, spy_on_sampling,
                     straight_and_resumed)


def tools_policy(seed=0):
    tok = build_char_tokenizer(ArithmeticToolsTask.alphabet)
    spec = TinySpec(**{**MINI_TINY, "seed": seed})
    return HFPolicy(new_tiny_model(spec, len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id), tok)


def calculator_recipe(**sections):
    rollout = {"max_new_tokens": 12, "max_turns": 3, "max_episode_tokens": 30, **sections.pop("rollout", {})}
    sections.setdefault("env", {"name": "calculator"})
    return mini_recipe(task={"name": "arithmetic_tools"}, rollout=rollout, **sections)


# -- the layout ------------------------------------------------------------------------------

def test_a_three_turn_episode_has_the_hand_checked_loss_mask(monkeypatch):
    pol = tools_policy()
    tok = pol.tokenizer
    seen = []
    monkeypatch.setattr(hf_policy, "sample_completions", scripted(["[1+2]", "[3*4]", "12;####12</s>"], tok, seen))
    ep = EpisodeRollout(pol, calculator_recipe())
    problem = Problem("1+2*4;", "12")
    s = sample_problems(ep, [problem], 2, 12, 1.0, torch.Generator().manual_seed(0))
    #          [ 1 + 2 ] = 3 [ 3 * 4 ]  = 1 2  1 2 ; # # # # 1 2 </s>
    want_mask = [1] * 5 + [0] * 2 + [1] * 5 + [0] * 3 + [1] * 10
    assert s.completion_mask.tolist() == [[1] * 25] * 2
    assert s.loss_mask.tolist() == [want_mask] * 2
    assert s.texts == ["[1+2]=3[3*4]=1212;####12"] * 2
    ids = tok("[1+2]=3[3*4]=1212;####12", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert s.completion_ids.tolist() == [ids] * 2
    assert torch.equal(s.sample_logprobs, torch.tensor([[-0.5 * m for m in want_mask]] * 2))
    prompt = pol.encode_prompts([problem.prompt])[0][0].tolist()
    assert seen[1] == [prompt + ids[:7]] * 2 and seen[2] == [prompt + ids[:15]] * 2  # contexts are ids, not text
    assert not s.truncated.any() and s.env_rewards.tolist() == [0.0, 0.0]
    m = ep.metrics()
    assert m["episode/turns"] == 3 and m["episode/tool_calls"] == 2 and m["episode/env_tokens"] == 5


def test_an_episode_that_runs_out_of_turns_is_truncated_and_calls_cost(monkeypatch):
    pol = tools_policy()
    monkeypatch.setattr(hf_policy, "sample_completions", scripted(["[1+2]"] * 3, pol.tokenizer, []))
    ep = EpisodeRollout(pol, calculator_recipe(env={"name": "calculator", "call_cost": 0.25}))
    s = sample_problems(ep, [Problem("1+2;", "3")], 2, 12, 1.0, torch.Generator().manual_seed(0))
    assert s.truncated.all() and s.env_rewards.tolist() == [-0.75, -0.75]
    assert int(s.completion_mask[0].sum()) == 3 * 5 + 2 * 2  # the third call is not answered


def test_the_episode_token_budget_cuts_the_last_turn(monkeypatch):
    pol = tools_policy()
    monkeypatch.setattr(hf_policy, "sample_completions", scripted(["[10+20]", "[30*40]", "1200;####1200</s>"],
                                                                  pol.tokenizer, []))
    ep = EpisodeRollout(pol, calculator_recipe(rollout={"max_episode_tokens": 20}))
    s = sample_problems(ep, [Problem("10+20*40;", "1200")], 2, 12, 1.0, torch.Generator().manual_seed(0))
    assert s.completion_mask.sum(-1).tolist() == [20, 20] and s.truncated.all()


# -- no re-tokenisation ----------------------------------------------------------------------

class Echo(Environment):
    """Answers every turn that ends in "x" with "y" (a BPE tokenizer below merges "xy")."""

    stop = ("x",)

    def step(self, action):
        return Step(observation="y") if action.endswith("x") else Step(done=True)


ENVIRONMENTS.register("echo_xy_test")(Echo)


def merging_tokenizer():
    core = Tokenizer(models.BPE(unk_token="<unk>"))
    core.decoder = decoders.BPEDecoder()
    trainer = trainers.BpeTrainer(special_tokens=["<pad>", "<s>", "</s>", "<unk>"], vocab_size=12,
                                  initial_alphabet=list("xyz"))
    core.train_from_iterator(["xy" * 50, "zxy z"], trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                  unk_token="<unk>")
    tok.padding_side = "left"
    return tok


def test_the_trained_ids_are_the_sampled_ids_with_a_tokenizer_that_merges_across_turns(monkeypatch):
    tok = merging_tokenizer()
    assert len(tok("xy", add_special_tokens=False)["input_ids"]) == 1  # "x" + "y" is one token
    pol = HFPolicy(new_tiny_model(TinySpec(**MINI_TINY), len(tok), tok.pad_token_id, tok.bos_token_id,
                                  tok.eos_token_id), tok)
    drawn = spy_on_sampling(monkeypatch)
    ep = EpisodeRollout(pol, mini_recipe(env={"name": "echo_xy_test"}, rollout={"max_new_tokens": 6, "max_turns": 4}))
    s = sample_problems(ep, [Problem("z", "")] * 4, 4, 6, 1.0, torch.Generator().manual_seed(0))
    seen = assert_trained_ids_were_sampled(pol, s, drawn)
    assert seen["merged"] > 0, "no episode crossed a merging boundary: the test would not see re-tokenisation"
    assert seen["turns"] > len(s.texts)  # some episodes had several turns


# -- the calculator --------------------------------------------------------------------------

@pytest.mark.parametrize("text, value", [("7*5", 35), ("2*(3+4)", 14), ("-3*-4", 12), ("12", 12), ("1/0", None),
                                         ("2**10", None), ("9" * 12, None), ("__import__('os')", None), ("", None),
                                         ("1+", None), ("3" + "+3" * 30, None)])
def test_the_calculator_evaluates_integer_arithmetic_only(text, value):
    assert evaluate_expression(text) == value


def test_the_calculator_answers_calls_and_ends_on_anything_else():
    env = Calculator(call_cost=0.1, max_calls=2)
    assert env.reset(None, 0) == ""
    assert env.step("3+4=7;[7*5]") == Step("=35", -0.1, False, {"tool_calls": 1.0, "tool_errors": 0.0})
    assert env.step("[7/5]") == Step("=", -0.1, False, {"tool_calls": 1.0, "tool_errors": 1.0})
    assert env.step("[1+1]").done  # over max_calls
    assert Calculator().step("7*5=35;####35").done and Calculator().step("7*5]").done


def test_the_tools_warm_up_writes_a_share_of_steps_as_calls():
    task = ArithmeticToolsTask(tool_fraction=0.3)
    plain = [p.solution for p in super(ArithmeticToolsTask, task).warmup_problems(3, 200, 0)]
    tools = task.warmup_problems(3, 200, 0)
    calls = steps = 0
    for a, p in zip(plain, tools):
        assert p.solution.replace("[", "").replace("]", "") == a  # the same steps, some bracketed
        for s in p.solution.split(";")[:-1]:
            steps += 1
            calls += s.startswith("[")
            assert not s.startswith("[") or (s.index("]") < s.index("=") and evaluate_expression(s[1:s.index("]")])
                                             == int(s.split("=")[1]))
    assert 0.25 < calls / steps < 0.35
    assert set("[]") <= set(task.alphabet) and ArithmeticToolsTask(tool_fraction=0).warmup_problems(3, 5, 0)[0].solution == plain[0]
    with pytest.raises(ValueError, match="tool_fraction"):
        ArithmeticToolsTask(tool_fraction=1.5)


# -- training --------------------------------------------------------------------------------

def tools_recipe(**sections):
    return calculator_recipe(model={"backend": "tiny", "tiny": {**MINI_TINY, "task": "arithmetic_tools"}},
                             **sections)


def test_grpo_trains_on_episodes_and_resumes_exactly(tmp_path, monkeypatch):
    recipe = tools_recipe(train={"steps": 4, "checkpoint_every": 1}, eval={"size": 8}, optim={"lr": 1e-3})
    a = straight_and_resumed(recipe, tmp_path, monkeypatch)
    trained = [r for r in a if "episode/tool_calls" in r and "reward/mean" in r]
    assert len(trained) == 4 and sum(r["episode/tool_calls"] for r in trained) > 0  # the untrained model does call
    evals = [r for r in a if "eval/accuracy" in r]
    assert evals, "eval/accuracy was never logged"
    assert all("eval/episode/turns" in r for r in evals)


def test_an_async_sampler_runs_episodes(tmp_path):
    recipe = tools_recipe(train={"steps": 2, "threads": 1}, eval={"size": 8},
                          rollout={"source": "async", "max_staleness": 1, "sampler_threads": 1})
    Trainer(recipe, tmp_path / "run", log=lambda m: None).run()
    rows = [r for r in read_metrics(tmp_path / "run") if "reward/mean" in r]
    assert len(rows) == 2 and all("episode/turns" in r for r in rows)


BAD = [
    ({"env": {"name": "calculater"}}, "Did you mean 'calculator'"),
    ({"env": {"name": "calculator", "call_cost": -1}}, "env.call_cost must be >= 0"),
    ({"env": {"name": "calculator", "budget": 3}}, "unknown parameter 'env.budget'"),
    ({"env": {"name": "calculator"}, "rollout": {"max_turns": 0}}, "rollout.max_turns must be >= 1"),
    ({"env": {"name": "calculator"}, "rollout": {"max_new_tokens": 24, "max_episode_tokens": 10}},
     "rollout.max_episode_tokens=10 is below"),
    ({"env": {"name": "calculator"}, "rollout": {"simulated_staleness": 1, "simulated_partial": 4}},
     "act on single completions"),
]


@pytest.mark.parametrize("sections, message", BAD, ids=[m[:25] for _, m in BAD])
def test_bad_episode_settings_are_recipe_errors(sections, message):
    with pytest.raises(ConfigError, match=message):
        mini_recipe(**sections)


class TwoStreams(Environment):
    """Answers a turn ending in "1" from stream a ("11"), one ending in "2" from stream b ("2")."""

    stop = ("1", "2")
    channels = ("a", "b")

    def step(self, action):
        if action.endswith("1"):
            return Step(observation="11", channel="a")
        return Step(observation="2", channel="b") if action.endswith("2") else Step(done=True)


ENVIRONMENTS.register("two_streams_test")(TwoStreams)


def test_each_observation_token_records_its_channel(monkeypatch):
    pol = tools_policy()
    monkeypatch.setattr(hf_policy, "sample_completions", scripted(["31", "42", "5</s>"], pol.tokenizer, []))
    ep = EpisodeRollout(pol, mini_recipe(env={"name": "two_streams_test"}, rollout={"max_turns": 3}))
    s = sample_problems(ep, [Problem("9;", "")], 2, 8, 1.0, torch.Generator().manual_seed(0))
    #            3  1  1  1  4  2  2  5  </s>
    assert s.env_channels.tolist() == [[0, 0, 1, 1, 0, 0, 2, 0, 0]] * 2
    assert s.loss_mask.tolist() == [[1, 1, 0, 0, 1, 1, 0, 1, 1]] * 2


def test_an_unknown_channel_is_a_clear_error(monkeypatch):
    class Bad(TwoStreams):
        def step(self, action):
            return Step(observation="1", channel="c")

    ENVIRONMENTS.register("bad_channel_test")(Bad)
    pol = tools_policy()
    monkeypatch.setattr(hf_policy, "sample_completions", scripted(["31"], pol.tokenizer, []))
    ep = EpisodeRollout(pol, mini_recipe(env={"name": "bad_channel_test"}))
    with pytest.raises(ValueError, match=r"channel 'c'; its channels are \['a', 'b'\]"):
        sample_problems(ep, [Problem("9;", "")], 2, 8, 1.0, torch.Generator().manual_seed(0))
