import math

import pytest
import torch

from reasonrl.registry import SCHEDULES
from reasonrl.train.optim import lr_multiplier
from reasonrl.train.trainer import outcome_token_rewards

from helpers import make


def lr_lambda(step, warmup, total, schedule):
    return lr_multiplier(step, warmup, total, SCHEDULES.get(schedule))


def test_lr_schedule_warmup_then_decay():
    # warm-up 4 of 12 steps: 1/4, 2/4, 3/4, 4/4, then the decay runs over the remaining 8.
    assert [lr_lambda(s, 4, 12, "constant") for s in (0, 3, 4, 11)] == [0.25, 1.0, 1.0, 1.0]
    assert lr_lambda(8, 4, 12, "linear") == pytest.approx(0.5)
    assert lr_lambda(8, 4, 12, "cosine") == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_lambda(12, 4, 12, "cosine") == pytest.approx(0.0)


def test_outcome_reward_sits_on_the_last_completion_token():
    b = make(2, 2, 4)
    b.completion_mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    b.rewards = torch.tensor([0.5, -1.0])
    expected = torch.tensor([[0.0, 0.0, 0.5, 0.0], [-1.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(outcome_token_rewards(b), expected)
