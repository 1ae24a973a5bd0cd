"""COPC: the coupled mask and traces by hand, the traced GAE against its closed sum and against
V-trace's recursion, whitening inside the importance weight (the regression of the collapse),
on-policy COPC = GAE, the ratio mask correction, and the recipe checks."""

import pytest
import torch

from reasonrl.methods.copc.advantage import copc_advantages_and_returns, copc_traces
from reasonrl.algos.critic import RETURNS_KEY, gae_advantages_and_returns
from reasonrl.algos.masked import masked_whiten
from reasonrl.algos.offpolicy import ratio_mask
from reasonrl.config import ConfigError
from reasonrl.registry import ADVANTAGES

from helpers import mini_recipe


class Holder:
    def __init__(self, ratio=None, weights=None):
        self.aux, self.behaviour_ratio, self.is_weights = {}, ratio, weights


def test_the_ratio_mask_keeps_the_band_unweighted():
    rho = torch.tensor([[0.1, 0.25, 1.5, 4.0, 7.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    out = ratio_mask(rho.log(), torch.zeros_like(rho), mask, cap=5.0)
    # 1/5 <= rho <= 5 kept (0.25, 1.5, 4) with weight 1 (not rho, unlike mis); 0.1 and 7 dropped; padding 0.
    assert torch.equal(out.weights, torch.tensor([[0.0, 1.0, 1.0, 1.0, 0.0, 0.0]]))
    assert torch.equal(out.masked, torch.tensor([[1.0, 0.0, 0.0, 0.0, 1.0, 0.0]]))
    assert out.anchor == "proximal"
    assert ratio_mask(rho.log(), torch.zeros_like(rho), mask, anchor="behaviour").anchor == "behaviour"
    with pytest.raises(ValueError, match="cap must be >= 1"):
        ratio_mask(rho.log(), torch.zeros_like(rho), mask, cap=0.5)


def test_traces_are_the_masked_two_sided_clip():
    rho = torch.tensor([[0.3, 1.5, 3.0, 7.0, float("nan")]])
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0, 0.0]])
    valid = torch.tensor([[1, 1, 1, 1, 0]])
    # clip(0.3) = 0.5, 1.5 stays, clip(3) = 2, the masked token's trace is 0 whatever rho; NaN in padding never shows.
    assert torch.equal(copc_traces(rho, m, valid), torch.tensor([[0.5, 1.5, 2.0, 0.0, 0.0]]))
    # c_low = 0 is V-trace's one-sided min(c_high, rho): 0.3 keeps its weight, 1.5 is cut to 1.
    assert torch.allclose(copc_traces(rho, m, valid, c_low=0.0, c_high=1.0), torch.tensor([[0.3, 1.0, 1.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="c_low <= 1 <= c_high"):
        copc_traces(rho, m, valid, c_low=1.2)


def test_traced_gae_by_hand_and_a_mask_cuts_the_trace():
    r = torch.tensor([[0.0, 0.0, 1.0]])
    v = torch.tensor([[0.2, 0.4, 0.6]])
    mask = torch.ones(1, 3)
    # delta = [0 + 0.4 - 0.2, 0 + 0.6 - 0.4, 1 - 0.6] = [0.2, 0.2, 0.4]; gamma = lambda = 1.
    # B_2 = 0.4; B_1 = 0.2 + c_2 B_2 = 0.6; B_0 = 0.2 + c_1 B_1 = 0.2 + 2 * 0.6 = 1.4; A = c * B.
    a, ret = gae_advantages_and_returns(r, v, mask, 1.0, 1.0, False, traces=torch.tensor([[0.5, 2.0, 1.0]]))
    assert torch.allclose(a, torch.tensor([[0.7, 1.2, 0.4]]))
    assert torch.allclose(ret, torch.tensor([[0.9, 1.6, 1.0]]))
    # Masked middle token (c_1 = 0): A_1 = 0 and B_0 = delta_0 = 0.2, so A_0 = 0.5 * 0.2; its target stays V_1.
    a, ret = gae_advantages_and_returns(r, v, mask, 1.0, 1.0, False, traces=torch.tensor([[0.5, 0.0, 1.0]]))
    assert torch.allclose(a, torch.tensor([[0.1, 0.0, 0.4]]))
    assert torch.allclose(ret, torch.tensor([[0.3, 0.4, 1.0]]))


def test_traced_gae_equals_the_closed_retrace_sum():
    g = torch.Generator().manual_seed(0)
    b, t, gamma, lam = 4, 7, 0.9, 0.8
    r, v = torch.randn(b, t, generator=g), torch.randn(b, t, generator=g)
    c = torch.rand(b, t, generator=g) * 2
    c[0, 3] = 0.0
    lengths = [7, 5, 3, 6]
    mask = torch.zeros(b, t)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    a, _ = gae_advantages_and_returns(r, v, mask, gamma, lam, False, traces=c)
    for i, n in enumerate(lengths):
        vi = torch.cat([v[i, :n], torch.zeros(1)])
        delta = r[i, :n] + gamma * vi[1:] - vi[:-1]
        for s in range(n):
            # A_s = sum_l (gamma lam)^l (prod_{j=1..l} c_{s+j}) c_s delta_{s+l}
            total, prod = 0.0, 1.0
            for l_ in range(n - s):
                if l_:
                    prod *= float(c[i, s + l_])
                total += (gamma * lam) ** l_ * prod * float(c[i, s]) * float(delta[s + l_])
            assert float(a[i, s]) == pytest.approx(total, abs=1e-5)


def test_the_traced_advantage_is_v_trace_three_tokens_by_hand():
    # IMPALA's V-trace (Espeholt et al. 2018) with rho-bar = c-bar and lambda = 1, written from the paper:
    # v_s = V_s + c_s delta_s + gamma c_s (v_{s+1} - V_{s+1}), and the policy term c_s (r_s + gamma v_{s+1} - V_s).
    r = torch.tensor([[0.0, 0.0, 1.0]])
    v = torch.tensor([[0.5, 0.25, 0.75]])
    c = torch.tensor([[2.0, 0.5, 1.5]])
    # delta = [0 + 0.25 - 0.5, 0 + 0.75 - 0.25, 1 - 0.75] = [-0.25, 0.5, 0.25]
    # v_2 = 0.75 + 1.5 * 0.25 = 1.125; v_1 = 0.25 + 0.5 * 0.5 + 0.5 * (1.125 - 0.75) = 0.6875;
    # v_0 = 0.5 + 2 * (-0.25) + 2 * (0.6875 - 0.25) = 0.875.
    # Policy terms: 2 * (0 + 0.6875 - 0.5) = 0.375; 0.5 * (0 + 1.125 - 0.25) = 0.4375; 1.5 * (1 - 0.75) = 0.375.
    # The product runs over the LATER tokens: A_0 = c_0 (delta_0 + c_1 delta_1 + c_1 c_2 delta_2).
    a, ret = copc_advantages_and_returns(r, v, torch.ones(1, 3), c, gamma=1.0, lam=1.0, whiten=False)
    assert torch.allclose(ret, torch.tensor([[0.875, 0.6875, 1.125]]))
    assert torch.allclose(a, torch.tensor([[0.375, 0.4375, 0.375]]))
    assert float(a[0, 0]) == pytest.approx(2.0 * (-0.25 + 0.5 * 0.5 + 0.5 * 1.5 * 0.25))


def test_the_traced_advantage_is_v_trace_on_random_batches():
    g = torch.Generator().manual_seed(3)
    b, t, gamma = 3, 6, 0.9
    r, v = torch.randn(b, t, generator=g), torch.randn(b, t, generator=g)
    c = 0.5 + 1.5 * torch.rand(b, t, generator=g)
    lengths = [6, 4, 2]
    mask = torch.zeros(b, t)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    a, ret = copc_advantages_and_returns(r, v, mask, c, gamma=gamma, lam=1.0, whiten=False)
    for i, n in enumerate(lengths):
        target = [0.0] * (n + 1)  # v_n = V_n = 0 past the end
        values = [float(x) for x in v[i, :n]] + [0.0]
        for s in reversed(range(n)):
            delta = float(r[i, s]) + gamma * values[s + 1] - values[s]
            target[s] = values[s] + float(c[i, s]) * (delta + gamma * (target[s + 1] - values[s + 1]))
            assert float(ret[i, s]) == pytest.approx(target[s], abs=1e-5)
            pg = float(c[i, s]) * (float(r[i, s]) + gamma * target[s + 1] - values[s])
            assert float(a[i, s]) == pytest.approx(pg, abs=1e-5)


def _drift_gradient(advantages, tokens, prox):
    """sum_rows A_row * d log softmax(theta)[y_row] / d theta at theta = log prox: the policy
    gradient the rows push (one-token rows of one state)."""
    theta = prox.log().clone().requires_grad_(True)
    (advantages.squeeze(-1) * torch.log_softmax(theta, 0)[tokens]).sum().backward()
    return theta.grad


def test_whitening_inside_the_weight_has_no_drift_and_the_spec_form_extrapolates_it():
    # Regression for the collapse of every stale COPC run. One state, four samples drawn exactly in
    # proportion to mu = [0.5, 0.25, 0.25]; the learner has since moved to prox = [0.4, 0.35, 0.25],
    # so rho = [0.8, 1.4, 1.0]. The reward does not depend on the action and the critic lags it
    # (V = 0, r = 0.5: B = 0.5 on every row), so the true policy gradient is 0.
    mu, prox = torch.tensor([0.5, 0.25, 0.25]), torch.tensor([0.4, 0.35, 0.25])
    tokens = torch.tensor([0, 0, 1, 2])
    rho = (prox / mu)[tokens].unsqueeze(-1)
    r, v, mask = torch.full((4, 1), 0.5), torch.zeros(4, 1), torch.ones(4, 1)
    c = copc_traces(rho, torch.ones(4, 1), mask)
    fixed, _ = copc_advantages_and_returns(r, v, mask, c, lam=0.95)
    # Inside the weight: c * whiten(B) = c * 0 = 0 on every row, no gradient.
    assert torch.equal(fixed, torch.zeros(4, 1))
    assert torch.allclose(_drift_gradient(fixed, tokens, prox), torch.zeros(3))
    # The spec's order whitens c B = [0.4, 0.4, 0.7, 0.5]: minus its mean 0.5 -> [-0.1, -0.1, 0.2, 0],
    # over the unbiased sd sqrt(0.06 / 3) = 0.1414 -> [-0.7071, -0.7071, 1.4142, 0].
    spec, _ = copc_advantages_and_returns(r, v, mask, c, lam=0.95, whiten_at="advantage")
    assert torch.allclose(spec.squeeze(-1), torch.tensor([-0.7071, -0.7071, 1.4142, 0.0]), atol=1e-4)
    # Its gradient, sum_rows A (e_y - prox) = [-1.4142, 1.4142, 0], is 14.14 x (prox - mu): it pushes
    # the policy further the way it moved since mu sampled, with no reward behind it.
    drift = _drift_gradient(spec, tokens, prox)
    assert torch.allclose(drift, torch.tensor([-1.4142, 1.4142, 0.0]), atol=1e-4)
    assert torch.allclose(drift, 14.1421 * (prox - mu), atol=1e-4)


def test_the_whitening_options():
    g = torch.Generator().manual_seed(2)
    r, v = torch.randn(2, 5, generator=g), torch.randn(2, 5, generator=g)
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
    c = torch.tensor([[0.5, 0.0, 1.5, 2.0, 0.0], [1.0, 0.8, 1.2, 0.0, 0.0]])
    live = mask.bool() & (c > 0)
    weighted, ret = gae_advantages_and_returns(r, v, mask, 1.0, 0.95, False, traces=c)  # c B
    residual = torch.where(live, weighted / torch.where(live, c, 1.0), 0.0)  # B
    out = {k: copc_advantages_and_returns(r, v, mask, c, 1.0, 0.95, **k_args)
           for k, k_args in {"fixed": {}, "spec": {"whiten_at": "advantage"}, "off": {"whiten": False},
                             "unweighted": {"weight": False}, "raw": {"whiten": False, "weight": False}}.items()}
    assert torch.allclose(out["fixed"][0], c * masked_whiten(residual, live), atol=1e-6)
    assert torch.allclose(out["spec"][0], masked_whiten(weighted, live), atol=1e-6)  # the form first built
    assert torch.allclose(out["off"][0], weighted) and torch.allclose(out["raw"][0], residual)
    assert torch.allclose(out["unweighted"][0], masked_whiten(residual, live), atol=1e-6)
    assert not torch.allclose(out["fixed"][0], out["spec"][0], atol=1e-3)
    for a, targets in out.values():
        assert torch.equal(targets, ret)  # the critic's targets V + c B whatever the whitening
        assert torch.equal(a[~live], torch.zeros(int((~live).sum())))
    with pytest.raises(ValueError, match="whiten_at"):
        copc_advantages_and_returns(r, v, mask, c, whiten_at="both")


def test_on_policy_copc_is_gae_and_leaves_the_returns():
    g = torch.Generator().manual_seed(1)
    r, v = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 1, 0], [1, 0, 0, 0, 0]])
    for holder in (Holder(), Holder(torch.ones(3, 5), torch.ones(3, 5))):
        for whiten_at in ("residual", "advantage"):
            a = ADVANTAGES.get("copc")(r, mask, torch.zeros(3), values=v, batch=holder, whiten_at=whiten_at)
            ref_a, ref_r = gae_advantages_and_returns(r, v, mask, 1.0, 0.95, True)
            assert torch.allclose(a, ref_a, atol=1e-6) and torch.allclose(holder.aux[RETURNS_KEY], ref_r, atol=1e-6)


def test_masked_tokens_get_no_advantage_after_whitening():
    r = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    v = torch.full((2, 3), 0.3)
    mask = torch.ones(2, 3)
    weights = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]])
    holder = Holder(torch.ones(2, 3), weights)
    a = ADVANTAGES.get("copc")(r, mask, torch.zeros(2), values=v, batch=holder)
    assert float(a[0, 1]) == 0.0
    live = a[weights.bool()]
    assert float(live.mean()) == pytest.approx(0.0, abs=1e-6)  # whitened over the unmasked tokens only


def test_copc_recipes_are_checked():
    recipe = mini_recipe(advantage={"name": "copc"}, methods=[{"name": "critic"}],
                         off_policy={"name": "ratio_mask", "cap": 5.0})
    assert recipe.advantage.params == {}
    one_sided = mini_recipe(advantage={"name": "copc", "c_low": 0.0, "c_high": 1.0, "whiten_at": "advantage"},
                            methods=[{"name": "critic"}], off_policy={"name": "none"})
    assert one_sided.advantage.params == {"c_low": 0.0, "c_high": 1.0, "whiten_at": "advantage"}
    with pytest.raises(ConfigError, match="whiten_at"):
        mini_recipe(advantage={"name": "copc", "whiten_at": "late"}, methods=[{"name": "critic"}])
    with pytest.raises(ConfigError, match=r"off_policy must be one of ratio_mask, none .*got 'tis'"):
        mini_recipe(advantage={"name": "copc"}, methods=[{"name": "critic"}], off_policy={"name": "tis"})
    with pytest.raises(ConfigError, match=r"advantage 'copc' reads batch.aux\['values'\].*written by method 'critic'"):
        mini_recipe(advantage={"name": "copc"}, off_policy={"name": "ratio_mask"})
