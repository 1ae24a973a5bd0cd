"""``reasonrl report --baseline``: the statistics by hand, and the report and JSON built from them.

Run folders are written by hand (metrics.jsonl, recipe.json, summary.json), so the final
values, and therefore every difference, t, df and p, are known exactly.
"""

import json
import math
import re

import pytest

from reasonrl.cli import main
from reasonrl.evaluate.baseline import compare_to_baseline
from reasonrl.evaluate.report import stats_path, verdict_lines, write_report
from reasonrl.evaluate.runs import group_runs, load_run, number_text, signed_text
from reasonrl.evaluate.stats import (bootstrap_diff, regularized_incomplete_beta, student_t_cdf,
                                     student_t_two_sided_p, welch_t_test)

# --- the Student-t distribution through the incomplete beta function --------------------------


def test_incomplete_beta_closed_forms():
    for x in (0.0, 0.03, 0.4, 0.5, 0.77, 0.999, 1.0):
        assert regularized_incomplete_beta(3.5, 1.0, x) == pytest.approx(x ** 3.5, abs=1e-13)      # I_x(a, 1) = x^a
        assert regularized_incomplete_beta(1.0, 2.5, x) == pytest.approx(1 - (1 - x) ** 2.5, abs=1e-13)
        assert regularized_incomplete_beta(2.0, 2.0, x) == pytest.approx(3 * x**2 - 2 * x**3, abs=1e-13)
        # symmetry I_x(a, b) = 1 − I_{1−x}(b, a), across the branch point of the continued fraction
        assert regularized_incomplete_beta(7.3, 0.5, x) == pytest.approx(
            1 - regularized_incomplete_beta(0.5, 7.3, 1 - x), abs=1e-13)
    assert regularized_incomplete_beta(40.0, 40.0, 0.5) == pytest.approx(0.5, abs=1e-13)
    with pytest.raises(ValueError):
        regularized_incomplete_beta(0.0, 1.0, 0.5)


def test_t_cdf_against_closed_forms_and_the_normal():
    for t in (-30.0, -3.0, -0.5, 0.0, 0.7, 2.0, 12.7062047):
        # df = 1 (Cauchy): F(t) = 1/2 + atan(t)/π
        assert student_t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)
        # df = 2: F(t) = 1/2 + t / (2 sqrt(2 + t²))
        assert student_t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)
        # large df: the normal CDF Φ(t) = erfc(−t/√2)/2 (the gap is O(1/df))
        assert student_t_cdf(t, 1e7) == pytest.approx(0.5 * math.erfc(-t / math.sqrt(2)), abs=1e-6)
        assert student_t_cdf(t, math.inf) == pytest.approx(0.5 * math.erfc(-t / math.sqrt(2)), abs=1e-15)
    # the tabulated 97.5% quantiles: t = 12.7062 (df 1), 2.228139 (df 10) have two-sided p = 0.05
    assert student_t_two_sided_p(12.706204736, 1) == pytest.approx(0.05, abs=1e-9)
    assert student_t_two_sided_p(-2.2281388520, 10) == pytest.approx(0.05, abs=1e-9)
    assert student_t_two_sided_p(0.0, 3.7) == 1.0
    assert student_t_two_sided_p(math.inf, 3.7) == 0.0


def _cdf_df3(t):  # F(t) = 1/2 + (θ + sin θ cos θ)/π, θ = atan(t/√3)
    theta = math.atan(t / math.sqrt(3))
    return 0.5 + (theta + math.sin(theta) * math.cos(theta)) / math.pi


def _cdf_df4(t):  # F(t) = 1/2 + (3/8) · t/√(1+t²/4) · (1 − t²/(12(1+t²/4)))
    u = 1 + t * t / 4
    return 0.5 + 3 / 8 * t / math.sqrt(u) * (1 - t * t / (12 * u))


def test_welch_by_hand():
    # method 0.70, 0.73, 0.76 vs baseline 0.50, 0.52, 0.54
    # means 0.73 and 0.52: difference 0.21
    # s² = (0.03² + 0 + 0.03²)/2 = 0.0009 and (0.02² + 0 + 0.02²)/2 = 0.0004; divided by n = 3:
    # 0.0003 and 0.000133…; their sum 0.0013/3, so se = sqrt(0.0013/3) = 0.0208167
    # t = 0.21 / 0.0208167 = 10.0881
    # df = (0.0013/3)² / ((0.0009/3)²/2 + (0.0004/3)²/2) = 2·0.0013² / (0.0009² + 0.0004²) = 3.38/0.97 = 3.4845
    t, df, p = welch_t_test([0.70, 0.73, 0.76], [0.50, 0.52, 0.54])
    assert t == pytest.approx(0.21 / math.sqrt(0.0013 / 3), rel=1e-12) == pytest.approx(10.0881, abs=1e-4)
    assert df == pytest.approx(3.38 / 0.97, rel=1e-12)
    # p is two-sided and, at fixed t, decreases with df: bracketed by the closed forms for df 3 and 4
    p3, p4 = 2 * (1 - _cdf_df3(t)), 2 * (1 - _cdf_df4(t))
    assert p4 < p < p3
    assert p == pytest.approx(0.0010617, abs=1e-6)
    # at integer df the incomplete-beta route equals the closed forms
    assert student_t_two_sided_p(t, 3) == pytest.approx(p3, rel=1e-10)
    assert student_t_two_sided_p(t, 4) == pytest.approx(p4, rel=1e-10)
    # swapping the samples flips t only
    t2, df2, p2 = welch_t_test([0.50, 0.52, 0.54], [0.70, 0.73, 0.76])
    assert (t2, df2, p2) == pytest.approx((-t, df, p))
    # equal variances and sizes: df = 2(n−1) = 4
    t, df, p = welch_t_test([1.0, 2.0, 3.0], [2.0, 3.0, 4.0])
    assert (t, df) == pytest.approx((-1 / math.sqrt(2 / 3), 4.0))  # diff −1, se² = 1/3 + 1/3
    assert p == pytest.approx(2 * _cdf_df4(t), rel=1e-10)


def test_welch_needs_two_runs_and_spread():
    with pytest.raises(ValueError, match="at least 2"):
        welch_t_test([0.5], [0.4, 0.6])
    t, df, p = welch_t_test([0.5, 0.5], [0.4, 0.4])
    assert t == math.inf and math.isnan(df) and math.isnan(p)


# --- the two-level bootstrap --------------------------------------------------------------------


def test_bootstrap_by_hand_over_seeds():
    # baseline runs 0 and 1: a resampled baseline mean is 0, 0.5 or 1 with probability 1/4, 1/2, 1/4;
    # the group's single run is always 0.3, so the 2.5% and 97.5% quantiles are 0.3 − 1 and 0.3 − 0
    low, high = bootstrap_diff([0.3], [0.0, 1.0], num_resamples=2000, seed=0)
    assert (low, high) == pytest.approx((-0.7, 0.3))
    # one run per side and no per-problem values: nothing to resample
    assert bootstrap_diff([0.8], [0.5]) == pytest.approx((0.3, 0.3))


def test_bootstrap_over_problems_matches_the_binomial_standard_error():
    # one run each, 400 problems, accuracies 0.5 and 0.7: se = sqrt(0.5·0.5/400 + 0.7·0.3/400) = 0.0339
    a = [1.0] * 280 + [0.0] * 120
    b = [1.0] * 200 + [0.0] * 200
    low, high = bootstrap_diff([a], [b], num_resamples=2000, seed=1)
    half = 1.959964 * math.sqrt((0.25 + 0.21) / 400)
    assert (high - low) / 2 == pytest.approx(half, rel=0.1)
    assert (low + high) / 2 == pytest.approx(0.2, abs=0.01)


def test_bootstrap_is_reproducible_and_contains_the_difference():
    group = [[1.0] * k + [0.0] * (100 - k) for k in (70, 73, 76)]
    base = [[1.0] * k + [0.0] * (100 - k) for k in (50, 52, 54)]
    first = bootstrap_diff(group, base, seed=7)
    assert bootstrap_diff(group, base, seed=7) == first
    assert bootstrap_diff(group, base, seed=8) != first
    assert first[0] < 0.21 < first[1] and first[0] > 0
    # resampling problems as well as seeds widens the interval over resampling seeds alone
    seeds_only = bootstrap_diff([0.70, 0.73, 0.76], [0.50, 0.52, 0.54], seed=7)
    assert seeds_only[0] < 0.21 < seeds_only[1]
    assert first[1] - first[0] > seeds_only[1] - seeds_only[0]
    with pytest.raises(ValueError):
        bootstrap_diff([], base)


# --- the report ------------------------------------------------------------------------------------

BASE = (50, 52, 54)        # grpo: 0.50 0.52 0.54
CLEAR = (70, 73, 76)       # bot: 0.70 0.73 0.76, +0.21
NOISE = (50, 56, 53)       # noisy: 0.50 0.56 0.53, +0.01
SINGLE = (60,)             # lone: 0.60


def _run(root, name, method, seed, correct, per_problem=True):
    path = root / name
    path.mkdir(parents=True)
    (path / "recipe.json").write_text(json.dumps({"train": {"seed": seed, "steps": 2},
                                                  "advantage": {"name": method}, "run_name": None}))
    (path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward/mean": 0.1 * s}) + "\n" for s in (1, 2)))
    outcomes = [1.0] * correct + [0.0] * (100 - correct)
    summary = {"final_eval": {"accuracy": correct / 100, "accuracy[a+b]": correct / 100 - 0.1},
               "base_eval": {"accuracy": 0.4}, "wall_seconds": 1.0}
    if per_problem:
        summary["final_eval_per_problem"] = {"accuracy": outcomes}
        summary["base_eval_per_problem"] = {"accuracy": [1.0] * 40 + [0.0] * 60}
    (path / "summary.json").write_text(json.dumps(summary))
    return path


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("baseline")
    paths = []
    for method, accs in (("grpo", BASE), ("bot", CLEAR), ("noisy", NOISE), ("lone", SINGLE)):
        paths += [_run(root, f"{method}-s{seed}", method, seed, c) for seed, c in enumerate(accs)]
    return root, paths


@pytest.fixture(scope="module")
def report(folders):
    root, paths = folders
    out = root / "out" / "cmp.html"
    assert main(["report", *map(str, paths), "-o", str(out), "--baseline", "grpo"]) == 0
    return out.read_text(), json.loads(stats_path(out).read_text()), out


def _row(rows, metric, group):
    (row,) = [r for r in rows if r["metric"] == metric and r["group"] == group]
    return row


def test_stats_json_holds_the_hand_computed_numbers(report):
    _, rows, out = report
    assert stats_path(out).name == "cmp_stats.json"
    # 2 metrics × 3 non-baseline groups, in metric order then group order
    assert [(r["metric"], r["group"]) for r in rows] == [
        (m, g) for m in ("accuracy", "accuracy[a+b]") for g in ("bot", "noisy", "lone")]
    keys = {"metric", "group", "baseline", "diff", "ci_low", "ci_high", "t", "df", "p", "n_runs", "n_baseline_runs",
            "significant", "resampled"}
    assert all(keys <= set(r) and r["baseline"] == "grpo" for r in rows)

    clear = _row(rows, "accuracy", "bot")
    t, df, p = welch_t_test([0.70, 0.73, 0.76], [0.50, 0.52, 0.54])
    assert clear["diff"] == pytest.approx(0.21)
    assert (clear["t"], clear["df"], clear["p"]) == pytest.approx((10.0881, 3.4845, 0.0010617), abs=1e-4)
    assert (clear["t"], clear["df"], clear["p"]) == pytest.approx((t, df, p))
    assert clear["ci_low"] > 0 and clear["ci_low"] < 0.21 < clear["ci_high"]
    assert (clear["n_runs"], clear["n_baseline_runs"]) == (3, 3)
    assert clear["resampled"] == "seeds+problems" and clear["significant"] is True

    noise = _row(rows, "accuracy", "noisy")
    assert noise["diff"] == pytest.approx(0.01)
    # s² = 0.0009 for both: t = 0.01 / sqrt(0.0003 + 0.0004/3), df = (0.0013/3)² / ((0.0003² + (0.0004/3)²)/2)
    assert noise["t"] == pytest.approx(0.01 / math.sqrt(0.0013 / 3))
    assert noise["p"] > 0.5 and noise["ci_low"] < 0 < noise["ci_high"] and noise["significant"] is False

    lone = _row(rows, "accuracy", "lone")
    assert lone["diff"] == pytest.approx(0.08) and lone["n_runs"] == 1
    assert lone["t"] is None and lone["df"] is None and lone["p"] is None and lone["significant"] is False
    assert "lone has 1 run" in lone["note"]
    assert lone["ci_low"] < 0.08 < lone["ci_high"]  # problems of the lone run are still resampled

    # a metric without per-problem values: seeds only; same seed spread as accuracy, shifted by −0.1
    sub = _row(rows, "accuracy[a+b]", "bot")
    assert sub["resampled"] == "seeds" and sub["diff"] == pytest.approx(0.21)
    assert sub["t"] == pytest.approx(clear["t"]) and sub["significant"] is True


def test_report_marks_a_clear_effect_only(report):
    page, _, _ = report
    assert "Against the baseline grpo" in page

    def cells(metric, group):
        row = re.search(rf"<tr><td>{re.escape(metric)}</td><td>{group}</td>(.*?)</tr>", page)
        assert row, (metric, group)
        return row.group(1)

    assert "●" in cells("accuracy", "bot") and "<td>+0.21</td>" in cells("accuracy", "bot")
    assert "●" not in cells("accuracy", "noisy")
    lone = cells("accuracy", "lone")
    assert "●" not in lone and "n/a" in lone and "1 run" in lone
    assert "†" in cells("accuracy[a+b]", "bot") and "†" not in cells("accuracy", "bot")
    # p = 0.0010617 and 0.66 in the report's one number format
    assert "<td>0.00106</td>" in cells("accuracy", "bot") and "<td>0.66</td>" in cells("accuracy", "noisy")
    assert "● marks a difference that the seed spread cannot explain: Welch's two-sided p &lt; 0.05" in page
    assert "3 is few" in page


def test_the_report_is_reproducible(folders, report, tmp_path):
    _, paths = folders
    _, rows, _ = report
    out = write_report(paths, tmp_path / "again.html", baseline="grpo")
    assert json.loads(stats_path(out).read_text()) == rows
    # another bootstrap seed moves the intervals, not the differences or the test
    other = compare_to_baseline(group_runs([load_run(p) for p in paths]), "grpo", seed=1)
    assert [r["ci_low"] for r in other] != [r["ci_low"] for r in rows]
    assert [(r["diff"], r["p"]) for r in other] == [(r["diff"], r["p"]) for r in rows]
    # each (metric, group) row has its own generator: leaving a group out changes no other row
    without_noise = compare_to_baseline(group_runs([load_run(p) for p in paths if "noisy" not in p.name]), "grpo")
    assert without_noise == [r for r in rows if r["group"] != "noisy"]


def test_a_run_named_twice_counts_once(folders, report, tmp_path):
    """Overlapping globs (`bot-s*` and `*-s1`) name a folder twice: it counts once, with a warning."""
    _, paths = folders
    _, rows, _ = report
    warnings = []
    twice = [*paths, paths[4], tmp_path / ".." / tmp_path.name / ".." / paths[4].parent.name / paths[4].name]
    out = write_report(twice, tmp_path / "twice.html", baseline="grpo", warn=warnings.append)
    assert json.loads(stats_path(out).read_text()) == rows  # bot still has 3 runs, the same numbers
    assert _row(rows, "accuracy", "bot")["n_runs"] == 3
    assert sum("named more than once; counted once" in w for w in warnings) == 2


def test_unknown_baseline_is_exit_2_and_writes_nothing(folders, tmp_path, capsys):
    _, paths = folders
    out = tmp_path / "x.html"
    assert main(["report", *map(str, paths), "-o", str(out), "--baseline", "dapo"]) == 2
    err = capsys.readouterr().err
    assert "--baseline 'dapo'" in err
    for name in ("'grpo' (3 runs", "'bot' (3 runs", "'noisy' (3 runs", "'lone' (1 run"):
        assert name in err
    assert list(tmp_path.iterdir()) == []


def test_old_run_folders_fall_back_to_seeds_and_bad_lists_warn(tmp_path):
    paths = [_run(tmp_path, f"grpo-s{s}", "grpo", s, c, per_problem=False) for s, c in enumerate(BASE)]
    paths += [_run(tmp_path, f"bot-s{s}", "bot", s, c) for s, c in enumerate(CLEAR)]
    summary = json.loads((paths[-1] / "summary.json").read_text())
    summary["final_eval_per_problem"]["accuracy"] = [1.0] * 10 + [0.0] * 90  # mean 0.1, final 0.76
    (paths[-1] / "summary.json").write_text(json.dumps(summary))
    warnings = []
    rows = compare_to_baseline(group_runs([load_run(p) for p in paths]), "grpo", warn=warnings.append)
    assert all(r["resampled"] == "seeds" for r in rows)
    assert _row(rows, "accuracy", "bot")["diff"] == pytest.approx(0.21)
    assert len(warnings) == 1 and "bot-s2" in warnings[0] and "seeds only" in warnings[0]


# --- the verdict, and no interval from a single paired value ------------------------------------------


def test_a_one_line_verdict_opens_the_comparison(report):
    page, rows, _ = report
    clear = _row(rows, "accuracy", "bot")
    low, high = clear["ci_low"], clear["ci_high"]
    lines = verdict_lines(rows)
    # one line per group on the headline metric (accuracy), in the rows' group order
    assert lines == [
        f"bot vs grpo: accuracy +0.21 [{signed_text(low)}, {signed_text(high)}], p = 0.00106 (3 vs 3 runs) — better",
        f"noisy vs grpo: accuracy +0.01 [{signed_text(_row(rows, 'accuracy', 'noisy')['ci_low'])}, "
        f"{signed_text(_row(rows, 'accuracy', 'noisy')['ci_high'])}], p = {number_text(_row(rows, 'accuracy', 'noisy')['p'])} "
        "(3 vs 3 runs) — no clear difference",
        f"lone vs grpo: accuracy +0.08 [{signed_text(_row(rows, 'accuracy', 'lone')['ci_low'])}, "
        f"{signed_text(_row(rows, 'accuracy', 'lone')['ci_high'])}], p n/a (1 vs 3 runs) — too few runs to tell"]
    # at the top of the page: before the first section
    verdict = page.index("class='verdict'")
    assert verdict < page.index("<h2 id='runs'>") and "<span class='better'>better</span>" in page
    # a worse group reads worse
    flipped = [{**r, "diff": -r["diff"], "ci_low": -r["ci_high"], "ci_high": -r["ci_low"]} for r in rows]
    assert verdict_lines(flipped)[0].endswith("— worse") and verdict_lines(flipped)[0].startswith("bot vs grpo: accuracy -0.21")


def test_one_run_a_side_has_no_zero_width_interval(tmp_path, capsys):
    """One seed per arm and no per-problem values: one paired difference; its "interval" [d, d] is not shown."""
    paths = [_run(tmp_path, "grpo-s0", "grpo", 0, 50, per_problem=False), _run(tmp_path, "bot-s0", "bot", 0, 70, per_problem=False)]
    out = tmp_path / "one.html"
    assert main(["report", *map(str, paths), "-o", str(out), "--baseline", "grpo"]) == 0
    rows = json.loads(stats_path(out).read_text())
    for row in rows:
        assert row["diff"] == pytest.approx(0.2) and row["ci_low"] is None and row["ci_high"] is None
        assert row["ci_note"].startswith("1 run per group and no per-problem values")
    page = out.read_text()
    assert "n/a (1 run each)" in page
    # no interval anywhere in the page has equal ends
    intervals = re.findall(r"\[([-+0-9.e]+), ([-+0-9.e]+)\]", page)
    assert all(low != high for low, high in intervals)
    assert verdict_lines(rows) == ["bot vs grpo: accuracy +0.2 (interval n/a), p n/a (1 vs 1 runs) — too few runs to tell"]
    # with per-problem values the problems are still resampled: a real interval
    paths = [_run(tmp_path / "pp", "grpo-s0", "grpo", 0, 50), _run(tmp_path / "pp", "bot-s0", "bot", 0, 70)]
    out = tmp_path / "pp.html"
    assert main(["report", *map(str, paths), "-o", str(out), "--baseline", "grpo"]) == 0
    accuracy = _row(json.loads(stats_path(out).read_text()), "accuracy", "bot")
    assert accuracy["ci_low"] < 0.2 < accuracy["ci_high"] and "ci_note" not in accuracy
    capsys.readouterr()


def test_identical_runs_have_no_zero_width_interval(tmp_path):
    """Every resample alike (all runs of both groups equal): n/a, not [0, 0]."""
    paths = [_run(tmp_path, f"{m}-s{s}", m, s, 50, per_problem=False) for m in ("grpo", "same") for s in (0, 1)]
    out = write_report(paths, tmp_path / "same.html", baseline="grpo")
    (row, _) = json.loads(stats_path(out).read_text())
    assert row["diff"] == 0 and row["ci_low"] is None and "no spread" in row["ci_note"]
    assert "n/a (no spread)" in out.read_text()
