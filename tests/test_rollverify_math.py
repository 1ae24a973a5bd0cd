"""RollVerify math (reasonrl.methods.rollverify.maths): OPS, sequence/token verification, residual sampling.

The statistical tests check the speculative-sampling identity: draw y ~ μ, accept with
min(1, π/μ), else resample from norm(max(0, π − μ)); the result is distributed as π. Chi-square
p-values use the closed form for even degrees of freedom,
sf(x; 2m) = e^{−x/2} Σ_{j<m} (x/2)^j / j!, cross-checked against scipy when it is installed.
Critical values at α = 1e-4 (solved from that formula): df 4 → 23.513, df 24 → 58.613.
"""

import math

import pytest
import torch
from torch.testing import assert_close

from reasonrl.methods.rollverify import maths as rollverify
from reasonrl.algos.prefix_shift import ops, verification_metrics
from reasonrl.methods.rollverify.maths import (TAU_SEQ, TAU_TOK, accept_tokens, accept_tokens_random,
                                               residual_distribution, sample_residual, speculative_verify,
                                               truncate_deterministic, verify_sequences)

NAN, INF = float("nan"), float("inf")
ALPHA = 1e-4
CRIT = {4: 23.513, 24: 58.613}


def chi2_sf(x: float, df: int) -> float:
    assert df % 2 == 0
    h = x / 2.0
    return math.exp(-h) * sum(h ** j / math.factorial(j) for j in range(df // 2))


def chi2_stat(counts: torch.Tensor, probs: torch.Tensor) -> float:
    n = counts.sum().double()
    expected = n * probs.double().flatten()
    return float(((counts.double().flatten() - expected) ** 2 / expected).sum())


def test_chi2_helper():
    for df, crit in CRIT.items():
        assert abs(chi2_sf(crit, df) - ALPHA) < 1e-6
    try:
        from scipy.stats import chi2
    except ImportError:
        return
    for df in (4, 24):
        for x in (1.0, 10.0, 40.0):
            assert abs(chi2_sf(x, df) - chi2.sf(x, df)) < 1e-9


# ----------------------------------------------------------------------------- ops


def ops_batch():
    """3 rows x 3 tokens. d = log π − log μ: row 0 [0.1, −0.2, 0.3] (k = 3), row 1 [−0.5] (k = 1,
    its padding NaN / inf), row 2 empty (all padding, +5 log-ratios)."""
    behaviour = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, NAN, -1.0], [-1.0, -1.0, -1.0]])
    d = torch.tensor([[0.1, -0.2, 0.3], [-0.5, 0.0, INF], [5.0, 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    return behaviour + d, behaviour, mask


def test_ops_hand_computed():
    out = ops(*ops_batch())
    # mean_abs: row 0 (0.1 + 0.2 + 0.3)/3 = 0.2; row 1 0.5/1; row 2 empty → 0
    assert_close(out["mean_abs"], torch.tensor([0.2, 0.5, 0.0]))
    # k3 = e^{−d} − 1 + d: row 0 (0.904837 − 0.9) + (1.221403 − 1.2) + (0.740818 − 0.7)
    #                              = 0.004837 + 0.021403 + 0.040818 = 0.067058, /3 = 0.022353
    #                     row 1 e^{0.5} − 1 − 0.5 = 0.148721
    assert_close(out["k3"], torch.tensor([0.022353, 0.148721, 0.0]), rtol=1e-4, atol=1e-6)
    # max_abs: max(0.1, 0.2, 0.3) = 0.3; 0.5; empty → 0
    assert_close(out["max_abs"], torch.tensor([0.3, 0.5, 0.0]))
    for v in out.values():
        assert v.dtype == torch.float32 and v.shape == (3,) and torch.isfinite(v).all()


def test_ops_clamped_detached_and_low_precision():
    cur = torch.tensor([[100.0, -INF]], dtype=torch.float64, requires_grad=True)
    out = ops(cur, torch.zeros(1, 2).bfloat16(), torch.ones(1, 2))
    # d clamped to ±20: mean |d| = 20, max 20; k3 per token clamped to ≤ 10 (kl_k3)
    assert_close(out["mean_abs"], torch.tensor([20.0]))
    assert_close(out["max_abs"], torch.tensor([20.0]))
    assert_close(out["k3"], torch.tensor([10.0]))
    assert not any(v.requires_grad for v in out.values())


def test_identical_policies_give_zero():
    behaviour = torch.tensor([[-1.0, -2.0, -0.5]])
    out = ops(behaviour.clone(), behaviour, torch.ones(1, 3))
    assert all(float(v) == 0.0 for v in out.values())


def test_mask_must_be_right_padded_and_shapes_match():
    lp = torch.zeros(1, 3)
    with pytest.raises(ValueError, match="right-padded"):
        ops(lp, lp, torch.tensor([[0, 1, 1]]))
    with pytest.raises(ValueError, match="shape"):
        ops(lp, torch.zeros(1, 2), torch.ones(1, 3))


# ----------------------------------------------------------------------------- sequence level


def test_verify_sequences_threshold_edge():
    tau = 0.1
    ops_values = torch.tensor([0.05, tau, math.nextafter(tau, 1.0), NAN, 0.0], dtype=torch.float64)
    # ≤ τ kept (== τ included), > τ discarded, NaN discarded
    assert verify_sequences(ops_values, tau).tolist() == [True, True, False, False, True]
    f32 = torch.tensor([0.1, 0.1000001])
    assert verify_sequences(f32, 0.1).tolist() == [True, False]
    assert verify_sequences(torch.tensor([0.09, 0.11])).tolist() == [TAU_SEQ >= 0.09, TAU_SEQ >= 0.11]
    with pytest.raises(ValueError):
        verify_sequences(ops_values, -1.0)


# ----------------------------------------------------------------------------- token level


def accept_batch():
    """Ratios π/μ = [0.5, 1, 2, 0.25] in every row → a = min(1, ·) = [0.5, 1, 1, 0.25]."""
    behaviour = torch.tensor([[-1.0, -2.0, -0.5, -1.5]]).repeat(4, 1)
    cur = behaviour + torch.tensor([math.log(0.5), 0.0, math.log(2.0), math.log(0.25)])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0]])
    u = torch.tensor([
        [0.40, 0.99, 0.90, 0.30],  # 0.4<0.5 ✓, 0.99<1 ✓, 0.9<1 ✓, 0.3<0.25 ✗ → t* = 3
        [0.60, 0.10, 0.10, 0.10],  # 0.6<0.5 ✗ → t* = 0 (later acceptances ignored)
        [0.10, 0.50, 0.50, 0.20],  # all accepted → t* = k = 4
        [0.45, 0.70, 0.99, NAN],   # k = 2, both accepted → 2 (padding u ignored)
    ])
    return cur, behaviour, mask, u


def test_accept_tokens_with_given_uniforms():
    t = accept_tokens(*accept_batch())
    assert t.dtype == torch.long
    assert t.tolist() == [3, 0, 4, 2]


def test_accept_tokens_padding_never_leaks():
    cur, beh, mask, u = accept_batch()
    ref = accept_tokens(cur, beh, mask, u)
    for cp, bp in ((NAN, NAN), (INF, 0.0), (0.0, -INF), (-INF, INF)):
        c, b = cur.clone(), beh.clone()
        c[3, 2:], b[3, 2:] = cp, bp
        assert torch.equal(accept_tokens(c, b, mask, u), ref)


def test_accept_tokens_random_matches_given_uniforms():
    cur, beh, mask, _ = accept_batch()
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    u = torch.rand(mask.shape, generator=g2, dtype=torch.float64)
    assert torch.equal(accept_tokens_random(cur, beh, mask, g1), accept_tokens(cur, beh, mask, u))


def test_accept_tokens_random_rate():
    # one token with π/μ = 0.3: accepted with probability 0.3 (n = 20000, 4 sigma ≈ 0.013)
    n = 20000
    cur, beh = torch.full((n, 1), math.log(0.3)), torch.zeros(n, 1)
    t = accept_tokens_random(cur, beh, torch.ones(n, 1), torch.Generator().manual_seed(0))
    assert abs(t.double().mean().item() - 0.3) < 0.013


def test_truncate_deterministic():
    beh = torch.full((4, 3), -1.0)
    # exact binary fractions so |d| == τ is exact
    d = torch.tensor([[0.5, 0.25, -0.75], [-0.5, 0.5, 0.25], [0.75, 0.0, 0.0], [0.25, 9.0, NAN]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 0, 0]])
    # τ = 0.5: row 0 |0.75| > 0.5 at t = 2 (0.5 == τ kept); row 1 none → k = 3; row 2 at 0;
    # row 3 k = 1, the 9.0 / NaN in padding ignored → 1
    assert truncate_deterministic(beh + d, beh, mask, 0.5).tolist() == [2, 3, 0, 1]
    # default τ = log 2: ratio 2.1 cut, 1.9 and 0.55 kept
    cur = torch.log(torch.tensor([[0.55, 1.9, 2.1]]))
    assert TAU_TOK == math.log(2.0)
    assert truncate_deterministic(cur, torch.zeros(1, 3), torch.ones(1, 3)).tolist() == [2]
    assert truncate_deterministic(cur, cur, torch.zeros(1, 3)).tolist() == [0]


# ----------------------------------------------------------------------------- residual


def test_residual_hand_computed():
    pi = torch.tensor([0.5, 0.3, 0.2])
    mu = torch.tensor([0.2, 0.2, 0.6])
    # π − μ = [0.3, 0.1, −0.4] → max(0, ·) = [0.3, 0.1, 0] → / 0.4 = [0.75, 0.25, 0]
    assert_close(residual_distribution(pi, mu), torch.tensor([0.75, 0.25, 0.0]))
    # batched over leading dims, float64 kept
    both = residual_distribution(torch.stack([pi, mu]).double(), torch.stack([mu, pi]).double())
    # second row: μ − π = [−0.3, −0.1, 0.4] → [0, 0, 1]
    assert both.dtype == torch.float64
    assert_close(both, torch.tensor([[0.75, 0.25, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64))


def test_residual_equal_distributions_fall_back_to_pi():
    pi = torch.tensor([[0.5, 0.3, 0.2], [0.0, 1.0, 0.0]])
    out = residual_distribution(pi, pi.clone())
    assert torch.isfinite(out).all()
    assert_close(out, pi)
    ids = sample_residual(pi, pi.clone(), torch.Generator().manual_seed(0))
    assert ids.shape == (2,) and ids[1] == 1


def test_sample_residual_support_and_shape():
    pi = torch.tensor([0.5, 0.3, 0.2]).expand(2, 500, 3)
    mu = torch.tensor([0.2, 0.2, 0.6]).expand(2, 500, 3)
    ids = sample_residual(pi, mu, torch.Generator().manual_seed(1))
    assert ids.shape == (2, 500) and ids.dtype == torch.long
    assert set(ids.unique().tolist()) <= {0, 1}  # token 2 has residual 0


# ----------------------------------------------------------------------------- speculative step


def test_speculative_verify_hand_computed():
    V = 3
    p_behaviour = torch.tensor([[0.6, 0.2, 0.2]]).expand(2, 3, V).clone()
    p_current = torch.tensor([[0.2, 0.8, 0.0]]).expand(2, 3, V).clone()
    # residual norm(max(0, π − μ)) = norm([0, 0.6, 0]) = one-hot(1): the replacement is deterministic
    tokens = torch.tensor([[1, 0, 2], [1, 1, 2]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    # row 0: y0 = 1, π/μ = 4 → accepted; y1 = 0, π/μ = 1/3, u = 0.5 → rejected at t* = 1
    # row 1: y0, y1 = 1, accepted whatever u; k = 2 → kept = 2, no replacement (−1)
    u = torch.tensor([[0.9, 0.5, 0.0], [0.99, 0.99, NAN]])
    p_current[1, 2], p_behaviour[1, 2] = NAN, INF  # padding position
    kept, repl = speculative_verify(p_current, p_behaviour, tokens, mask, torch.Generator().manual_seed(0), u)
    assert kept.tolist() == [1, 2] and repl.tolist() == [1, -1]
    # a token π gives probability 0 is never accepted (u = 0)
    kept, repl = speculative_verify(p_current[:1], p_behaviour[:1], torch.tensor([[2, 0, 0]]), mask[:1],
                                    uniforms=torch.zeros(1, 3))
    assert kept.tolist() == [0] and repl.tolist() == [1]


PI = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.1], dtype=torch.float64)
MU = torch.tensor([0.1, 0.2, 0.3, 0.25, 0.15], dtype=torch.float64)
N = 200_000


def draw(p: torch.Tensor, n: int, g: torch.Generator) -> torch.Tensor:
    return torch.multinomial(p, n, replacement=True, generator=g)


def one_step(mode: str, seed: int = 1234) -> float:
    """Chi-square statistic of the one-token verify-and-resample outcome against π (df 4)."""
    g = torch.Generator().manual_seed(seed)
    x = draw(MU, N, g)
    if mode == "module":  # the module's whole step
        kept, repl = speculative_verify(PI.expand(N, 1, 5), MU.expand(N, 1, 5), x.unsqueeze(-1),
                                        torch.ones(N, 1), g)
        out = torch.where(kept == 1, x, repl)
    else:
        u = torch.rand(N, generator=g, dtype=torch.float64)
        lp, lm = PI.log()[x], MU.log()[x]
        if mode == "composed":  # accept_tokens (3) + sample_residual (5)
            ok = accept_tokens(lp.unsqueeze(-1), lm.unsqueeze(-1), torch.ones(N, 1), u.unsqueeze(-1)) == 1
            other = sample_residual(PI.expand(N, 5), MU.expand(N, 5), g)
        elif mode == "resample_from_pi":
            ok, other = u < (lp - lm).exp(), draw(PI, N, g)
        elif mode == "abs_residual":  # norm(|π − μ|) instead of norm(max(0, π − μ))
            res = (PI - MU).abs()
            ok, other = u < (lp - lm).exp(), draw(res / res.sum(), N, g)
        elif mode == "inverted_ratio":  # accept with min(1, μ/π)
            ok, other = u < (lm - lp).exp(), sample_residual(PI.expand(N, 5), MU.expand(N, 5), g)
        elif mode == "no_verification":
            ok, other = torch.ones(N, dtype=torch.bool), x
        else:
            raise AssertionError(mode)
        out = torch.where(ok, x, other)
    return chi2_stat(torch.bincount(out, minlength=5), PI)


@pytest.mark.parametrize("mode", ["module", "composed"])
def test_speculative_step_samples_pi(mode):
    stat = one_step(mode)
    assert chi2_sf(stat, 4) > ALPHA and stat < CRIT[4], stat


@pytest.mark.parametrize("mode", ["resample_from_pi", "abs_residual", "inverted_ratio", "no_verification"])
def test_mutants_fail_the_same_test(mode):
    # expected statistics ≈ N Σ (P − π)²/π: 22500, 31750, 122537, 127000 — all ≫ 23.5
    assert one_step(mode) > 100 * CRIT[4]


def test_module_mutant_fails(monkeypatch):
    """The module path itself is sensitive: speculative_verify with its residual replaced by π."""
    monkeypatch.setattr(rollverify, "residual_distribution", lambda pi, mu: pi / pi.sum(-1, keepdim=True))
    assert one_step("module") > 100 * CRIT[4]


def test_two_token_prefix_resumed_samples_pi_jointly():
    """Two context-free positions, π_t ≠ μ_t each; tokens kept up to t*, the replacement at t*,
    then fresh π draws after it. The joint law of the 2 tokens must be π_0 ⊗ π_1 (df 24)."""
    pi = torch.stack([PI, torch.tensor([0.1, 0.1, 0.2, 0.3, 0.3], dtype=torch.float64)])
    mu = torch.stack([MU, torch.tensor([0.3, 0.25, 0.2, 0.15, 0.1], dtype=torch.float64)])
    g = torch.Generator().manual_seed(99)
    x = torch.stack([draw(mu[0], N, g), draw(mu[1], N, g)], dim=-1)
    kept, repl = speculative_verify(pi.expand(N, 2, 5), mu.expand(N, 2, 5), x, torch.ones(N, 2), g)
    fresh = draw(pi[1], N, g)
    y0 = torch.where(kept >= 1, x[:, 0], repl)
    y1 = torch.where(kept == 2, x[:, 1], torch.where(kept == 1, repl, fresh))
    counts = torch.bincount(y0 * 5 + y1, minlength=25)
    stat = chi2_stat(counts, torch.outer(pi[0], pi[1]))
    assert chi2_sf(stat, 24) > ALPHA and stat < CRIT[24], stat
    assert (kept == 0).any() and (kept == 1).any() and (kept == 2).any()


# ----------------------------------------------------------------------------- metrics


def test_verification_metrics_hand_computed():
    k = torch.tensor([4, 3, 0, 2])
    kept = torch.tensor([4, 1, 0, 2])
    seq = torch.tensor([True, True, True, False])
    m = verification_metrics(k, kept, seq)
    # rows with a prefix: 0, 1, 3. Row 3 dropped by sequence verification → kept 0.
    assert m["rollverify/sequence_kept_fraction"] == pytest.approx(2 / 3)
    assert m["rollverify/truncation_mean"] == pytest.approx((4 + 1 + 0) / 3)
    assert m["rollverify/truncation_fraction"] == pytest.approx((1 + 1 / 3 + 0) / 3)
    assert m["rollverify/fully_accepted_fraction"] == pytest.approx(1 / 3)
    assert m["rollverify/regenerated_tokens"] == 0 + 2 + 2
    assert all(isinstance(v, float) for v in m.values())
    no_seq = verification_metrics(k, kept)
    assert no_seq["rollverify/sequence_kept_fraction"] == 1.0
    assert no_seq["rollverify/regenerated_tokens"] == 2.0


def test_verification_metrics_empty():
    empty = torch.zeros(0, dtype=torch.long)
    for m in (verification_metrics(empty, empty), verification_metrics(torch.zeros(3), torch.zeros(3))):
        assert set(m.values()) == {0.0}
