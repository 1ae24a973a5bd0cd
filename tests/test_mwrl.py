"""MWRL: coverage credit over up-sets (reasonrl.methods.mwrl) and the minimal_witness task."""

import dataclasses
import math
import random
from itertools import combinations
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml

from reasonrl.methods.mwrl.advantage import (
    EXACT_MAX_LOG2,
    MEASURES,
    count_value,
    coverage_credit_exact,
    coverage_credit_lattice,
    coverage_credit_mc,
    coverage_value,
    deletion_credit,
    exact_plan,
    group_credit,
    l2o_baseline,
    mwrl_advantages,
    prune_antichain,
    scale_credit,
    union_measure,
    upset_measure,
    witness_advantages,
)
from reasonrl.config import EvalConfig
from reasonrl.registry import ADVANTAGES, REWARDS, TASKS
from reasonrl.methods.mwrl.task import (
    MinimalWitnessTask,
    is_minimal,
    is_sufficient,
    minimal_witnesses,
    parse_proposal,
    verdict,
    witness_minimal,
    witness_sufficient,
)
from reasonrl.metrics_log import read_metrics
from reasonrl.train.trainer import Trainer

from helpers import MINI_TINY, RECIPES, mini_recipe

F = frozenset


# -- brute force over 2^[d], written independently of the module ------------------------

def point_weight(t: int, d: int, measure: str, p: float = 0.7) -> float:
    """ν({T}) for |T| = t on 2^[d]."""
    if measure == "layer":  # uniform layer, uniform within the layer
        return 1.0 / ((d + 1) * math.comb(d, t))
    q = 0.5 if measure == "uniform" else p
    return q**t * (1 - q) ** (d - t)


def all_points(d: int):
    return [F(c) for r in range(d + 1) for c in combinations(range(d), r)]


def brute_union(sets, d, measure):
    return sum(point_weight(len(t), d, measure) for t in all_points(d) if any(s <= t for s in sets))


def brute_only_and_exactly_one(sets, successes, d, measure):
    """Per i: ν(points covered only by i), ν(points covered by exactly one success ≠ i)."""
    k = len(sets)
    only, others_one = np.zeros(k), np.zeros(k)
    for t in all_points(d):
        w = point_weight(len(t), d, measure)
        cover = [bool(ok) and s is not None and s <= t for s, ok in zip(sets, successes)]
        for i in range(k):
            if cover[i] and sum(cover) == 1:
                only[i] += w
            if sum(cover) - cover[i] == 1:
                others_one[i] += w
    return only, others_one


def random_sets(rng, d, k):
    return [F(x for x in range(d) if rng.random() < 0.45) or F({rng.randrange(d)}) for _ in range(k)]


# -- measures, antichains, unions ----------------------------------------------------

def test_upset_measure_hand_values():
    # |S| = 2: layer 1/(2+1) = 1/3; uniform 2^-2 = 1/4; geometric 0.7^2 = 0.49.
    assert upset_measure(2, "layer") == pytest.approx(1 / 3)
    assert upset_measure(2, "uniform") == pytest.approx(0.25)
    assert upset_measure(2, "geometric", 0.7) == pytest.approx(0.49)
    # The empty set's up-set is everything.
    assert all(upset_measure(0, m) == 1.0 for m in MEASURES)
    assert upset_measure(3, "geometric", 0.5) == upset_measure(3, "uniform") == 0.125


def test_bad_parameters_are_named():
    with pytest.raises(ValueError, match="measure must be one of"):
        upset_measure(1, "cubic")
    with pytest.raises(ValueError, match=r"p \(the geometric"):
        upset_measure(1, "geometric", 1.5)
    with pytest.raises(ValueError, match="valuation must be one of"):
        group_credit([F({0})], [True], valuation="size")
    with pytest.raises(ValueError, match="baseline must be one of"):
        group_credit([F({0})], [True], baseline="l3o")
    with pytest.raises(ValueError, match="scale must be one of"):
        scale_credit(torch.ones(2), torch.zeros(2, dtype=torch.long), "token")
    with pytest.raises(ValueError, match="mc_samples"):
        group_credit([F({0})], [True], mc_samples=-1)


def test_prune_antichain_keeps_minimal_elements_once():
    sets = [F({0, 1}), F({0}), F({1, 2}), F({0, 2}), F({1, 2}), F({0, 1, 2})]
    # {0,1}, {0,2}, {0,1,2} contain {0}; {1,2} appears twice.
    assert prune_antichain(sets) == [F({0}), F({1, 2})]


def test_union_measure_hand_value():
    # ν(up{0} ∪ up{1,2}) = 1/2 + 1/3 − ν(up{0,1,2}) = 1/2 + 1/3 − 1/4 = 7/12 (layer).
    assert union_measure([F({0}), F({1, 2})], "layer") == pytest.approx(7 / 12)
    # Adding a dominated set changes nothing.
    assert union_measure([F({0}), F({1, 2}), F({0, 3})], "layer") == pytest.approx(7 / 12)
    assert union_measure([], "layer") == 0.0


@pytest.mark.parametrize("measure", MEASURES)
def test_inclusion_exclusion_equals_brute_force(measure):
    rng = random.Random(measure)
    for _ in range(25):
        d = rng.randint(1, 6)
        sets = random_sets(rng, d, rng.randint(1, 5))
        assert union_measure(sets, measure) == pytest.approx(brute_union(sets, d, measure), abs=1e-12)


# -- deletion credit and the l2o baseline on a worked group ------------------------------

# S1 = {0}, S2 = {0,1} (dominated by S1), S3 = {1,2}, S4 failed; layer measure.
WORKED_SETS = [F({0}), F({0, 1}), F({1, 2}), None]
WORKED_OK = [True, True, True, False]


def test_deletion_credit_worked_group():
    value = coverage_value(WORKED_SETS, WORKED_OK, "layer")
    # V(U_K)  = ν(up{0} ∪ up{1,2})            = 1/2 + 1/3 − 1/4 = 7/12
    # V(U_-1) = ν(up{0,1} ∪ up{1,2})          = 1/3 + 1/3 − 1/4 = 5/12 → A_1 = 2/12
    # V(U_-2) = V(U_K) (S2 is dominated)                          → A_2 = 0
    # V(U_-3) = ν(up{0})                      = 1/2               → A_3 = 1/12
    # S4 failed                                                   → A_4 = 0
    assert deletion_credit(value, 4) == pytest.approx([2 / 12, 0.0, 1 / 12, 0.0])
    # The same numbers from the lattice sum (mass covered only by i).
    raw, _ = coverage_credit_lattice(WORKED_SETS, WORKED_OK, "layer")
    assert raw == pytest.approx([2 / 12, 0.0, 1 / 12, 0.0])
    # A duplicated success is dominated by its twin: both get 0.
    twin = coverage_value([F({0}), F({0}), F({1, 2})], [True] * 3, "uniform")
    assert deletion_credit(twin, 3) == pytest.approx([0.0, 0.0, 0.25 - 0.125])  # ν(up{1,2}) − ν(up{0,1,2})


def test_l2o_baseline_worked_group():
    value = coverage_value(WORKED_SETS, WORKED_OK, "layer")
    # Pairs removed: V{1,2} = ν(up{1,2}) = 1/3, V{1,3} = ν(up{0,1}) = 1/3, V{1,4} = V(U_-1) = 5/12,
    #                V{2,3} = 1/2, V{2,4} = 7/12, V{3,4} = 1/2.
    # b_1 = 5/12 − (1/3 + 1/3 + 5/12)/3 = 15/36 − 13/36 = 1/18
    # b_2 = 7/12 − (1/3 + 1/2 + 7/12)/3 = 21/36 − 17/36 = 1/9
    # b_3 = 1/2 − (1/3 + 1/2 + 1/2)/3   = 1/2 − 4/9    = 1/18
    # b_4 = 7/12 − (5/12 + 7/12 + 1/2)/3 = 7/12 − 1/2  = 1/12
    assert l2o_baseline(value, 4) == pytest.approx([1 / 18, 1 / 9, 1 / 18, 1 / 12])
    _, base = coverage_credit_lattice(WORKED_SETS, WORKED_OK, "layer")
    assert base == pytest.approx([1 / 18, 1 / 9, 1 / 18, 1 / 12])
    # Â = A − b = [2/12 − 1/18, −1/9, 1/12 − 1/18, −1/12] = [4, −4, 1, −3]/36
    credit = group_credit(WORKED_SETS, WORKED_OK, valuation="layer")
    assert credit == pytest.approx(np.array([4, -4, 1, -3]) / 36)
    # mean |Â| = 12/36/4 = 1/12 → scaled [4/3, −4/3, 1/3, −1]
    scaled = scale_credit(torch.tensor(credit), torch.zeros(4, dtype=torch.long))
    assert scaled.tolist() == pytest.approx([4 / 3, -4 / 3, 1 / 3, -1.0], rel=1e-4)


def test_other_baselines_and_singleton_group():
    # A = [2, 0, 1, 0]/12: rloo (A − mean)·4/3 with mean 1/16; mean: A − 1/16; none: A.
    a = np.array([2, 0, 1, 0]) / 12
    assert group_credit(WORKED_SETS, WORKED_OK, baseline="none") == pytest.approx(a)
    assert group_credit(WORKED_SETS, WORKED_OK, baseline="mean") == pytest.approx(a - 1 / 16)
    assert group_credit(WORKED_SETS, WORKED_OK, baseline="rloo") == pytest.approx((a - 1 / 16) * 4 / 3)
    # K = 1: b = 0, A = ν(up{0,1}) = 1/3.
    assert group_credit([F({0, 1})], [True]) == pytest.approx([1 / 3])


@pytest.mark.parametrize("measure", MEASURES)
def test_l2o_equals_only_i_minus_mean_exactly_one_mass(measure):
    rng = random.Random(7 + len(measure))
    zero_credit = 0
    for _ in range(15):
        d, k = rng.randint(2, 6), rng.randint(2, 6)
        sets = random_sets(rng, d, k)
        ok = [rng.random() < 0.75 for _ in range(k)]
        only, others_one = brute_only_and_exactly_one(sets, ok, d, measure)
        value = coverage_value(sets, ok, measure)
        a, b = deletion_credit(value, k), l2o_baseline(value, k)
        assert a == pytest.approx(only, abs=1e-12)
        assert b == pytest.approx(others_one / (k - 1), abs=1e-12)
        raw, base = coverage_credit_lattice(sets, ok, measure)
        assert raw == pytest.approx(only, abs=1e-12) and base == pytest.approx(others_one / (k - 1), abs=1e-12)
        # Failed proposals and dominated successes get exactly zero deletion credit.
        for i in range(k):
            dominated = any(ok[j] and j != i and sets[j] <= sets[i] for j in range(k))
            if not ok[i] or dominated:
                assert a[i] == 0.0
                zero_credit += 1
    assert zero_credit > 0, "no failed or dominated proposal was drawn"


def test_count_valuation():
    # V = number of distinct successful sets: A_i = 1 for a success no other success repeats.
    sets = [F({0}), F({0}), F({1, 2}), F({3}), None]
    ok = [True, True, True, False, False]
    value = count_value(sets, ok)
    assert deletion_credit(value, 5) == pytest.approx([0, 0, 1, 0, 0])
    # rloo: A − mean(A) = A − 0.2, times 5/4 → [−0.25, −0.25, 1, −0.25, −0.25]
    assert group_credit(sets, ok, valuation="count", baseline="rloo") == pytest.approx([-0.25, -0.25, 1, -0.25, -0.25])
    # l2o with V = count: V(U_-i) = 2 except V(U_-3) = 1; V(U_-i-j) per pair, e.g. row 1:
    # b_1 = 2 − (V{1,2}=1 + V{1,3}=1 + V{1,4}=2 + V{1,5}=2)/4 = 2 − 1.5 = 0.5 → Â_1 = −0.5
    assert group_credit(sets, ok, valuation="count")[0] == pytest.approx(-0.5)


# -- Monte-Carlo path ------------------------------------------------------------------

def wide_group(seed=0, k=16, d=8):
    rng = random.Random(seed)
    sets = [F(rng.sample(range(d), 4)) for _ in range(k)]  # same size: distinct sets form an antichain
    ok = [rng.random() < 0.9 for _ in range(k)]
    return sets, ok


@pytest.mark.parametrize("measure", MEASURES)
def test_mc_estimate_close_to_exact_and_sign_consistent(measure):
    sets, ok = wide_group()
    assert len(prune_antichain(s for s, g in zip(sets, ok) if g)) > 12  # the source's MC regime
    exact_a, exact_b = coverage_credit_exact(sets, ok, measure)
    exact = exact_a - exact_b
    mc_a, mc_b = coverage_credit_mc(sets, ok, measure, samples=200_000, seed=3)
    mc = mc_a - mc_b
    assert not np.array_equal(exact, mc)  # really an estimate
    # Credits here are ~0.005; with 200k shared samples each estimate has σ ≈ 0.0003.
    assert mc == pytest.approx(exact, abs=0.0012)
    clear = np.abs(exact) > 0.002
    assert clear.sum() >= 4 and np.all(np.sign(mc[clear]) == np.sign(exact[clear]))
    # Seeded: the same seed repeats, another seed differs.
    again_a, again_b = coverage_credit_mc(sets, ok, measure, samples=200_000, seed=3)
    assert np.array_equal(mc, again_a - again_b)
    other_a, other_b = coverage_credit_mc(sets, ok, measure, samples=200_000, seed=4)
    assert not np.array_equal(mc, other_a - other_b)
    chosen = group_credit(sets, ok, valuation=measure, mc_samples=200_000, seed=3)
    if measure == "layer":  # exact at any width, as in the source
        assert chosen == pytest.approx(exact, abs=1e-12)
    else:  # the product measures take the source's shared-sample MC path above 12
        assert np.array_equal(chosen, mc)
        assert group_credit(sets, ok, valuation=measure, mc_samples=0) == pytest.approx(exact, abs=1e-12)


def test_mc_failed_rows_get_zero_raw_credit():
    sets, ok = wide_group(1)
    ok[3] = ok[11] = False  # wide_group(1) draws no failed row, which left the check below nothing to check
    raw, _ = coverage_credit_mc(sets, ok, "geometric", 0.7, samples=5000, seed=0)
    failed = [i for i in range(len(ok)) if not ok[i]]
    assert failed, "the group has no failed row"
    assert all(raw[i] == 0.0 for i in failed)


# -- the exact engines beyond 12 antichain elements --------------------------------------

def wide_antichain_group(rng, d, k):
    """K proposals over [d] whose successes prune to an antichain of > 12 elements, plus a
    duplicate, a dominated success, a failure and a malformed row."""
    for _ in range(100):
        sets = [F(rng.sample(range(d), rng.randint(d // 2, d // 2 + 1))) for _ in range(k)]
        sets[1] = sets[0]  # a duplicated success
        sets[3] = sets[2] | {next(v for v in range(d) if v not in sets[2])}  # dominated by sets[2]
        ok = [True] * k
        ok[4] = False
        sets[5] = None
        if len(prune_antichain(s for s, g in zip(sets, ok) if g and s is not None)) > 12:
            return sets, ok
    raise AssertionError("no group with a wide antichain drawn")


def brute_credit(sets, ok, d, measure):
    """(A, b) by summing ν over all 2^d points."""
    only, others_one = brute_only_and_exactly_one(sets, ok, d, measure)
    return only, others_one / (len(sets) - 1)


@pytest.mark.parametrize("measure", MEASURES)
def test_exact_credit_above_12_antichain_elements_equals_brute_force(measure):
    rng = random.Random(f"wide-{measure}")
    for _ in range(3):
        d = rng.randint(9, 10)
        sets, ok = wide_antichain_group(rng, d, rng.randint(16, 20))
        a, b = brute_credit(sets, ok, d, measure)
        assert a[1] == a[0] == 0.0 and a[3] == 0.0 and a[4] == a[5] == 0.0  # duplicate, dominated, failed
        assert a.max() > 1e-4
        for engine in ("atoms", "subsets"):
            raw, base = coverage_credit_exact(sets, ok, measure, engine=engine)
            assert np.abs(raw - a).max() < 1e-9 and np.abs(base - b).max() < 1e-9, engine
            assert all(raw[i] == 0.0 for i in (0, 1, 3, 4, 5)) and raw.min() >= 0.0  # exact zeros, as in theory
    # The layer measure (the source default) stays exact on the default path: no MC above 12.
    if measure == "layer":
        assert np.abs(group_credit(sets, ok, valuation="layer") - (a - b)).max() < 1e-9


def test_exact_credit_on_42_variables_equals_block_brute_force():
    # 14 blocks of 3 variables (d = 42: 2^42 points), each proposal a union of 2–3 blocks,
    # > 12 antichain elements. Coverage only depends on which blocks T holds in full, so
    # the brute force runs over the 2^14 block states; the layer weight of "exactly the
    # blocks F full" counts T by size: [x^t] x^{3|F|} ((1+x)^3 − x^3)^{14−|F|}, each T of
    # size t weighing 1/((d+1)·C(d,t)). No quadrature, no atoms, no Möbius inversion.
    rng = random.Random(5)
    blocks, size = 14, 3
    d = blocks * size
    chosen = [F(rng.sample(range(blocks), rng.randint(2, 3))) for _ in range(20)]
    chosen[1] = chosen[0]
    sets = [F(b * size + c for b in bs for c in range(size)) for bs in chosen]
    ok = [rng.random() < 0.9 for _ in sets]
    assert len(prune_antichain(s for s, g in zip(sets, ok) if g)) > 12
    partial = np.array([1.0, 3.0, 3.0])  # (1+x)^3 − x^3 = 1 + 3x + 3x²
    per_full = []
    for full in range(blocks + 1):
        poly = np.concatenate([np.zeros(size * full), np.polynomial.polynomial.polypow(partial, blocks - full)])
        per_full.append(sum(c / ((d + 1) * math.comb(d, t)) for t, c in enumerate(poly)))
    k = len(sets)
    only, others_one = np.zeros(k), np.zeros(k)
    for state in range(1 << blocks):
        w = per_full[bin(state).count("1")]
        cover = [g and all(state >> b & 1 for b in bs) for bs, g in zip(chosen, ok)]
        count = sum(cover)
        for i in range(k):
            if cover[i] and count == 1:
                only[i] += w
            if count - cover[i] == 1:
                others_one[i] += w
    base = others_one / (k - 1)
    assert only.max() > 1e-4
    for engine in ("atoms", "subsets"):
        raw, b = coverage_credit_exact(sets, ok, "layer", engine=engine)
        assert np.abs(raw - only).max() < 1e-9 and np.abs(b - base).max() < 1e-9, engine
    assert np.abs(group_credit(sets, ok, valuation="layer") - (only - base)).max() < 1e-9
    engine, log2_states = exact_plan(sets, ok)
    assert engine == "atoms" and log2_states <= blocks  # 42 variables merge into ≤ 14 atoms


def test_group_beyond_both_exact_spaces_warns_or_raises():
    # 30 distinct 3-sets over 40 variables: > 22 atoms, > 22 distinct successes, > 12 antichain elements.
    rng = random.Random(11)
    sets = []
    while len(sets) < 30:
        s = F(rng.sample(range(40), 3))
        if s not in sets:
            sets.append(s)
    ok = [True] * 30
    assert exact_plan(sets, ok)[1] > EXACT_MAX_LOG2 and len(prune_antichain(sets)) > 12
    with pytest.raises(ValueError, match="no exact engine fits"):
        group_credit(sets, ok, valuation="layer", mc_samples=0)
    with pytest.warns(RuntimeWarning, match="Monte-Carlo"):
        mc = group_credit(sets, ok, valuation="layer", mc_samples=2000, seed=1)
    a, b = coverage_credit_mc(sets, ok, "layer", samples=2000, seed=1)
    assert np.array_equal(mc, a - b)


# -- the advantage stage --------------------------------------------------------------

def test_witness_advantages_broadcast_and_scopes():
    # Group 0: the worked group; group 1: one success among failures. Ragged mask.
    sets = WORKED_SETS + [F({5}), None]
    ok = WORKED_OK + [True, False]
    gids = torch.tensor([0, 0, 0, 0, 1, 1])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0]])
    adv = witness_advantages(sets, ok, gids, mask, valuation="layer")
    # Group 1 (K=2): A = [1/2, 0]; b_1 = V(U_-1) − V(U_-1-2) = 0 − 0; b_2 = V(U_-2) − V(∅) = 1/2
    # → Â = [1/2, −1/2], mean |Â| = 1/2 → [1, −1].
    per_row = [4 / 3, -4 / 3, 1 / 3, -1.0, 1.0, -1.0]
    expected = torch.tensor(per_row).unsqueeze(-1) * mask
    assert torch.allclose(adv, expected, atol=1e-4)
    assert adv.dtype == torch.float32
    # One divisor for the batch: raw Â = [4,−4,1,−3]/36 and [1/2,−1/2]; mean |Â| = (1/3 + 1)/6 = 2/9.
    batch_scaled = witness_advantages(sets, ok, gids, mask, valuation="layer", scale="batch")
    raw = torch.tensor([4 / 36, -4 / 36, 1 / 36, -3 / 36, 0.5, -0.5])
    assert torch.allclose(batch_scaled[:, 0], raw / (2 / 9), atol=1e-4)


# The example of issue 32: masks 0011, 0011, 0101, 1111 (bit c = variable c), the last failed.
ISSUE_SETS = [F({0, 1}), F({0, 1}), F({0, 2}), F({0, 1, 2, 3})]
ISSUE_OK = [True, True, True, False]


@pytest.mark.parametrize("measure", MEASURES)
def test_rloo_and_mean_divide_by_the_raw_credit_before_centring(measure):
    # A = [0, 0, a, 0] (the twins dominate each other, the last failed), a = ν(up{0,2} \ up{0,1}):
    # layer 1/3 − 1/4, uniform 1/4 − 1/8, geometric .49 − .343. Any a > 0 gives the same numbers:
    # rloo   Â = (A − a/4)·4/3 = [−1, −1, 3, −1]·a/3; divided by mean |A| = a/4 → [−4/3, −4/3, 4, −4/3]
    # mean   Â = A − a/4       = [−1, −1, 3, −1]·a/4; divided by a/4            → [−1, −1, 3, −1]
    # none   Â = A; divided by a/4                                              → [0, 0, 4, 0]
    # (dividing by the mean |Â| instead, as before, gave [−2/3, −2/3, 2, −2/3] for rloo and mean.)
    gids, mask = torch.zeros(4, dtype=torch.long), torch.ones(4, 1)
    expected = {"rloo": [-4 / 3, -4 / 3, 4.0, -4 / 3], "mean": [-1.0, -1.0, 3.0, -1.0], "none": [0.0, 0.0, 4.0, 0.0]}
    for baseline, want in expected.items():
        adv = witness_advantages(ISSUE_SETS, ISSUE_OK, gids, mask, valuation=measure, baseline=baseline)
        assert adv[:, 0].tolist() == pytest.approx(want, rel=1e-4), baseline
    # The source's update scope (our scale: batch) divides the CENTRED credit by its mean |Â|.
    batch = witness_advantages(ISSUE_SETS, ISSUE_OK, gids, mask, valuation=measure, baseline="rloo", scale="batch")
    assert batch[:, 0].tolist() == pytest.approx([-2 / 3, -2 / 3, 2.0, -2 / 3], rel=1e-4)


# -- a re-statement of the authors' group advantage (mwrl.advantage.mwrl_group_advantages,
# scale "mean", scope "group", no discovery term), written from their code independently of
# the module, on integer bitmasks as they do ------------------------------------------

def _bits(m):
    return bin(m).count("1")


def _phi(measure, p=0.7):
    if measure == "layer":
        return lambda size: 1.0 / (size + 1)
    q = 0.5 if measure == "uniform" else p
    return lambda size: q**size


def _minimal(masks):
    kept = []
    for m in sorted(set(masks), key=_bits):
        if not any(k & m == k for k in kept):
            kept.append(m)
    return kept


def _union_value(masks, phi):
    chain, total = _minimal(masks), 0.0
    for r in range(1, len(chain) + 1):
        for sub in combinations(chain, r):
            u = 0
            for m in sub:
                u |= m
            total += (-1) ** (r + 1) * phi(_bits(u))
    return total


def authors_credit_l1o(masks, succ, phi):
    out = []
    for i, m in enumerate(masks):
        others = _minimal([masks[j] for j in range(len(masks)) if j != i and succ[j]])
        if not succ[i] or any(o & m == o for o in others):
            out.append(0.0)
            continue
        total = 0.0
        for r in range(len(others) + 1):
            for sub in combinations(others, r):
                u = m
                for o in sub:
                    u |= o
                total += (-1) ** r * phi(_bits(u))
        out.append(total)
    return out


def authors_credit_l2o(masks, succ, phi):
    k = len(masks)

    def v(excluded):
        return _union_value([masks[j] for j in range(k) if succ[j] and j not in excluded], phi)

    out = []
    for i in range(k):
        marginal = v(set()) - v({i})
        others = [j for j in range(k) if j != i]
        base = v({i}) - sum(v({i, j}) for j in others) / len(others) if others else 0.0
        out.append(marginal - base)
    return out


def authors_group_advantage(masks, succ, valuation, baseline, eps=1e-6):
    """baseline 'none' = the authors' witness_center False."""
    center = baseline != "none"
    if valuation == "count":
        credit = [1.0 if succ[i] and not any(succ[j] and masks[j] == masks[i] for j in range(len(masks)) if j != i)
                  else 0.0 for i in range(len(masks))]
        l2o = False
    elif center and baseline == "l2o":
        credit, l2o = authors_credit_l2o(masks, succ, _phi(valuation)), True
    else:
        credit, l2o = authors_credit_l1o(masks, succ, _phi(valuation)), False
    credit = np.array(credit)
    raw_scale = np.abs(credit).mean()  # taken before centring
    if center and not l2o:
        n = len(credit)
        credit = credit - credit.mean()
        if baseline == "rloo" and n > 1:
            credit = credit * (n / (n - 1))
    return credit / (raw_scale + eps)


@pytest.mark.parametrize("valuation", MEASURES + ("count",))
def test_group_advantage_equals_the_authors_formula_on_random_groups(valuation):
    rng = random.Random(f"authors-{valuation}")
    baselines = ("rloo", "mean", "none") + (("l2o",) if valuation != "count" else ())
    checked = 0
    for _ in range(40):
        d, k = rng.randint(2, 6), rng.randint(2, 8)
        masks = [rng.randrange(1, 1 << d) for _ in range(k)]
        if rng.random() < 0.5:
            masks[-1] = masks[0]  # duplicates
        succ = [rng.random() < 0.7 for _ in range(k)]
        sets = [F(c for c in range(d) if m >> c & 1) for m in masks]
        gids, mask = torch.zeros(k, dtype=torch.long), torch.ones(k, 1)
        for baseline in baselines:
            ours = witness_advantages(sets, succ, gids, mask, valuation=valuation, baseline=baseline)[:, 0]
            theirs = authors_group_advantage(masks, succ, valuation, baseline)
            assert ours.double().numpy() == pytest.approx(theirs, rel=1e-5, abs=1e-5), (baseline, masks, succ)
            checked += float(np.abs(theirs).max()) > 0
    assert checked > 60


def problem_for(values, target):
    return MinimalWitnessTask().problem(values, target)


def test_registered_adapter_parses_and_verifies_each_row():
    # values [9,4,5], target 9: "9" = {0} ok, "9+4" = {0,1} ok (dominated), "4+5" = {1,2} ok,
    # "4" = {1} insufficient → the worked group, so the scaled credit is [4/3, −4/3, 1/3, −1].
    assert ADVANTAGES.get("mwrl") is mwrl_advantages
    prob = problem_for([9, 4, 5], 9)
    batch = SimpleNamespace(meta={"completion": ["9", "9+4", "4+5", "4"], "problem": [prob] * 4})
    mask = torch.ones(4, 3)
    adv = mwrl_advantages(torch.zeros(4, 3), mask, torch.zeros(4, dtype=torch.long), batch=batch, valuation="layer")
    assert adv[:, 0].tolist() == pytest.approx([4 / 3, -4 / 3, 1 / 3, -1.0], rel=1e-4)
    # A malformed completion is a failure, never an exception.
    batch.meta["completion"][0] = "9+junk"
    adv = mwrl_advantages(torch.zeros(4, 3), mask, torch.zeros(4, dtype=torch.long), batch=batch, valuation="layer")
    assert adv[0, 0] < 0
    with pytest.raises(ValueError, match="batch.meta\\['problem'\\]"):
        mwrl_advantages(torch.zeros(4, 3), mask, torch.zeros(4, dtype=torch.long),
                        batch=SimpleNamespace(meta={"completion": ["9"] * 4}))


# -- the task -------------------------------------------------------------------------

def brute_force_witnesses(values, target):
    every = [F(c) for r in range(len(values) + 1) for c in combinations(range(len(values)), r)]
    return sorted((s for s in every if is_minimal(values, target, s)), key=lambda s: (len(s), sorted(s)))


def test_enumerator_matches_brute_force():
    rng = random.Random(0)
    for _ in range(300):
        values = rng.sample(range(1, 15), rng.randint(1, 7))
        target = rng.randint(1, sum(values) + 2)
        assert minimal_witnesses(values, target) == brute_force_witnesses(values, target)


def test_verifier_and_minimality_by_hand():
    values, target = [1, 3, 4, 6, 8], 9
    assert is_sufficient(values, target, F({1, 3}))  # 3 + 6 = 9
    assert not is_sufficient(values, target, F({0, 2}))  # 1 + 4 = 5
    assert is_minimal(values, target, F({1, 3}))
    assert not is_minimal(values, target, F({0, 1, 3}))  # 1 + 3 + 6 = 10, but 3 + 6 = 9 already
    assert is_minimal(values, target, F({3, 4}))  # 6 + 8 = 14: 6 < 9 and 8 < 9
    # 1+8, 3+6, 3+8, 4+6, 4+8, 6+8 (indices of the values)
    assert minimal_witnesses(values, target) == [F({0, 4}), F({1, 3}), F({1, 4}), F({2, 3}), F({2, 4}), F({3, 4})]


def test_parser_and_rewards_on_malformed_text():
    prob = problem_for([1, 3, 4, 6, 8], 9)
    values = prob.meta["values"]
    assert parse_proposal("8+1", values) == F({0, 4})
    assert parse_proposal(" 3+6\n", values) == F({1, 3})
    for bad in ["", "+", "3+", "+3", "3++6", "3+3", "7+8", "3 + 6", "3+6;", "abc", "0", None]:
        assert parse_proposal(bad, values) is None, bad
        assert witness_sufficient(bad, prob) == 0.0 and witness_minimal(bad, prob) == 0.0
        assert verdict(bad, prob) == (None, False)
    assert witness_sufficient("1+3+6", prob) == 1.0 and witness_minimal("1+3+6", prob) == 0.0
    assert witness_sufficient("6+3", prob) == 1.0 and witness_minimal("6+3", prob) == 1.0
    assert REWARDS.get("witness_minimal") is witness_minimal
    with pytest.raises(ValueError, match="minimal_witness problem"):
        verdict("3", SimpleNamespace(meta={}, prompt="1+1;"))


def test_group_metrics_by_hand():
    task = MinimalWitnessTask()
    prob = task.problem([1, 3, 4, 6, 8], 9)  # 6 minimal witnesses
    completions = ["1+8", "8+1", "3+6", "1+3+6", "junk", "4+6+8"]
    m = task.group_metrics(prob, completions)
    # minimal: 1+8 (twice), 3+6 → 2 distinct of 6; sufficient: all but junk; parsed: all but junk.
    assert m == pytest.approx({"witness_recall": 2 / 6, "distinct_minimal": 2.0, "minimal_rate": 3 / 6,
                               "sufficient_rate": 5 / 6, "parse_rate": 5 / 6})


def test_task_stream_split_and_warmup():
    task = TASKS.get("minimal_witness")()
    assert task.train_problems(3, 5, 1) == task.train_problems(3, 5, 1)  # pure in (step, count, seed)
    assert task.train_problems(3, 5, 1) != task.train_problems(4, 5, 1)
    held_out = {p.prompt for p in task.eval_problems(len(task._eval))}
    train = task.train_problems(0, 500, 0)
    assert not held_out & {p.prompt for p in train}
    for p in train[:100] + task.eval_problems(20):
        n = p.meta["num_witnesses"]
        assert 3 <= n <= 8 and n == len(minimal_witnesses(p.meta["values"], p.meta["target"]))
        assert max(p.meta["values"]) < p.meta["target"]  # every witness combines items
        assert set(p.prompt) <= set(task.alphabet)
    warm = task.warmup_problems(0, 400, 0)
    assert all(set(p.solution) <= set(task.alphabet) for p in warm)
    assert all(witness_sufficient(p.solution, p) == 1.0 for p in warm)
    minimal = [witness_minimal(p.solution, p) for p in warm]
    assert 0.4 < sum(minimal) / len(minimal) < 0.6  # favourite_fraction = 0.5; the padded rest is never minimal
    with pytest.raises(ValueError, match="favourite_fraction"):
        MinimalWitnessTask(favourite_fraction=2.0)
    with pytest.raises(ValueError, match="held-out split"):
        task.eval_problems(10_000)


# -- end to end ------------------------------------------------------------------------

def recipe_sections(name):
    raw = yaml.safe_load((RECIPES / name).read_text())
    return {k: raw[k] for k in ("task", "rewards", "advantage", "loss")}


@pytest.mark.parametrize("name", ["mwrl.yaml", "mwrl_grpo.yaml"])
def test_recipe_trains_end_to_end(name, tmp_path):
    eval_cfg = {"size": 8, "reward": "witness_minimal"}
    with_samples = "n" in {f.name for f in dataclasses.fields(EvalConfig)}
    if with_samples:
        eval_cfg["n"] = 4
    recipe = mini_recipe(
        **recipe_sections(name),
        model={"backend": "tiny", "tiny": {**MINI_TINY, "task": "minimal_witness"}},
        rollout={"num_generations": 4, "max_new_tokens": 12},
        eval=eval_cfg,
    )
    summary = Trainer(recipe, tmp_path / "run", log=lambda m: None).run()
    assert summary["steps"] == 4
    rows = read_metrics(tmp_path / "run")
    train_rows = [r for r in rows if "loss" in r or "skipped" in r]
    assert len(train_rows) == 4
    reward = recipe.rewards[0].name
    assert all(0.0 <= r[f"reward/{reward}"] <= 1.0 for r in train_rows)
    if with_samples:
        final = [r for r in rows if "eval/witness_recall" in r]
        assert final and 0.0 <= final[-1]["eval/witness_recall"] <= 1.0
