"""Trajectory-ratio policy losses: TIC-GRPO (trajectory clip) and GMC-GRPO (group-mass cap).

Hand-computed numbers on small batches, the per-token straight-through gradient, equality
with GRPO on-policy, padding, the group-id wiring of the objective (the split-group guard
and micro-batch invariance) and the recipe checks.
"""

import math

import pytest
import torch
from torch.testing import assert_close

from reasonrl.algos.losses import AGG_MODES, aggregate, ppo_clip_loss
from reasonrl.methods.gmc_grpo.loss import gmc_grpo_loss, tic_grpo_loss
from reasonrl.batch import RolloutBatch
from reasonrl.config import ConfigError, LossConfig
from reasonrl.registry import POLICY_LOSSES
from reasonrl.metrics_log import read_metrics
from reasonrl.train.objective import micro_batch_loss, totals
from reasonrl.train.trainer import Trainer

from helpers import mini_recipe


def rows_of(token_ratios, pad_to=None):
    """logp = log(token ratio) with old = 0, one row per list (right-padded with mask 0)."""
    width = pad_to or max(len(r) for r in token_ratios)
    logp = torch.zeros(len(token_ratios), width)
    mask = torch.zeros(len(token_ratios), width)
    for i, r in enumerate(token_ratios):
        logp[i, : len(r)] = torch.log(torch.tensor(r))
        mask[i, : len(r)] = 1.0
    return logp.requires_grad_(True), torch.zeros_like(logp), mask


def row_adv(values, mask):
    return torch.tensor(values).unsqueeze(-1) * mask


def test_registered_names():
    assert POLICY_LOSSES.get("tic_grpo") is tic_grpo_loss
    assert POLICY_LOSSES.get("gmc_grpo") is gmc_grpo_loss


# ----------------------------------------------------------------------------- TIC-GRPO


def test_tic_trajectory_ratio_is_the_product_and_is_clipped_per_trajectory():
    # w_i = Π_t token ratios: 1.1·1 = 1.1, 1.25·1.2 = 1.5, 0.5·1 = 0.5, 0.5 (one token), 1.5·1 = 1.5
    logp, old, mask = rows_of([[1.1, 1.0], [1.25, 1.2], [0.5, 1.0], [0.5], [1.5, 1.0]])
    adv = row_adv([1.0, 1.0, -1.0, 1.0, -1.0], mask)
    out = tic_grpo_loss(logp, old, adv, mask, epsilon=0.2)
    # l = max(−A w, −A clip(w, 0.8, 1.2)) on every token of the row:
    #  w=1.1 A=+1: −1.1 unclipped;  w=1.5 A=+1: max(−1.5, −1.2) = −1.2 clipped above
    #  w=0.5 A=−1: max(0.5, 0.8) = 0.8 clipped below;  w=0.5 A=+1: max(−0.5, −0.8) = −0.5 unclipped
    #  w=1.5 A=−1: max(1.5, 1.2) = 1.5 unclipped (the pessimistic branch is the raw one)
    expected = torch.tensor([[-1.1, -1.1], [-1.2, -1.2], [0.8, 0.8], [-0.5, 0.0], [1.5, 1.5]])
    assert_close(out.loss, expected)
    assert_close(out.clipped, torch.tensor([[0.0, 0.0], [1.0, 1.0], [1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]))
    assert_close(out.ratio, torch.tensor([[1.1, 1.1], [1.5, 1.5], [0.5, 0.5], [0.5, 0.0], [1.5, 1.5]]))
    # gradient of the token value w.r.t. logp_t is w_i: d l/d logp_t = −A w_i unclipped, 0 clipped
    out.loss.sum().backward()
    assert_close(logp.grad, torch.tensor([[-1.1, -1.1], [0.0, 0.0], [0.0, 0.0], [-0.5, 0.0], [1.5, 1.5]]))


def test_tic_clip_higher_and_sum_not_mean():
    # w = 1.118·1.118 ≈ 1.25 (mean log-ratio would give GSPO's ≈ 1.118)
    logp, old, mask = rows_of([[1.25 ** 0.5, 1.25 ** 0.5]])
    adv = row_adv([1.0], mask)
    asym = tic_grpo_loss(logp, old, adv, mask, epsilon=0.2, epsilon_high=0.28)  # band [0.8, 1.28]: inside
    assert_close(asym.loss, torch.tensor([[-1.25, -1.25]]))
    sym = tic_grpo_loss(logp, old, adv, mask, epsilon=0.2)  # band [0.8, 1.2]: clipped to −1.2
    assert_close(sym.loss, torch.tensor([[-1.2, -1.2]]))


def test_tic_with_one_token_rows_is_ppo_clip():
    torch.manual_seed(0)
    logp = (-torch.rand(6, 1) * 2).requires_grad_(True)
    old = logp.detach() + 0.4 * torch.randn(6, 1)
    adv, mask = torch.randn(6, 1), torch.ones(6, 1)
    tic, ppo = tic_grpo_loss(logp, old, adv, mask), ppo_clip_loss(logp, old, adv, mask)
    assert_close(tic.loss, ppo.loss)
    assert_close(tic.clipped, ppo.clipped)
    g_tic, = torch.autograd.grad(tic.loss.sum(), logp)
    g_ppo, = torch.autograd.grad(ppo.loss.sum(), logp)
    assert_close(g_tic, g_ppo)


def test_seq_mean_token_sum_recovers_the_trajectory_gradient():
    # Trajectory surrogate −(1/N) Σ_i A_i w_i with w_i = exp(Σ_t logp − old) differentiated directly.
    torch.manual_seed(1)
    logp, _, mask = rows_of([[0.9, 1.05, 1.0], [1.1, 0.95], [1.02]], pad_to=3)
    adv = row_adv([0.7, -1.3, 0.4], mask)
    out = tic_grpo_loss(logp, torch.zeros_like(logp), adv, mask, epsilon=0.5)
    assert out.clipped.sum() == 0  # all w within [0.5, 1.5]: the surrogate is w A everywhere
    g_tokens, = torch.autograd.grad(aggregate(out.loss, mask, "seq-mean-token-sum"), logp)
    w = torch.exp(torch.where(mask.bool(), logp, 0.0).sum(-1))
    g_traj, = torch.autograd.grad(-(torch.tensor([0.7, -1.3, 0.4]) * w).sum() / 3, logp)
    assert_close(g_tokens, g_traj * mask)


# ----------------------------------------------------------------------------- GMC-GRPO


def test_gmc_cap_inactive_is_plain_trajectory_importance_sampling():
    # one group: w = [1.2·1.0, 0.9, 1.3] = [1.2, 0.9, 1.3], w̄ = 3.4/3 ≈ 1.133 ≤ 1.2: s = 1, ω = w
    logp, old, mask = rows_of([[1.2, 1.0], [0.9], [1.3, 1.0]])
    adv = row_adv([1.0, -2.0, 0.5], mask)
    out = gmc_grpo_loss(logp, old, adv, mask, group_ids=torch.tensor([7, 7, 7]), epsilon=0.2)
    assert_close(out.loss, torch.tensor([[-1.2, -1.2], [1.8, 0.0], [-0.65, -0.65]]))
    assert_close(out.extra["gmc/scale"], mask)
    assert out.extra["gmc/cap_active"].sum() == 0
    assert out.clipped.sum() == 0
    # ESS = (Σw)²/(G Σw²) = 3.4²/(3·(1.44+0.81+1.69)) = 11.56/11.82
    assert_close(out.extra["gmc/ess"], mask * (11.56 / 11.82))
    g, = torch.autograd.grad(out.loss.sum(), logp)
    assert_close(g, torch.tensor([[-1.2, -1.2], [1.8, 0.0], [-0.65, -0.65]]))  # −A w per token


def test_gmc_cap_active_hand_computed_with_unequal_groups():
    # group 0 (3 rows): w = [2·1, 1.5, 0.5·1], M = 4 > G(1+ε) = 3.6 → s = 0.9, ω = [1.8, 1.35, 0.45]
    # group 1 (2 rows): w = [0.5, 1], M = 1.5 ≤ 2.4 → s = 1, ω = w
    logp, old, mask = rows_of([[2.0, 1.0], [1.5], [0.5, 1.0], [0.5, 1.0], [1.0]])
    adv = row_adv([1.0, -1.0, 2.0, 1.0, -0.5], mask)
    gids = torch.tensor([0, 0, 0, 1, 1])
    out = gmc_grpo_loss(logp, old, adv, mask, group_ids=gids, epsilon=0.2)
    # l = −A ω: −1.8, +1.35, −0.9, −0.5, +0.5
    assert_close(out.loss, torch.tensor([[-1.8, -1.8], [1.35, 0.0], [-0.9, -0.9], [-0.5, -0.5], [0.5, 0.0]]))
    assert_close(out.ratio, torch.tensor([[2.0, 2.0], [1.5, 0.0], [0.5, 0.5], [0.5, 0.5], [1.0, 0.0]]))
    assert_close(out.extra["gmc/scale"], torch.tensor([[0.9, 0.9], [0.9, 0.0], [0.9, 0.9], [1.0, 1.0], [1.0, 0.0]]))
    assert_close(out.extra["gmc/cap_active"], torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]))
    # ESS group 0: 4²/(3·(4 + 2.25 + 0.25)) = 16/19.5; group 1: 1.5²/(2·(0.25 + 1)) = 0.9
    ess0 = 16 / 19.5
    assert_close(out.extra["gmc/ess"], torch.tensor([[ess0, ess0], [ess0, 0.0], [ess0, ess0], [0.9, 0.9], [0.9, 0.0]]))
    # Token means as the trainer logs them (8 valid tokens): cap active on 5 of them, scale 0.9 on 5
    n = mask.sum()
    assert float((out.extra["gmc/cap_active"]).sum() / n) == pytest.approx(5 / 8)
    assert float(out.extra["gmc/scale"].sum() / n) == pytest.approx((5 * 0.9 + 3) / 8)
    # The scale is a constant: d l/d logp_t = −A s w_i (a differentiated s would add cross terms)
    g, = torch.autograd.grad(out.loss.sum(), logp)
    assert_close(g, torch.tensor([[-1.8, -1.8], [1.35, 0.0], [-0.9, -0.9], [-0.5, -0.5], [0.5, 0.0]]))


def test_gmc_mass_is_computed_in_log_space():
    # log w = 25 is clamped to 20: w = [e^20, 1], M = e^20 + 1, s = G(1+ε)/M = 2.4/(e^20 + 1);
    # through logsumexp and p_j = w_j/M ≤ 1 nothing overflows (w² = e^40 would, in float16).
    logp = torch.tensor([[25.0], [0.0]], requires_grad=True)
    out = gmc_grpo_loss(logp, torch.zeros(2, 1), torch.ones(2, 1), torch.ones(2, 1), group_ids=torch.tensor([0, 0]))
    s = 2.4 / (math.exp(20.0) + 1.0)
    assert_close(out.extra["gmc/scale"], torch.full((2, 1), s), rtol=1e-5, atol=0)
    # ω = s·w: row 0 ≈ 2.4, row 1 ≈ 2.4·e^−20; the group's mass is exactly the cap G(1+ε) = 2.4
    assert_close(-out.loss.sum(), torch.tensor(2.4))
    assert_close(out.extra["gmc/ess"], torch.full((2, 1), 0.5), rtol=1e-4, atol=0)
    assert torch.isfinite(out.loss).all()


def test_gmc_rows_without_loss_tokens_are_not_part_of_the_group():
    # group 0: a row w = 2 and a fully masked row (e.g. loss.mask_truncated): G = 1, cap 1.2, s = 0.6
    logp, old, mask = rows_of([[2.0, 1.0], [1.0]])
    mask[1] = 0.0
    out = gmc_grpo_loss(logp, old, row_adv([1.0, 1.0], mask), mask, group_ids=torch.tensor([0, 0]))
    assert_close(out.loss, torch.tensor([[-1.2, -1.2], [0.0, 0.0]]))
    assert_close(out.extra["gmc/scale"], torch.tensor([[0.6, 0.6], [0.0, 0.0]]))


def test_gmc_needs_group_ids_and_a_valid_epsilon():
    logp, old, mask = rows_of([[1.0]])
    with pytest.raises(ValueError, match="needs group_ids"):
        gmc_grpo_loss(logp, old, mask, mask)
    with pytest.raises(ValueError, match=r"group_ids must be \[B\]"):
        gmc_grpo_loss(logp, old, mask, mask, group_ids=torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="epsilon must be >= 0"):
        gmc_grpo_loss(logp, old, mask, mask, group_ids=torch.tensor([0]), epsilon=-0.1)


# ----------------------------------------------------------------------------- both


def loss_and_grad(fn, logp, old, adv, mask, mode, **kw):
    lp = logp.detach().clone().requires_grad_(True)
    out = fn(lp, old(lp) if callable(old) else old, adv, mask, **kw)
    total = aggregate(out.loss, mask, mode)
    total.backward()
    return out, total.detach(), lp.grad


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("name", ["tic_grpo", "gmc_grpo"])
def test_on_policy_both_are_grpo_bit_for_bit(name, mode):
    # old = sg(logp): every ratio is exactly 1, s = 1 (w̄ = 1 ≤ 1 + ε): the ppo_clip loss at ratio 1.
    torch.manual_seed(2)
    logp = -torch.rand(6, 5) * 3
    adv = torch.randn(6, 5)
    mask = torch.ones(6, 5)
    mask[2, 3:] = 0
    mask[4, 1:] = 0
    kw = {"group_ids": torch.tensor([0, 0, 0, 1, 1, 2])} if name == "gmc_grpo" else {}
    out, loss, grad = loss_and_grad(POLICY_LOSSES.get(name), logp, lambda lp: lp.detach(), adv, mask, mode, **kw)
    ref, ref_loss, ref_grad = loss_and_grad(ppo_clip_loss, logp, lambda lp: lp.detach(), adv, mask, mode)
    assert torch.equal(out.loss, ref.loss)
    assert torch.equal(loss, ref_loss)
    assert torch.equal(grad, ref_grad)
    assert torch.equal(out.ratio, mask) and out.clipped.sum() == 0
    if name == "gmc_grpo":
        assert torch.equal(out.extra["gmc/scale"], mask) and out.extra["gmc/cap_active"].sum() == 0


# ----------------------------------------------------------------------------- through the objective


class TablePolicy:
    """``completion_logprobs`` over a free logit table: row r is looked up by its first prompt
    token, so a micro-batch sees the same parameters as the whole batch."""

    def __init__(self, rows: int, width: int, vocab: int = 5, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.table = torch.nn.Parameter(torch.randn(rows, width, vocab, generator=g))

    def completion_logprobs(self, prompt_ids, prompt_mask, completion_ids, completion_mask, group_ids=None,
                            temperature=1.0, with_entropy=False):
        logp_all = self.table[prompt_ids[:, 0]][:, : completion_ids.shape[1]].log_softmax(-1)
        logp = logp_all.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
        return logp, (-(logp_all.exp() * logp_all).sum(-1) if with_entropy else None)


def grouped_batch(policy: TablePolicy, group_sizes, t: int = 4, seed: int = 0) -> RolloutBatch:
    """Rows of groups of the given sizes, right-padded, with behaviour log-probs off by noise."""
    n = sum(group_sizes)
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (n,), generator=g)
    mask = (torch.arange(t) < lengths[:, None]).long()
    batch = RolloutBatch(
        prompt_ids=torch.arange(n)[:, None], prompt_mask=torch.ones(n, 1, dtype=torch.long),
        completion_ids=torch.randint(0, 5, (n, t), generator=g) * mask, completion_mask=mask,
        group_ids=torch.repeat_interleave(torch.arange(len(group_sizes)), torch.tensor(group_sizes)),
        rewards=torch.zeros(n), truncated=torch.zeros(n, dtype=torch.bool),
        advantages=torch.randn(n, 1, generator=g).expand(n, t) * mask)
    with torch.no_grad():
        logp, _ = policy.completion_logprobs(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, mask)
    # stale behaviour log-probs: w̄ well above 1 + ε in some groups, so the cap acts
    batch.old_logprobs = (logp - 0.6 * torch.rand(n, t, generator=g)) * mask
    return batch


def accumulate(policy, batch, config, size):
    policy.table.grad = None
    tot = totals(batch, config, norm_len=batch.completion_ids.shape[1])
    losses, sums = [], {}
    for micro in batch.split(size):
        loss, stats = micro_batch_loss(policy, micro, config, tot, 1.0, True)
        loss.backward()
        losses.append(loss.detach())
        for k, v in stats.items():
            sums[k] = sums.get(k, 0.0) + v
    return sum(losses), sums, policy.table.grad.clone()


@pytest.mark.parametrize("mode", AGG_MODES)
def test_gmc_through_the_objective_is_micro_batch_invariant_when_groups_stay_whole(mode):
    sizes = [2, 2, 2, 2]  # 8 rows; micro-batches of 2 and 4 keep every group whole
    policy = TablePolicy(8, 4)
    batch = grouped_batch(policy, sizes)
    config = LossConfig(policy="gmc_grpo", epsilon=0.1, agg=mode)
    whole, sums, g_whole = accumulate(policy, batch, config, 8)
    assert sums["token/gmc/cap_active"] > 0  # the cap really acts in this batch
    for size in (2, 4):
        loss, split_sums, grad = accumulate(policy, batch, config, size)
        assert_close(loss, whole)
        assert_close(grad, g_whole)
        for k in ("token/gmc/scale", "token/gmc/ess", "token/gmc/cap_active"):
            assert split_sums[k] == pytest.approx(sums[k], rel=1e-6)
    # The objective hands the loss the micro-batch's group ids: the result is the direct call's.
    mask = batch.response_mask.float()
    logp, _ = policy.completion_logprobs(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, mask)
    direct = gmc_grpo_loss(logp.detach(), batch.old_logprobs, batch.advantages, mask, group_ids=batch.group_ids, epsilon=0.1)
    assert float(aggregate(direct.loss, mask, mode, total_tokens=int(mask.sum()), total_seqs=8, norm_len=4)) == \
        pytest.approx(float(whole), rel=1e-6)


def test_a_group_split_across_micro_batches_is_refused():
    policy = TablePolicy(7, 4)
    batch = grouped_batch(policy, [3, 4])  # unequal groups (e.g. after GRPODropout)
    config = LossConfig(policy="gmc_grpo")
    with pytest.raises(ConfigError, match=r"group 0 has 2 of its 3 rows in this micro-batch of 2: set "
                                          r"train.micro_batch_size to at least the rows of a mini-batch \(7\)"):
        accumulate(policy, batch, config, 2)
    accumulate(policy, batch, config, 7)  # whole: fine
    # A loss without group_ids never looks at groups.
    accumulate(policy, batch, LossConfig(policy="ppo_clip"), 2)


def test_other_losses_are_called_exactly_as_before():
    policy = TablePolicy(6, 4)
    batch = grouped_batch(policy, [3, 3])
    for name in ("ppo_clip", "gspo", "cispo", "tic_grpo"):
        config = LossConfig(policy=name)
        loss, _, grad = accumulate(policy, batch, config, 6)
        mask = batch.response_mask.float()
        policy.table.grad = None
        logp, _ = policy.completion_logprobs(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, mask)
        out = POLICY_LOSSES.get(name)(logp, batch.old_logprobs, batch.advantages, mask)
        ref = aggregate(out.loss, mask, "token-mean", total_tokens=int(mask.sum()), total_seqs=6, norm_len=4)
        ref.backward()
        assert torch.equal(loss, ref.detach()), name
        assert torch.equal(grad, policy.table.grad), name


# ----------------------------------------------------------------------------- recipes and the trainer


def test_recipe_refuses_batch_sizes_that_cut_groups():
    # mini_recipe: G = 4, 4 prompts per step = 16 rows
    for train in ({"micro_batch_size": 6}, {"mini_batch_size": 6, "micro_batch_size": 6},
                  {"mini_batch_size": 10, "micro_batch_size": 16}):
        with pytest.raises(ConfigError, match="normalises over whole prompt groups"):
            mini_recipe(loss={"policy": "gmc_grpo"}, train=train)
    for train in ({"micro_batch_size": 4}, {"micro_batch_size": 16}, {"micro_batch_size": 6, "mini_batch_size": 4},
                  {"micro_batch_size": 12, "mini_batch_size": 8}, {"mini_batch_size": 20, "micro_batch_size": 20}):
        mini_recipe(loss={"policy": "gmc_grpo"}, train=train)
    mini_recipe(loss={"policy": "tic_grpo"}, train={"micro_batch_size": 6})  # per-row: no constraint
    with pytest.raises(ConfigError, match="unknown parameter 'loss.group_ids'"):
        mini_recipe(loss={"policy": "gmc_grpo", "params": {"group_ids": [0]}})
    with pytest.raises(ConfigError, match="loss.epsilon_high does not apply to loss.policy 'gmc_grpo'"):
        mini_recipe(loss={"policy": "gmc_grpo", "epsilon_high": 0.3})


def varied(completion, problem, **_):
    """A reward that differs within groups, so advantages are not all zero."""
    return (len(completion) % 3) / 2


def drop_first(batch):
    """A selection stage that drops one row inside the first group (as GRPODropout may)."""
    return batch.select(list(range(1, len(batch))))


@pytest.mark.parametrize("name", ["tic_grpo", "gmc_grpo"])
def test_trains_end_to_end_on_stale_behaviour_log_probs(name, tmp_path):
    recipe = mini_recipe(loss={"policy": name, "agg": "seq-mean-token-sum"}, rewards=[{"name": varied}],
                         off_policy={"name": "behaviour_ppo"}, rollout={"simulated_staleness": 1},
                         train={"steps": 3}, eval={"size": 0}, optim={"lr": 1e-2, "warmup_steps": 0})
    Trainer(recipe, tmp_path / "r", log=lambda m: None).run()
    rows = [r for r in read_metrics(tmp_path / "r") if r.get("step", 0) > 0 and "loss" in r]
    assert len(rows) == 3
    keys = {"clip_fraction", "ratio/mean"} | ({"gmc/cap_active", "gmc/scale", "gmc/ess"} if name == "gmc_grpo" else set())
    for row in rows:
        assert keys <= row.keys() and all(math.isfinite(row[k]) for k in keys)
    assert rows[0]["ratio/mean"] == pytest.approx(1.0, abs=1e-4)  # step 1 samples with the current weights
    assert rows[-1]["offpolicy/staleness_mean"] == 1.0


def test_trainer_refuses_a_group_cut_by_a_selection_stage(tmp_path):
    # 16 rows less one = 15 (groups of 3, 4, 4, 4); micro-batches of 8, a multiple of G = 4 that
    # the recipe check accepts, now hold rows 0-7: the 3rd group's first row only
    recipe = mini_recipe(loss={"policy": "gmc_grpo"}, selection=[{"name": drop_first}], train={"steps": 1},
                         eval={"size": 0})
    with pytest.raises(ConfigError, match=r"group \d+ has 1 of its 4 rows in this micro-batch of 8"):
        Trainer(recipe, tmp_path / "r", log=lambda m: None).run()
