"""The student–advisor loop under a budget (``env: {name: advisor}``): the environment's answers,
costs and budget, the advisors (the tiny one, the OpenAI-chat one against a local stub), the
``arithmetic_advisor`` warm-up, a short run, recipe errors, and the routing baselines."""

import importlib.util
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

import reasonrl.policy.hf as hf_policy  # the module whose sample_completions an episode turn calls
from reasonrl.config import ConfigError
from reasonrl.methods.advisor import (ADVISORS, Advisor, AdvisorEnv, AdvisorError, ArithmeticAdvisorTask,
                                   OpenAIChatAdvisor, TinyAdvisor, advice_value, get_advisor)
from reasonrl.envs.base import Step
from reasonrl.policy.char_tokenizer import build_char_tokenizer
from reasonrl.policy.hf import HFPolicy
from reasonrl.policy.sampling import Samples
from reasonrl.policy.tiny import TinySpec, new_tiny_model
from reasonrl.registry import ENVIRONMENTS
from reasonrl.rewards.basic import exact_answer
from reasonrl.rollout.episodes import EpisodeRollout, sample_problems
from reasonrl.tasks.arithmetic import ArithmeticTask
from reasonrl.problem import Problem
from reasonrl.metrics_log import read_metrics
from reasonrl.train.trainer import Trainer

from helpers import MINI_TINY, Stub, mini_recipe, scripted

ORACLE = {"name": "advisor", "advisor": "oracle_arithmetic"}


def student(seed=0):
    tok = build_char_tokenizer(ArithmeticAdvisorTask.alphabet)
    spec = TinySpec(**{**MINI_TINY, "seed": seed})
    return HFPolicy(new_tiny_model(spec, len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id), tok)


def advisor_recipe(env=None, **sections):
    rollout = {"max_new_tokens": 12, "max_turns": 4, "max_episode_tokens": 40, **sections.pop("rollout", {})}
    return mini_recipe(task={"name": "arithmetic_advisor"}, rollout=rollout, env={**ORACLE, **(env or {})}, **sections)


class Counting(Advisor):
    """The exact arithmetic advisor, counting the queries it receives."""

    received: list[str] = []

    def answer(self, query, problem):
        Counting.received.append(query)
        return get_advisor("oracle_arithmetic", {}).answer(query, problem)


ADVISORS.register("counting_test")(Counting)


# -- the environment -------------------------------------------------------------------------

def test_a_two_call_episode_has_the_hand_checked_reward_and_layout(monkeypatch):
    pol = student()
    monkeypatch.setattr(hf_policy, "sample_completions", scripted(["{1+2}", "{3*4}", ";####12</s>"], pol.tokenizer, []))
    ep = EpisodeRollout(pol, advisor_recipe({"budget": 2, "cost": 0.1, "token_cost": 0.01}))
    problem = Problem("1+2*4;", "12")
    s = sample_problems(ep, [problem], 2, 12, 1.0, torch.Generator().manual_seed(0))
    assert s.texts == ["{1+2}=3{3*4}=12;####12"] * 2
    #                 { 1 + 2 }  = 3  { 3 * 4 }  = 1 2  ; # # # # 1 2 </s>
    assert s.loss_mask.tolist() == [[1] * 5 + [0] * 2 + [1] * 5 + [0] * 3 + [1] * 8] * 2
    assert s.env_channels.tolist() == [[0] * 5 + [1] * 2 + [0] * 5 + [1] * 3 + [0] * 8] * 2  # channel "advisor"
    # Two calls of 3 query characters: 2 x -(0.1 + 0.01 x 3) = -0.26; the answer is right: 1 - 0.26.
    torch.testing.assert_close(s.env_rewards, torch.tensor([-0.26, -0.26]))
    assert [exact_answer(t, problem) + float(r) for t, r in zip(s.texts, s.env_rewards)] == pytest.approx([0.74, 0.74])
    m = ep.metrics()
    assert (m["episode/calls"], m["episode/over_budget"], m["episode/query_tokens"], m["episode/advice_tokens"]) \
        == (2, 0, 6, 3)
    assert not s.truncated.any()


def test_a_call_over_the_budget_is_refused_unsent_and_penalised(monkeypatch):
    pol = student()
    Counting.received = []
    monkeypatch.setattr(hf_policy, "sample_completions", scripted(["{1+2}", "{3*4}", "{5+5}"], pol.tokenizer, []))
    ep = EpisodeRollout(pol, advisor_recipe({"advisor": "counting_test", "budget": 2, "cost": 0.1}))
    s = sample_problems(ep, [Problem("1+2*4;", "12")], 2, 12, 1.0, torch.Generator().manual_seed(0))
    assert Counting.received == ["1+2", "1+2", "3*4", "3*4"]  # turn by turn; the third query of each never left
    assert s.texts == ["{1+2}=3{3*4}=12{5+5}"] * 2 and not s.truncated.any()  # ended at the refusal
    torch.testing.assert_close(s.env_rewards, torch.tensor([-1.2, -1.2]))  # 2 calls and the hard-fail penalty
    m = ep.metrics()
    assert m["episode/calls"] == 2 and m["episode/over_budget"] == 1


def test_refuse_mode_answers_an_empty_refusal_and_goes_on():
    env = AdvisorEnv(advisor="oracle_arithmetic", budget=1, cost=0.25, over_budget="refuse", over_budget_penalty=0.5)
    env.reset(Problem("7*5+1;", "36"), 0)
    assert env.step("{7*5}") == Step("=35", -0.25, False, {"calls": 1.0, "query_tokens": 3.0, "advice_tokens": 2.0},
                                     "advisor")
    assert env.step("35+1=36;{36}") == Step("=", -0.5, False, {"over_budget": 1.0}, "advisor")
    assert env.step(";####36").done and env.calls == 1 and env.refused == 1
    assert AdvisorEnv(advisor="oracle_arithmetic").step("no query}").done  # a '}' without '{' is no query
    free = AdvisorEnv(advisor="oracle_arithmetic", cost=0.0)
    free.reset(None, 0)
    assert free.step("{2*3}").reward == 0.0  # not -0.0


def test_the_budget_is_never_exceeded_over_random_episodes():
    """Every query sequence, budget and mode: the advisor receives at most ``budget`` queries per
    episode, every answered call is charged, and every refused one is counted."""
    rng = random.Random(0)
    for _ in range(300):
        budget, mode = rng.randint(1, 3), rng.choice(["end", "refuse"])
        env = AdvisorEnv(advisor="counting_test", budget=budget, cost=0.1, over_budget=mode)
        env.reset(Problem("1+1;", "2"), 0)
        Counting.received = []
        charged = refused = 0
        for _ in range(rng.randint(0, 8)):
            step = env.step(rng.choice(["{1+1}", "{2*x}", "1+1=2;", "{}", "{9*9}"]))
            charged += step.info.get("calls", 0)
            refused += step.info.get("over_budget", 0)
            assert len(Counting.received) <= budget
            if step.done:
                break
        assert len(Counting.received) == charged == env.calls <= budget and refused == env.refused


class SpyEnv(AdvisorEnv):
    """The advisor env, keeping every instance (one per episode)."""

    made: list = []

    def reset(self, problem, seed):
        SpyEnv.made.append(self)
        return super().reset(problem, seed)


ENVIRONMENTS.register("advisor_spy_test")(SpyEnv)


def random_turns(pool, tok, seed=0):
    """A stand-in for ``sample_completions`` that writes, for each row, a turn drawn from ``pool``."""
    rng = random.Random(seed)

    def sample(model, tokenizer, ids, mask, g, max_new_tokens, *args, **kwargs):
        rows = []
        for _ in range(len(ids)):
            text = rng.choice(pool)
            t = tok(text.removesuffix("</s>"), add_special_tokens=False)["input_ids"]
            rows.append((t + [tok.eos_token_id] if text.endswith("</s>") else t)[:max_new_tokens])
        width = max(len(r) for r in rows)
        out = torch.full((len(rows), width), tok.pad_token_id)
        cmask = torch.zeros(len(rows), width, dtype=torch.long)
        for i, r in enumerate(rows):
            out[i, :len(r)], cmask[i, :len(r)] = torch.tensor(r), 1
        return Samples(prompt_ids=ids, prompt_mask=mask, completion_ids=out, completion_mask=cmask,
                       sample_logprobs=-0.5 * cmask.float(), truncated=torch.zeros(len(rows), dtype=torch.bool),
                       texts=[tok.decode(r, skip_special_tokens=True) for r in rows])
    return sample


@pytest.mark.parametrize("mode", ["end", "refuse"])
def test_sampled_episodes_never_exceed_the_budget(monkeypatch, mode):
    """Through the episode sampler, rows asking, answering and refused at random: no episode's
    advisor receives more than ``budget`` queries, and the logged calls are the queries sent."""
    pol = student()
    pool = ["{1+1}", "{2*3}", "{7}", "1+1=2;", "{9*9}", "5;####5</s>", "9}"]
    monkeypatch.setattr(hf_policy, "sample_completions", random_turns(pool, pol.tokenizer))
    SpyEnv.made, Counting.received = [], []
    r = advisor_recipe({"name": "advisor_spy_test", "advisor": "counting_test", "budget": 2, "over_budget": mode},
                       rollout={"max_new_tokens": 8, "max_turns": 8, "max_episode_tokens": 64})
    ep = EpisodeRollout(pol, r)
    sample_problems(ep, [Problem(f"{i}+{i}*2;", str(3 * i)) for i in range(16)], 4, 8, 1.0,
                    torch.Generator().manual_seed(0))
    assert len(SpyEnv.made) == 64
    assert all(e.calls <= 2 for e in SpyEnv.made)
    assert len(Counting.received) == sum(e.calls for e in SpyEnv.made) > 0
    assert sum(e.refused for e in SpyEnv.made) > 0 and max(e.calls for e in SpyEnv.made) == 2  # the budget was tested
    m = ep.metrics()
    assert m["episode/calls"] == pytest.approx(len(Counting.received) / 64)
    assert m["episode/over_budget"] == pytest.approx(sum(e.refused for e in SpyEnv.made) / 64)


@pytest.mark.parametrize("reply, value", [("####472", "472"), ("The answer is 472.", "472"), ("1,234", "1234"),
                                          ("12+3=15;15*2=30;####30", "30"), ("-7", "-7"), ("no idea", ""), ("", "")])
def test_advice_value_reads_the_number_of_a_reply(reply, value):
    assert advice_value(reply) == value


# -- the task's warm-up ------------------------------------------------------------------------

def test_the_warm_up_asks_a_share_of_problems_exactly_as_the_env_answers():
    task = ArithmeticAdvisorTask(ask_fraction=0.3, max_operand=99)
    plain = super(ArithmeticAdvisorTask, task).warmup_problems(4, 300, 0)
    asked = 0
    for base, p in zip(plain, task.warmup_problems(4, 300, 0)):
        assert set(p.solution) <= set(task.alphabet) and p.prompt == base.prompt
        if not p.solution.startswith("{"):
            assert p.solution == base.solution  # solved by hand, careless brackets and all
            continue
        asked += 1
        query_turn, rest = p.solution.split("}", 1)
        env = AdvisorEnv(advisor="oracle_arithmetic")
        env.reset(p, 0)
        step = env.step(query_turn + "}")
        assert query_turn[1:] == p.meta["expr"] and rest.startswith(step.observation + ";")
        assert env.step(rest[len(step.observation):]).done  # the last turn is the answer
        assert exact_answer(p.solution, p) == 1.0
    assert 0.25 < asked / 300 < 0.35
    assert ArithmeticAdvisorTask(ask_fraction=0.0).warmup_problems(4, 5, 0)[0].solution == \
        ArithmeticTask().warmup_problems(4, 5, 0)[0].solution
    with pytest.raises(ValueError, match="ask_fraction"):
        ArithmeticAdvisorTask(ask_fraction=1.5)


def test_a_scripted_student_replaying_its_warm_up_earns_it(monkeypatch):
    p = next(p for p in ArithmeticAdvisorTask(ask_fraction=1.0).warmup_problems(0, 4, 0))
    pol = student()
    query, rest = p.solution.split("}", 1)
    answer_turn = rest.split(";", 1)[1]
    monkeypatch.setattr(hf_policy, "sample_completions", scripted([query + "}", ";" + answer_turn + "</s>"],
                                                                  pol.tokenizer, []))
    s = sample_problems(EpisodeRollout(pol, advisor_recipe()), [p], 2, 12, 1.0, torch.Generator().manual_seed(0))
    assert s.texts == [p.solution] * 2 and exact_answer(s.texts[0], p) == 1.0


# -- the advisors ------------------------------------------------------------------------------

def test_the_tiny_advisor_is_built_offline_answers_greedily_and_loads_from_a_folder(tmp_path):
    spec = {**MINI_TINY, "warmup_steps": 5}
    adv = get_advisor("tiny", {"tiny": spec, "max_new_tokens": 8})
    assert isinstance(adv, TinyAdvisor) and get_advisor("tiny", {"tiny": spec, "max_new_tokens": 8}) is adv
    first = adv.answer("(1+2)*3", None)
    assert isinstance(first, str) and adv.answer("(1+2)*3", None) == first
    assert adv.answer_batch(["(1+2)*3"], [None]) == [first]
    adv.policy.save(tmp_path / "m")
    assert TinyAdvisor(path=str(tmp_path / "m"), max_new_tokens=8).answer("(1+2)*3", None) == first
    with pytest.raises(ValueError, match="not both"):
        TinyAdvisor(tiny=spec, path=str(tmp_path / "m"))
    with pytest.raises(ValueError, match="never downloaded"):
        TinyAdvisor(path="org/some-model")


@pytest.fixture
def stub():
    made = []

    def make(**kwargs):
        made.append(Stub(**kwargs))
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_the_openai_chat_advisor_sends_the_standard_request(stub, monkeypatch):
    server = stub()
    monkeypatch.setenv("ADVISOR_TEST_KEY", "sk-test")
    adv = OpenAIChatAdvisor(base_url=server.url + "/", model="big-model", api_key_env="ADVISOR_TEST_KEY",
                            template="Compute {query}.", max_tokens=16)
    assert adv.answer("(12+47)*8", Problem("(12+47)*8;", "472")) == "The answer is 472."
    path, headers, body = server.requests[0]
    assert path == "/v1/chat/completions" and headers["Authorization"] == "Bearer sk-test"
    assert headers["Content-Type"] == "application/json"
    assert body == {"model": "big-model", "temperature": 0.0, "max_tokens": 16,
                    "messages": [{"role": "system", "content": adv.system},
                                 {"role": "user", "content": "Compute (12+47)*8."}]}
    # Through the environment: the query sent, the number of the reply appended.
    env = AdvisorEnv(advisor="openai_chat", advisor_params={"base_url": server.url, "model": "big-model",
                                                            "system": None})
    env.reset(Problem("(12+47)*8;", "472"), 0)
    assert env.step("{(12+47)*8}").observation == "=472"
    assert server.requests[1][2]["messages"] == [{"role": "user", "content": "(12+47)*8"}]
    assert "Authorization" not in server.requests[1][1]


def test_the_openai_chat_advisor_fails_clearly(stub, monkeypatch):
    broken = stub(status=500)
    with pytest.raises(AdvisorError, match=r"POST http://127\.0\.0\.1:\d+/v1/chat/completions returned HTTP 500 "
                                           r"Internal Server Error: .*model overloaded"):
        OpenAIChatAdvisor(base_url=broken.url, model="m", retries=0).answer("1+1", None)
    slow = stub(delay_s=0.5)
    with pytest.raises(AdvisorError, match=r"timed out after 0\.1 s \(1 attempt\(s\)\)"):
        OpenAIChatAdvisor(base_url=slow.url, model="m", timeout_s=0.1, retries=0).answer("1+1", None)
    bad = stub(reply=None)
    assert OpenAIChatAdvisor(base_url=bad.url, model="m").answer("1+1", None) == ""
    monkeypatch.delenv("NO_SUCH_ADVISOR_KEY", raising=False)
    with pytest.raises(AdvisorError, match="NO_SUCH_ADVISOR_KEY .* is not set"):
        OpenAIChatAdvisor(base_url=broken.url, model="m", api_key_env="NO_SUCH_ADVISOR_KEY")
    with pytest.raises(AdvisorError, match="failed: .*refused"):
        OpenAIChatAdvisor(base_url="http://127.0.0.1:9/v1", model="m", retries=0).answer("1+1", None)


def test_the_openai_chat_advisor_retries_overloaded_servers(stub):
    flaky = stub(fail_first=2)
    adv = OpenAIChatAdvisor(base_url=flaky.url, model="m", retries=2, retry_wait_s=0.01)
    assert adv.answer("1+1", None) == "The answer is 472." and len(flaky.requests) == 3
    with pytest.raises(AdvisorError, match="HTTP 503"):
        OpenAIChatAdvisor(base_url=stub(fail_first=5).url, model="m", retries=1, retry_wait_s=0.01).answer("1+1", None)


# -- training and recipes ----------------------------------------------------------------------

def test_grpo_trains_a_student_with_an_advisor(tmp_path):
    recipe = advisor_recipe({"budget": 1, "cost": 0.1},
                            model={"backend": "tiny", "tiny": {**MINI_TINY, "task": "arithmetic_advisor",
                                                               "task_params": {"ask_fraction": 0.5}}},
                            train={"steps": 2}, eval={"size": 8})
    Trainer(recipe, tmp_path / "run", log=lambda m: None).run()
    rows = read_metrics(tmp_path / "run")
    trained = [r for r in rows if "reward/mean" in r]
    assert len(trained) == 2 and all(0 <= r["episode/calls"] <= 1 for r in trained)
    assert all(r["episode/calls"] >= 0 and "episode/over_budget" in r for r in trained)
    assert any("eval/episode/calls" in r for r in rows)


BAD = [
    ({"cost": -1}, "env.cost must be >= 0"),
    ({"budget": 0}, "env.budget must be >= 1, got 0 .a budget of 0 allows no call"),
    ({"token_cost": -0.1}, "env.token_cost must be >= 0"),
    ({"over_budget": "ignore"}, "'env.over_budget' must be one of end, refuse"),
    ({"advisor": "orcale_arithmetic"}, "unknown advisor 'orcale_arithmetic'.*Did you mean 'oracle_arithmetic'"),
    ({"advisor": "tiny", "advisor_params": {"hidden": 3}}, "unknown parameter 'env.advisor_params.hidden'"),
    ({"advisor": "tiny", "advisor_params": {"tiny": {"hiden_size": 3}}}, "env.advisor_params.tiny: unknown key 'hiden_size'"),
    ({"advisor": "openai_chat"}, "needs env.advisor_params.base_url"),
    ({"advisor": "openai_chat", "advisor_params": {"base_url": "localhost:8000", "model": "m"}}, "must start with http"),
    ({"advisor": "openai_chat", "advisor_params": {"base_url": "http://x/v1", "model": "m", "timeout_s": 0}},
     "env.advisor_params.timeout_s must be > 0"),
    ({"budgets": 2}, "unknown parameter 'env.budgets'.*Did you mean 'budget'"),
]


@pytest.mark.parametrize("env, message", BAD, ids=[m[:30] for _, m in BAD])
def test_bad_advisor_settings_are_recipe_errors(env, message):
    with pytest.raises(ConfigError, match=message):
        advisor_recipe(env)


# -- the routing baselines ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def routing():
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "advisor_routing.py"
    spec = importlib.util.spec_from_file_location("advisor_routing", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_routing_points_by_hand(routing):
    alone = [True, True, False, False]
    adv = [True, False, True, False]
    assert routing.route_point(alone, adv, [False] * 4) == (0.5, 0.0)
    assert routing.route_point(alone, adv, [True] * 4) == (0.5, 1.0)
    assert routing.route_point(alone, adv, [not a for a in alone]) == (0.75, 0.5)
    assert routing.route_point(alone, adv, [not a and b for a, b in zip(alone, adv)]) == (0.75, 0.25)  # the oracle
    x = np.array([[0.0], [0.1], [0.9], [1.0]] * 10)
    router = routing.LogisticRouter().fit(x, np.array([0.0, 0.0, 1.0, 1.0] * 10))
    assert (router.prob(x[:4]) > 0.5).tolist() == [False, False, True, True]
    # At cost 0.1 routing the two hard problems pays (+0.25 - 0.05); at cost 1 nothing does.
    assert router.choose_threshold(x[:4], alone, adv, 0.1) <= router.prob(x[2:3])[0]
    assert router.choose_threshold(x[:4], alone, adv, 1.0) > 1


def test_the_routing_benchmark_runs_on_mini_models(routing, tmp_path, capsys):
    assert routing.main(["--mini", "--size", "12", "--train-size", "24", "--threads", "1", "--cost", "0.1",
                         "--cost", "2", "--json", str(tmp_path / "r.json")]) == 0
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["costs"] == [0.1, 2.0] and len(result["rows"]) == 10
    for cost in (0.1, 2.0):
        rows = {r["policy"]: r for r in result["rows"] if r["cost"] == cost}
        never, always, oracle, learned = (rows[k] for k in ("never call (student alone)", "always call (advisor answers)",
                                                             "oracle routing", "learned routing (logistic)"))
        assert never["calls"] == 0 and always["calls"] == 1
        assert oracle["accuracy"] >= max(never["accuracy"], always["accuracy"]) and oracle["calls"] <= always["calls"]
        assert oracle["reward"] >= max(never["reward"], always["reward"], learned["reward"])
        if cost >= 1:
            assert oracle["calls"] == 0  # a call never pays at cost >= 1
        assert all(r["reward"] == pytest.approx(r["accuracy"] - cost * r["calls"]) for r in rows.values())
    assert "learned routing" in capsys.readouterr().out
