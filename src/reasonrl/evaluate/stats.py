"""Statistics for comparing groups of runs (``reasonrl report --baseline``).

Pure functions, no I/O: the Student-t distribution (through the regularised incomplete
beta function), Welch's unequal-variance t-test over seeds, and a two-level bootstrap
of a difference of group means (seeds, then held-out problems within each seed).

Written here rather than imported from scipy, which is not a dependency of the project;
each function names the scipy function it agrees with so the numbers can be checked.
"""

from __future__ import annotations

import math
from typing import Sequence, Union

import numpy as np

__all__ = [
    "regularized_incomplete_beta",
    "student_t_cdf",
    "student_t_two_sided_p",
    "welch_t_test",
    "bootstrap_diff",
    "Run",
]

# A run as the bootstrap sees it: its final value (a number), or its per-problem values
# (a sequence whose mean is the run's final value).
Run = Union[float, Sequence[float]]

_FPMIN = 1e-300
_EPS = 1e-15


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b), evaluated with the modified Lentz method.

        I_x(a, b) = x^a (1−x)^b / (a B(a, b)) · 1 / (1 + d_1 / (1 + d_2 / (1 + …)))
        d_{2m+1} = −(a+m)(a+b+m) x / ((a+2m)(a+2m+1))
        d_{2m}   =  m(b−m) x / ((a+2m−1)(a+2m))

    This returns 1/(1 + d_1/(1 + …)). It converges fast for x < (a+1)/(a+b+2), in
    O(sqrt(max(a, b))) terms. Source: Numerical Recipes, 3rd ed., §6.4, eq. 6.4.5 and
    routine ``betacf``; Abramowitz & Stegun 26.5.8; Lentz's method as modified by
    Thompson & Barnett (1986), NR §5.2.
    """
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = 1.0
    d = 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _FPMIN else _FPMIN)
    h = d
    max_terms = 1000 + int(20 * math.sqrt(max(a, b)))
    for m in range(1, max_terms + 1):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)),             # even step d_{2m}
                   -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):  # odd step d_{2m+1}
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > _FPMIN else _FPMIN)
            c = 1.0 + aa / c
            c = c if abs(c) > _FPMIN else _FPMIN
            delta = d * c
            h *= delta
        if abs(delta - 1.0) < _EPS:
            return h
    raise ArithmeticError(f"incomplete beta continued fraction did not converge for a={a}, b={b}, x={x}")


def regularized_incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b) = B(x; a, b) / B(a, b) = (1/B(a, b)) ∫_0^x u^(a−1) (1−u)^(b−1) du, for a, b > 0
    and 0 ≤ x ≤ 1.

    Uses the continued fraction of :func:`_beta_continued_fraction` directly when
    x < (a+1)/(a+b+2) and the symmetry I_x(a, b) = 1 − I_{1−x}(b, a) otherwise (where
    the fraction for the mirrored arguments converges fast). The prefactor
    x^a (1−x)^b / B(a, b) is computed in log space with ``math.lgamma``. Source:
    Numerical Recipes, 3rd ed., §6.4 (``betai``). Agrees with ``scipy.special.betainc``
    to about 1e-12 (checked against mpmath for a up to 3000, b up to 100).
    """
    if a <= 0 or b <= 0:
        raise ValueError(f"incomplete beta needs a, b > 0, got a={a}, b={b}")
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"incomplete beta needs 0 <= x <= 1, got x={x}")
    if x == 0.0 or x == 1.0:
        return x
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, 1.0 - x) / b


def student_t_two_sided_p(t: float, df: float) -> float:
    """Two-sided tail probability P(|T| ≥ |t|) of Student's t with ``df`` > 0 degrees of
    freedom (``df`` need not be an integer, as Welch's test needs):

        P(|T| ≥ |t|) = I_{ν/(ν+t²)}(ν/2, 1/2)

    (Abramowitz & Stegun 26.7.1 with 26.5; Numerical Recipes, 3rd ed., eq. 6.14.11).
    ``df = inf`` gives the normal tail erfc(|t|/√2). Equals
    ``2 * scipy.stats.t.sf(abs(t), df)``.
    """
    if math.isnan(t) or math.isnan(df) or df <= 0:
        raise ValueError(f"Student t needs df > 0 and a number t, got t={t}, df={df}")
    if math.isinf(t):
        return 0.0
    if math.isinf(df):
        return math.erfc(abs(t) / math.sqrt(2.0))
    return regularized_incomplete_beta(df / 2.0, 0.5, df / (df + t * t))


def student_t_cdf(t: float, df: float) -> float:
    """P(T ≤ t) for Student's t with ``df`` > 0 degrees of freedom:

        F(t) = 1 − ½ I_{ν/(ν+t²)}(ν/2, 1/2)   for t ≥ 0,   and F(t) = 1 − F(−t).

    Checks: ν = 1 (Cauchy) gives ½ + atan(t)/π; ν = 2 gives ½ + t / (2 sqrt(2 + t²));
    ν → ∞ gives the normal CDF. Equals ``scipy.stats.t.cdf(t, df)``.
    """
    if math.isinf(t) and not math.isnan(df):
        return 1.0 if t > 0 else 0.0
    half_tail = 0.5 * student_t_two_sided_p(t, df)
    return 1.0 - half_tail if t >= 0 else half_tail


def welch_t_test(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """Welch's unequal-variance t-test of mean(a) − mean(b), two-sided (Welch 1947):

        t  = (m_a − m_b) / sqrt(s_a²/n_a + s_b²/n_b)
        ν  = (s_a²/n_a + s_b²/n_b)² / ((s_a²/n_a)² / (n_a−1) + (s_b²/n_b)² / (n_b−1))
        p  = P(|T_ν| ≥ |t|)

    with s² the unbiased sample variance (divisor n − 1) and ν the Welch–Satterthwaite
    degrees of freedom (Satterthwaite 1946), generally not an integer. Returns
    ``(t, df, p)``; equals ``scipy.stats.ttest_ind(a, b, equal_var=False)`` (and its
    ``df``). Each sample needs at least 2 values (else there is no variance to
    estimate: ``ValueError``). When both variances are 0 the test is undefined: ``t`` is
    ±inf (or NaN for equal means) and ``df`` and ``p`` are NaN.
    """
    a = [float(v) for v in a]
    b = [float(v) for v in b]
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"Welch's t-test needs at least 2 values per sample, got {len(a)} and {len(b)}")
    if not all(map(math.isfinite, a + b)):
        raise ValueError("Welch's t-test of non-finite values")
    n_a, n_b = len(a), len(b)
    m_a, m_b = math.fsum(a) / n_a, math.fsum(b) / n_b
    v_a = math.fsum((x - m_a) ** 2 for x in a) / (n_a - 1) / n_a  # s_a² / n_a
    v_b = math.fsum((x - m_b) ** 2 for x in b) / (n_b - 1) / n_b
    se2 = v_a + v_b
    diff = m_a - m_b
    if se2 == 0.0:
        return (math.copysign(math.inf, diff) if diff else math.nan), math.nan, math.nan
    t = diff / math.sqrt(se2)
    df = se2 * se2 / (v_a * v_a / (n_a - 1) + v_b * v_b / (n_b - 1))
    return t, df, student_t_two_sided_p(t, df)


def _resampled_group_means(runs: Sequence[Run], num_resamples: int, rng: np.random.Generator) -> np.ndarray:
    """[num_resamples] group means: draw n runs with replacement; a drawn run given by its
    per-problem values contributes the mean of its problems drawn with replacement (a
    fresh draw for every time it is drawn), a run given as a number contributes it."""
    n = len(runs)
    picks = rng.integers(0, n, size=(num_resamples, n))
    values = np.empty((num_resamples, n))
    for i, run in enumerate(runs):
        where = picks == i
        count = int(where.sum())
        if np.ndim(run) == 0:
            values[where] = float(run)
        elif count:
            problems = np.asarray(run, dtype=float)
            draws = rng.integers(0, len(problems), size=(count, len(problems)))
            values[where] = problems[draws].mean(axis=1)
    return values.mean(axis=1)


def bootstrap_diff(group: Sequence[Run], baseline: Sequence[Run], num_resamples: int = 2000,
                   seed: int | Sequence[int] = 0, confidence: float = 0.95) -> tuple[float, float]:
    """Percentile interval of mean(group) − mean(baseline) from a two-level bootstrap.

    Each group is a list of runs (seeds). A run is either its final value (a number) or
    its per-problem values (a sequence whose mean is that value). One resample b:

        G*_b = (1/n_g) Σ_{j=1..n_g} v*(r_j),   r_j drawn uniformly with replacement from the group's runs
        v*(r) = mean of P_r problems of run r drawn with replacement   (per-problem values)
              = the run's value                                        (a number)
        Δ*_b = G*_b − B*_b                                             (B* the same for the baseline)

    and the interval is the (1−c)/2 and (1+c)/2 quantiles of Δ*_1..Δ*_B (numpy's
    linear interpolation). Resampling seeds captures run-to-run (training) variance,
    resampling problems the finite held-out set (Efron & Tibshirani 1993, §8 on
    hierarchical data; Davison & Hinkley 1997, §3.8). With runs given as numbers only it
    is the ordinary bootstrap over seeds, which with 3 seeds has only 10 distinct
    resampled means per group and understates the spread. Deterministic for a fixed
    ``seed`` (an int or a sequence of ints, as ``numpy.random.default_rng`` takes).
    """
    if not group or not baseline:
        raise ValueError(f"bootstrap needs at least one run per side, got {len(group)} and {len(baseline)}")
    if num_resamples < 1:
        raise ValueError(f"num_resamples must be >= 1, got {num_resamples}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    for run in (*group, *baseline):
        if np.ndim(run) not in (0, 1) or (np.ndim(run) == 1 and len(run) == 0):
            raise ValueError("each run is a number or a non-empty sequence of per-problem values")
    rng = np.random.default_rng(seed)
    diffs = _resampled_group_means(group, num_resamples, rng) - _resampled_group_means(baseline, num_resamples, rng)
    low, high = np.quantile(diffs, [(1.0 - confidence) / 2.0, (1.0 + confidence) / 2.0])
    return float(low), float(high)
