"""COPC: the coupled mask and traces by hand, the traced GAE against its closed sum, on-policy
COPC = GAE, the ratio mask correction, and the recipe checks."""

import pytest
import torch

from reasonrl.methods.copc.advantage import copc_traces
from reasonrl.algos.critic import RETURNS_KEY, gae_advantages_and_returns
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


def test_on_policy_copc_is_gae_and_leaves_the_returns():
    g = torch.Generator().manual_seed(1)
    r, v = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 1, 0], [1, 0, 0, 0, 0]])
    for holder in (Holder(), Holder(torch.ones(3, 5), torch.ones(3, 5))):
        a = ADVANTAGES.get("copc")(r, mask, torch.zeros(3), values=v, batch=holder)
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
    with pytest.raises(ConfigError, match=r"off_policy must be one of ratio_mask, none .*got 'tis'"):
        mini_recipe(advantage={"name": "copc"}, methods=[{"name": "critic"}], off_policy={"name": "tis"})
    with pytest.raises(ConfigError, match=r"advantage 'copc' reads batch.aux\['values'\].*written by method 'critic'"):
        mini_recipe(advantage={"name": "copc"}, off_policy={"name": "ratio_mask"})
