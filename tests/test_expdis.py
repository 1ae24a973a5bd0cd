"""ExpDis (Exploration–Distillation): novelty by hand, the bonus after GRPO normalisation, the
filter, SFT, the shared memory between explorers, and the round loop end to end with an exact
resume after a crash inside an explorer."""

import json
import math

import pytest
import torch

from reasonrl.algos.advantages import grpo_advantages
from reasonrl.methods.expdis.advantage import (CORRECT_KEY, NOVELTY_KEY, answer_count_novelty, filter_solutions, jaccard,
                                    memory_novelty, near_duplicate_keep, ngram_similarity, ngrams,
                                    novelty_advantages)
from reasonrl.batch import RolloutBatch
from reasonrl.config import ConfigError
from reasonrl.registry import ADVANTAGES, REWARDS

from helpers import mini_policy, mini_recipe


# -- novelty by hand ------------------------------------------------------------------------------

def test_ngram_sets_and_jaccard_by_hand():
    assert ngrams("abcd", 3) == {"abc", "bcd"}
    assert ngrams("ab", 3) == {"ab"}  # shorter than n: the text is its own gram
    assert ngrams("", 3) == frozenset()
    assert ngrams("1+2 = 3", 2, "word") == {("1", "+"), ("+", "2"), ("2", "="), ("=", "3")}
    # {abc, bcd} vs {abc, bce}: 1 shared of 3.
    assert ngram_similarity("abcd", "abce") == pytest.approx(1 / 3)
    assert ngram_similarity("abcd", "abcd") == 1.0
    assert ngram_similarity("abcd", "wxyz") == 0.0
    assert jaccard(frozenset(), frozenset()) == 1.0
    # "3+4=7;" vs "4+3=7;": 3-grams {3+4,+4=,4=7,=7;} and {4+3,+3=,3=7,=7;}: 1 shared of 7.
    assert ngram_similarity("3+4=7;", "4+3=7;") == pytest.approx(1 / 7)


def test_memory_and_answer_count_novelty_by_hand():
    mem = ["abce", "wxyz"]
    assert memory_novelty(ngram_similarity("abcd", m) for m in mem) == pytest.approx(1 - 1 / 3)
    assert memory_novelty([]) == 1.0  # an empty memory: everything is new
    assert memory_novelty(ngram_similarity("abcd", m) for m in mem + ["abcd"]) == 0.0
    assert answer_count_novelty("35", ["35", "35", "12"]) == pytest.approx(1 / math.sqrt(3))
    assert answer_count_novelty("35", []) == 1.0


# -- the explorer's advantage --------------------------------------------------------------------

class _Batch:
    def __init__(self, aux):
        self.aux = aux


def test_bonus_is_added_after_grpo_normalisation_by_hand():
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 1.0])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0]])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    token_rewards = torch.zeros(6, 3)
    token_rewards[torch.arange(6), mask.sum(-1) - 1] = rewards
    nov = torch.tensor([1.0, 0.25, 0.0, 0.0, 0.5, 0.0])
    correct = (rewards == 1).float()
    aux = {NOVELTY_KEY: nov, CORRECT_KEY: correct}
    out = ADVANTAGES.get("novelty")(token_rewards, mask, groups, batch=_Batch(aux), beta=0.5)
    # Group 0: mean 1/2, unbiased std sqrt(1/3): A = ±(1/2)/sqrt(1/3) = ±0.866025; group 1 all correct: A = 0.
    a = 0.5 / math.sqrt(1 / 3)
    want_rows = [a + 0.5 * 1.0, a + 0.5 * 0.25, -a, -a, 0.5 * 0.5, 0.0]
    want = torch.tensor(want_rows).unsqueeze(-1) * mask
    assert torch.allclose(out, want, atol=1e-5)
    # β = 0 is the base estimator exactly; the bonus never reaches incorrect rows.
    base = grpo_advantages(token_rewards, mask, groups)
    zero = ADVANTAGES.get("novelty")(token_rewards, mask, groups, batch=_Batch(aux), beta=0.0)
    assert torch.equal(zero, base)
    wrong = novelty_advantages(base, torch.ones(6), torch.zeros(6), mask, beta=1.0)
    assert torch.equal(wrong, base)


def test_novelty_advantage_without_the_memory_is_a_recipe_error():
    with pytest.raises(ConfigError, match="novelty"):
        mini_recipe(advantage={"name": "novelty"})


def test_embedding_similarity_refused_without_sentence_transformers():
    from reasonrl.methods.expdis.method import embedding_available

    if embedding_available():
        pytest.skip("sentence_transformers is installed here")
    with pytest.raises(ConfigError, match="sentence_transformers"):
        mini_recipe(advantage={"name": "novelty"},
                    methods=[{"name": "novelty_memory", "similarity": "embedding", "embedding_model": "/nope"}])


# -- the filter -----------------------------------------------------------------------------------

def _rec(prompt, completion, novelty=1.0, correct=True, truncated=False, tokens=5):
    return {"prompt": prompt, "completion": completion, "novelty": novelty, "correct": correct,
            "truncated": truncated, "tokens": tokens}


def test_filter_and_near_duplicate_removal_by_hand():
    records = [
        _rec("p", "3+4=7;7*5=35;####35"),                    # kept
        _rec("p", "3+4=7;7*5=35;####35"),                    # exact duplicate of the first
        _rec("p", "4+3=7;5*7=35;####35"),                    # a different route: kept
        _rec("p", "x", novelty=0.05),                        # novelty below τ_N
        _rec("p", "y", correct=False),                       # wrong
        _rec("p", "z", truncated=True),                      # truncated
        _rec("p", "long", tokens=50),                        # too long
        _rec("q", "3+4=7;7*5=35;####35"),                    # same text, another prompt: kept
    ]
    res = filter_solutions(records, tau_n=0.1, tau_dup=0.9, max_tokens=20)
    assert [(r["prompt"], r["completion"]) for r in res.kept] == [
        ("p", "3+4=7;7*5=35;####35"), ("p", "4+3=7;5*7=35;####35"), ("q", "3+4=7;7*5=35;####35")]
    assert res.counts == {"candidates": 8, "incorrect": 1, "low_novelty": 1, "format": 2, "duplicate": 1, "kept": 3}
    # abcd / abce share 1/3 of their 3-grams: a duplicate at τ_dup = 0.3, not at 0.5.
    assert near_duplicate_keep(["abcd", "abce"], 0.3) == [True, False]
    assert near_duplicate_keep(["abcd", "abce"], 0.5) == [True, True]


# -- SFT ------------------------------------------------------------------------------------------

def _examples(policy):
    from reasonrl.train.sft import SFTExample

    tok = policy.tokenizer
    pairs = [("3+4*2;", "4*2=8;3+8=11;####11"), ("(1+2)*3;", "1+2=3;3*3=9;####9"),
             ("5*2+1;", "5*2=10;10+1=11;####11")]
    return [SFTExample(p, tuple(tok(c, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]))
            for p, c in pairs]


def test_sft_lowers_the_nll_of_its_data_and_does_not_depend_on_the_split():
    from reasonrl.sections import OptimConfig
    from reasonrl.train.sft import response_nll, sft

    weights = {}
    for mb in (3, 1):
        policy = mini_policy(seed=0)
        ex = _examples(policy)
        before = response_nll(policy, ex)
        stats = sft(policy, ex, OptimConfig(lr=3e-3, warmup_steps=0), epochs=3, batch_size=3,
                    micro_batch_size=mb, seed=0)
        after = response_nll(policy, ex)
        assert after < before - 0.1 and stats["sft/loss_last"] < stats["sft/loss_first"]
        weights[mb] = {k: v.detach().clone() for k, v in policy.model.state_dict().items()}
    assert all(torch.allclose(weights[3][k], weights[1][k], atol=1e-5) for k in weights[3])


# -- the memory on the method hooks ------------------------------------------------------------------

def _scored_batch(policy, prompt, texts, correct):
    tok = policy.tokenizer
    ids = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
    width = max(map(len, ids))
    n = len(texts)
    p_ids, p_mask = policy.encode_prompts([prompt] * n)
    comp = torch.tensor([x + [tok.pad_token_id] * (width - len(x)) for x in ids])
    mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids])
    return RolloutBatch(prompt_ids=p_ids, prompt_mask=p_mask, completion_ids=comp, completion_mask=mask,
                        group_ids=torch.zeros(n, dtype=torch.long), rewards=torch.tensor(correct, dtype=torch.float32),
                        truncated=torch.zeros(n, dtype=torch.bool),
                        meta={"prompt": [prompt] * n, "completion": list(texts), "answer": ["35"] * n,
                              "problem": [None] * n, "reward/exact_answer": list(correct)})


def _memory(tmp_path, name, policy, **params):
    from reasonrl.hooks import MethodContext
    from reasonrl.methods.expdis.method import NoveltyMemory

    run = tmp_path / name
    run.mkdir()
    m = NoveltyMemory(**params)
    m.setup(MethodContext(recipe=mini_recipe(), policy=policy, run_dir=run, log=lambda s: None))
    return m, run


def test_the_shared_memory_pushes_the_second_explorers_novelty_down(tmp_path):
    from reasonrl.methods.expdis.method import RECORD_FILE, read_records

    policy = mini_policy()
    sol = ["3+4=7;7*5=35;####35", "4+3=7;5*7=35;####35"]
    first, run1 = _memory(tmp_path, "e0", policy)
    b = _scored_batch(policy, "(3+4)*5;", sol + ["wrong"], [1.0, 1.0, 0.0])
    metrics = first.annotate(b, 0)
    assert b.aux[NOVELTY_KEY].tolist() == [1.0, 1.0, 0.0] and b.aux[CORRECT_KEY].tolist() == [1.0, 1.0, 0.0]
    assert metrics["novelty/correct_rows"] == 2 and metrics["novelty/new_distinct"] == 2
    recs = read_records(run1 / RECORD_FILE)
    assert [r["completion"] for r in recs] == sol and all(r["novelty"] == 1.0 for r in recs)
    # The second explorer starts from the first's record: the same solutions are no longer new,
    # a fresh one still is.
    second, _ = _memory(tmp_path, "e1", policy, memory_files=[str(run1 / RECORD_FILE)])
    fresh = "5*3=15;5*4=20;15+20=35;####35"
    b2 = _scored_batch(policy, "(3+4)*5;", [sol[0], fresh], [1.0, 1.0])
    second.annotate(b2, 0)
    want_fresh = 1 - max(ngram_similarity(fresh, s) for s in sol)
    assert b2.aux[NOVELTY_KEY].tolist() == pytest.approx([0.0, want_fresh])
    # An explorer without that memory sees both as new.
    alone, _ = _memory(tmp_path, "e2", policy)
    b3 = _scored_batch(policy, "(3+4)*5;", [sol[0], fresh], [1.0, 1.0])
    alone.annotate(b3, 0)
    assert b3.aux[NOVELTY_KEY].tolist() == [1.0, 1.0]
    # include_group: the other correct rows of the prompt in the batch count too (symmetrically).
    grouped, _ = _memory(tmp_path, "e4", policy, include_group=True)
    b5 = _scored_batch(policy, "(3+4)*5;", [sol[0], sol[0], fresh, "wrong"], [1.0, 1.0, 1.0, 0.0])
    grouped.annotate(b5, 0)
    assert b5.aux[NOVELTY_KEY].tolist() == pytest.approx([0.0, 0.0, 1 - ngram_similarity(fresh, sol[0]), 0.0])
    # The answer-count kind: 1/sqrt(1 + n) over the solutions of the prompt with that answer.
    counted, _ = _memory(tmp_path, "e3", policy, similarity="answer", memory_files=[str(run1 / RECORD_FILE)])
    b4 = _scored_batch(policy, "(3+4)*5;", [fresh], [1.0])
    counted.annotate(b4, 0)
    assert b4.aux[NOVELTY_KEY].tolist() == pytest.approx([1 / math.sqrt(3)])


def test_the_memory_resumes_exactly_and_drops_records_after_the_checkpoint(tmp_path):
    from reasonrl.methods.expdis.method import RECORD_FILE, read_records

    policy = mini_policy()
    m, run = _memory(tmp_path, "e0", policy)
    m.annotate(_scored_batch(policy, "p;", ["a1", "b2"], [1.0, 0.0]), 0)
    state = json.loads(json.dumps(m.state_dict()))
    m.annotate(_scored_batch(policy, "p;", ["a1", "c3"], [1.0, 1.0]), 1)  # lost in the "crash"
    assert len(read_records(run / RECORD_FILE)) == 3
    from reasonrl.hooks import MethodContext
    from reasonrl.methods.expdis.method import NoveltyMemory

    resumed = NoveltyMemory()
    resumed.setup(MethodContext(recipe=mini_recipe(), policy=policy, run_dir=run, log=lambda s: None))
    resumed.load_state_dict(state)
    assert [r["completion"] for r in read_records(run / RECORD_FILE)] == ["a1"]
    b = _scored_batch(policy, "p;", ["a1", "c3"], [1.0, 1.0])
    resumed.annotate(b, 1)
    assert b.aux[NOVELTY_KEY].tolist() == [0.0, pytest.approx(1 - ngram_similarity("c3", "a1"))]
    assert [r["completion"] for r in read_records(run / RECORD_FILE)] == ["a1", "a1", "c3"]


# -- the loop ---------------------------------------------------------------------------------------

HIT = "expdis_test_has_one"
if HIT not in REWARDS.names():
    @REWARDS.register(HIT)
    def _has_one(completion, problem, **_):
        """1.0 when the completion holds the digit 1 (an untrained mini model's "correct" answer,
        so that the loop has something to distil)."""
        return float("1" in completion)


def loop_recipe(**expdis):
    settings = {"rounds": 1, "explorers": 2, "student_steps": 1, "sft_epochs": 1, "sft_batch_size": 8,
                "sft_lr": 1e-3, **expdis}
    return mini_recipe(
        rewards=[{"name": "exact_answer"}, {"name": HIT}],
        advantage={"name": "novelty", "base": "grpo", "beta": 0.5},
        methods=[{"name": "novelty_memory", "correct_reward": HIT, "expdis": settings}],
        rollout={"num_generations": 4, "max_new_tokens": 12},
        train={"steps": 2, "prompts_per_step": 3, "checkpoint_every": 1, "micro_batch_size": 16},
        eval={"size": 4, "n": 2, "k": [1, 2]}, log={"plots": False, "progress": False})


def _weights(path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_the_loop_runs_end_to_end_and_resumes_exactly_after_a_crash_in_an_explorer(tmp_path, monkeypatch):
    from reasonrl.methods.expdis.loop import STATE_FILE, ExpDisLoop, saved_recipe
    from reasonrl.train.trainer import Trainer

    recipe = loop_recipe()
    a = ExpDisLoop(recipe, tmp_path / "a", log=lambda m: None).run()
    state = json.loads((tmp_path / "a" / STATE_FILE).read_text())
    assert list(state["done"]) == ["start/eval", "round_1/explorer_0", "round_1/explorer_1", "round_1/filter",
                                   "round_1/sft", "round_1/student", "final"]
    e0, e1 = state["done"]["round_1/explorer_0"], state["done"]["round_1/explorer_1"]
    assert e0["correct_samples"] > 0 and e0["distinct_correct"] <= e0["correct_samples"]
    # Explorer 1 started from explorer 0's record.
    r1 = json.loads((tmp_path / "a" / "round_1" / "explorer_1" / "recipe.json").read_text())
    mem = next(m for m in r1["methods"] if m["name"] == "novelty_memory")
    assert mem["memory_files"] == [str(tmp_path / "a" / "round_1" / "explorer_0" / "novelty_samples.jsonl")]
    filt = state["done"]["round_1/filter"]
    assert filt["candidates"] == e0["correct_samples"] + e1["correct_samples"] and filt["kept"] > 0
    sft = state["done"]["round_1/sft"]
    assert sft["examples"] == filt["kept"] and sft["nll_after"] < sft["nll_before"]
    # The plain-GRPO student started from the SFT model (backend hf, path) with the base advantage.
    rs = json.loads((tmp_path / "a" / "round_1" / "student" / "recipe.json").read_text())
    assert rs["model"]["backend"] == "hf" and rs["model"]["path"] == sft["model"]
    assert rs["advantage"]["name"] == "grpo" and all(m["name"] != "novelty_memory" for m in rs["methods"])
    assert set(a["final_eval"]) >= {"accuracy", "pass@1", "pass@2"}
    assert a["rounds"][0]["explorer_correct"] == [e0["correct_samples"], e1["correct_samples"]]
    rows = (tmp_path / "a" / "expdis_rounds.jsonl").read_text().splitlines()
    assert len(rows) == len(state["done"])
    assert saved_recipe(tmp_path / "a").to_dict() == recipe.to_dict()

    # A crash at step 1 of the second explorer (after its checkpoint at step 1), then --resume.
    original, calls = Trainer.train_step, {"n": 0}

    def crashing(self, s):
        if s == 1:
            calls["n"] += 1
            if calls["n"] == 2:
                raise RuntimeError("simulated crash")
        return original(self, s)

    monkeypatch.setattr(Trainer, "train_step", crashing)
    with pytest.raises(RuntimeError, match="simulated crash"):
        ExpDisLoop(recipe, tmp_path / "b", log=lambda m: None).run()
    monkeypatch.setattr(Trainer, "train_step", original)
    done = json.loads((tmp_path / "b" / STATE_FILE).read_text())["done"]
    assert list(done) == ["start/eval", "round_1/explorer_0"]
    with pytest.raises(ConfigError, match="not empty"):
        ExpDisLoop(recipe, tmp_path / "b", log=lambda m: None).run()
    b = ExpDisLoop(saved_recipe(tmp_path / "b"), tmp_path / "b", resume=True, log=lambda m: None).run()
    wa, wb = _weights(tmp_path / "a" / "final_model"), _weights(tmp_path / "b" / "final_model")
    assert set(wa) == set(wb) and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert a["rounds"] == b["rounds"] and a["final_eval"] == b["final_eval"]
    for name in ("round_1/distill.jsonl", "round_1/memory.jsonl"):
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text()
