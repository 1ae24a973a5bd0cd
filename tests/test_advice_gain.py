"""Stage 2 of the student–advisor method: the ``advice_gain`` method (the information gain of the
advisor's answer). The pure math by hand; on a hand-built batch, the gain against independent
forwards on the transcript with the advice deleted (positions kept), and no forward for rows
without an answered call; the stage-2 recipe end to end from a saved model; load-time errors."""

import math
import re
from pathlib import Path

import pytest
import torch

import reasonrl.methods.advisor.method as advice_gain_module
import reasonrl.policy.hf as hf_policy  # the module whose sample_completions an episode turn calls
from reasonrl.methods.advisor.maths import advice_gain, answer_probability
from reasonrl.config import ConfigError, load_recipe
from reasonrl.methods.advisor import ArithmeticAdvisorTask
from reasonrl.methods.advisor.method import AdviceGain
from reasonrl.hooks import MethodContext
from reasonrl.policy.char_tokenizer import build_char_tokenizer
from reasonrl.policy.hf import HFPolicy
from reasonrl.policy.tiny import TinySpec, new_tiny_model
from reasonrl.metrics_log import read_metrics
from reasonrl.train.trainer import Trainer

from helpers import MINI_TINY, episode_batch, mini_recipe, scripted_samples

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "advisor_stage2.yaml"
ORACLE = {"name": "advisor", "advisor": "oracle_arithmetic"}
NAN, LN = float("nan"), math.log


def student(seed=0):
    tok = build_char_tokenizer(ArithmeticAdvisorTask.alphabet)
    spec = TinySpec(**{**MINI_TINY, "seed": seed})
    return HFPolicy(new_tiny_model(spec, len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id), tok)


# -- the pure math by hand -------------------------------------------------------------------

def test_the_gain_on_a_hand_built_case():
    # Row 0: p_with = 1 · 0.4, p_without = 1 · 0.1 (sequence); token means 0.7 and 0.55.
    # Row 1: no advice: 0 whatever its log-probs (NaN here). Row 2: advice that hurts.
    # Row 3: advice, but an empty answer mask: p = 0. The third column is padding (NaN, -inf).
    w = torch.tensor([[0.0, LN(0.4), NAN], [NAN] * 3, [LN(0.2), LN(0.5), -math.inf], [NAN] * 3])
    wo = torch.tensor([[0.0, LN(0.1), -math.inf], [NAN] * 3, [LN(0.5), LN(0.5), NAN], [NAN] * 3])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 1, 0], [0, 0, 0]])
    has = torch.tensor([True, False, True, True])
    torch.testing.assert_close(answer_probability(w[:1], mask[:1]), torch.tensor([0.4]))
    torch.testing.assert_close(answer_probability(w[:1], mask[:1], "token_mean"), torch.tensor([0.7]))
    gain, p_with, p_without = advice_gain(w, wo, mask, has)
    torch.testing.assert_close(p_with, torch.tensor([0.4, 0.0, 0.1, 0.0]))
    torch.testing.assert_close(p_without, torch.tensor([0.1, 0.0, 0.25, 0.0]))
    torch.testing.assert_close(gain, torch.tensor([0.3, 0.0, -0.15, 0.0]))  # not clamped: bad advice costs
    gain, p_with, _ = advice_gain(w, wo, mask, has, "token_mean")
    torch.testing.assert_close(gain, torch.tensor([0.7 - 0.55, 0.0, 0.35 - 0.5, 0.0]))
    # The gate: only correct episodes are paid; p is reported either way.
    gain, p_with, _ = advice_gain(w, wo, mask, has, correct=torch.tensor([1, 1, 0, 1]))
    torch.testing.assert_close(gain, torch.tensor([0.3, 0.0, 0.0, 0.0]))
    assert p_with[2] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="aggregate"):
        answer_probability(w, mask, "max")


# -- the method on a hand-built batch ----------------------------------------------------------

def hand_batch(pol, rows):
    """Episodes given as (prompt, gold, [(text, kind)]): kind 'm' for the model's tokens, 'v' for
    an advisor observation (channel 1)."""
    return episode_batch(pol, [p for p, _, _ in rows], [parts for _, _, parts in rows], {"v": 1},
                         meta={"answer": [g for _, g, _ in rows], "reward/exact_answer": [1.0] * len(rows)})


def method(pol, **params):
    m = AdviceGain(**params)
    m.setup(MethodContext(recipe=mini_recipe(task={"name": "arithmetic_advisor"}, env=ORACLE,
                                             rollout={"max_new_tokens": 12, "max_turns": 4}),
                          policy=pol, run_dir=Path("."), log=lambda s: None))
    return m


M, V, EOS = "m", "v", ("</s>", "m")
# (prompt, gold, the episode, the transcript x the answer is appended to, answered call?)
CASES = [
    ("1+2*4;", "9", [("{1+2*4}", M), ("=9", V), (";####9", M), EOS], [("{1+2*4}", M), ("=9", V), (";", M)], True),
    ("1+2;", "3", [("1+2=3;####3", M), EOS], None, False),  # no call
    ("1+2;", "3", [("{1+2}", M), ("=", V), (";####3", M), EOS], None, False),  # refused: a bare '='
    ("7*5;", "35", [("{7*5}", M), ("=35", V), ("####35", M), EOS], [("{7*5}", M), ("=35", V)], True),  # x ends in advice
    ("3*4;", "12", [("{3*4}", M), ("=12", V)], [("{3*4}", M), ("=12", V)], True),  # stopped after the advice
    ("(1+2)*4;", "12", [("{1+2}", M), ("=3", V), ("{3*4}", M), ("=12", V), (";1+1=2;####12", M), EOS],
     [("{1+2}", M), ("=3", V), ("{3*4}", M), ("=12", V), (";1+1=2;", M)], True),  # two calls, work before ####
    ("9+9;", "18", [("{9+9}", M), ("=18", V), (";####17", M), EOS], [("{9+9}", M), ("=18", V), (";", M)], True),  # wrong
]


def independent_logp(pol, prompt, transcript, gold, delete_advice):
    """log p(gold | x) by a plain forward on one unpadded row: BOS + prompt + x + '####gold' + EOS, the
    advice tokens deleted (every other position id kept) when ``delete_advice``."""
    tok = pol.tokenizer
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    ids = pol.encode_prompts([prompt])[0][0].tolist()
    keep = [True] * len(ids)
    for text, kind in transcript:
        t = enc(text)
        ids, keep = ids + t, keep + [not (delete_advice and kind == V)] * len(t)
    start = len(ids)
    ids = ids + enc(f"####{gold}") + [tok.eos_token_id]
    keep += [True] * (len(ids) - start)
    pos = [q for q in range(len(ids)) if keep[q]]
    logits = pol.model(input_ids=torch.tensor([[ids[q] for q in pos]]), position_ids=torch.tensor([pos])).logits[0]
    logp = torch.log_softmax(logits.float(), -1)
    at = {q: i for i, q in enumerate(pos)}
    total = 0.0
    for q in range(start, len(ids)):
        prev = max(p for p in pos if p < q)  # the last kept token before the answer token predicts it
        total += float(logp[at[prev], ids[q]])
    return total


def test_the_gain_equals_independent_forwards_with_the_advice_deleted(monkeypatch):
    pol = student()
    forwarded = []
    real = advice_gain_module.masked_logprobs
    monkeypatch.setattr(advice_gain_module, "masked_logprobs",
                        lambda model, ids, *a, **k: forwarded.append(len(ids)) or real(model, ids, *a, **k))
    m = method(pol, eta=1.0)
    batch = hand_batch(pol, [(p, g, ep) for p, g, ep, _, _ in CASES])
    assert not batch.prompt_mask.all()  # left-padded prompts
    before = batch.rewards.clone()
    metrics = m.annotate(batch, 0)
    assert pol.model.training  # restored
    advice = [c for c in CASES if c[4]]
    assert forwarded == [len(advice), len(advice)]  # one micro-batch, two views, only the rows with advice
    pol.model.eval()
    want, p_w, p_wo, lp_w, lp_wo = [], [], [], [], []
    with torch.no_grad():
        for prompt, gold, _, transcript, answered in CASES:
            if not answered:
                want.append(0.0)
                continue
            lp_w.append(independent_logp(pol, prompt, transcript, gold, False))
            lp_wo.append(independent_logp(pol, prompt, transcript, gold, True))
            p_w.append(math.exp(lp_w[-1]))
            p_wo.append(math.exp(lp_wo[-1]))
            want.append(p_w[-1] - p_wo[-1])
        # Row by row, in log space (the untrained model's p are ~1e-8): log π(y* | x) with and without.
        got_w, got_wo, amask = m.answer_logprobs(m.views(batch, [i for i, c in enumerate(CASES) if c[4]]))
    torch.testing.assert_close((got_w * amask).sum(-1), torch.tensor(lp_w), atol=1e-4, rtol=0)
    torch.testing.assert_close((got_wo * amask).sum(-1), torch.tensor(lp_wo), atol=1e-4, rtol=0)
    assert all(abs(a - b) > 1e-2 for a, b in zip(lp_w, lp_wo))  # hiding the advice changed every p
    torch.testing.assert_close(batch.rewards - before, torch.tensor(want), atol=1e-13, rtol=1e-3)
    assert metrics["advice_gain/rows"] == pytest.approx(len(advice) / len(CASES))
    assert metrics["advice_gain/gain"] == pytest.approx(sum(want) / len(CASES), abs=1e-6)
    assert metrics["advice_gain/p_with"] == pytest.approx(sum(p_w) / len(p_w), rel=1e-4)
    assert metrics["advice_gain/p_without"] == pytest.approx(sum(p_wo) / len(p_wo), rel=1e-4)
    # Micro-batches of 2 (other paddings), token_mean and the gate: consistent with the above.
    pol.model.train()
    small = hand_batch(pol, [(p, g, ep) for p, g, ep, _, _ in CASES])
    method(pol, eta=2.0, micro_batch_size=2).annotate(small, 0)
    torch.testing.assert_close(small.rewards - before, 2 * torch.tensor(want), atol=1e-13, rtol=1e-3)
    gated = hand_batch(pol, [(p, g, ep) for p, g, ep, _, _ in CASES])
    gated.meta["reward/exact_answer"] = [float(i % 2) for i in range(len(CASES))]
    method(pol, eta=1.0, gated=True).annotate(gated, 0)
    torch.testing.assert_close(gated.rewards - before, torch.tensor([w * (i % 2) for i, w in enumerate(want)]),
                               atol=1e-13, rtol=1e-3)
    # token_mean: p is a mean of token probabilities (~1/vocab here), far from the sequence's.
    mean = hand_batch(pol, [(p, g, ep) for p, g, ep, _, _ in CASES])
    metrics = method(pol, eta=1.0, aggregate="token_mean").annotate(mean, 0)
    assert 1e-3 < metrics["advice_gain/p_with"] < 1 and metrics["advice_gain/p_with"] > 1e3 * max(p_w)


def test_rows_without_an_answered_call_get_zero_without_a_forward(monkeypatch):
    pol = student()
    m = method(pol, eta=1.0)
    monkeypatch.setattr(advice_gain_module, "masked_logprobs", lambda *a, **k: pytest.fail("no forward is needed"))
    batch = hand_batch(pol, [(p, g, ep) for p, g, ep, _, answered in CASES if not answered])
    metrics = m.annotate(batch, 0)
    assert batch.rewards.tolist() == [0.0, 0.0]
    assert metrics == {"advice_gain/gain": 0.0, "advice_gain/p_with": 0.0, "advice_gain/p_without": 0.0,
                       "advice_gain/rows": 0.0}
    del batch.aux["env_channel"]  # a batch without observations at all
    assert m.annotate(batch, 0)["advice_gain/rows"] == 0.0 and batch.rewards.tolist() == [0.0, 0.0]


def test_the_answer_starts_at_the_last_marker_of_the_last_turn():
    pol = student()
    m = method(pol)
    tok = pol.tokenizer
    ids = lambda s: torch.tensor(tok(s, add_special_tokens=False)["input_ids"])  # noqa: E731
    no_obs = lambda s: torch.zeros(len(ids(s)), dtype=torch.bool)  # noqa: E731
    assert m.answer_start(ids("1+2=3;####3"), no_obs("1+2=3;####3")) == 6
    assert m.answer_start(ids("####1;####3"), no_obs("####1;####3")) == 6  # the last one
    assert m.answer_start(ids("1+2=3;"), no_obs("1+2=3;")) == 6  # no answer: all of it
    eos = torch.cat([ids("12"), torch.tensor([tok.eos_token_id])])
    assert m.answer_start(eos, torch.zeros(3, dtype=torch.bool)) == 2  # less the EOS
    # A '####' inside an observation (advice: text) is not the student's answer.
    text = ids("{1+2}=####3;")
    observed = torch.tensor([0] * 5 + [1] * 6 + [0], dtype=torch.bool)
    assert m.answer_start(text, observed) == len(text)
    with pytest.raises(ValueError, match="answer_format"):
        AdviceGain(answer_format="####")


# -- the recipe end to end ---------------------------------------------------------------------

def asker(model, tokenizer, ids, mask, g, max_new_tokens, *args, **kwargs):
    """A stand-in for ``sample_completions`` that plays an advisor episode: ask the whole problem,
    then answer with the advice, right on even rows and off by one on odd ones."""
    rows = []
    for r, (row, m) in enumerate(zip(ids, mask)):
        text = tokenizer.decode(row[m.bool()], skip_special_tokens=True)
        found = re.search(r"\}=(-?\d+)", text)
        turn = "{" + text.split(";")[0] + "}" if found is None else f";####{int(found.group(1)) + r % 2}"
        rows.append(tokenizer(turn, add_special_tokens=False)["input_ids"][:max_new_tokens]
                    + ([tokenizer.eos_token_id] if found else []))
    return scripted_samples(ids, mask, rows, tokenizer)


def test_the_stage_2_recipe_trains_from_a_saved_model(tmp_path, monkeypatch):
    """Two steps of recipes/advisor_stage2.yaml, starting (as stage 2 of the schedule does) from a
    model folder written by ``policy.save``, the way a run writes ``final_model``."""
    student().save(tmp_path / "stage1_final_model")
    monkeypatch.setattr(hf_policy, "sample_completions", asker)
    recipe = load_recipe(RECIPE, [
        f"model={{backend: hf, path: {tmp_path / 'stage1_final_model'}}}", "env.advisor=oracle_arithmetic",
        "train.steps=2", "train.prompts_per_step=2", "rollout.num_generations=4", "eval.size=4",
        "log.plots=false", "log.progress=false"])
    assert recipe.methods[0].name == "advice_gain" and recipe.env.params["token_cost"] > 0
    summary = Trainer(recipe, tmp_path / "run", log=lambda m: None).run()
    assert summary["steps"] == 2
    rows = [r for r in read_metrics(tmp_path / "run") if r["step"] > 0 and "reward/mean" in r]
    assert len(rows) == 2
    for r in rows:
        assert r["episode/calls"] == 1.0 and r["reward/exact_answer"] == 0.5 and r["advice_gain/rows"] == 1.0
        assert 0 < r["advice_gain/p_with"] < 1 and 0 < r["advice_gain/p_without"] < 1
        assert r["advice_gain/gain"] == pytest.approx(r["advice_gain/p_with"] - r["advice_gain/p_without"], abs=1e-6)
        assert r["reward/env"] == pytest.approx(-0.005 * r["episode/query_tokens"])  # the query-length cost
        assert not r.get("skipped") and r["grad_norm"] > 0


# -- load-time errors --------------------------------------------------------------------------

ADVISOR = {"task": {"name": "arithmetic_advisor"}, "env": ORACLE, "rollout": {"max_new_tokens": 12, "max_turns": 4}}
BAD = [
    ({"methods": [{"name": "advice_gain"}], "task": {"name": "arithmetic_advisor"}},
     "method 'advice_gain': .*this recipe has no env"),
    ({"methods": [{"name": "advice_gain"}], "task": {"name": "arithmetic_tools"}, "env": {"name": "calculator"}},
     r"channel 'advisor' is not an observation channel of env 'calculator' \(its channels: none\)"),
    ({"methods": [{"name": "advice_gain"}], "task": {"name": "evidence_seek"}, "env": {"name": "evidence"},
      "rollout": {"max_new_tokens": 16}}, r"channel 'advisor' .* env 'evidence' \(its channels: \['a', 'b'\]\)"),
    ({**ADVISOR, "methods": [{"name": "advice_gain", "channel": "advice"}]}, r"channel 'advice' .*\['advisor'\]"),
    ({**ADVISOR, "methods": [{"name": "advice_gain", "gated": True, "correct_reward": "format"}]},
     r"correct_reward 'format' .* not among the recipe's rewards \['exact_answer'\]"),
    ({**ADVISOR, "methods": [{"name": "advice_gain", "answer_format": "#### answer"}]}, "answer_format must hold"),
    ({**ADVISOR, "methods": [{"name": "advice_gain", "eta": -1}]}, "eta must be >= 0"),
    ({**ADVISOR, "methods": [{"name": "advice_gain", "aggregate": "mean"}]}, "must be one of sequence, token_mean"),
]


@pytest.mark.parametrize("sections, message", BAD, ids=[m[:30] for _, m in BAD])
def test_bad_advice_gain_settings_are_recipe_errors(sections, message):
    with pytest.raises(ConfigError, match=message):
        mini_recipe(**sections)


def test_the_stage_2_recipe_loads_and_a_gated_one_too():
    recipe = load_recipe(RECIPE, [])
    assert recipe.env.params["cost"] == 0.0 and recipe.methods[0].params["eta"] == 0.5
    mini_recipe(**ADVISOR, methods=[{"name": "advice_gain", "gated": True, "aggregate": "token_mean"}])
