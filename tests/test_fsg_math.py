"""FSG-RL's reward composition and span-level advantages: hand-computed numbers and the
reference's group normalisation (github.com/ZihanLiummyycc/FSG-RL)."""

import math

import pytest
import torch

from reasonrl.methods.fsg.advantage import FSGWeights, fsg_span, fsg_span_rewards, fsg_total_reward, group_normalize, span_advantages

W = FSGWeights()  # the reference's main config
t = torch.tensor


def test_total_reward_by_hand():
    # Rollout 1: everything right but half the unit tests; rollout 2: wrong answer (gate 0.25); 3: bad format.
    r = fsg_total_reward(W, fmt=t([1., 1., 0.]), sig=t([1., .5, 1.]), exec_=t([1., 1., 1.]), unit=t([.5, 0., 1.]),
                         prop=t([0., 0., 0.]), node=t([0., 0., 0.]), edge=t([1., 0., 1.]), final=t([1., 0., 1.]),
                         back=t([1., 0., 1.]))
    # 1: (0.1 + 0.15) + 1·(0.5 + 0.375 + 0.05) + (1.5 + 0.75) = 3.425
    # 2: (0.1 + 0.075) + 0.25·0.5 = 0.3;   3: F = 0 → 0
    torch.testing.assert_close(r, t([3.425, 0.3, 0.0]))


def test_efficiency_and_repair_penalties_apply_outside_the_format_gate():
    w = FSGWeights(eff=0.1, rep=0.2)
    zero = t([0.])
    r = fsg_total_reward(w, fmt=zero, sig=zero, exec_=zero, unit=zero, prop=zero, node=zero, edge=zero,
                         final=zero, back=zero, eff=t([.5]), repaired=t([1.]))
    torch.testing.assert_close(r, t([-0.25]))


def test_span_rewards_by_hand():
    # Nodes: 0 = "f", 1 = main; one edge f -> main.
    spans = fsg_span_rewards(W, fmt=t([1., 1., 0.]), sig_n=t([[1., 1.], [1., 0.], [1., 1.]]),
                             node_n=torch.zeros(3, 2), exec_n=t([[1., 1.], [1., 0.], [1., 1.]]),
                             unit_n=t([[1., 0.], [0., 0.], [1., 1.]]), prop_n=torch.zeros(3, 2),
                             final=t([1., 0., 1.]), back=t([1., 0., 1.]), main=1, edges=[(0, 1)],
                             edge_e=t([[1.], [0.], [1.]]))
    # R_f    = 0.15 + 1·(0.5 + 0.75) + 0.5·(1.5 + 0.75) + ½·1·0.05·1 = 2.55
    # R_main = 0.15 + 1·0.5 + ½·0.05 + (1.5 + 0.75)                   = 2.925
    # rollout 2 (gate 0.25): R_f = 0.15 + 0.25·0.5 = 0.275, R_main = 0;  rollout 3: F = 0 → 0
    torch.testing.assert_close(spans, t([[2.55, 2.925], [0.275, 0.0], [0.0, 0.0]]))


def reference_group_normalize(values):
    """The reference's formula, written out (fsg_rl/grpo.py): population std, 0 below 1e-8."""
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    return [0.0 for _ in values] if std < 1e-8 else [(v - mean) / std for v in values]


def test_group_normalize_is_the_reference_per_group():
    g = torch.Generator().manual_seed(0)
    values = torch.randn(12, generator=g, dtype=torch.float64)
    values[8:12] = 0.7  # a group that agrees → 0
    groups = torch.arange(3).repeat_interleave(4)
    got = group_normalize(values, groups)
    want = [x for k in range(3) for x in reference_group_normalize(values[4 * k:4 * k + 4].tolist())]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64))
    assert group_normalize(t([1., 2.]), torch.tensor([0, 1])).tolist() == [0.0, 0.0]  # singletons


def test_span_advantages_by_hand():
    # Two rollouts of one group: R = [3, 1] → [1, −1]; R_f = [2, 2] → 0; R_main = [0, 4] → [−1, 1].
    ids = torch.tensor([[1, 1, 0, 2, 2], [1, 0, 0, 2, 2]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    adv = span_advantages(t([3., 1.]), t([[2., 0.], [2., 4.]]), ids, mask, torch.tensor([0, 0]))
    assert adv.tolist() == [[0., 0., 1., -1., -1.], [0., -1., -1., 1., 0.]]


def test_the_registered_advantage_reads_the_sequence_reward():
    token_rewards = t([[0., 0., 0., 0., 3.], [0., 0., 0., 1., 0.]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    adv = fsg_span(token_rewards, mask, torch.tensor([0, 0]), fsg_span_ids=torch.tensor([[1, 1, 0, 2, 2], [1, 0, 0, 2, 2]]),
                   fsg_span_rewards=t([[2., 0.], [2., 4.]]))
    assert adv.tolist() == [[0., 0., 1., -1., -1.], [0., -1., -1., 1., 0.]]
    assert fsg_span.consumes == ("fsg_span_ids", "fsg_span_rewards")


def test_bad_span_ids_are_clear():
    with pytest.raises(ValueError, match="span_ids must lie in 0..2"):
        span_advantages(t([1., 0.]), torch.zeros(2, 2), torch.tensor([[3, 0], [0, 0]]), torch.ones(2, 2),
                        torch.tensor([0, 0]))
