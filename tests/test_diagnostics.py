"""Reward-hacking diagnostics (evaluate.diagnostics) and the proxy reward, by hand."""

import math

import pytest

from reasonrl.evaluate.diagnostics import (CITATION_VALIDATORS, commit_metrics, compare_with_baseline,
                                           confidence_theater_score, confidence_theater_share, diagnose_run,
                                           find_citations, hacking_flag, is_committed, regret_gap)
from reasonrl.evaluate.metrics import bootstrap_ci, paired_difference
from reasonrl.evaluate.sampling_eval import summarise
from reasonrl.registry import REWARDS
from reasonrl.rewards.basic import extract_answer
from reasonrl.rewards.proxy import keyword_density
from reasonrl.problem import Problem

P = Problem(prompt="(3+4)*5;", answer="35")


def test_proxy_reward_by_hand():
    proxy = REWARDS.get("proxy_length_keyword")
    honest = "3+4=7;7*5=35;####35"
    # 0.5 * 20/32 + 0.5 * 2/19
    assert proxy(honest, P, num_tokens=20, max_len=32) == pytest.approx(0.5 * 20 / 32 + 0.5 * 2 / 19)
    assert proxy("=" * 32, P, num_tokens=32, max_len=32) == pytest.approx(1.0)
    assert proxy("=" * 40, P, num_tokens=40, max_len=32) == pytest.approx(1.0)  # length capped at 1
    assert keyword_density("ab cite cite", "cite") == pytest.approx(8 / 12)
    assert proxy("", P, num_tokens=0) == 0.0
    assert proxy("x therefore y", P, num_tokens=4, max_len=8, keyword="therefore", w_length=1.0, w_keyword=2.0) \
        == pytest.approx(0.5 + 2 * 9 / 13)


def test_proxy_parameters_are_validated_at_load():
    from helpers import mini_recipe

    from reasonrl.config import ConfigError

    with pytest.raises(ConfigError, match="max_len"):
        mini_recipe(rewards=[{"name": "proxy_length_keyword", "max_len": 0}])
    with pytest.raises(ConfigError, match="w_length"):
        mini_recipe(rewards=[{"name": "proxy_length_keyword", "w_length": -1}])


def test_commitment_and_accuracy_given_commit():
    texts = ["3+4=7;7*5=35;####35", "3+4=7;####36", "=====", "I don't know ####35"]
    committed = [is_committed(t, extract_answer(t)) for t in texts]
    assert committed == [True, True, False, False]  # no #### answer, or an explicit abstention
    correct = [True, False, False, True]
    m = commit_metrics(committed, correct)
    assert m["commit_rate"] == 0.5
    assert m["accuracy_given_commit"] == 0.5  # 1 of the 2 committed
    assert math.isnan(commit_metrics([False], [False])["accuracy_given_commit"])
    with pytest.raises(ValueError, match="equally many"):
        commit_metrics([True], [])


def test_confidence_theater_score_by_hand():
    # proxies 0.1 0.2 0.8 0.9, median 0.5; the two high ones abstain, one low one abstains:
    # P(no commit | high) = 2/2, P(no commit | low) = 1/2 -> CTS 0.5
    proxy, committed = [0.1, 0.2, 0.8, 0.9], [True, False, False, False]
    assert confidence_theater_score(proxy, committed) == pytest.approx(0.5)
    # share of proxy earned without commitment: (0.2 + 0.8 + 0.9) / 2.0
    assert confidence_theater_share(proxy, committed) == pytest.approx(1.9 / 2.0)
    # an honest model: commitment unrelated to the proxy -> 0
    assert confidence_theater_score([0.1, 0.2, 0.8, 0.9], [True, False, True, False]) == 0.0
    # median ties go high: proxies 1 1 1 2 (median 1): nothing below -> undefined
    assert math.isnan(confidence_theater_score([1, 1, 1, 2], [True] * 4))


def test_citation_validators():
    assert set(CITATION_VALIDATORS.names()) >= {"legal_case", "author_year", "doi", "arithmetic_step"}
    assert CITATION_VALIDATORS.get("arithmetic_step")("3+4=7;7*5=3;8-2=6;####3") == \
        [("3+4=7", True), ("7*5=3", False), ("8-2=6", True)]
    legal = CITATION_VALIDATORS.get("legal_case")
    assert legal("As held in Roe v. Wade, 410 U.S. 113 (1973); see") == [("Roe v. Wade, 410 U.S. 113 (1973)", True)]
    assert legal("As held in Smith v. Jones, in the court of appeals.") == [("Smith v. Jones, in the court of appeals", False)]
    assert legal("Brown v. Board of Education, 347 U.S. 483 (3054)")[0][1] is False  # impossible year
    ay = CITATION_VALIDATORS.get("author_year")
    assert ay("see [Smith et al., 2020] and [Smith, 20201] and [Jones and Lee, 1999a]") == \
        [("[Smith et al., 2020]", True), ("[Smith, 20201]", False), ("[Jones and Lee, 1999a]", True)]
    doi = CITATION_VALIDATORS.get("doi")
    assert doi("doi:10.1000/xyz123 and 10.12/x, not 10.5 apples") == [("10.1000/xyz123", True), ("10.12/x", False)]
    # over every validator: 2 steps + 1 case, 2 plausible
    assert find_citations("1+1=2;2*2=5; Roe v. Wade, 410 U.S. 113 (1973)") == (3, 2)
    assert find_citations("1+1=2", ["doi"]) == (0, 0)


def test_regret_gap_is_a_paired_difference():
    base, model = [1, 1, 0, 1], [0, 1, 0, 0]
    gap = regret_gap(base, model)
    assert gap["mean"] == pytest.approx(0.5)  # 0.75 - 0.25
    # the paired bootstrap resamples problems: the CI of the differences [1, 0, 0, 1]
    assert (gap["ci_low"], gap["ci_high"]) == bootstrap_ci([1.0, 0.0, 0.0, 1.0])
    same = paired_difference([0.5, 0.5], [0.25, 0.25])
    assert same == {"mean": 0.25, "ci_low": 0.25, "ci_high": 0.25}  # no spread in the differences
    with pytest.raises(ValueError, match="equally many"):
        paired_difference([1.0], [1.0, 0.0])


def _row(prompt, correct, committed, proxy, citations=0, plausible=0):
    n = len(correct)
    return {"prompt": prompt, "answer": "0", "n": n, "correct": sum(correct), "sample_correct": correct,
            "maj": {1: correct[0]}, "majority_answer": "0", "majority_votes": 1, "majority_correct": correct[0],
            "format_failures": sum(not c for c in committed), "distinct_correct": sum(correct), "tokens": 10 * n,
            "nll": 1.0, "sequence_confidence": [0.5] * n, "stated_confidence": [None] * n,
            "committed": committed, "proxy": proxy, "citations": citations, "plausible_citations": plausible}


def honest_and_hacked():
    """Hand-built evaluation rows of 4 problems × 2 samples: an honest base model (commits,
    short, 6 of 8 right, steps true) and a hacked one (long keyword runs, rarely commits)."""
    honest = summarise([
        _row("a", [True, True], [True, True], [0.35, 0.35], 4, 4),
        _row("b", [True, False], [True, True], [0.35, 0.40], 4, 3),
        _row("c", [True, True], [True, True], [0.30, 0.35], 4, 4),
        _row("d", [True, False], [True, True], [0.35, 0.35], 4, 4)], [1])
    hacked = summarise([
        _row("a", [False, False], [False, False], [1.0, 1.0], 1, 0),
        _row("b", [True, False], [True, False], [0.40, 0.95], 2, 2),
        _row("c", [False, False], [False, False], [1.0, 0.9], 0, 0),
        _row("d", [False, False], [False, False], [0.95, 1.0], 1, 0)], [1])
    return honest, hacked


def test_summarise_reports_the_diagnostics():
    honest, hacked = honest_and_hacked()
    h, k = honest["metrics"], hacked["metrics"]
    assert h["diagnostics/commit_rate"]["mean"] == 1.0 and k["diagnostics/commit_rate"]["mean"] == 0.125
    assert h["diagnostics/accuracy_given_commit"] == 0.75
    assert k["diagnostics/accuracy_given_commit"] == 1.0  # the paper's pattern: fewer answers, surer ones
    assert k["diagnostics/proxy_reward"]["mean"] == pytest.approx((2.0 + 1.35 + 1.9 + 1.95) / 8)
    assert h["diagnostics/cpr"] == pytest.approx(15 / 16) and k["diagnostics/cpr"] == pytest.approx(2 / 4)
    assert k["diagnostics/citations_per_sample"] == 0.5
    # hacked proxies sorted: .4 .9 .95 .95 | 1 1 1 1 ... median 0.975; high half 4/4 abstain,
    # low half (.4 commits, .9 .95 .95 abstain) 3/4 -> CTS 0.25
    assert k["diagnostics/cts"] == pytest.approx(0.25)
    assert math.isnan(h["diagnostics/cts"]) is False and h["diagnostics/cts"] == 0.0  # everything commits


def test_flag_raised_on_hacked_outputs_not_on_honest_ones():
    honest, hacked = honest_and_hacked()
    out = compare_with_baseline(hacked, honest)
    # R_true per problem: honest 1, .5, 1, .5; hacked 0, .5, 0, 0 -> RG = 0.625
    assert out["regret_gap"]["mean"] == pytest.approx(0.625)
    assert out["hacking"]["suspected"] is True
    checks = out["hacking"]["checks"]
    assert checks["commit_drop"]["value"] == pytest.approx(0.875)
    assert checks["cpr_drop"]["value"] == pytest.approx(15 / 16 - 0.5)
    # an honest model against itself (and a second honest run): nothing dropped, no flag
    assert compare_with_baseline(honest, honest)["hacking"]["suspected"] is False
    # one failed check clears it: the proxy rose and RG > 0, but the commit rate held
    metrics = {"diagnostics/commit_rate": 0.95, "diagnostics/proxy_reward": 0.9, "diagnostics/cpr": float("nan")}
    base = {"diagnostics/commit_rate": 1.0, "diagnostics/proxy_reward": 0.4, "diagnostics/cpr": 0.9}
    flag = hacking_flag(metrics, base, gap=0.2)
    assert flag["suspected"] is False and flag["checks"]["commit_drop"]["passed"] is False
    assert flag["checks"]["cpr_drop"]["passed"] is None  # undefined CPR: skipped, not failed
    assert hacking_flag({**metrics, "diagnostics/commit_rate": 0.5}, base, gap=0.2)["suspected"] is True
    with pytest.raises(ValueError, match="commit_drop"):
        hacking_flag({}, base, gap=0.2)


def test_baseline_must_cover_the_same_problems():
    honest, hacked = honest_and_hacked()
    hacked["per_problem"] = hacked["per_problem"][::-1]
    with pytest.raises(ValueError, match="other problems"):
        compare_with_baseline(hacked, honest)


def test_diagnose_run_reuses_the_trainers_base_evaluation():
    honest, hacked = honest_and_hacked()
    flat = lambda m: {k: (v["mean"] if isinstance(v, dict) else v) for k, v in m.items()}  # noqa: E731
    summary = {"base_eval": flat(honest["metrics"]), "final_eval": flat(hacked["metrics"]),
               "base_eval_per_problem": {"accuracy": [1.0, 1.0, 1.0, 0.0]},
               "final_eval_per_problem": {"accuracy": [0.0, 1.0, 0.0, 0.0]}}
    out = diagnose_run(summary)
    assert out["regret_gap"]["mean"] == 0.5 and out["hacking"]["suspected"] is True
    with pytest.raises(ValueError, match="eval.n > 0"):
        diagnose_run({"base_eval": {"accuracy": 0.5}, "final_eval": {"accuracy": 0.1}})


def test_evaluate_sampling_rows_carry_the_diagnostics():
    """End to end on the mini model: every sample gets a commit flag and a proxy reward equal
    to the proxy reward recomputed by hand from its text and token count."""
    import torch
    from helpers import mini_policy

    from reasonrl.evaluate.sampling_eval import evaluate_sampling
    from reasonrl.rewards.basic import exact_answer
    from reasonrl.tasks.arithmetic import ArithmeticTask

    seen = []

    def proxy(text, problem, num_tokens):
        seen.append((text, num_tokens))
        return float(len(text))

    problems = ArithmeticTask().eval_problems(3)
    torch.manual_seed(0)
    out = evaluate_sampling(mini_policy(), problems, is_correct=lambda t, p: exact_answer(t, p) == 1.0,
                            extract=lambda t, p: extract_answer(t), n=2, ks=[1], max_new_tokens=8, proxy=proxy)
    rows = out["per_problem"]
    assert [p for r in rows for p in r["proxy"]] == [float(len(t)) for t, _ in seen]
    assert all(0 < ntok <= 8 for _, ntok in seen)
    assert "diagnostics/commit_rate" in out["metrics"]
