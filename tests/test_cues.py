"""Token cues (evaluate.cues): prefill, Δpass@1 with a paired CI, cue log-prob, emission."""

import json

import pytest
import torch

from helpers import mini_policy, scripted_samples
from reasonrl.evaluate.cues import Prefilled, cue_logprobs, cue_report, emission_rates, unescape_cue
from reasonrl.evaluate.metrics import bootstrap_ci
from reasonrl.evaluate.sampling_eval import evaluate_sampling
from reasonrl.rewards.basic import exact_answer, extract_answer
from reasonrl.problem import Problem


def test_prefill_keeps_the_cue_in_the_parsed_output(monkeypatch):
    """The model sees prompt + cue and continues; answer extraction reads cue + continuation:
    the cue "####3" and the continuation "5" make the answer 35."""
    import reasonrl.evaluate.cues as cues

    policy = mini_policy()
    tok = policy.tokenizer
    seen = {}

    def fake_sample(model, tokenizer, ids, mask, n, max_new_tokens, temperature, generator, stop, **kw):
        seen["ids"], seen["mask"] = ids, mask
        return scripted_samples(ids, mask, [tok("5", add_special_tokens=False)["input_ids"]] * (len(ids) * n), tok)

    monkeypatch.setattr(cues, "sample_completions", fake_sample)
    problem = Problem(prompt="(3+4)*5;", answer="35")
    out = evaluate_sampling(Prefilled(policy, "####3"), [problem], is_correct=lambda t, p: exact_answer(t, p) == 1.0,
                            extract=lambda t, p: extract_answer(t), n=2, ks=[1], max_new_tokens=4)
    row = out["per_problem"][0]
    assert row["correct"] == 2 and row["majority_answer"] == "35" and row["greedy"] is True
    prompt_and_cue = tok.decode(seen["ids"][0], skip_special_tokens=True)
    assert prompt_and_cue == "(3+4)*5;####3"  # the cue follows the prompt, as the start of the answer
    assert seen["mask"][0, -5:].tolist() == [1] * 5
    # no cue: exactly the policy's own sampling
    assert Prefilled(policy).cue_ids.numel() == 0


def test_prefill_appends_after_left_padding_and_records_samples():
    policy = mini_policy()
    pre = Prefilled(policy, "1+")
    g = torch.Generator().manual_seed(0)
    out = pre.sample(["2+3;", "10*10+1;"], 2, 3, 1.0, generator=g)
    assert all(t.startswith("1+") for t in out.texts)
    # the prompts are left-padded and end with the cue's 2 tokens
    assert out.prompt_ids[:, -2:].tolist() == [policy.tokenizer("1+", add_special_tokens=False)["input_ids"]] * 4
    assert int(out.prompt_mask[0].sum()) == 4 + 2 and int(out.prompt_mask[2].sum()) == 8 + 2
    assert pre.sampled_texts == out.texts
    pre.sample(["2+3;"], 1, 3, 0.0)  # greedy calls are not samples
    assert len(pre.sampled_texts) == 4


def test_cue_the_tokenizer_cannot_read_is_refused():
    with pytest.raises(ValueError, match="does not know"):
        Prefilled(mini_policy(), "Okay")


def test_cue_logprob_is_the_sum_of_the_cue_tokens_logprobs():
    policy = mini_policy()
    tok = policy.tokenizer
    prompts = ["2+3;", "10*10+1;"]
    got = cue_logprobs(policy, prompts, "5;")
    for prompt, value in zip(prompts, got):
        ids = torch.tensor([tok(prompt + "5;")["input_ids"]])
        with torch.no_grad():
            logits = policy.model(input_ids=ids).logits[0].float().log_softmax(-1)
        n = ids.shape[1]
        by_hand = float(logits[n - 3, ids[0, n - 2]] + logits[n - 2, ids[0, n - 1]])
        assert value == pytest.approx(by_hand, abs=1e-4)


def test_emission_rates():
    texts = ["1+2=3", "##1+", "1+1", "9"]
    assert emission_rates(texts, "1+") == {"start": 0.5, "anywhere": 0.75}
    with pytest.raises(ValueError):
        emission_rates([], "1+")


def test_delta_pass_at_1_and_its_paired_ci_by_hand():
    def result(correct):
        return {"per_problem": [{"prompt": str(i), "correct": c, "n": 4} for i, c in enumerate(correct)],
                "metrics": {}}

    plain, cued = result([0, 2, 4, 1]), result([1, 2, 4, 3])
    rep = cue_report(plain, cued, [-1.0, -3.0, -2.0, -2.0], ["#a", "b", "#", "c"], "#")
    assert rep["pass@1"] == pytest.approx(10 / 16) and rep["pass@1_no_cue"] == pytest.approx(7 / 16)
    # per-problem differences 0.25, 0, 0, 0.5 -> mean 0.1875; CI = bootstrap of the differences
    d = rep["delta_pass@1"]
    assert d["mean"] == pytest.approx(0.1875)
    assert (d["ci_low"], d["ci_high"]) == bootstrap_ci([0.25, 0.0, 0.0, 0.5])
    assert 0.0 <= d["ci_low"] <= d["mean"] <= d["ci_high"] <= 0.5
    assert rep["cue_logprob"] == -2.0 and rep["emitted"] == {"start": 0.5, "anywhere": 0.5}
    with pytest.raises(ValueError, match="same problems"):
        cue_report(plain, result([1, 2, 3]), [0.0], ["x"], "#")


def test_unescape_cue():
    assert unescape_cue(r".\n\nOkay") == ".\n\nOkay"
    assert unescape_cue(r"a\\n\tb") == "a\\n\tb"
    assert unescape_cue("Alright,") == "Alright,"


def test_eval_cli_prefill_and_baseline(tmp_path, capsys):
    """``reasonrl eval --prefill`` (twice) and ``--baseline-model`` end to end on the mini model."""
    from helpers import MINI_TINY

    from reasonrl.cli import main
    from reasonrl.policy.tiny import TinySpec, load_tiny_policy

    load_tiny_policy(TinySpec(**MINI_TINY)).save(tmp_path / "m")
    out = tmp_path / "eval.json"
    code = main(["eval", "--model", str(tmp_path / "m"), "--baseline-model", str(tmp_path / "m"), "--task",
                 "arithmetic", "--size", "4", "--n", "2", "--k", "2", "--max-new-tokens", "6",
                 "--prefill", "1", "--prefill", r"####", "-o", str(out)])
    assert code == 0
    res = json.loads(out.read_text())["arithmetic"]
    assert set(res["cues"]) == {"1", "####"}
    # the same model as its own baseline: no regret, no flag
    assert res["vs_baseline"]["regret_gap"]["mean"] == 0.0 and res["vs_baseline"]["hacking"]["suspected"] is False
    assert "diagnostics/commit_rate" in res["metrics"]
    assert "cue '1'" in capsys.readouterr().out
    assert main(["eval", "--model", str(tmp_path / "m"), "--task", "arithmetic", "--size", "2", "--n", "1",
                 "--prefill", "Okay", "-o", str(out)]) == 2
