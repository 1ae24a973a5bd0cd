"""``train.skip_zero_advantage``: rows without advantage leave the learner's forward and backward,
and the loss, the gradient and the update stay what they were.

On the table policy of ``helpers`` each row owns its own logits, so a row's gradient can be read
off on its own: a left-out row must have had an exactly zero gradient, and every other row's
gradient must not move."""

import pytest
import torch

from reasonrl.algos.losses import AGG_MODES
from reasonrl.metrics_log import read_metrics
from reasonrl.train.objective import micro_batch_loss, reduce_stats, rows_with_signal, totals, zero_advantage_skip_blocker
from reasonrl.train.optim import Learner
from reasonrl.train.trainer import Trainer

from helpers import TablePolicy, cfg, loss_and_grad, mini_recipe, table_batch, weights

N, T = 8, 5


def batch_with_silent_rows():
    """table_batch with rows 1 and 3 at zero advantage, and row 5 with advantages only on padding
    (the loss never sees them): rows 1, 3 and 5 carry no signal."""
    batch = table_batch(N, T, seed=3)
    batch.completion_mask[5, 2:] = 0
    batch.advantages = batch.advantages * batch.completion_mask
    batch.advantages[1] = 0.0
    batch.advantages[3] = 0.0
    batch.advantages[5] = 0.0
    batch.advantages[5, 2:] = 7.0  # outside the mask
    return batch


def test_rows_with_signal_keeps_rows_with_a_nonzero_advantage_under_the_mask():
    batch = batch_with_silent_rows()
    kept = rows_with_signal(batch, cfg())
    assert kept.prompt_ids[:, 0].tolist() == [0, 2, 4, 6, 7]
    # Every row has a signal: the micro-batch itself, not a copy.
    full = table_batch(N, T, seed=3)
    assert rows_with_signal(full, cfg()) is full
    # No row has one: the first row stays, so the backward still runs.
    full.advantages = torch.zeros_like(full.advantages)
    assert rows_with_signal(full, cfg()).prompt_ids[:, 0].tolist() == [0]


def test_a_truncated_row_masked_by_the_loss_carries_no_signal():
    batch = table_batch(N, T, seed=3, truncated=[False, True, False, False, False, False, False, False])
    assert 1 in rows_with_signal(batch, cfg()).prompt_ids[:, 0].tolist()
    assert 1 not in rows_with_signal(batch, cfg(mask_truncated=True)).prompt_ids[:, 0].tolist()


@pytest.mark.parametrize("policy_loss", ["ppo_clip", "gspo", "cispo"])
@pytest.mark.parametrize("agg", AGG_MODES)
def test_leaving_out_rows_without_advantage_changes_neither_loss_nor_gradient(policy_loss, agg):
    batch = batch_with_silent_rows()
    policy = TablePolicy(N, T)
    config = cfg(policy=policy_loss, agg=agg)
    tot = totals(batch, config, norm_len=T)
    # π_old a little off π_θ, so ratios and clipping are not trivial.
    with torch.no_grad():
        logp, _ = policy.completion_logprobs(batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                             batch.completion_mask)
    batch.old_logprobs = (logp + 0.3 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(1))) \
        * batch.completion_mask
    loss_all, stats_all, grad_all = loss_and_grad(policy, batch, config, tot)
    loss_kept, stats_kept, grad_kept = loss_and_grad(policy, batch, config, tot, skip_zero_advantage=True)
    silent = [1, 3, 5]
    assert grad_all[silent].abs().sum() == 0  # what is left out had no gradient to give
    assert grad_all.abs().sum() > 0
    torch.testing.assert_close(grad_kept, grad_all, atol=0, rtol=1e-6)
    torch.testing.assert_close(loss_kept, loss_all, atol=1e-7, rtol=1e-6)
    assert (stats_kept["skip/rows"], stats_kept["skip/left_out"]) == (N, 3)
    assert "skip/rows" not in stats_all
    # The token statistics are over the computed rows.
    assert stats_kept["tokens"] == stats_all["tokens"] - float(batch.completion_mask[silent].sum())


def test_a_micro_batch_without_signal_leaves_a_zero_gradient_that_adamw_steps_on():
    """A whole micro-batch at zero advantage: one row is computed, the gradient is a zero tensor
    (not None), so AdamW's moments and weight decay move exactly as for the full micro-batch."""
    batch = table_batch(N, T, seed=3)
    batch.advantages = torch.zeros_like(batch.advantages)
    config = cfg()
    tot = totals(batch, config, norm_len=T)
    tables = []
    for skip in (False, True):
        policy = TablePolicy(N, T)
        learner = Learner(policy.parameters(), mini_recipe().optim, total_steps=4)
        # A first step with a signal gives Adam moments that the silent step then decays.
        first = table_batch(N, T, seed=4)
        learner.optimise(first, lambda m, mini, p, j: micro_batch_loss(policy, m, config, totals(mini, config, T),
                                                                       1.0, True, skip_zero_advantage=skip),
                         micro_batch_size=N)
        sums, norms = learner.optimise(
            batch, lambda m, mini, p, j: micro_batch_loss(policy, m, config, tot, 1.0, True, skip_zero_advantage=skip),
            micro_batch_size=3)
        assert norms == [0.0]
        tables.append(policy.table.detach().clone())
        if skip:
            assert reduce_stats(sums, 1)["train/skipped_fraction"] == pytest.approx((N - 3) / N)  # one row per micro-batch
    assert not torch.equal(tables[0], TablePolicy(N, T).table.detach())  # the silent step moved the weights
    torch.testing.assert_close(tables[1], tables[0], atol=0, rtol=0)


class _Probe:
    row_skipping = False


@pytest.mark.parametrize("overrides, terms, learner, reason", [
    ({}, (), None, None),
    ({"loss": {"kl": {"coef": 0.1, "in_reward": True}}}, (), None, None),
    ({"loss": {"kl": {"coef": 0.1}}}, (), None, "KL term"),
    ({"loss": {"entropy_coef": 0.01}}, (), None, "entropy term"),
    ({"loss": {"policy": "none"}}, (), None, "not marked"),
    ({}, (lambda inputs: (0.0, {}),), None, "method adds a loss term"),
    ({}, (), _Probe(), "computes every row"),
])
def test_the_skip_applies_only_where_it_is_exact(overrides, terms, learner, reason):
    recipe = mini_recipe(train={"skip_zero_advantage": True}, **overrides)
    blocker = zero_advantage_skip_blocker(recipe, terms, learner)
    assert blocker is None if reason is None else reason in blocker


def test_learners_that_need_every_row_say_so():
    """LoGRA's sketch hooks see every row; FSDP2 ranks must make the same forward calls (a rank
    with rows left out would wait on a collective the others never reach)."""
    from reasonrl.methods.logra.optimizer import LoGRALearner
    from reasonrl.train.fsdp import ShardedLearner

    assert LoGRALearner.row_skipping is False and ShardedLearner.row_skipping is False
    assert Learner.row_skipping is True


def sparse_reward(completion, problem, **_):
    """1 for a completion whose length is a multiple of 4: rare enough on the untrained mini model
    that many groups agree on 0, common enough that some do not."""
    return float(len(completion) % 4 == 0)


def test_a_run_with_the_skip_trains_the_same_weights(tmp_path):
    """SGD, whose update is linear in the gradient: Adam would turn the float rounding of a
    near-zero gradient element into a step of ±lr, which says nothing about the skip."""
    runs = {}
    for skip in (False, True):
        recipe = mini_recipe(train={"steps": 3, "skip_zero_advantage": skip, "micro_batch_size": 5},
                             rewards=[{"name": sparse_reward}], eval={"size": 0},
                             optim={"name": "sgd", "lr": 0.5, "warmup_steps": 0, "max_grad_norm": 100.0})
        Trainer(recipe, tmp_path / str(skip), log=lambda m: None).run()
        runs[skip] = (weights(tmp_path / str(skip)), [r for r in read_metrics(tmp_path / str(skip)) if r["step"] > 0])
    (w_all, rows_all), (w_skip, rows_skip) = runs[False], runs[True]
    fractions = [r["train/skipped_fraction"] for r in rows_skip]
    assert any(0 < f < 1 for f in fractions), fractions  # some rows were left out, not all
    assert all("train/skipped_fraction" not in r for r in rows_all)
    assert [r["reward/mean"] for r in rows_skip] == [r["reward/mean"] for r in rows_all]  # same samples
    for k in w_all:
        torch.testing.assert_close(w_skip[k], w_all[k], atol=1e-7, rtol=1e-6)
    start = weights_at_start(tmp_path)
    assert any(not torch.equal(w_all[k], start[k]) for k in w_all if k in start)  # the runs did learn


def weights_at_start(tmp_path):
    """The mini model's starting weights (a run of 0 updates would need a recipe of its own)."""
    recipe = mini_recipe()
    trainer = Trainer(recipe, tmp_path / "start", log=lambda m: None)
    trainer.setup()
    state = {k: v.detach().clone() for k, v in trainer.policy.model.state_dict().items()}
    trainer.close()
    return state
