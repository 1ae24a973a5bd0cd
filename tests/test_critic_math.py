"""The critic's math. GAE(γ, λ): hand-computed numbers (with an interior masked gap), the edge
cases, and equivalence with verl's ``compute_gae_advantage_return`` recursion (re-derived in
``verl_style_gae`` below from its documented semantics). The clipped value loss: hand-computed
numbers, where its gradient stops, the clipped fraction."""

import pytest
import torch

from reasonrl.algos.critic import clipped_value_loss, gae_advantages_and_returns
from reasonrl.algos.masked import masked_whiten

T = torch.tensor


def test_hand_computed_three_tokens():
    # γ = 0.9, λ = 0.8, γλ = 0.72; δ2 = 1 − 0.7 = 0.3; δ1 = 0.9·0.7 − 0.6 = 0.03; δ0 = 0.9·0.6 − 0.5 = 0.04
    # A2 = 0.3; A1 = 0.03 + 0.72·0.3 = 0.246; A0 = 0.04 + 0.72·0.246 = 0.21712
    adv, ret = gae_advantages_and_returns(T([[0.0, 0.0, 1.0]]), T([[0.5, 0.6, 0.7]]), T([[1, 1, 1]]),
                                          gamma=0.9, lam=0.8, whiten=False)
    torch.testing.assert_close(adv, T([[0.21712, 0.246, 0.3]]))
    torch.testing.assert_close(ret, T([[0.71712, 0.846, 1.0]]))


def test_an_interior_masked_gap_is_skipped_not_a_break():
    """Position 1 is masked (a tool's output): its reward 5 and value 9 never enter, and token 0
    chains to token 2 as if adjacent: δ0 = 0.9·0.7 − 0.5 = 0.13, A0 = 0.13 + 0.72·0.3 = 0.346.
    Position 3 is padding."""
    adv, ret = gae_advantages_and_returns(T([[0.0, 5.0, 1.0, 0.0]]), T([[0.5, 9.0, 0.7, 3.0]]), T([[1, 0, 1, 0]]),
                                          gamma=0.9, lam=0.8, whiten=False)
    torch.testing.assert_close(adv, T([[0.346, 0.0, 0.3, 0.0]]))
    torch.testing.assert_close(ret, T([[0.846, 0.0, 1.0, 0.0]]))


def test_lambda_one_is_return_minus_value_and_lambda_zero_is_the_td_error():
    r, v, m = T([[0.5, 0.0, 1.0]]), T([[0.2, 0.4, 0.1]]), T([[1, 1, 1]])
    mc, _ = gae_advantages_and_returns(r, v, m, gamma=1.0, lam=1.0, whiten=False)
    torch.testing.assert_close(mc, T([[1.5 - 0.2, 1.0 - 0.4, 1.0 - 0.1]]))
    td, _ = gae_advantages_and_returns(r, v, m, gamma=0.5, lam=0.0, whiten=False)
    torch.testing.assert_close(td, T([[0.5 + 0.5 * 0.4 - 0.2, 0.0 + 0.5 * 0.1 - 0.4, 1.0 - 0.1]]))


def verl_style_gae(rewards, values, mask, gamma, lam):
    """verl's recursion: masked positions carry the next value and the running advantage; the
    advantages are whitened over the mask; returns = advantages + values (before whitening)."""
    mask = mask.float()
    next_values, last, out = 0, 0, []
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_values - values[:, t]
        last_ = delta + gamma * lam * last
        next_values = values[:, t] * mask[:, t] + (1 - mask[:, t]) * next_values
        last = last_ * mask[:, t] + (1 - mask[:, t]) * last
        out.append(last)
    adv = torch.stack(out[::-1], dim=1)
    return masked_whiten(adv, mask), (adv + values) * mask


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
def test_equals_verl_on_random_batches_with_gaps(gamma, lam):
    g = torch.Generator().manual_seed(0)
    rewards = torch.randn(6, 9, generator=g)
    values = torch.randn(6, 9, generator=g)
    mask = (torch.rand(6, 9, generator=g) > 0.3).long()
    mask[:, -2:] = 0  # right padding too
    mask[0] = 0
    mask[0, 0] = 1  # a one-token row
    assert ((mask[:, :-1] == 0) & (mask[:, 1:] == 1)).any()  # at least one interior gap exists
    want_adv, want_ret = verl_style_gae(rewards, values, mask, gamma, lam)
    adv, ret = gae_advantages_and_returns(rewards, values, mask, gamma=gamma, lam=lam)
    torch.testing.assert_close(adv, want_adv, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ret, want_ret, atol=1e-5, rtol=1e-5)
    assert (adv[mask == 0] == 0).all() and (ret[mask == 0] == 0).all()


def test_targets_carry_no_gradient_and_bad_input_is_named():
    values = torch.rand(2, 3, requires_grad=True)
    adv, ret = gae_advantages_and_returns(torch.ones(2, 3), values, torch.ones(2, 3))
    assert not adv.requires_grad and not ret.requires_grad
    with pytest.raises(ValueError, match=r"must all be \[B,T\]"):
        gae_advantages_and_returns(torch.ones(2, 3), torch.ones(2, 4), torch.ones(2, 3))
    with pytest.raises(ValueError, match="gamma and lam"):
        gae_advantages_and_returns(torch.ones(2, 3), torch.ones(2, 3), torch.ones(2, 3), lam=1.5)


def test_clipped_value_loss_hand_computed():
    """c = 0.2. Token 0: v 1.0, v_old 0.5, R 0: clip(v) = 0.7, (1.0)² vs 0.49 -> ½·1.0 = 0.5.
    Token 1: v 0.2, v_old 0.5, R 1: clip = 0.3, 0.64 vs 0.49 -> 0.32. Token 2: v 0.9, v_old 0.5,
    R 1: clip = 0.7, 0.01 vs 0.09 -> the clipped term, 0.045. Token 3 is masked."""
    v = T([[1.0, 0.2, 0.9, 7.0]], requires_grad=True)
    loss, frac = clipped_value_loss(v, T([[0.5, 0.5, 0.5, 0.0]]), T([[0.0, 1.0, 1.0, 0.0]]), T([[1, 1, 1, 0]]), 0.2)
    torch.testing.assert_close(loss, T([[0.5, 0.32, 0.045, 0.0]]))
    torch.testing.assert_close(frac, T(1 / 3))
    loss.sum().backward()
    # d/dv ½(v − R)² = v − R where the plain term wins; 0 where the clipped term (constant in v
    # outside the clip range) wins; 0 at the masked token.
    torch.testing.assert_close(v.grad, T([[1.0, -0.8, 0.0, 0.0]]))


def test_unclipped_value_loss_and_bad_input():
    loss, frac = clipped_value_loss(T([[1.0, 2.0]]), T([[0.0, 0.0]]), T([[0.0, 0.0]]), T([[1, 1]]), clip=None)
    torch.testing.assert_close(loss, T([[0.5, 2.0]]))
    assert float(frac) == 0.0
    with pytest.raises(ValueError, match="clip range must be > 0"):
        clipped_value_loss(T([[1.0]]), T([[0.0]]), T([[0.0]]), T([[1]]), clip=0.0)
    with pytest.raises(ValueError, match=r"must all be \[B,T\]"):
        clipped_value_loss(T([1.0]), T([0.0]), T([0.0]), T([1]))
