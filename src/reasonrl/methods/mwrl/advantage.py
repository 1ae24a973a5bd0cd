"""MWRL (Minimal-Witness RL) credit: lattice coverage of a group's successful sets.

Source: the authors' code, github.com/TSUITUENYUE/MWRL (read at commit 6dc11b3f):
``packages/mwrl/src/mwrl/{credit,advantage,config,runner}.py`` (core credit, centring,
scaling and defaults) and ``packages/mwrl-rlvr/src/mwrl_rlvr/credit.py`` (the LLM arm's
exact lattice sum). No paper or write-up was available; see ``docs/methods/mwrl.md``.

Setting. A context has variables [d] and a monotone verifier s(S) ∈ {0,1}, S ⊆ [d]. The
minimal witnesses are the inclusion-minimal sufficient sets. A group holds K proposals
S_1..S_K with successes s_i. With up(S) = {T ⊆ [d] : T ⊇ S}:

    U_K     = ∪_{i: s_i=1} up(S_i)          (what the group certifies)
    U_{−i}  = the same union without proposal i;  U_{−i−j} without i and j
    V(U)    = ν(U)                          (coverage valuation under a measure ν on 2^[d])

    deletion credit (l1o)   A_i = V(U_K) − V(U_{−i}) = ν(up S_i \\ ∪_{j≠i, s_j=1} up S_j) ≥ 0
    l2o baseline            b_i = V(U_{−i}) − 1/(K−1) Σ_{j≠i} V(U_{−i−j})
    advantage (l2o)         Â_i = A_i − b_i,            then  Â_i / (mean_j |Â_j| + 1e-6)
    advantage (rloo, mean)  Â_i = c·(A_i − mean_j A_j),  then  Â_i / (mean_j |A_j| + 1e-6)
                            (c = K/(K−1) for rloo, 1 for mean: the divisor is the mean of
                            the RAW credit, taken before centring, as in the source)

A failed or dominated proposal (some other success ⊆ S_i, or a duplicate) gets A_i = 0
exactly, so only new, small sufficient sets earn credit: smaller sets own more mass
(minimality) and a set found twice owns none (diversity). b_i never looks at proposal i,
so the centred estimator stays unbiased. Set algebra gives
V(U_{−i}) − V(U_{−i−j}) = mass covered by j and by no success other than i, so

    b_i = 1/(K−1) · ν(points covered by exactly one success other than i),

and every path below computes A_i and b_i in that form.

Exact computation (:func:`coverage_credit_exact`). Write c_j(T) = [S_j ⊆ T] for the
successes and count(T) = Σ_j c_j(T). Then A_i = ν(c_i = 1, count = 1) and
(K−1)·b_i = ν(count − c_i = 1) = M1 − A_i + ν(c_i = 1, count = 2) for a success
(M1 = ν(count = 1)), and M1 for a failure. So three masses per distinct successful set
give every credit, and they come from one table ν(state) over one of two state spaces:

- ``atoms``: the coordinates of U = ∪ successful sets, grouped into atoms by which sets
  hold them (coordinates no set tells apart are merged). The state is the set F of atoms
  T contains in full; a set is covered iff its atoms ⊆ F. For a product measure with
  inclusion probability q, ν(F) = Π_{a∈F} q^{m_a} Π_{a∉F} (1 − q^{m_a}) (m_a = atom size).
  The layer measure is the U(0,1) mixture of the product measures (see
  :func:`upset_measure`), and ν(F) is then a polynomial of degree ≤ |U| in q, so
  Gauss–Legendre quadrature with ⌊|U|/2⌋+1 nodes integrates it exactly. 2^atoms states.
- ``subsets``: the state is the set E of distinct successful sets that cover T.
  ν(all of J cover) = ν(up ∪J) = φ(|∪J|) for every J, and Möbius inversion over supersets
  gives ν(exactly E covers). 2^(distinct successful sets) states; exact for every measure.

count(state) is a subset-sum (zeta) transform of the multiplicities and the per-set
masses are superset sums; every intermediate is a probability, so the float error stays
near 1e-15. The cheaper space is used; the cost is exponential in min(atoms, distinct
successes), never in K or the antichain width (counting points of a monotone DNF is
#P-hard, so some exponent is unavoidable). :func:`group_credit` says which groups take
it: every ``layer`` group that fits in 2^``EXACT_MAX_LOG2`` states, and the product
measures up to the source's Monte-Carlo threshold.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from itertools import combinations

import numpy as np
import torch
from torch import Tensor

from reasonrl.algos.masked import group_inverse, group_sum
from reasonrl.registry import ADVANTAGES

__all__ = [
    "BASELINES",
    "ENGINES",
    "EXACT_MAX_LOG2",
    "MC_THRESHOLD",
    "MEASURES",
    "SCALES",
    "VALUATIONS",
    "count_value",
    "coverage_credit_exact",
    "coverage_credit_lattice",
    "coverage_credit_mc",
    "coverage_value",
    "deletion_credit",
    "exact_plan",
    "group_credit",
    "l2o_baseline",
    "mwrl_advantages",
    "prune_antichain",
    "scale_credit",
    "union_measure",
    "upset_measure",
    "witness_advantages",
]

MEASURES = ("layer", "uniform", "geometric")
VALUATIONS = MEASURES + ("count",)
BASELINES = ("l2o", "rloo", "mean", "none")
SCALES = ("group", "batch", "none")
ENGINES = ("atoms", "subsets")
MC_THRESHOLD = 12
"""Source default: above this many antichain elements the source estimates the product
measures (uniform, geometric) by Monte Carlo; its inclusion–exclusion costs 2^|antichain|
per union. The layer measure stays exact here at any width (see :func:`group_credit`)."""
EXACT_MAX_LOG2 = 22
"""The exact engines enumerate at most 2^22 states (about 4M; tens of MB, well under a
second) per group; a group beyond that in both state spaces leaves the exact path."""
EPS = 1e-6


def _check_measure(measure: str, p: float) -> None:
    if measure not in MEASURES:
        raise ValueError(f"measure must be one of {', '.join(MEASURES)}; got {measure!r}")
    if measure == "geometric" and not 0.0 < p <= 1.0:
        raise ValueError(f"p (the geometric measure's inclusion probability) must be in (0, 1], got {p}")


def upset_measure(size: int, measure: str = "layer", p: float = 0.7) -> float:
    """ν(up S) for |S| = ``size``.

    - ``layer`` (source default): 1/(|S|+1). The measure that picks a layer k ∈ {0..d}
      uniformly and then a uniform k-subset; equivalently q ~ U(0,1), T ~ product(q),
      since ∫ q^|S| dq = 1/(|S|+1).
    - ``uniform``: 2^−|S| (every subset equally likely).
    - ``geometric``: p^|S| (each variable in T independently with probability p).
    """
    _check_measure(measure, p)
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    if measure == "layer":
        return 1.0 / (size + 1)
    return (0.5 if measure == "uniform" else p) ** size


def prune_antichain(sets: Iterable[frozenset]) -> list[frozenset]:
    """The inclusion-minimal elements of ``sets`` (duplicates merged), smallest first.

    ∪ up(S) over the sets equals ∪ up(S) over the minimal ones, so dominated sets can
    be dropped before inclusion–exclusion.
    """
    out: list[frozenset] = []
    for candidate in sorted(set(sets), key=lambda s: (len(s), sorted(s))):
        if not any(kept <= candidate for kept in out):
            out.append(candidate)
    return out


def union_measure(sets: Iterable[frozenset], measure: str = "layer", p: float = 0.7) -> float:
    """ν(∪_i up S_i) by inclusion–exclusion over the pruned antichain:

        Σ_{∅≠J} (−1)^{|J|+1} ν(up ∪_{j∈J} S_j),   using  up S ∩ up T = up (S ∪ T).

    Exact; costs 2^|antichain| terms (source: ``mwrl.credit.union_upset_measure``).
    """
    _check_measure(measure, p)
    antichain = prune_antichain(sets)
    total = 0.0
    for r in range(1, len(antichain) + 1):
        sign = 1.0 if r % 2 else -1.0
        for subset in combinations(antichain, r):
            total += sign * upset_measure(len(frozenset().union(*subset)), measure, p)
    return total


# -- the exact engines ------------------------------------------------------------------

def _ok_rows(sets: Sequence[frozenset | None], successes: Sequence[bool]) -> np.ndarray:
    return np.array([bool(s) and x is not None for x, s in zip(sets, successes)], dtype=bool)


def _distinct(sets: Sequence[frozenset | None], ok: np.ndarray) -> tuple[list[frozenset], list[int], list[int]]:
    """(distinct successful sets, their multiplicities, each row's index into them or −1)."""
    index: dict[frozenset, int] = {}
    mult: list[int] = []
    row = []
    for s, good in zip(sets, ok):
        if not good:
            row.append(-1)
            continue
        if s not in index:
            index[s] = len(mult)
            mult.append(0)
        mult[index[s]] += 1
        row.append(index[s])
    return list(index), mult, row


def _atoms(distinct: Sequence[frozenset]) -> tuple[list[int], list[int]]:
    """The coordinates of ∪ ``distinct`` grouped by the sets that hold them:
    (atom sizes, atom patterns: bit j set when distinct set j holds the atom)."""
    pattern: dict = {}
    for j, s in enumerate(distinct):
        for v in s:
            pattern[v] = pattern.get(v, 0) | (1 << j)
    sizes = Counter(pattern.values())
    patterns = sorted(sizes)
    return [sizes[q] for q in patterns], patterns


def _layer_nodes(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss–Legendre nodes and weights on [0, 1], exact for polynomials of degree ≤ n."""
    x, w = np.polynomial.legendre.leggauss(n // 2 + 1)
    return (x + 1.0) / 2.0, w / 2.0


def exact_plan(sets: Sequence[frozenset | None], successes: Sequence[bool]) -> tuple[str, int]:
    """(engine, log2 of its state count) of the smaller exact state space for a group:
    ``atoms`` (2^atoms states) or ``subsets`` (2^(distinct successful sets)); ties go to
    ``atoms``. Each costs a few dozen passes over its states, for every measure."""
    distinct, _, _ = _distinct(sets, _ok_rows(sets, successes))
    atoms = len(_atoms(distinct)[0])
    return ("atoms", atoms) if atoms <= len(distinct) else ("subsets", len(distinct))


def _zeta_subsets(x: np.ndarray, bits: int) -> None:
    """In place: x[F] ← Σ_{G ⊆ F} x[G]."""
    for b in range(bits):
        v = x.reshape(-1, 2, 1 << b)
        v[:, 1, :] += v[:, 0, :]


def _zeta_supersets(x: np.ndarray, bits: int) -> None:
    """In place: x[F] ← Σ_{G ⊇ F} x[G]."""
    for b in range(bits):
        v = x.reshape(-1, 2, 1 << b)
        v[:, 0, :] += v[:, 1, :]


def _mobius_supersets(x: np.ndarray, bits: int) -> None:
    """In place: the inverse of :func:`_zeta_supersets`."""
    for b in range(bits):
        v = x.reshape(-1, 2, 1 << b)
        v[:, 0, :] -= v[:, 1, :]


def _product_table(sizes: Sequence[int], q: np.ndarray) -> np.ndarray:
    """[len(q), 2^atoms]: Π_{a∈F} q^{m_a} Π_{a∉F} (1 − q^{m_a}) per node q, F as a bitmask."""
    table = np.ones((len(q), 1))
    for m in sizes:
        full = (q**m)[:, None]
        table = np.concatenate([table * (1.0 - full), table * full], axis=1)  # atom = the new highest bit
    return table


def _atom_weights(sizes: Sequence[int], measure: str, p: float) -> np.ndarray:
    """ν(T holds exactly the atoms F in full), indexed by the atom bitmask F.

    The product over atoms splits into low and high halves, so the quadrature sum of the
    layer measure is one matrix product: Σ_r ω_r high_r[h]·low_r[l]."""
    if measure == "layer":
        q, node_weights = _layer_nodes(sum(sizes))
    else:
        q, node_weights = np.array([0.5 if measure == "uniform" else p]), np.ones(1)
    half = len(sizes) // 2
    low, high = _product_table(sizes[:half], q), _product_table(sizes[half:], q)
    return ((high * node_weights[:, None]).T @ low).reshape(-1)


def _subset_weights(sizes: Sequence[int], patterns: Sequence[int], m: int, measure: str, p: float) -> np.ndarray:
    """ν(exactly the distinct sets E cover T), indexed by the set bitmask E: Möbius
    inversion of ν(all of J cover) = φ(|∪J|).

    |∪J| = |U| − Σ_a m_a·[J misses atom a's pattern], a superset sum over the patterns'
    complements."""
    missed = np.zeros(1 << m, dtype=np.int64)
    np.add.at(missed, [(1 << m) - 1 - pattern for pattern in patterns], sizes)
    _zeta_supersets(missed, m)
    union_size = sum(sizes) - missed
    if measure == "layer":
        weight = 1.0 / (union_size + 1.0)
    else:
        weight = (0.5 if measure == "uniform" else p) ** union_size.astype(np.float64)
    _mobius_supersets(weight, m)
    return weight


def coverage_credit_exact(sets: Sequence[frozenset | None], successes: Sequence[bool],
                          measure: str = "layer", p: float = 0.7, engine: str | None = None,
                          max_log2: int = EXACT_MAX_LOG2) -> tuple[np.ndarray, np.ndarray]:
    """Exact (A_i, b_i) for one group (``None`` = malformed, a failure); see the module
    docstring. A_i = ν(points covered only by S_i); b_i = ν(points covered by exactly one
    success other than i)/(K−1). ``engine``: ``atoms``, ``subsets`` or None (the cheaper,
    :func:`exact_plan`). Raises ValueError when the engine would enumerate more than
    2^``max_log2`` states."""
    _check_measure(measure, p)
    if engine is not None and engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}; got {engine!r}")
    if len(sets) != len(successes):
        raise ValueError(f"sets and successes differ in length: {len(sets)} vs {len(successes)}")
    ok = _ok_rows(sets, successes)
    k = len(sets)
    if not ok.any():
        return np.zeros(k), np.zeros(k)
    distinct, mult, row = _distinct(sets, ok)
    sizes, patterns = _atoms(distinct)
    engine = engine or exact_plan(sets, successes)[0]
    if engine == "atoms":
        bits = len(sizes)
        masks = [sum(1 << a for a, pattern in enumerate(patterns) if pattern >> j & 1) for j in range(len(distinct))]
    else:
        bits = len(distinct)
        masks = [1 << j for j in range(bits)]
    if bits > max_log2:
        raise ValueError(f"the exact {engine!r} engine would enumerate 2^{bits} states for this group "
                         f"({len(sizes)} atoms, {len(distinct)} distinct successful sets); the limit is "
                         f"2^{max_log2}")
    weight = (_atom_weights(sizes, measure, p) if engine == "atoms"
              else _subset_weights(sizes, patterns, bits, measure, p))
    count = np.zeros(1 << bits, dtype=np.int32)
    np.add.at(count, masks, mult)
    _zeta_subsets(count, bits)  # count[F] = Σ multiplicities of the sets covered in state F
    once = np.where(count == 1, weight, 0.0)
    twice = np.where(count == 2, weight, 0.0)
    m1 = float(once.sum())
    _zeta_supersets(once, bits)
    _zeta_supersets(twice, bits)
    only, pair = once[masks], twice[masks]  # per distinct set: ν(covered, count = 1), ν(covered, count = 2)
    # A duplicated or dominated success owns no mass: make its 0 exact (the Möbius
    # inversion of the subsets engine leaves rounding residue near 1e-17 there).
    owns_none = [mult[j] > 1 or any(other < s for other in distinct) for j, s in enumerate(distinct)]
    only = np.where(owns_none, 0.0, np.maximum(only, 0.0))
    raw, base = np.zeros(k), np.full(k, m1)
    for i, j in enumerate(row):
        if j >= 0:
            raw[i] = only[j]
            base[i] = m1 - only[j] + pair[j]
    return raw, (base / (k - 1) if k > 1 else np.zeros(k))


def coverage_credit_lattice(sets: Sequence[frozenset | None], successes: Sequence[bool],
                            measure: str = "geometric", p: float = 0.7) -> tuple[np.ndarray, np.ndarray]:
    """Exact (A_i, b_i) by summing ν over the lattice of U = ∪_{s_i=1} S_i, its coordinates
    merged into atoms (:func:`coverage_credit_exact` with ``engine="atoms"``). Source:
    ``mwrl_rlvr.credit.coverage_l2o_exact`` (the RLVR arm, geometric p = 0.7, over the 2^|U|
    points); the layer and uniform measures are the same sum. Equals inclusion–exclusion
    (tested)."""
    return coverage_credit_exact(sets, successes, measure, p, engine="atoms")


def coverage_credit_mc(sets: Sequence[frozenset | None], successes: Sequence[bool],
                       measure: str = "geometric", p: float = 0.7, samples: int = 20000,
                       seed: int | np.random.SeedSequence = 0) -> tuple[np.ndarray, np.ndarray]:
    """Shared-sample Monte-Carlo estimate of (A_i, b_i).

    Draws ``samples`` points T ~ ν (restricted to U) ONCE and computes every credit on
    them: A_i ≈ fraction covered only by S_i, b_i ≈ fraction covered by exactly one other
    success, /(K−1). Shared samples are mandatory: estimating each union separately and
    subtracting leaves O(σ) noise on an O(credit) difference and flips signs. Source:
    ``mwrl.credit._mc_shared_l2o`` (product measures). For the layer measure (no product
    form; the source keeps it exact) we draw q ~ U(0,1) per sample, then T ~ product(q),
    unbiased by the mixture identity in :func:`upset_measure`; :func:`group_credit` only
    takes this for ``layer`` when no exact engine fits, and warns.
    """
    _check_measure(measure, p)
    if samples < 1:
        raise ValueError(f"mc_samples must be >= 1 for the Monte-Carlo path, got {samples}")
    ok = _ok_rows(sets, successes)
    k = len(sets)
    if not ok.any():
        return np.zeros(k), np.zeros(k)
    universe = sorted(frozenset().union(*(s for s, good in zip(sets, ok) if good)))
    where = {v: j for j, v in enumerate(universe)}
    member = np.zeros((k, len(universe)), dtype=bool)  # failed rows stay all-False
    for i, (s, good) in enumerate(zip(sets, ok)):
        if good:
            member[i, [where[v] for v in s]] = True
    rng = np.random.default_rng(seed)
    if measure == "layer":
        q = rng.random((samples, 1))
    else:
        q = np.full((samples, 1), 0.5 if measure == "uniform" else p)
    inside = rng.random((samples, len(universe))) < q
    cover = ~(member[None, :, :] & ~inside[:, None, :]).any(axis=2) & ok[None, :]
    count = cover.sum(axis=1, keepdims=True)
    raw = (cover & (count == 1)).mean(axis=0)
    if k < 2:
        return raw, np.zeros(k)
    return raw, ((count - cover) == 1).mean(axis=0) / (k - 1)


def deletion_credit(value: Callable[[frozenset], float], k: int) -> np.ndarray:
    """A_i = V(U_K) − V(U_{−i}); ``value(excluded)`` is V of the union without the
    proposals whose indices are in ``excluded``."""
    full = value(frozenset())
    return np.array([full - value(frozenset({i})) for i in range(k)])


def l2o_baseline(value: Callable[[frozenset], float], k: int) -> np.ndarray:
    """b_i = V(U_{−i}) − 1/(K−1) Σ_{j≠i} V(U_{−i−j}); 0 for a group of one."""
    if k < 2:
        return np.zeros(k)
    return np.array([value(frozenset({i}))
                     - sum(value(frozenset({i, j})) for j in range(k) if j != i) / (k - 1)
                     for i in range(k)])


def _successful(sets: Sequence[frozenset | None], successes: Sequence[bool]) -> dict[int, frozenset]:
    return {i: s for i, (s, ok) in enumerate(zip(sets, successes)) if ok and s is not None}


def coverage_value(sets: Sequence[frozenset | None], successes: Sequence[bool],
                   measure: str = "layer", p: float = 0.7) -> Callable[[frozenset], float]:
    """V(excluded) = ν(∪ up S_j over successes j ∉ excluded), by inclusion–exclusion (cached)."""
    _check_measure(measure, p)
    good = _successful(sets, successes)

    @cache
    def value(excluded: frozenset) -> float:
        return union_measure([s for i, s in good.items() if i not in excluded], measure, p)

    return lambda excluded: value(frozenset(excluded) & frozenset(good))


def count_value(sets: Sequence[frozenset | None], successes: Sequence[bool]) -> Callable[[frozenset], float]:
    """The count valuation: V(excluded) = number of DISTINCT successful sets left.

    Its deletion credit is A_i = s_i·1[S_i is not duplicated by another success]
    (source: ``mwrl.credit.count_advantages``; the RLVR "distinct" arm uses the raw sets,
    as here, without canonicalisation)."""
    good = _successful(sets, successes)
    return lambda excluded: float(len({s for i, s in good.items() if i not in excluded}))


def _check_params(valuation: str, p: float, baseline: str, scale: str, mc_samples: int) -> None:
    if valuation not in VALUATIONS:
        raise ValueError(f"valuation must be one of {', '.join(VALUATIONS)}; got {valuation!r}")
    if valuation != "count":
        _check_measure(valuation, p)
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {', '.join(BASELINES)}; got {baseline!r}")
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {', '.join(SCALES)}; got {scale!r}")
    if mc_samples < 0:
        raise ValueError(f"mc_samples must be >= 0 (0 forces the exact path), got {mc_samples}")


def _coverage_credit(sets: Sequence[frozenset | None], successes: Sequence[bool], valuation: str, p: float,
                     mc_samples: int, mc_threshold: int,
                     seed: int | np.random.SeedSequence) -> tuple[np.ndarray, np.ndarray]:
    """(A, b) of one group by the path :func:`group_credit` describes."""
    good = _successful(sets, successes)
    width = len(prune_antichain(good.values()))
    if valuation != "layer" and mc_samples > 0 and width > mc_threshold:
        return coverage_credit_mc(sets, successes, valuation, p, mc_samples, seed)
    engine, log2_states = exact_plan(sets, successes)
    if log2_states <= EXACT_MAX_LOG2:
        return coverage_credit_exact(sets, successes, valuation, p, engine)
    if width <= mc_threshold:  # the source's own exact path: inclusion–exclusion on the antichain
        value = coverage_value(sets, successes, valuation, p)
        return deletion_credit(value, len(sets)), l2o_baseline(value, len(sets))
    why = (f"no exact engine fits this group: 2^{log2_states} states in the cheaper state space "
           f"(limit 2^{EXACT_MAX_LOG2}) and a {width}-element antichain (inclusion–exclusion above "
           f"{mc_threshold} costs 2^{width} terms per union)")
    if mc_samples == 0:
        raise ValueError(f"{why}; set mc_samples > 0 to estimate it by Monte Carlo")
    warnings.warn(f"MWRL {valuation} credit: {why}; using the shared-sample Monte-Carlo estimate "
                  f"({mc_samples} samples)", RuntimeWarning, stacklevel=3)
    return coverage_credit_mc(sets, successes, valuation, p, mc_samples, seed)


def _group_credit_parts(sets: Sequence[frozenset | None], successes: Sequence[bool], *,
                        valuation: str, p: float, baseline: str, mc_samples: int, mc_threshold: int,
                        seed: int | np.random.SeedSequence) -> tuple[np.ndarray, np.ndarray]:
    """(raw deletion credit A, centred credit Â) of one group; see :func:`group_credit`."""
    _check_params(valuation, p, baseline, "none", mc_samples)
    if len(sets) != len(successes):
        raise ValueError(f"sets and successes differ in length: {len(sets)} vs {len(successes)}")
    k = len(sets)
    if k == 0:
        return np.zeros(0), np.zeros(0)
    if valuation == "count":
        value = count_value(sets, successes)
        raw, base = deletion_credit(value, k), (l2o_baseline(value, k) if baseline == "l2o" else None)
    else:
        raw, base = _coverage_credit(sets, successes, valuation, p, mc_samples, mc_threshold, seed)
    if baseline == "l2o":
        return raw, raw - base
    if baseline == "none":
        return raw, raw
    centred = raw - raw.mean()
    return raw, (centred * (k / (k - 1)) if baseline == "rloo" and k > 1 else centred)


def group_credit(sets: Sequence[frozenset | None], successes: Sequence[bool], *,
                 valuation: str = "layer", p: float = 0.7, baseline: str = "l2o",
                 mc_samples: int = 20000, mc_threshold: int = MC_THRESHOLD,
                 seed: int | np.random.SeedSequence = 0) -> np.ndarray:
    """The centred, unscaled credit Â_i of one group of K proposals (``None`` = malformed).

    Baselines: ``l2o`` (default) Â = A − b (above); ``rloo`` Â = (A − mean A)·K/(K−1)
    (= A_i − mean_{j≠i} A_j); ``mean`` Â = A − mean A; ``none`` Â = A. The divisor that
    :func:`witness_advantages` applies next depends on the baseline (see there).

    Coverage credit, one method per group:

    - ``uniform``/``geometric`` with more than ``mc_threshold`` pruned antichain elements
      and ``mc_samples`` > 0: the shared-sample Monte-Carlo estimate (source behaviour);
    - otherwise exact, by :func:`coverage_credit_exact` (the cheaper of its two state
      spaces), at any antichain width. ``layer`` is always exact here, as in the source
      (whose inclusion–exclusion is exponential in the width);
    - when neither exact state space fits in 2^``EXACT_MAX_LOG2``: inclusion–exclusion if
      the antichain has ≤ ``mc_threshold`` elements (the source's exact path), else the
      Monte-Carlo estimate with a RuntimeWarning, or a ValueError when ``mc_samples`` = 0.

    With the count valuation, ``l2o`` applies the same b_i formula to V = number of
    distinct successes (our generalisation; the source centres count credit with the
    group mean whenever ``l2o`` is asked for, and with rloo/mean otherwise).
    """
    return _group_credit_parts(sets, successes, valuation=valuation, p=p, baseline=baseline,
                               mc_samples=mc_samples, mc_threshold=mc_threshold, seed=seed)[1]


def scale_credit(credit: Tensor, group_ids: Tensor, scale: str = "group", eps: float = EPS,
                 magnitude: Tensor | None = None) -> Tensor:
    """Â_i / (mean |M| + eps), the mean over i's group (``group``, source default) or over
    the whole batch (``batch``, the source's ``scope: update``); ``none`` leaves Â as is.

    M is ``magnitude`` when given (the group divisor of the rloo/mean baselines is the
    mean |raw credit|, see :func:`witness_advantages`), else Â itself."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {', '.join(SCALES)}; got {scale!r}")
    if scale == "none":
        return credit
    magnitude = credit if magnitude is None else magnitude
    if magnitude.shape != credit.shape:
        raise ValueError(f"magnitude must have credit's shape {tuple(credit.shape)}, got {tuple(magnitude.shape)}")
    if scale == "batch":
        return credit / (magnitude.abs().mean() + eps)
    inverse, groups = group_inverse(group_ids)
    total = group_sum(magnitude.abs(), inverse, groups)
    count = group_sum(torch.ones_like(magnitude), inverse, groups)
    return credit / ((total / count)[inverse] + eps)


def witness_advantages(sets: Sequence[frozenset | None], successes: Sequence[bool], group_ids: Tensor,
                       response_mask: Tensor, *, valuation: str = "layer", p: float = 0.7,
                       baseline: str = "l2o", scale: str = "group", mc_samples: int = 20000,
                       mc_threshold: int = MC_THRESHOLD, seed: int = 0, step: int = 0) -> Tensor:
    """MWRL advantages [B,T]: :func:`group_credit` per group, :func:`scale_credit`, and the
    sequence value broadcast to every valid token (REINFORCE-style, as in the source).

    The divisor follows the source's ``mwrl_group_advantages`` (scale ``mean``): with
    ``scale: group`` it is the group's mean |A| of the RAW deletion credit, taken before
    centring, for ``rloo``, ``mean`` and ``none`` (for ``none`` A is Â), and the mean |A − b|
    for ``l2o`` (the source's l2o credit arrives centred). With ``scale: batch`` (the
    source's ``scope: update``, ``normalize_update_advantages``) it is the batch mean |Â|
    of the centred credit for every baseline.

    The Monte-Carlo path of group g draws from ``SeedSequence([seed, step, g])``.
    """
    if response_mask.dim() != 2 or response_mask.shape[0] != len(sets):
        raise ValueError(f"response_mask must be [B,T] with B={len(sets)} rows, got {tuple(response_mask.shape)}")
    if group_ids.shape != (len(sets),):
        raise ValueError(f"group_ids must be [B]={len(sets)}, got {tuple(group_ids.shape)}")
    if len(successes) != len(sets):
        raise ValueError(f"sets and successes differ in length: {len(sets)} vs {len(successes)}")
    _check_params(valuation, p, baseline, scale, mc_samples)
    credit = torch.zeros(len(sets), dtype=torch.float64)
    raw = torch.zeros(len(sets), dtype=torch.float64)
    for g in torch.unique(group_ids).tolist():
        rows = torch.nonzero(group_ids == g).squeeze(-1).tolist()
        a, centred = _group_credit_parts(
            [sets[i] for i in rows], [bool(successes[i]) for i in rows], valuation=valuation, p=p,
            baseline=baseline, mc_samples=mc_samples, mc_threshold=mc_threshold,
            seed=np.random.SeedSequence([seed, step, int(g)]))
        credit[rows] = torch.as_tensor(centred, dtype=torch.float64)
        raw[rows] = torch.as_tensor(a, dtype=torch.float64)
    magnitude = raw if scale == "group" and baseline in ("rloo", "mean") else credit
    credit = scale_credit(credit, group_ids, scale, magnitude=magnitude).to(torch.float32)
    return torch.where(response_mask.bool(), credit.unsqueeze(-1), 0.0)


@ADVANTAGES.register("mwrl")
def mwrl_advantages(token_rewards: Tensor, response_mask: Tensor, group_ids: Tensor, *, batch,
                    step: int = 0, valuation: str = "layer", p: float = 0.7, baseline: str = "l2o",
                    scale: str = "group", mc_samples: int = 20000, seed: int = 0) -> Tensor:
    """MWRL (github.com/TSUITUENYUE/MWRL) for set-valued proposals; see the module docstring.

    Parses each row's proposal from ``batch.meta["completion"]`` with its
    ``batch.meta["problem"]`` and verifies it (``reasonrl.methods.mwrl.task.verdict``): s_i is
    SUFFICIENCY, not the recipe reward, so ``token_rewards`` is unused. A malformed
    proposal is a failure. Defaults follow the core ``GroupedRLConfig`` (layer ν, l2o,
    mean-|Â| scale per group, 20,000 MC samples for the product measures above 12
    antichain elements; layer stays exact); the source's LLM arm is ``valuation:
    geometric, p: 0.7``.
    """
    from reasonrl.methods.mwrl.task import verdict  # the task owns the parser and verifier

    meta = batch.meta
    for key in ("completion", "problem"):
        if key not in meta or len(meta[key]) != token_rewards.shape[0]:
            raise ValueError(f"advantage 'mwrl' needs batch.meta['{key}'] with one entry per row")
    verdicts = [verdict(c, prob) for c, prob in zip(meta["completion"], meta["problem"])]
    return witness_advantages([s for s, _ in verdicts], [ok for _, ok in verdicts], group_ids, response_mask,
                              valuation=valuation, p=p, baseline=baseline, scale=scale,
                              mc_samples=mc_samples, seed=seed, step=step)
