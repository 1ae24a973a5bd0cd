"""KL estimators and KL-in-reward shaping."""

import math

import pytest
import torch
from torch.testing import assert_close

from reasonrl.algos.kl import apply_kl_to_rewards, kl_k1, kl_k2, kl_k3
from reasonrl.registry import KL_ESTIMATORS

LOGP = torch.tensor([[-1.0, -2.0, -0.5]])
REF = torch.tensor([[-1.5, -1.0, -0.5]])


def test_registered_names():
    assert KL_ESTIMATORS.get("k1") is kl_k1
    assert KL_ESTIMATORS.get("k2") is kl_k2
    assert KL_ESTIMATORS.get("k3") is kl_k3


def test_k1_hand_computed():
    # logp - ref = [-1+1.5, -2+1, 0]
    assert_close(kl_k1(LOGP, REF), torch.tensor([[0.5, -1.0, 0.0]]))


def test_k2_hand_computed():
    # 0.5·[0.5², 1², 0]
    assert_close(kl_k2(LOGP, REF), torch.tensor([[0.125, 0.5, 0.0]]))


def test_k3_hand_computed_value_and_grad():
    logp = LOGP.clone().requires_grad_(True)
    kl = kl_k3(logp, REF)
    # d = ref - logp = [-0.5, 1, 0]: e^-0.5 + 0.5 - 1 = 0.106531; e - 1 - 1 = 0.718282; 0
    assert_close(kl, torch.tensor([[0.106531, 0.718282, 0.0]]), atol=1e-6, rtol=0)
    kl.sum().backward()
    # d k3 / d logp = 1 - e^d: 1 - 0.606531 = 0.393469; 1 - e = -1.718282; 0
    assert_close(logp.grad, torch.tensor([[0.393469, -1.718282, 0.0]]), atol=1e-6, rtol=0)


def test_k3_clamped_like_verl_low_var_kl():
    logp = torch.tensor([[0.0, 0.0, 0.0, 0.0]])
    ref = torch.tensor([[15.0, 30.0, -30.0, 1000.0]])
    # d=15: e^15 - 16 ≈ 3.27e6 -> 10; d=30 -> d clamped to 20 first, still 10; d=-30 -> d=-20: e^-20+19 -> 10
    kl = kl_k3(logp, ref)
    assert_close(kl, torch.full((1, 4), 10.0))
    assert torch.isfinite(kl).all()


def test_k3_is_nonnegative():
    torch.manual_seed(0)
    logp, ref = torch.randn(50, 20) * 3, torch.randn(50, 20) * 3
    assert (kl_k3(logp, ref) >= 0).all()


@pytest.mark.parametrize("name,unbiased", [("k1", True), ("k3", True), ("k2", False)])
def test_monte_carlo_estimate_of_kl(name, unbiased):
    # x ~ p; E_p[k1] = E_p[k3] = KL(p‖q) exactly; E_p[k2] = ½ E_p[ln²(p/q)] = 0.094090, biased by ~0.006
    torch.manual_seed(1)
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.3, 0.4, 0.3])
    exact = (p * (p / q).log()).sum().item()  # 0.5 ln(5/3) + 0.3 ln(3/4) + 0.2 ln(2/3) = 0.255413 - 0.086305 - 0.081093 = 0.088015
    assert math.isclose(exact, 0.088015, abs_tol=1e-6)
    x = torch.multinomial(p, 400_000, replacement=True)
    est = KL_ESTIMATORS.get(name)(p.log()[x], q.log()[x]).mean().item()
    assert abs(est - (exact if unbiased else 0.094090)) < 3e-3


def test_apply_kl_to_rewards():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, float("nan")]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    # r - 0.1·kl on valid tokens; padding keeps its reward and never sees the NaN KL
    expected = torch.tensor([[-0.01, -0.02, 0.97], [-0.04, 1.95, 0.0]])
    assert_close(apply_kl_to_rewards(rewards, kl, mask, 0.1), expected)


def test_apply_kl_to_rewards_does_not_backprop_into_kl():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    shaped = apply_kl_to_rewards(torch.zeros(1, 2), kl_k1(logp, torch.zeros(1, 2)), torch.ones(1, 2), 0.5)
    assert not shaped.requires_grad
