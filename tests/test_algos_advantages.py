"""Advantage estimators and the masked / group helpers they rest on."""

import pytest
import torch
from torch.testing import assert_close

from reasonrl.algos.advantages import (
    discounted_returns,
    grpo_advantages,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
    sequence_scores,
)
from reasonrl.algos.masked import group_stats, masked_mean, masked_var, masked_whiten
from reasonrl.registry import ADVANTAGES


def outcome_rewards(scores, lengths, T):
    """Place each sequence's score at its last valid token; mask = first `length` tokens."""
    B = len(scores)
    mask = torch.zeros(B, T)
    rewards = torch.zeros(B, T)
    for i, (s, n) in enumerate(zip(scores, lengths)):
        mask[i, :n] = 1.0
        rewards[i, n - 1] = s
    return rewards, mask


# Two groups with non-contiguous ids: group 7 scores [1,0,0,1], group 3 scores [2,0].
SCORES = [1.0, 0.0, 0.0, 1.0, 2.0, 0.0]
LENGTHS = [3, 2, 1, 3, 2, 3]
IDS = torch.tensor([7, 7, 7, 7, 3, 3])


def expand(per_seq, mask):
    return torch.tensor(per_seq).unsqueeze(-1) * mask


def test_registered_names():
    assert ADVANTAGES.get("grpo") is grpo_advantages
    assert ADVANTAGES.get("rloo") is rloo_advantages
    assert ADVANTAGES.get("reinforce_pp") is reinforce_pp_advantages
    assert ADVANTAGES.get("reinforce_pp_baseline") is reinforce_pp_baseline_advantages


def test_sequence_scores_sum_valid_tokens_only():
    rewards = torch.tensor([[0.5, 0.0, 1.0], [0.0, 2.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    assert_close(sequence_scores(rewards, mask), torch.tensor([1.5, 2.0]))


# ----------------------------------------------------------------------------- GRPO


def test_grpo_group_scale_hand_computed():
    rewards, mask = outcome_rewards(SCORES, LENGTHS, 3)
    adv = grpo_advantages(rewards, mask, IDS, scale="group", eps=0.0)
    # group 7: [1,0,0,1] mean 0.5, unbiased std sqrt((4*0.25)/3) = 0.577350 -> A = ±0.5/0.577350 = ±0.866025
    # group 3: [2,0] mean 1, unbiased std sqrt((1+1)/1) = 1.414214 -> A = ±1/1.414214 = ±0.707107
    expected = expand([0.866025, -0.866025, -0.866025, 0.866025, 0.707107, -0.707107], mask)
    assert_close(adv, expected, atol=1e-5, rtol=0)


def test_grpo_default_eps_is_1e6():
    rewards, mask = outcome_rewards([1.0, 0.0, 0.0, 1.0], [1, 1, 1, 1], 1)
    adv = grpo_advantages(rewards, mask, torch.zeros(4, dtype=torch.long))
    # 0.5 / (0.5773503 + 1e-6) = 0.8660239
    assert_close(adv[:, 0], torch.tensor([0.8660239, -0.8660239, -0.8660239, 0.8660239]), atol=1e-6, rtol=0)


def test_grpo_batch_scale_hand_computed():
    rewards, mask = outcome_rewards(SCORES, LENGTHS, 3)
    adv = grpo_advantages(rewards, mask, IDS, scale="batch", eps=0.0)
    # batch scores [1,0,0,1,2,0]: mean 2/3, squared deviations sum 10/3, unbiased var 2/3, std 0.816497
    # numerators stay per-group: ±0.5 (group 7), ±1 (group 3) -> ±0.612372, ±1.224745
    expected = expand([0.612372, -0.612372, -0.612372, 0.612372, 1.224745, -1.224745], mask)
    assert_close(adv, expected, atol=1e-5, rtol=0)


def test_grpo_none_scale_is_dr_grpo():
    rewards, mask = outcome_rewards(SCORES, LENGTHS, 3)
    adv = grpo_advantages(rewards, mask, IDS, scale="none")
    # s - group mean: group 7 mean 0.5, group 3 mean 1
    assert_close(adv, expand([0.5, -0.5, -0.5, 0.5, 1.0, -1.0], mask))


def test_grpo_none_does_not_divide_by_std():
    torch.manual_seed(0)
    rewards = torch.rand(8, 5)
    mask = torch.ones(8, 5)
    ids = torch.arange(8) // 4
    base = grpo_advantages(rewards, mask, ids, scale="none")
    assert_close(grpo_advantages(10 * rewards, mask, ids, scale="none"), 10 * base)
    # ... whereas the std-normalised version is scale-invariant
    g = grpo_advantages(rewards, mask, ids, scale="group", eps=0.0)
    assert_close(grpo_advantages(10 * rewards, mask, ids, scale="group", eps=0.0), g)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_grpo_zero_mean_per_group(scale):
    torch.manual_seed(1)
    B, T = 24, 6
    rewards = torch.randn(B, T)
    mask = (torch.rand(B, T) < 0.8).float()
    mask[:, 0] = 1.0
    ids = torch.randperm(B) % 5 * 11  # shuffled, non-contiguous ids
    adv = grpo_advantages(rewards, mask, ids, scale=scale)
    per_seq = adv[:, 0]
    for g in ids.unique():
        assert abs(per_seq[ids == g].sum().item()) < 1e-5


def test_grpo_singleton_group_gets_zero():
    rewards, mask = outcome_rewards([1.0, 0.0, 3.0], [1, 2, 2], 2)
    ids = torch.tensor([0, 0, 5])
    for scale in ("group", "batch", "none"):
        adv = grpo_advantages(rewards, mask, ids, scale=scale)
        assert_close(adv[2], torch.zeros(2))
        assert adv[0, 0].item() > 0


def test_grpo_zero_variance_group_gets_zero():
    rewards, mask = outcome_rewards([1.0, 1.0, 1.0], [1, 1, 1], 1)
    adv = grpo_advantages(rewards, mask, torch.zeros(3, dtype=torch.long))
    assert_close(adv, torch.zeros(3, 1))


def test_grpo_unknown_scale_names_allowed_values():
    rewards, mask = outcome_rewards([1.0, 0.0], [1, 1], 1)
    with pytest.raises(ValueError, match="group, batch, none"):
        grpo_advantages(rewards, mask, torch.zeros(2, dtype=torch.long), scale="grp")


def test_grpo_non_contiguous_ids_equal_dense_ids():
    rewards, mask = outcome_rewards([1.0, 0.0, 3.0, 1.0], [1, 2, 2, 1], 2)
    dense = grpo_advantages(rewards, mask, torch.tensor([0, 0, 1, 1]))
    assert_close(grpo_advantages(rewards, mask, torch.tensor([7, 7, 3, 3])), dense)
    # interleaved: rows 0,2 share a group and rows 1,3 another
    perm = torch.tensor([0, 2, 1, 3])
    inter = grpo_advantages(rewards[perm], mask[perm], torch.tensor([5, 2, 5, 2]))
    assert_close(inter, dense[perm])


def naive_trl_grpo(scores, ids, scale, eps):
    """Per-group loop transcribing TRL's formula (mean/std over each group's rewards)."""
    adv = torch.zeros_like(scores)
    batch_std = scores.std()
    for g in ids.unique().tolist():
        idx = (ids == g).nonzero().flatten().tolist()
        r = scores[idx]
        mean = r.mean()
        std = r.std() if len(idx) > 1 else torch.tensor(0.0)
        for k, i in enumerate(idx):
            if len(idx) == 1:
                adv[i] = 0.0
            elif scale == "group":
                adv[i] = (r[k] - mean) / (std + eps)
            elif scale == "batch":
                adv[i] = (r[k] - mean) / (batch_std + eps)
            else:
                adv[i] = r[k] - mean
    return adv


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_grpo_matches_naive_loop(scale):
    torch.manual_seed(2)
    B, T = 30, 7
    rewards = torch.randn(B, T)
    mask = (torch.rand(B, T) < 0.7).float()
    mask[:, 0] = 1.0
    ids = torch.randint(0, 40, (B,))  # random sizes, some singletons
    scores = (rewards * mask).sum(-1)
    expected = naive_trl_grpo(scores, ids, scale, 1e-4)
    adv = grpo_advantages(rewards, mask, ids, scale=scale, eps=1e-4)
    assert_close(adv, expected.unsqueeze(-1) * mask, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- RLOO


def test_rloo_hand_computed():
    rewards, mask = outcome_rewards(SCORES, LENGTHS, 3)
    adv = rloo_advantages(rewards, mask, IDS)
    # group 7 [1,0,0,1]: s=1 -> 1 - mean(0,0,1) = 2/3; s=0 -> 0 - mean(1,0,1) = -2/3
    # group 3 [2,0]: 2 - 0 = 2, 0 - 2 = -2
    expected = expand([2 / 3, -2 / 3, -2 / 3, 2 / 3, 2.0, -2.0], mask)
    assert_close(adv, expected)


def test_rloo_matches_naive_leave_one_out_loop():
    torch.manual_seed(3)
    B, T = 30, 5
    rewards = torch.randn(B, T)
    mask = (torch.rand(B, T) < 0.7).float()
    mask[:, 0] = 1.0
    ids = torch.randint(0, 12, (B,))
    scores = (rewards * mask).sum(-1)
    expected = torch.zeros(B)
    for i in range(B):
        others = [j for j in range(B) if ids[j] == ids[i] and j != i]
        expected[i] = scores[i] - scores[others].mean() if others else 0.0
    assert_close(rloo_advantages(rewards, mask, ids), expected.unsqueeze(-1) * mask, atol=1e-5, rtol=1e-5)


def test_rloo_singleton_and_zero_mean():
    rewards, mask = outcome_rewards([1.0, 0.0, 0.5, 4.0], [1, 1, 1, 1], 1)
    adv = rloo_advantages(rewards, mask, torch.tensor([2, 2, 2, 9]))
    assert adv[3, 0].item() == 0.0
    assert abs(adv[:3, 0].sum().item()) < 1e-6


# ----------------------------------------------------------------------------- REINFORCE++

RPP_REWARDS = torch.tensor([[0.5, 0.0, 1.0], [0.0, 2.0, 9.0]])  # the 9.0 is padding
RPP_MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_discounted_returns_hand_computed():
    # gamma=1: row0 [0.5+0+1, 0+1, 1] = [1.5, 1, 1]; row1 [2, 2, pad]
    assert_close(discounted_returns(RPP_REWARDS, RPP_MASK, 1.0), torch.tensor([[1.5, 1.0, 1.0], [2.0, 2.0, 0.0]]))
    # gamma=0.5: row0 t2=1, t1=0+0.5*1=0.5, t0=0.5+0.5*0.5=0.75; row1 t1=2, t0=0+0.5*2=1
    assert_close(discounted_returns(RPP_REWARDS, RPP_MASK, 0.5), torch.tensor([[0.75, 0.5, 1.0], [1.0, 2.0, 0.0]]))


def test_discounted_returns_carry_across_interior_gaps():
    # mask [1,0,1] (e.g. masked tool output mid-sequence); the 5.0 under the gap is ignored,
    # the return is carried across it: t0 = 0 + γ²·1. (verl would reset at the gap and give t0 = 0.)
    rewards = torch.tensor([[0.0, 5.0, 1.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    assert_close(discounted_returns(rewards, mask, 1.0), torch.tensor([[1.0, 0.0, 1.0]]))
    assert_close(discounted_returns(rewards, mask, 0.5), torch.tensor([[0.25, 0.0, 1.0]]))


def test_reinforce_pp_gamma_1():
    adv = reinforce_pp_advantages(RPP_REWARDS, RPP_MASK, torch.tensor([0, 0]))
    # valid returns [1.5,1,1,2,2]: mean 1.5, deviations [0,-.5,-.5,.5,.5], unbiased var 1/4, std 0.5
    expected = torch.tensor([[0.0, -1.0, -1.0], [1.0, 1.0, 0.0]])
    assert_close(adv, expected, atol=1e-6, rtol=0)


def test_reinforce_pp_gamma_half():
    adv = reinforce_pp_advantages(RPP_REWARDS, RPP_MASK, torch.tensor([0, 0]), gamma=0.5)
    # valid returns [0.75,0.5,1 | 1,2]: mean 1.05, deviations [-.3,-.55,-.05,-.05,.95],
    # squares sum 1.3, unbiased var 0.325, std 0.570088 -> deviations / 0.570088
    expected = torch.tensor([[-0.526235, -0.964764, -0.087706], [-0.087706, 1.666410, 0.0]])
    assert_close(adv, expected, atol=1e-5, rtol=0)


def test_reinforce_pp_baseline_hand_computed():
    rewards, mask = outcome_rewards([1.0, 0.0, 3.0, 1.0], [2, 1, 3, 1], 3)
    adv = reinforce_pp_baseline_advantages(rewards, mask, torch.tensor([0, 0, 1, 1]))
    # centred scores [0.5,-0.5,1,-1] broadcast to 2,1,3,1 tokens: [.5,.5 | -.5 | 1,1,1 | -1]
    # mean 2.5/7 = 5/14; deviations 1/7, -6/7, 9/14, -19/14; squares sum 756/196; var /6 = 9/14; std 0.801784
    a, b, c, d = 0.178174, -1.069045, 0.801784, -1.692655
    expected = torch.tensor([[a, a, 0.0], [b, 0.0, 0.0], [c, c, c], [d, 0.0, 0.0]])
    assert_close(adv, expected, atol=1e-5, rtol=0)


def test_reinforce_pp_baseline_singleton_is_centred_to_zero_before_whitening():
    rewards, mask = outcome_rewards([1.0, 0.0, 5.0], [1, 1, 1], 1)
    adv = reinforce_pp_baseline_advantages(rewards, mask, torch.tensor([0, 0, 1]))
    # centred [0.5,-0.5,0]: mean 0, unbiased var 0.25, std 0.5 -> [1,-1,0]
    assert_close(adv, torch.tensor([[1.0], [-1.0], [0.0]]), atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------- invariants


@pytest.mark.parametrize(
    "name,params",
    [
        ("grpo", {}),
        ("grpo", {"scale": "batch"}),
        ("grpo", {"scale": "none"}),
        ("rloo", {}),
        ("reinforce_pp", {}),
        ("reinforce_pp", {"gamma": 0.9}),
        ("reinforce_pp_baseline", {}),
    ],
)
def test_padding_never_leaks(name, params):
    torch.manual_seed(4)
    B, T = 8, 6
    rewards = torch.randn(B, T)
    mask = (torch.rand(B, T) < 0.6).float()
    mask[:, 0] = 1.0
    ids = torch.arange(B) // 3
    fn = ADVANTAGES.get(name)
    ref = fn(rewards, mask, ids, **params)
    garbage = rewards.clone()
    garbage[mask == 0] = float("nan")
    garbage[(mask == 0) & (torch.rand(B, T) < 0.5)] = 1e6
    out = fn(garbage, mask, ids, **params)
    assert_close(out, ref)
    assert torch.all(out[mask == 0] == 0)
    # a bool mask behaves like the float one
    assert_close(fn(rewards, mask.bool(), ids, **params), ref)


def test_outputs_are_float32_for_low_precision_inputs():
    rewards, mask = outcome_rewards([1.0, 0.0], [1, 1], 1)
    adv = grpo_advantages(rewards.bfloat16(), mask.long(), torch.tensor([0, 0]))
    assert adv.dtype == torch.float32


# ----------------------------------------------------------------------------- helpers


def test_masked_helpers_ignore_padding():
    x = torch.tensor([[1.0, 2.0, float("nan")], [3.0, float("inf"), 5.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 1]])
    # valid [1,2,3,5]: mean 11/4 = 2.75; squared deviations 3.0625+0.5625+0.0625+5.0625 = 8.75; unbiased var 8.75/3
    assert_close(masked_mean(x, m), torch.tensor(2.75))
    assert_close(masked_mean(x, m, dim=-1), torch.tensor([1.5, 4.0]))
    assert_close(masked_var(x, m), torch.tensor(8.75 / 3))
    w = masked_whiten(x, m)
    std = (8.75 / 3) ** 0.5
    expected = torch.tensor([[(1 - 2.75) / std, (2 - 2.75) / std, 0.0], [(3 - 2.75) / std, 0.0, (5 - 2.75) / std]])
    assert_close(w, expected, atol=1e-6, rtol=0)
    assert masked_mean(x, torch.zeros_like(m)).item() == 0.0


def test_group_stats_non_contiguous_ids():
    values = torch.tensor([1.0, 1.0, 0.0, 1.0, 4.0])
    mean, std, count = group_stats(values, torch.tensor([7, 7, 3, 3, 100]))
    assert_close(mean, torch.tensor([1.0, 1.0, 0.5, 0.5, 4.0]))
    # group 3 [0,1]: unbiased std sqrt(0.5) = 0.707107; singleton std is defined as 0
    assert_close(std, torch.tensor([0.0, 0.0, 0.707107, 0.707107, 0.0]), atol=1e-6, rtol=0)
    assert_close(count, torch.tensor([2.0, 2.0, 2.0, 2.0, 1.0]))


def test_group_stats_rejects_float_ids():
    with pytest.raises(ValueError):
        group_stats(torch.ones(2), torch.tensor([0.0, 1.0]))


def test_group_first_rows_is_each_groups_first_index():
    from reasonrl.algos.masked import group_first_rows, group_inverse

    inverse, g = group_inverse(torch.tensor([7, 3, 7, 9, 3, 9]))  # dense: 3 → 0, 7 → 1, 9 → 2
    assert group_first_rows(inverse, g).tolist() == [1, 0, 3]
