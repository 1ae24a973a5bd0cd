"""Group selection (DAPO dynamic sampling) and over-long handling."""

import pytest
import torch
from torch.testing import assert_close

from reasonrl.algos.advantages import grpo_advantages
from reasonrl.algos.overlong import mask_truncated_completions, soft_overlong_punishment
from reasonrl.algos.selection import group_reward_std, zero_variance_groups


def test_zero_variance_groups_non_contiguous_ids():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 2.0])
    ids = torch.tensor([7, 7, 3, 3, 9, 9, 4])
    # group 7 all 1 -> drop; group 3 [0,1] -> keep; group 9 all 0.5 -> drop; group 4 singleton -> drop
    expected = torch.tensor([True, True, False, False, True, True, True])
    assert torch.equal(zero_variance_groups(rewards, ids), expected)


def test_zero_variance_groups_tolerance():
    ids = torch.tensor([0, 0, 1, 1])
    rewards = torch.tensor([1.0, 1.0 + 1e-7, 1.0, 1.001])
    assert torch.equal(zero_variance_groups(rewards, ids), torch.tensor([True, True, False, False]))


def test_zero_variance_groups_are_exactly_the_zero_advantage_groups():
    torch.manual_seed(0)
    B = 32
    ids = torch.randperm(B) // 4
    rewards = torch.randint(0, 2, (B,)).float()  # binary rewards: many all-0 / all-1 groups
    flat = zero_variance_groups(rewards, ids)
    adv = grpo_advantages(rewards.unsqueeze(-1), torch.ones(B, 1), ids)[:, 0]
    assert flat.any() and (~flat).any()
    assert torch.all(adv[flat] == 0)
    assert torch.all(adv[~flat] != 0)


def test_group_reward_std():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 3.0])
    # group 7 [1,1] -> 0; group 3 [0,1] -> sqrt(0.5) = 0.707107; singleton -> 0
    std = group_reward_std(rewards, torch.tensor([7, 7, 3, 3, 1]))
    assert_close(std, torch.tensor([0.0, 0.0, 0.707107, 0.707107, 0.0]), atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------- overlong


def test_soft_overlong_punishment_three_regions():
    lengths = torch.tensor([10, 15, 16, 18, 20, 21, 40])
    # max_len 20, buffer 5 -> expected length 15
    # L<=15: 0; 15<L<=20: (15-L)/5 -> 16: -0.2, 18: -0.6, 20: -1.0; L>20: -1
    expected = torch.tensor([0.0, 0.0, -0.2, -0.6, -1.0, -1.0, -1.0])
    assert_close(soft_overlong_punishment(lengths, max_len=20, buffer_len=5), expected)
    # penalty factor scales all of it
    assert_close(soft_overlong_punishment(lengths, 20, 5, penalty_factor=0.5), 0.5 * expected)


@pytest.mark.parametrize("max_len,buffer_len", [(20, 0), (20, 21), (20, -1)])
def test_soft_overlong_punishment_validates_buffer(max_len, buffer_len):
    with pytest.raises(ValueError, match="buffer_len"):
        soft_overlong_punishment(torch.tensor([1]), max_len, buffer_len)


def test_soft_overlong_buffer_equal_max_len():
    # expected length 0: every positive length is in the ramp
    assert_close(soft_overlong_punishment(torch.tensor([0, 5, 10]), 10, 10), torch.tensor([0.0, -0.5, -1.0]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool, torch.long])
def test_mask_truncated_completions(dtype):
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]]).to(dtype)
    truncated = torch.tensor([False, True, False])
    out = mask_truncated_completions(mask, truncated)
    assert out.dtype == dtype
    assert torch.equal(out, torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]]).to(dtype))
