"""MWRL (Minimal-Witness RL) credit: lattice coverage of a group's successful sets.

Source: github.com/TSUITUENYUE/MWRL, ``packages/mwrl/src/mwrl/{credit,advantage,config}.py``
(core credit, defaults) and ``packages/mwrl-rlvr/src/mwrl_rlvr/credit.py`` (the LLM arm's
exact lattice sum). Spec: ``specs/methods-b.md`` §3 (VERIFIED-CODE).

Setting. A context has variables [d] and a monotone verifier s(S) ∈ {0,1}, S ⊆ [d]. The
minimal witnesses are the inclusion-minimal sufficient sets. A group holds K proposals
S_1..S_K with successes s_i. With up(S) = {T ⊆ [d] : T ⊇ S}:

    U_K     = ∪_{i: s_i=1} up(S_i)          (what the group certifies)
    U_{−i}  = the same union without proposal i;  U_{−i−j} without i and j
    V(U)    = ν(U)                          (coverage valuation under a measure ν on 2^[d])

    deletion credit (l1o)   A_i = V(U_K) − V(U_{−i}) = ν(up S_i \\ ∪_{j≠i, s_j=1} up S_j) ≥ 0
    l2o baseline            b_i = V(U_{−i}) − 1/(K−1) Σ_{j≠i} V(U_{−i−j})
    advantage               Â_i = A_i − b_i,  then  Â_i / (mean_j |Â_j| + 1e-6)

A failed or dominated proposal (some other success ⊆ S_i, or a duplicate) gets A_i = 0
exactly, so only new, small sufficient sets earn credit: smaller sets own more mass
(minimality) and a set found twice owns none (diversity). b_i never looks at proposal i,
so the centred estimator stays unbiased. Set algebra gives
V(U_{−i}) − V(U_{−i−j}) = mass covered by j and by no success other than i, so

    b_i = 1/(K−1) · ν(points covered by exactly one success other than i),

and the lattice and Monte-Carlo paths below compute A_i and b_i in that form.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from functools import cache, lru_cache
from itertools import combinations

import numpy as np
import torch
from torch import Tensor

from reasonrl.algos.masked import group_inverse, group_sum
from reasonrl.registry import ADVANTAGES

__all__ = [
    "BASELINES",
    "MC_THRESHOLD",
    "MEASURES",
    "SCALES",
    "VALUATIONS",
    "count_value",
    "coverage_credit_lattice",
    "coverage_credit_mc",
    "coverage_value",
    "deletion_credit",
    "group_credit",
    "l2o_baseline",
    "lattice_point_weights",
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
MC_THRESHOLD = 12
"""Above this many antichain elements the exact sum costs 2^|antichain| per union (source default)."""
EPS = 1e-6
# The exact lattice sum enumerates 2^|union of successful sets| points; beyond this it
# falls back to inclusion–exclusion, whose cost depends on the antichain instead.
_LATTICE_MAX_COORDS = 16



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


def lattice_point_weights(n: int, measure: str = "layer", p: float = 0.7) -> np.ndarray:
    """ν({T}) for each T ⊆ U, |U| = n, indexed by bitmask (the marginal of ν on U).

    Coverage by sets inside U only depends on T ∩ U, so summing these weights over the
    2^n points is exact. geometric/uniform: q^|T| (1−q)^{n−|T|}. layer (a U(0,1) mixture
    of products): ∫ q^t (1−q)^{n−t} dq = t!(n−t)!/(n+1)! = 1/((n+1)·C(n,t)).
    """
    _check_measure(measure, p)
    sizes = _popcounts(n)
    if measure == "layer":
        per_size = np.array([1.0 / ((n + 1) * math.comb(n, t)) for t in range(n + 1)])
    else:
        q = 0.5 if measure == "uniform" else p
        per_size = np.array([q**t * (1.0 - q) ** (n - t) for t in range(n + 1)])
    return per_size[sizes]


@lru_cache(maxsize=32)
def _popcounts(n: int) -> np.ndarray:
    points = np.arange(1 << n, dtype=np.int64)
    sizes = np.zeros_like(points)
    for c in range(n):
        sizes += (points >> c) & 1
    return sizes


def _local_masks(sets: Sequence[frozenset | None], successes: np.ndarray) -> tuple[np.ndarray, int]:
    """Bitmasks of the sets over the coordinates of U = ∪ successful sets (failed rows: 0)."""
    universe = sorted(frozenset().union(*(s for s, ok in zip(sets, successes) if ok)))
    where = {v: j for j, v in enumerate(universe)}
    masks = np.zeros(len(sets), dtype=np.int64)
    for i, (s, ok) in enumerate(zip(sets, successes)):
        if ok:
            for v in s:
                masks[i] |= 1 << where[v]
    return masks, len(universe)


def _only_and_exactly_one(cover: np.ndarray, weight: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """From a [points, K] coverage matrix: (mass covered only by i, that mass of the
    points covered by exactly one success other than i, divided by K−1)."""
    count = cover.sum(axis=1, keepdims=True)
    raw = (weight[:, None] * (cover & (count == 1))).sum(axis=0)
    if k < 2:
        return raw, np.zeros(k)
    return raw, (weight[:, None] * ((count - cover) == 1)).sum(axis=0) / (k - 1)


def coverage_credit_lattice(sets: Sequence[frozenset | None], successes: Sequence[bool],
                            measure: str = "geometric", p: float = 0.7) -> tuple[np.ndarray, np.ndarray]:
    """Exact (A_i, b_i) by summing ν over the 2^|U| points of U = ∪_{s_i=1} S_i.

    A_i = ν(points covered only by S_i); b_i = ν(points covered by exactly one success
    other than i)/(K−1). Source: ``mwrl_rlvr.credit.coverage_l2o_exact`` (the RLVR arm,
    geometric p = 0.7); the layer and uniform weights are the same sum with
    :func:`lattice_point_weights`. Equals inclusion–exclusion (tested).
    """
    ok = np.array([bool(s) and x is not None for x, s in zip(sets, successes)], dtype=bool)
    k = len(sets)
    if not ok.any():
        return np.zeros(k), np.zeros(k)
    masks, n = _local_masks(sets, ok)
    if n > _LATTICE_MAX_COORDS:
        raise ValueError(f"the lattice sum enumerates 2^{n} points; use inclusion–exclusion above "
                         f"{_LATTICE_MAX_COORDS} variables")
    points = np.arange(1 << n, dtype=np.int64)
    cover = ((points[:, None] & masks[None, :]) == masks[None, :]) & ok[None, :]
    return _only_and_exactly_one(cover, lattice_point_weights(n, measure, p), k)


def coverage_credit_mc(sets: Sequence[frozenset | None], successes: Sequence[bool],
                       measure: str = "geometric", p: float = 0.7, samples: int = 20000,
                       seed: int | np.random.SeedSequence = 0) -> tuple[np.ndarray, np.ndarray]:
    """Shared-sample Monte-Carlo estimate of (A_i, b_i).

    Draws ``samples`` points T ~ ν (restricted to U) ONCE and computes every credit on
    them: A_i ≈ fraction covered only by S_i, b_i ≈ fraction covered by exactly one other
    success, /(K−1). Shared samples are mandatory: estimating each union separately and
    subtracting leaves O(σ) noise on an O(credit) difference and flips signs. Source:
    ``mwrl.credit._mc_shared_l2o`` (product measures). For the layer measure (no product
    form, kept exact in the source) we draw q ~ U(0,1) per sample, then T ~ product(q) —
    our extension, exact in expectation by the mixture identity in :func:`upset_measure`.
    """
    _check_measure(measure, p)
    if samples < 1:
        raise ValueError(f"mc_samples must be >= 1 for the Monte-Carlo path, got {samples}")
    ok = np.array([bool(s) and x is not None for x, s in zip(sets, successes)], dtype=bool)
    k = len(sets)
    if not ok.any():
        return np.zeros(k), np.zeros(k)
    masks, n = _local_masks(sets, ok)
    rng = np.random.default_rng(seed)
    if measure == "layer":
        q = rng.random((samples, 1))
    else:
        q = np.full((samples, 1), 0.5 if measure == "uniform" else p)
    inside = rng.random((samples, n)) < q
    member = ((masks[:, None] >> np.arange(n)[None, :]) & 1).astype(bool)  # [K, n]
    cover = ~(member[None, :, :] & ~inside[:, None, :]).any(axis=2) & ok[None, :]
    return _only_and_exactly_one(cover, np.full(samples, 1.0 / samples), k)


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


def group_credit(sets: Sequence[frozenset | None], successes: Sequence[bool], *,
                 valuation: str = "layer", p: float = 0.7, baseline: str = "l2o",
                 mc_samples: int = 20000, mc_threshold: int = MC_THRESHOLD,
                 seed: int | np.random.SeedSequence = 0) -> np.ndarray:
    """The centred, unscaled credit Â_i of one group of K proposals (``None`` = malformed).

    Baselines: ``l2o`` (default) Â = A − b (above); ``rloo`` Â = (A − mean A)·K/(K−1)
    (= A_i − mean_{j≠i} A_j); ``mean`` Â = A − mean A; ``none`` Â = A. Coverage credit
    is exact (lattice sum, or inclusion–exclusion for > 16 variables) while the pruned
    success antichain has ≤ ``mc_threshold`` elements, and uses the shared-sample
    Monte-Carlo estimate above that (unless ``mc_samples`` = 0, which forces exact).
    The choice is made once per group so all its credits come from one method. With the
    count valuation, ``l2o`` applies the same b_i formula to V = number of distinct
    successes (our generalisation; the source centres count credit with rloo/mean).
    """
    _check_params(valuation, p, baseline, "none", mc_samples)
    if len(sets) != len(successes):
        raise ValueError(f"sets and successes differ in length: {len(sets)} vs {len(successes)}")
    k = len(sets)
    if k == 0:
        return np.zeros(0)
    if valuation == "count":
        value = count_value(sets, successes)
        raw, base = deletion_credit(value, k), (l2o_baseline(value, k) if baseline == "l2o" else None)
    else:
        good = _successful(sets, successes)
        width = len(prune_antichain(good.values()))
        n_coords = len(frozenset().union(*good.values())) if good else 0
        if mc_samples > 0 and width > mc_threshold:
            raw, base = coverage_credit_mc(sets, successes, valuation, p, mc_samples, seed)
        elif n_coords <= _LATTICE_MAX_COORDS:
            raw, base = coverage_credit_lattice(sets, successes, valuation, p)
        else:
            value = coverage_value(sets, successes, valuation, p)
            raw, base = deletion_credit(value, k), l2o_baseline(value, k)
    if baseline == "l2o":
        return raw - base
    if baseline == "none":
        return raw
    centred = raw - raw.mean()
    return centred * (k / (k - 1)) if baseline == "rloo" and k > 1 else centred


def scale_credit(credit: Tensor, group_ids: Tensor, scale: str = "group", eps: float = EPS) -> Tensor:
    """Â_i / (mean |Â| + eps), the mean over i's group (``group``, source default) or over
    the whole batch (``batch``, the source's ``scope: update``); ``none`` leaves Â as is."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {', '.join(SCALES)}; got {scale!r}")
    if scale == "none":
        return credit
    if scale == "batch":
        return credit / (credit.abs().mean() + eps)
    inverse, groups = group_inverse(group_ids)
    total = group_sum(credit.abs(), inverse, groups)
    count = group_sum(torch.ones_like(credit), inverse, groups)
    return credit / ((total / count)[inverse] + eps)


def witness_advantages(sets: Sequence[frozenset | None], successes: Sequence[bool], group_ids: Tensor,
                       response_mask: Tensor, *, valuation: str = "layer", p: float = 0.7,
                       baseline: str = "l2o", scale: str = "group", mc_samples: int = 20000,
                       mc_threshold: int = MC_THRESHOLD, seed: int = 0, step: int = 0) -> Tensor:
    """MWRL advantages [B,T]: :func:`group_credit` per group, :func:`scale_credit`, and the
    sequence value broadcast to every valid token (REINFORCE-style, as in the source).

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
    for g in torch.unique(group_ids).tolist():
        rows = torch.nonzero(group_ids == g).squeeze(-1).tolist()
        values = group_credit([sets[i] for i in rows], [bool(successes[i]) for i in rows],
                              valuation=valuation, p=p, baseline=baseline, mc_samples=mc_samples,
                              mc_threshold=mc_threshold, seed=np.random.SeedSequence([seed, step, int(g)]))
        credit[rows] = torch.as_tensor(values, dtype=torch.float64)
    credit = scale_credit(credit, group_ids, scale).to(torch.float32)
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
    mean-|Â| scale per group, 20,000 MC samples above 12 antichain elements); the
    source's LLM arm is ``valuation: geometric, p: 0.7``.
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
