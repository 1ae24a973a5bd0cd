"""RLCPR: the probability reward, debiasing, t*, the length penalty (methods/rlcpr/maths.py,
methods/rlcpr/method.py) and the uncertainty prompt sampler (methods/rlcpr/sampler.py)."""

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from reasonrl.methods.rlcpr.maths import answer_reward, concentration_penalty, concentration_point, debias
from reasonrl.batch import RolloutBatch
from reasonrl.config import ConfigError
from reasonrl.recipe import load_recipe
from reasonrl.hooks import MethodContext
from reasonrl.methods.rlcpr.method import RLCPR, answer_probabilities, group_rewards, split_trace, thin
from reasonrl.policy.char_tokenizer import build_char_tokenizer
from reasonrl.algos.selection import one_group_reward_std
from reasonrl.methods.rlcpr.sampler import UncertaintySampler
from reasonrl.problem import Problem

from helpers import MINI_TINY, mini_policy, mini_recipe, registered, straight_and_resumed

ROOT = Path(__file__).resolve().parents[1]


# -- the pure maths --------------------------------------------------------------------------

def test_answer_reward_by_hand():
    logp = torch.tensor([[math.log(0.5), math.log(0.25), math.log(0.9)], [math.log(0.8), 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert answer_reward(logp, mask, "prob").tolist() == pytest.approx([0.375, 0.8])
    assert answer_reward(logp, mask, "logprob").tolist() == pytest.approx(
        [(math.log(0.5) + math.log(0.25)) / 2, math.log(0.8)])
    assert answer_reward(logp, torch.zeros_like(mask), "prob").tolist() == [0.0, 0.0]  # no answer tokens
    with pytest.raises(ValueError, match="kind"):
        answer_reward(logp, mask, "mean")


def test_debias_by_hand():
    r, empty = torch.tensor([0.7, 0.2, 1.0]), torch.tensor([0.3, 0.3, 0.0])
    assert debias(r, empty, "prob").tolist() == pytest.approx([0.4, 0.0, 1.0])  # clipped into [0, 1]
    assert debias(torch.tensor([-1.0]), torch.tensor([-0.5]), "logprob").tolist() == [-0.5]  # no clip


def test_concentration_point_by_hand():
    p = torch.tensor([[0.10, 0.50, 0.92, 0.95, 0.96],    # leaves the band last at index 1 → t* = t_2
                      [0.50, 0.52, 0.00, 0.00, 0.00],    # always within δ of p_T: t* = t_0; padding ignored
                      [0.20, 0.90, 0.30, 0.31, 0.00]])   # settles, wanders away, comes back: t* after the wander
    valid = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.bool)
    positions = torch.tensor([[0, 4, 8, 12, 15], [0, 6, 0, 0, 0], [0, 3, 7, 9, 0]])
    assert concentration_point(p, valid, positions, delta=0.05).tolist() == [8, 0, 7]
    # A looser δ counts 0.92 → 0.96 and 0.50 → 0.96 differently: δ = 0.5 makes t* = t_1.
    assert concentration_point(p[:1], valid[:1], positions[:1], delta=0.5).tolist() == [4]


def test_concentration_penalty_by_hand():
    out = concentration_penalty(reward=torch.tensor([0.9, 0.9, 0.3, 0.8]), gate_value=torch.tensor([0.9, 0.9, 0.3, 0.8]),
                                t_star=torch.tensor([8, 0, 0, 10]), trace_len=torch.tensor([16, 0, 10, 10]),
                                coef=0.1, gate=0.5)
    # 0.9 − 0.1·(16 − 8)/16; T = 0: no padding; 0.3 < gate: untouched; t* = T: no padding.
    assert out.tolist() == pytest.approx([0.85, 0.9, 0.3, 0.8])


def test_split_trace_and_thin():
    assert split_trace(list("3+4=7;7*5=35;####35"), "####", ";") == (13, [0, 6, 13])
    assert split_trace(list("3+4=7;7*5"), "####", ";") == (9, [0, 6, 9])  # no marker: the whole text
    # Multi-character tokens: the token where the marker starts (";##") is not trace, its ';' neither.
    assert split_trace(["3+4", "=7;", "7*5=35", ";##", "##35"], "####", ";") == (3, [0, 2, 3])
    assert thin(list(range(21)), 4) == [0, 1, 10, 19, 20]
    assert thin([0, 5, 9], 4) == [0, 5, 9]


# -- the method on a hand-built model ------------------------------------------------------------

class SemicolonPolicy:
    """A stand-in policy whose every next token has probability min(0.9, 0.3 + 0.3·k), k = the
    ';' tokens of the completion before it: the answer's probability rises with each step."""

    def __init__(self):
        self.tokenizer = build_char_tokenizer()
        self.tokenizer.padding_side = "left"
        self.model = torch.nn.Linear(1, 1)
        self.device = torch.device("cpu")
        self.semi = self.tokenizer(";", add_special_tokens=False)["input_ids"][0]
        self.rows = 0

    def completion_logprobs(self, prompt_ids, prompt_mask, ids, mask, *args, **kwargs):
        assert not self.model.training  # the reward is scored in eval mode
        is_semi = (ids == self.semi).long()
        before = torch.cumsum(is_semi, -1) - is_semi
        self.rows += len(ids)
        return (0.3 + 0.3 * before.float()).clamp(max=0.9).log(), None


def _batch(policy, rows):
    """rows: (prompt, completion, answer, group); completions end with EOS."""
    tok = policy.tokenizer
    enc = tok([r[0] for r in rows], return_tensors="pt", padding=True)
    comps = [tok(r[1], add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for r in rows]
    width = max(map(len, comps))
    ids = torch.tensor([c + [tok.pad_token_id] * (width - len(c)) for c in comps])
    mask = torch.tensor([[1] * len(c) + [0] * (width - len(c)) for c in comps])
    n = len(rows)
    return RolloutBatch(prompt_ids=enc["input_ids"], prompt_mask=enc["attention_mask"], completion_ids=ids,
                        completion_mask=mask, group_ids=torch.tensor([r[3] for r in rows]),
                        rewards=torch.full((n,), 5.0), truncated=torch.zeros(n, dtype=torch.bool),
                        meta={"answer": [r[2] for r in rows], "prompt": [r[0] for r in rows],
                              "reward/exact_answer": [1.0, 1.0, 0.0]})


ROWS = [("(3+4)*5;", "3+4=7;7*5=35;####35", "35", 0),          # T = 13, p_t = .3, .6, .9
        ("(3+4)*5;", "3+4=7;7*5=35;1+1=2;####35", "35", 0),    # T = 19, p_t = .3, .6, .9, .9: t* = 13
        ("2+3*4;", "####14", "14", 1)]                          # T = 0, p = .3


def _annotate(sampler=None, **params):
    policy = SemicolonPolicy()
    method = RLCPR(**params)
    recipe = SimpleNamespace(train=SimpleNamespace(micro_batch_size=2))
    method.setup(MethodContext(recipe=recipe, policy=policy, run_dir=None, log=print, sampler=sampler))
    batch = _batch(policy, ROWS)
    metrics = method.annotate(batch, 0)
    return batch, metrics, policy.rows


def test_probability_reward_with_the_concentration_penalty_by_hand():
    batch, metrics, forwards = _annotate(length_penalty=0.1, delta=0.05, gate=0.5)
    assert batch.rewards.tolist() == pytest.approx([0.9, 0.9 - 0.1 * 6 / 19, 0.3])
    # The empty trace runs once per group: group 0's {0}, row 0's {6, 13}, row 1's {6, 13, 19}, group 1's {0}.
    assert forwards == 7
    assert metrics["rlcpr/t_star_frac"] == pytest.approx((13 / 13 + 13 / 19) / 2)  # over rows with T > 0
    assert metrics["rlcpr/penalised"] == pytest.approx(1 / 3)
    assert metrics["rlcpr/prob"] == pytest.approx((0.9 + 0.9 + 0.3) / 3)
    assert metrics["rlcpr/prob_right"] == pytest.approx(0.9) and metrics["rlcpr/prob_wrong"] == pytest.approx(0.3)
    std0 = torch.tensor([0.9, 0.9 - 0.1 * 6 / 19]).std().item()
    assert metrics["rlcpr/group_std"] == pytest.approx(std0 / 2, rel=1e-5)  # float32; group 1 is a singleton: std 0


def test_the_plain_reward_is_one_flag_and_one_forward_per_row():
    batch, _, forwards = _annotate(length_penalty=0.0)
    assert batch.rewards.tolist() == pytest.approx([0.9, 0.9, 0.3])  # the scorer's 5.0 replaced
    assert forwards == 3


def test_debiasing_subtracts_the_empty_trace():
    batch, metrics, forwards = _annotate(length_penalty=0.0, debias=True)
    assert batch.rewards.tolist() == pytest.approx([0.6, 0.6, 0.0])
    assert metrics["rlcpr/p_empty"] == pytest.approx(0.3)
    assert forwards == 4  # rows 0 and 1 at T, each group's empty trace once (row 2's T is 0)
    batch, _, _ = _annotate(length_penalty=0.1, debias=True)  # the gate reads r̃ = 0.6 ≥ 0.5
    assert batch.rewards.tolist() == pytest.approx([0.6, 0.6 - 0.1 * 6 / 19, 0.0])


def test_logprob_kind_and_add():
    batch, _, _ = _annotate(length_penalty=0.0, kind="logprob")
    assert batch.rewards.tolist() == pytest.approx([math.log(0.9), math.log(0.9), math.log(0.3)])
    batch, _, _ = _annotate(length_penalty=0.0, combine="add", coef=2.0)
    assert batch.rewards.tolist() == pytest.approx([5 + 1.8, 5 + 1.8, 5 + 0.6])


def test_answer_probabilities_match_a_direct_forward():
    """The teacher-forced forward scores exactly the answer tokens of prompt + context + answer."""
    policy = mini_policy(seed=3)
    tok = policy.tokenizer
    prompts = ["(3+4)*5;", "12+3*4;"]
    p_ids, p_mask = policy.encode_prompts(prompts)  # left-padded, of different lengths
    jobs = [(0, tok("3+4=7;####", add_special_tokens=False)["input_ids"], tok("35", add_special_tokens=False)["input_ids"]),
            (1, tok("####", add_special_tokens=False)["input_ids"], tok("24", add_special_tokens=False)["input_ids"])]
    policy.model.eval()
    prob, logp = answer_probabilities(policy, p_ids, p_mask, jobs, micro=8)
    for j, (row, context, answer) in enumerate(jobs):
        prompt = tok(prompts[row])["input_ids"]
        seq = torch.tensor([prompt + context + answer])
        with torch.no_grad():
            lp = torch.log_softmax(policy.model(input_ids=seq).logits[0].float(), -1)
        start = len(prompt) + len(context)
        token_lp = [lp[start + k - 1, answer[k]].item() for k in range(len(answer))]
        assert prob[j].item() == pytest.approx(sum(math.exp(x) for x in token_lp) / len(answer), rel=1e-4)
        assert logp[j].item() == pytest.approx(sum(token_lp) / len(answer), rel=1e-4)


@pytest.mark.parametrize("params, key", [({"length_penalty": -0.1}, "length_penalty"), ({"delta": 2.0}, "delta"),
                                         ({"marker": ""}, "marker"), ({"kind": "mean"}, "kind")])
def test_bad_method_parameters_fail_at_load(params, key):
    with pytest.raises(ConfigError, match=key):
        mini_recipe(methods=[{"name": "rlcpr", **params}])


# -- the uncertainty sampler ----------------------------------------------------------------------

class EightPrompts:
    name = "eight"

    def train_problems(self, step, count, seed):
        return [Problem(prompt=f"p{(step + i) % 8}", answer="0") for i in range(count)]


def test_group_reward_std_is_the_unbiased_one():
    assert one_group_reward_std([0.0, 1.0, 0.0, 1.0]) == pytest.approx(math.sqrt(1 / 3))
    assert one_group_reward_std([1.0]) == 0.0 and one_group_reward_std([1.0, float("nan"), 1.0]) == 0.0


def test_sampler_weights_by_hand_and_it_prefers_spread_groups():
    s = UncertaintySampler(EightPrompts(), seed=0, pool=4, floor=0.01, ema=0.1, scale=0.5)
    first = s.problems(0, 2)  # nothing seen: uniform over the 8 candidates
    assert len(first) == 2
    s.record_rewards(["p0", "p1"], [[0.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    sigma = math.sqrt(1 / 3)
    assert s.tau == pytest.approx(sigma / 2)  # the first observation sets τ_σ
    assert s.weight(Problem("p0", "0")) == pytest.approx(sigma + 0.01)
    assert s.weight(Problem("p1", "0")) == 0.0  # σ̂ = 0 < 0.5·τ_σ: dropped
    assert s.weight(Problem("p5", "0")) == pytest.approx(sigma / 2 + 0.01)  # unseen: typical
    s.record_rewards(["p2"], [[0.0, 0.5]])
    assert s.tau == pytest.approx(0.9 * sigma / 2 + 0.1 * math.sqrt(0.125))
    # Over many draws of 1 from the 8 candidates, p1 is never drawn and p0 is drawn most.
    counts = {}
    for step in range(400):
        (chosen,) = s.problems(0, 1)
        counts[chosen.prompt] = counts.get(chosen.prompt, 0) + 1
    assert "p1" not in counts and counts["p0"] == max(counts.values())


def test_sampler_refills_from_dropped_prompts_when_too_few_survive():
    s = UncertaintySampler(EightPrompts(), seed=0, pool=2, scale=1.0)
    s.record_rewards([f"p{i}" for i in range(8)], [[0.0, 1.0]] + [[1.0, 1.0]] * 7)
    assert s.weight(Problem("p0", "0")) > 0 and s.weight(Problem("p3", "0")) == 0.0
    chosen = [p.prompt for p in s.problems(0, 3)]  # 6 candidates, 1 survivor, 3 asked: 2 come back
    assert len(chosen) == 3 and "p0" in chosen


def test_sampler_resumes_exactly():
    a = UncertaintySampler(EightPrompts(), seed=4)
    a.record_rewards([f"p{i}" for i in range(4)], [[0.0, 1.0], [1.0, 1.0], [0.2, 0.9], [0.5, 0.6]])
    a.problems(1, 2)
    b = UncertaintySampler(EightPrompts(), seed=4)
    b.load_state_dict(a.state_dict())
    assert [[p.prompt for p in a.problems(s, 3)] for s in range(5)] == \
        [[p.prompt for p in b.problems(s, 3)] for s in range(5)]


def test_the_sampler_learns_from_one_source_only():
    """``feedback: method`` (the default) ignores the scorer's rewards (a verifier's 0/1, say)
    and learns from the method's; ``feedback: scorer`` the other way round."""
    spread, flat = [[0.0, 1.0]], [[0.3, 0.3]]
    s = UncertaintySampler(EightPrompts(), seed=0)
    s.observe([Problem("p0", "0")], spread, 0)
    assert s.stds == {} and s.tau is None  # the scorer's rewards are not read
    s.record_rewards(["p0"], flat)
    assert s.stds == {"p0": 0.0} and s.tau == 0.0
    t = UncertaintySampler(EightPrompts(), seed=0, feedback="scorer")
    t.record_rewards(["p0"], flat)
    assert t.stds == {} and t.tau is None
    t.observe([Problem("p0", "0")], spread, 0)
    assert t.stds == {"p0": pytest.approx(math.sqrt(0.5))}


def test_group_rewards_by_hand():
    assert group_rewards(["a", "a", "b", "a", "c"], [3, 3, 1, 3, 7], [0.1, 0.2, 0.3, 0.4, 0.5]) == \
        (["a", "b", "c"], [[0.1, 0.2, 0.4], [0.3], [0.5]])


def test_the_method_feeds_its_probability_rewards_to_the_sampler():
    sampler = UncertaintySampler(EightPrompts(), seed=0)
    batch, _, _ = _annotate(sampler=sampler, length_penalty=0.1, delta=0.05, gate=0.5)
    r0, r1 = 0.9, 0.9 - 0.1 * 6 / 19  # the rewards written for group 0 (by hand above); group 1 is one row
    sigma = torch.tensor([r0, r1]).std().item()
    assert sampler.stds == {"(3+4)*5;": pytest.approx(sigma, rel=1e-5), "2+3*4;": 0.0}
    assert sampler.tau == pytest.approx(sigma / 2, rel=1e-5)
    # a sampler that takes the scorer's rewards gets nothing from the method
    scorer_fed = UncertaintySampler(EightPrompts(), seed=0, feedback="scorer")
    _annotate(sampler=scorer_fed, length_penalty=0.1)
    assert scorer_fed.stds == {}


def test_method_feedback_needs_the_method():
    with pytest.raises(ConfigError, match="feedback: method"):
        mini_recipe(sampler={"name": "uncertainty"})
    with pytest.raises(ConfigError, match="feedback"):
        mini_recipe(sampler={"name": "uncertainty", "feedback": "verifier"}, methods=[{"name": "rlcpr"}])
    assert mini_recipe(sampler={"name": "uncertainty", "feedback": "scorer"}).sampler.name == "uncertainty"


def test_bad_sampler_parameters_fail_at_load():
    with pytest.raises(ConfigError, match="floor"):
        mini_recipe(sampler={"name": "uncertainty", "floor": 0.0})


# -- a short run -----------------------------------------------------------------------------------

def test_a_short_run_resumes_exactly(tmp_path, monkeypatch):
    recipe = mini_recipe(sampler={"name": "uncertainty", "pool": 2},
                         methods=[{"name": "rlcpr", "length_penalty": 0.1, "debias": True}],
                         train={"steps": 4, "prompts_per_step": 4, "checkpoint_every": 2, "micro_batch_size": 8})
    rows = straight_and_resumed(recipe, tmp_path, monkeypatch)
    trained = [r for r in rows if "rlcpr/reward" in r]
    assert len(trained) == 4
    for r in trained:
        assert 0.0 <= r["rlcpr/prob"] <= 1.0 and 0.0 <= r["rlcpr/p_empty"] <= 1.0
        assert 0.0 <= r["rlcpr/t_star_frac"] <= 1.0 and r["rlcpr/group_std"] >= 0.0


# -- verifier-free end to end ----------------------------------------------------------------------

def _verifier_spy(path):
    """A stand-in for ``exact_answer`` that leaves a line in ``path`` and raises: the scorer
    runs reward functions in forked workers that turn an exception into a counted failure, so
    the file, not the exception, is what proves a call."""
    def verifier(completion, problem, **_):
        with open(path, "a") as fh:
            fh.write(f"{completion!r}\n")
        raise AssertionError("the verifier was called in training")
    return verifier


def _short(recipe_sets):
    return load_recipe(ROOT / "recipes" / "rlcpr.yaml", [
        *(f"model.tiny.{k}={v}" for k, v in MINI_TINY.items()), "train.steps=2", "train.prompts_per_step=2",
        "train.micro_batch_size=8", "train.checkpoint_every=2", "rollout.num_generations=4",
        "rollout.max_new_tokens=16", "eval.size=4", "eval.every=1", "eval.reward=exact_answer_eval",
        "log.plots=false", "log.progress=false", *recipe_sets])


def test_the_recipe_trains_without_calling_the_verifier(tmp_path, monkeypatch):
    """recipes/rlcpr.yaml with ``exact_answer`` replaced by a spy that records every call and
    raises: two training steps never call it, while the evaluation (which may read a verifier)
    does, through a copy registered under another name. The control, the recipe as it was (the
    sampler fed the scorer's ``exact_answer``), calls the spy: the check can fail."""
    from reasonrl.metrics_log import read_metrics
    from reasonrl.registry import REWARDS
    from reasonrl.rewards.basic import exact_answer
    from reasonrl.train.trainer import Trainer

    evaluated = []

    def eval_copy(completion, problem, **kw):
        evaluated.append(completion)
        return exact_answer(completion, problem, **kw)

    calls = tmp_path / "verifier_calls.txt"
    monkeypatch.setitem(REWARDS._items, "exact_answer", _verifier_spy(calls))
    with registered(exact_answer_eval=eval_copy):
        recipe = _short([])
        assert [r.name for r in recipe.rewards] == ["format"] and recipe.sampler.params["feedback"] == "method"
        assert recipe.methods[0].params.get("combine", "replace") == "replace"
        Trainer(recipe, tmp_path / "run", log=lambda m: None).run()
        assert not calls.exists()  # training never called the verifier
        assert evaluated  # the evaluation did score answers
        rows = [r for r in read_metrics(tmp_path / "run") if "rlcpr/reward" in r]
        assert len(rows) == 2 and all("reward/exact_answer" not in r for r in rows)
        assert all(not any(k.startswith("reward_failures") for k in r) for r in rows)
        # control: the old recipe (exact_answer scored, the sampler fed the scorer's rewards)
        control = _short(["rewards=[{name: exact_answer}]", "sampler.feedback=scorer"])
        with pytest.warns(UserWarning, match="the verifier was called in training"):
            Trainer(control, tmp_path / "control", log=lambda m: None).run()
    assert calls.exists() and len(calls.read_text().splitlines()) > 0
