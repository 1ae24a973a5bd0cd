import itertools
import math

import pytest

from reasonrl.evaluate.calibration import auroc, brier_score, expected_calibration_error, overconfidence_rate
from reasonrl.evaluate.metrics import avg_at_k, bootstrap_ci, distinct_correct, maj_at_k, majority_answer, pass_at_k


def test_pass_at_k_hand_values():
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    # n=4, c=1, k=1: c/n
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(8, 0, 3) == 0.0  # c = 0
    assert pass_at_k(8, 8, 1) == 1.0  # c = n
    assert pass_at_k(8, 1, 8) == 1.0  # k = n with one success
    assert pass_at_k(8, 0, 8) == 0.0
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


@pytest.mark.parametrize("n", [1, 2, 4, 6])
def test_pass_at_k_equals_subset_enumeration(n):
    for c in range(n + 1):
        outcomes = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(range(n), k))
            brute = sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)
            assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)


def test_avg_and_majority():
    assert avg_at_k([True, False, False, True]) == 0.5
    assert majority_answer(["3", None, "4", "4", "3"]) == "3"  # tie → first seen
    assert majority_answer([None, None]) is None
    assert maj_at_k(["7", "8", "8", None], lambda a: a == "8", 4) == 1.0
    assert maj_at_k(["7", "8", "8", None], lambda a: a == "8", 1) == 0.0


def test_bootstrap_is_deterministic_and_brackets_the_mean():
    values = [1, 0, 1, 1, 0, 1, 0, 1, 1, 1]
    lo, hi = bootstrap_ci(values, seed=3)
    assert (lo, hi) == bootstrap_ci(values, seed=3)
    assert lo <= 0.7 <= hi and 0.3 < lo and hi <= 1.0
    assert bootstrap_ci([0.5] * 5) == (0.5, 0.5)


def test_calibration_hand_values():
    conf = [0.9, 0.8, 0.3, 0.6]
    ok = [True, False, False, True]
    # bins of width 0.1: 0.9 → (0.8,0.9]: acc 1, conf .9 → |.1|·¼; 0.8 → (0.7,0.8]: acc 0 → .8·¼;
    # 0.3 → (0.2,0.3]: .3·¼; 0.6 → (0.5,0.6]: |1-.6|=.4·¼  ⇒ (0.1+0.8+0.3+0.4)/4 = 0.4
    assert expected_calibration_error(conf, ok) == pytest.approx(0.4)
    # two bins: (0,0.5] holds .3 (acc 0): .3·¼; (0.5,1] holds .9,.8,.6: acc 2/3, conf 2.3/3 → |.6667-.7667|·¾ = .075
    assert expected_calibration_error(conf, ok, num_bins=2) == pytest.approx(0.075 + 0.075)
    # Brier: (.1² + .8² + .3² + .4²)/4 = (.01+.64+.09+.16)/4
    assert brier_score(conf, ok) == pytest.approx(0.225)
    # AUROC: positives {.9,.6} vs negatives {.8,.3}: .9>.8, .9>.3, .6<.8, .6>.3 → 3/4
    assert auroc(conf, ok) == pytest.approx(0.75)
    # bin edges are right-closed: 0.3 shares (0.2, 0.3] with 0.25 → |0.5 − 0.275|
    assert expected_calibration_error([0.3, 0.25], [True, False]) == pytest.approx(0.225)
    assert auroc([0.5, 0.5], [True, False]) == 0.5
    assert math.isnan(auroc([0.5, 0.7], [True, True]))
    # wrong answers: .8 and .3; one of them at >= 0.8
    assert overconfidence_rate(conf, ok) == 0.5
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        brier_score([1.2], [True])


def test_distinct_correct_counts_different_correct_texts_only():
    texts = ["1+2=3;####3", " 1+2=3;####3", "2+1=3;####3", "1+2=4;####4", "####3"]
    correct = [True, True, True, False, True]
    assert distinct_correct(texts, correct) == 3  # the trimmed duplicate counts once, the wrong one not at all
    assert distinct_correct(texts, [False] * 5) == 0
