"""Language drift (arXiv 2610.02015, metrics INFERRED): the reasoning span, its reference
perplexity by hand, readability on scripted readers, the ``drift`` method's schedule and frozen
reference, exact resume, and the SFT and readability scripts end to end."""

import importlib.util
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from reasonrl.config import ConfigError
from reasonrl.methods.drift.measure import (drift_summary, readability, reasoning_lengths, reasoning_nll, span_mask,
                                     span_nll, text_reasoning_nll, truncate_reasoning)
from reasonrl.hooks import MethodContext
from reasonrl.methods.drift.method import ReasoningDrift
from reasonrl.policy.char_tokenizer import build_char_tokenizer
from reasonrl.problem import Problem
from reasonrl.metrics_log import read_metrics
from reasonrl.train.trainer import Trainer

from helpers import MINI_TINY, episode_batch, mini_policy, mini_recipe, straight_and_resumed

ROOT = Path(__file__).resolve().parents[1]


def _script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(tok, texts, eos=True):
    ids = [tok(t, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if eos else []) for t in texts]
    width = max(len(r) for r in ids)
    out = torch.full((len(ids), width), tok.pad_token_id)
    mask = torch.zeros_like(out)
    for i, r in enumerate(ids):
        out[i, :len(r)], mask[i, :len(r)] = torch.tensor(r), 1
    return out, mask


# -- the reasoning span ---------------------------------------------------------
def test_reasoning_span_is_the_tokens_before_the_marker():
    tok = build_char_tokenizer()  # one token per character
    ids, mask = _rows(tok, ["3+4=7;7*5=35;####35", "3+4=7;", "####5", "12+3=15;#"])
    # 13 reasoning characters; no marker: all 6 (the EOS is not reasoning); answer at once: 0;
    # a lone '#' is not the marker: all 9
    assert reasoning_lengths(tok, ids, mask).tolist() == [13, 6, 0, 9]
    assert span_mask(mask, torch.tensor([13, 6, 0, 9]))[1].tolist() == [1.0] * 6 + [0.0] * (ids.shape[1] - 6)
    with pytest.raises(ValueError, match="marker"):
        reasoning_lengths(tok, ids, mask, marker="")


class _PieceTokenizer:
    """Multi-character tokens: id i decodes to ``pieces[i]``; id 0 is EOS (special)."""

    def __init__(self, pieces):
        self.pieces, self.all_special_ids = pieces, [0]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.pieces[i] for i in ids if not (skip_special_tokens and i == 0))


def test_a_token_that_straddles_the_marker_is_not_reasoning():
    tok = _PieceTokenizer(["</s>", "3+4", "=7", ";#", "###7"])
    ids = torch.tensor([[1, 2, 3, 4, 0]])  # "3+4" "=7" ";#" "###7" EOS → "3+4=7;####7", marker at 6
    assert reasoning_lengths(tok, ids, torch.ones_like(ids)).tolist() == [2]  # ";#" reaches into "####"


# -- perplexity by hand ---------------------------------------------------------
def test_span_nll_by_hand():
    logp = torch.tensor([[-1.0, -2.0, -3.0, -9.0], [-0.5, -9.0, -9.0, -9.0], [-9.0, -9.0, -9.0, -9.0]])
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    d = span_nll(logp, mask)
    assert d[:2].tolist() == [2.0, 0.5] and math.isnan(d[2])  # (1+2+3)/3, 0.5/1, empty
    s = drift_summary(d, torch.tensor([3, 1, 0]))
    assert s["ref_nll"] == pytest.approx(1.25) and s["ref_ppl"] == pytest.approx(math.exp(1.25))
    assert s["reasoning_tokens"] == pytest.approx(4 / 3) and s["empty_spans"] == pytest.approx(1 / 3)


def test_a_uniform_reference_has_perplexity_equal_to_its_vocabulary():
    # All-zero LM head (tied to the embeddings): every next-token distribution is uniform over
    # V, so −log p = log V for each token and PPL = V, whatever the span.
    ref = mini_policy()
    with torch.no_grad():
        ref.model.get_output_embeddings().weight.zero_()
    v = ref.model.config.vocab_size
    nll, lengths = text_reasoning_nll(ref, ["3+4;", "(2+5)*3;"], ["3+4=7;####7", "2+5=7;7*3=21;####21"])
    assert lengths.tolist() == [6, 13]
    assert nll.tolist() == pytest.approx([math.log(v)] * 2, abs=1e-5)
    assert drift_summary(nll, lengths)["ref_ppl"] == pytest.approx(v, rel=1e-4)


def test_reasoning_nll_is_the_mean_log_prob_of_the_span_row_by_row():
    ref = mini_policy(seed=3)
    tok = ref.tokenizer
    prompts = ["3+4;", "3+4;", "(12+5)*3;"]
    texts = ["3+4=7;####7", "3+4=8;8####", "12+5=17;17*3=51;####51"]
    p_ids, p_mask = ref.encode_prompts(prompts)
    ids, mask = _rows(tok, texts)
    # micro-batches of 2, the first two rows one group (shared prompt): same numbers as row by row
    nll, lengths = reasoning_nll(ref, p_ids, p_mask, ids, mask, micro_batch_size=2, group_ids=torch.tensor([0, 0, 1]))
    assert lengths.tolist() == [6, 7, 16]
    for i in range(3):
        with torch.no_grad():
            logp, _ = ref.completion_logprobs(p_ids[i:i + 1], p_mask[i:i + 1], ids[i:i + 1], mask[i:i + 1])
        assert float(nll[i]) == pytest.approx(-float(logp[0, :lengths[i]].mean()), abs=1e-5)


# -- readability on scripted readers ----------------------------------------------
def test_truncate_reasoning():
    text = "3+4=7;7*5=35;####35"  # 13 reasoning characters
    assert truncate_reasoning(text, 0.5) == "3+4=7;"  # ⌊6.5⌋ = 6
    assert truncate_reasoning(text, 1.0) == "3+4=7;7*5=35;" and truncate_reasoning(text, 0.0) == ""
    assert truncate_reasoning("2+2=4;", 0.5) == "2+2"  # no marker: all of it is reasoning
    with pytest.raises(ValueError, match="fraction"):
        truncate_reasoning(text, 1.5)


class _Reader:
    """Answers right only when the prompt already holds the first step's sum ("=<a+b>;"), else 0."""

    def __init__(self):
        self.prompts = []

    def sample(self, prompts, n, max_new_tokens, temperature, stop=None):
        assert n == 1 and temperature == 0.0
        self.prompts += prompts
        texts = []
        for p in prompts:
            a, b, c = (int(x) for x in p.split(";")[0].replace("(", "").replace(")", "").replace("*", "+").split("+"))
            texts.append(f"####{(a + b) * c}" if f"={a + b};" in p else "####0")
        return SimpleNamespace(texts=texts)


def test_readability_on_a_scripted_reader():
    problems = [Problem(f"({a}+{b})*{c};", str((a + b) * c)) for a, b, c in [(3, 4, 5), (11, 22, 2), (2, 3, 4), (6, 0, 2)]]
    writer = ["3+4=7;7*5=35;####35",  # right
              "11+22=33;33*2=66;####66",  # right
              "2+3=6;6*4=24;####24",  # a wrong first step
              "####12"]               # no reasoning at all (right answer)
    is_correct = lambda text, p: text.split("####")[-1] == p.answer  # noqa: E731
    reader = _Reader()
    res = readability(reader, problems, writer, 0.5, is_correct=is_correct, max_new_tokens=8,
                      writer_correct=[True, True, False, True])
    # prefixes at f = 0.5: "3+4=7;" (⌊13/2⌋ = 6), "11+22=33" (⌊17/2⌋ = 8: no ';' yet), "2+3=6;", ""
    assert reader.prompts == ["(3+4)*5;3+4=7;", "(11+22)*2;11+22=33", "(2+3)*4;2+3=6;", "(6+0)*2;"]
    assert [r["correct"] for r in res["per_problem"]] == [True, False, False, False]
    assert res["accuracy"] == 0.25 and res["accuracy_writer_correct"] == pytest.approx(1 / 3)
    assert res["writer_correct"] == 3
    full = readability(_Reader(), problems, writer, 1.0, is_correct=is_correct, max_new_tokens=8)
    assert [r["correct"] for r in full["per_problem"]] == [True, True, False, False]
    with pytest.raises(ValueError, match="one writer completion per problem"):
        readability(_Reader(), problems, writer[:2], 0.5, is_correct=is_correct, max_new_tokens=8)


# -- the method ---------------------------------------------------------------
def _ctx(policy, **recipe_sections):
    return MethodContext(recipe=mini_recipe(**recipe_sections), policy=policy, run_dir=Path("."), log=lambda m: None)


def test_the_method_measures_on_its_schedule_against_the_frozen_initial_policy():
    policy = mini_policy(seed=1)
    method = ReasoningDrift(every=2)
    method.setup(_ctx(policy))
    batch = episode_batch(policy, ["3+4;", "3+4;"], [[("3+4=7;####7", "m"), ("</s>", "m")],
                                                     [("3+4=8;####8", "m"), ("</s>", "m")]], {})
    p_ids, p_mask = batch.prompt_ids, batch.prompt_mask
    with torch.no_grad():
        logp, _ = policy.completion_logprobs(p_ids, p_mask, batch.completion_ids, batch.completion_mask)
    expected = -float(logp[:, :6].mean())  # both spans are 6 tokens: the mean of the row means
    assert method.annotate(batch, 1) == {} and method.annotate(batch, 3) == {}
    m0 = method.annotate(batch, 0)
    assert m0["drift/ref_nll"] == pytest.approx(expected, abs=1e-5)
    assert m0["drift/ref_ppl"] == pytest.approx(math.exp(expected), rel=1e-5)
    assert m0["drift/reasoning_tokens"] == 6.0 and m0["drift/empty_spans"] == 0.0
    with torch.no_grad():  # training moves the policy; the reference stays the initial one
        for p in policy.parameters():
            p.add_(0.05)
    assert method.annotate(batch, 2)["drift/ref_nll"] == pytest.approx(expected, abs=1e-5)
    one = ReasoningDrift(every=1, max_rows=1)
    one.setup(_ctx(mini_policy(seed=1)))
    assert one.annotate(batch, 5)["drift/ref_nll"] == pytest.approx(-float(logp[0, :6].mean()), abs=1e-5)


def test_a_configured_reference_model_is_built_from_its_section():
    # The reference is the model its section names (the recipe's mini model, warmed up), not the policy.
    from reasonrl.policy.factory import build_policy

    expected_ref = build_policy(mini_recipe().model, trainable=False)
    policy = mini_policy(seed=5)
    method = ReasoningDrift(every=1, reference={"backend": "tiny", "tiny": dict(MINI_TINY)})
    method.setup(_ctx(policy))
    batch = episode_batch(policy, ["3+4;"], [[("3+4=7;####7", "m")]], {})

    def own_nll(model):
        with torch.no_grad():
            logp, _ = model.completion_logprobs(batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                                batch.completion_mask)
        return -float(logp[0, :6].mean())

    got = method.annotate(batch, 0)["drift/ref_nll"]
    assert got == pytest.approx(own_nll(expected_ref), abs=1e-5) and got != pytest.approx(own_nll(policy), abs=1e-3)


def test_bad_parameters_fail_at_load_naming_the_key():
    with pytest.raises(ConfigError, match="every"):
        mini_recipe(methods=[{"name": "drift", "every": 0}])
    with pytest.raises(ConfigError, match="max_rows"):
        mini_recipe(methods=[{"name": "drift", "max_rows": 0}])
    with pytest.raises(ConfigError, match="marker"):
        mini_recipe(methods=[{"name": "drift", "marker": ""}])


def test_a_run_logs_drift_on_every_other_step_and_resumes_exactly(tmp_path, monkeypatch):
    recipe = mini_recipe(methods=[{"name": "drift", "every": 2}], eval={"size": 0})
    rows = [r for r in straight_and_resumed(recipe, tmp_path, monkeypatch) if "reward/mean" in r]
    logged = [r["step"] for r in rows if "drift/ref_nll" in r]
    assert logged == [1, 3]  # measured on step indices 0 and 2, written in rows 1 and 3
    drifted = [r for r in rows if r["step"] in logged]
    assert drifted, "no row of a logged step"
    assert all(math.isfinite(r["drift/ref_nll"]) and r["drift/reasoning_tokens"] > 0 for r in drifted)


# -- the scripts --------------------------------------------------------------
def test_sft_run_measures_what_grpo_measures_and_writes_a_run_folder(tmp_path):
    sft_run = _script("sft_run")
    recipe = mini_recipe(methods=[{"name": "drift", "every": 2}], train={"steps": 3}, eval={"size": 8})
    assert sft_run.drift_settings(recipe) == (2, "####")
    Trainer(recipe, tmp_path / "grpo", log=lambda m: None).run()
    summary = sft_run.run(recipe, tmp_path / "sft", every=2, log=lambda m: None)
    grpo, sft = read_metrics(tmp_path / "grpo"), read_metrics(tmp_path / "sft")
    # Step 0: the same initial policy, the same seed, the same prompts: the same samples and numbers.
    g1, s1 = next(r for r in grpo if r["step"] == 1), next(r for r in sft if r["step"] == 1)
    for key in ("drift/ref_nll", "drift/reasoning_tokens", "reward/mean"):
        assert s1[key] == pytest.approx(g1[key], abs=1e-6), key
    assert [r["step"] for r in sft if "drift/ref_nll" in r] == [1, 3]
    logged = _script("drift_readability").curves(tmp_path / "sft")  # what the readability script reports
    assert logged["drift/ref_nll"] == {r["step"]: r["drift/ref_nll"] for r in sft if "drift/ref_nll" in r}
    assert set(logged["eval/accuracy"]) == {0, 3}
    sft_losses = [r["sft/loss"] for r in sft if "sft/loss" in r]
    assert sft_losses, "sft/loss was never logged"
    assert all(loss > 0 for loss in sft_losses)
    assert json.loads((tmp_path / "sft" / "recipe.json").read_text())["loss"]["policy"] == "none"
    assert summary["base_accuracy"] is not None and (tmp_path / "sft" / "final_model").is_dir()
    problems = [Problem("(1+2)*3;", "9", "1+2=3;3*3=9;####9")]
    ex = sft_run.solution_examples(mini_policy(), problems)[0]
    tok = build_char_tokenizer()
    assert tok.decode(list(ex.completion_ids[:-1])) == "1+2=3;3*3=9;####9" and ex.completion_ids[-1] == tok.eos_token_id
    with pytest.raises(ConfigError, match="worked solution"):
        sft_run.solution_examples(mini_policy(), [Problem("1+1;", "2")])


def test_drift_readability_compares_writers_and_readers(tmp_path):
    script = _script("drift_readability")
    recipe = mini_recipe()
    out = script.compare(["solutions", "base"], ["base"], [1.0], recipe, size=6, log=lambda m: None)
    assert out["writers"]["solutions"]["accuracy"] == 1.0  # the worked solutions are right
    assert "curves" not in out["writers"]["base"]  # not a run folder
    # the worked solutions' reasoning under the reference, computed directly
    from reasonrl.tasks.base import build_task

    problems = build_task(recipe).eval_problems(6)
    ref = script.load_model("base", recipe, {})
    nll, lengths = text_reasoning_nll(ref, [p.prompt for p in problems], [p.solution for p in problems])
    assert out["writers"]["solutions"]["ref_nll"] == pytest.approx(float(nll.mean()), abs=1e-5)
    base_own = out["readability"]["base"]["base"]["1.0"]["accuracy"]
    assert out["mutual"]["base"]["solutions"]["1.0"]["difference"] == pytest.approx(
        out["readability"]["base"]["solutions"]["1.0"]["accuracy"] - base_own)
    assert script.main(["base", "--recipe", str(ROOT / "recipes" / "grpo.yaml"), "--fraction", "2"]) == 2
    assert script.main(["base", "--readers", "solutions", "--recipe", str(ROOT / "recipes" / "grpo.yaml")]) == 2
