"""The objective's wiring, asserted through numbers.

Every term of the loss (policy gradient, KL, entropy), every mask and total it aggregates
with, the statistics it logs, the optimisation loop's clipping, zeroing and LR schedule,
and the calls the training loop must make (π_old, reference log-probs, KL in the reward,
credit under a loss mask, policy versions, method hooks, the prompt sampler's feedback).
These tests kill the hand-written mutants of ``benchmarks/mutants.py`` (``make mutants``).

The objective is tested on a *table policy*: its logits are a free parameter per (row,
position), so each token's gradient can be read off on its own and every expected number
is a few lines of arithmetic. The loop is tested with short runs of the mini model and a
probe method that records what the hooks are handed.
"""

import math

import pytest
import torch

from reasonrl.algos.advantages import grpo_advantages, rloo_advantages
from reasonrl.algos.losses import AGG_MODES
from reasonrl.batch import RolloutBatch
from reasonrl.config import OptimConfig
from reasonrl.hooks import Method
from reasonrl.registry import METHODS
from reasonrl.metrics_log import read_metrics
from reasonrl.train.objective import batch_logprobs, reduce_stats, totals
from reasonrl.train.optim import Learner
from reasonrl.train.trainer import Trainer, outcome_token_rewards

from helpers import TablePolicy, cfg, loss_and_grad, mini_recipe, table_batch


def logp_of(policy: TablePolicy, batch: RolloutBatch) -> torch.Tensor:
    return policy.distribution(batch).gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1)


def entropy_of(policy: TablePolicy, batch: RolloutBatch) -> torch.Tensor:
    logp_all = policy.distribution(batch).detach()
    return -(logp_all.exp() * logp_all).sum(-1)


def k3_by_hand(logp, ref):
    d = ref - logp
    return d.exp() - d - 1.0


def with_reference(policy, batch, seed=1, scale=0.5):
    g = torch.Generator().manual_seed(seed)
    batch.ref_logprobs = (logp_of(policy, batch).detach() + scale * torch.randn(batch.completion_ids.shape, generator=g))
    return batch


# --- the loss's terms ------------------------------------------------------------------------------

def test_kl_in_the_loss_adds_exactly_coef_times_the_gradient_of_the_aggregated_k3():
    policy = TablePolicy(6, 5)
    batch = with_reference(policy, table_batch())
    m = batch.completion_mask.float()
    tot = totals(batch, cfg(), norm_len=5)
    assert tot.tokens == int(m.sum())
    l0, _, g0 = loss_and_grad(policy, batch, cfg(kl=0.0), tot)
    l1, stats, g1 = loss_and_grad(policy, batch, cfg(kl=0.5), tot)
    # By hand: the token mean of k3 = exp(ref − logp) − (ref − logp) − 1 over the trained tokens.
    policy.table.grad = None
    kl = k3_by_hand(logp_of(policy, batch), batch.ref_logprobs)
    kl_term = (kl * m).sum() / m.sum()
    kl_term.backward()
    g_kl = policy.table.grad.clone()
    assert float(kl_term.detach()) > 0.01 and g_kl.abs().max() > 1e-3  # the policy really differs from the reference
    torch.testing.assert_close(l1 - l0, 0.5 * kl_term.detach(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(g1 - g0, 0.5 * g_kl, atol=1e-6, rtol=1e-5)
    assert stats["token/kl"] == pytest.approx(float((kl.detach() * m).sum()), rel=1e-5)
    # With the KL in the reward, the loss has no KL term: the same loss and gradient as coef 0.
    l2, stats2, g2 = loss_and_grad(policy, batch, cfg(kl=0.5, in_reward=True), tot)
    torch.testing.assert_close(l2, l0)
    torch.testing.assert_close(g2, g0)
    assert stats2["token/kl"] == pytest.approx(stats["token/kl"])  # still measured and logged


def test_entropy_bonus_is_subtracted_from_the_loss_and_a_step_raises_the_entropy():
    policy = TablePolicy(6, 5, seed=3)
    batch = table_batch(seed=3)
    m = batch.completion_mask.float()
    tot = totals(batch, cfg(), norm_len=5)
    l0, _, _ = loss_and_grad(policy, batch, cfg(entropy=0.0), tot)
    l1, _, _ = loss_and_grad(policy, batch, cfg(entropy=0.3), tot)
    h_bar = float((entropy_of(policy, batch) * m).sum() / m.sum())
    assert l1 == pytest.approx(float(l0) - 0.3 * h_bar, abs=1e-6)
    # One gradient step on the entropy bonus alone (no advantage) makes the policy less certain.
    batch.advantages = torch.zeros_like(batch.advantages)
    _, _, grad = loss_and_grad(policy, batch, cfg(entropy=1.0), tot)
    with torch.no_grad():
        policy.table -= 1.0 * grad
    after = float((entropy_of(policy, batch) * m).sum() / m.sum())
    assert after > h_bar + 1e-3


def test_truncated_rows_get_no_gradient_and_do_not_count_in_the_token_total():
    truncated = [False, True, False, False, True, False]
    policy = TablePolicy(6, 5, seed=4)
    batch = with_reference(policy, table_batch(seed=4, truncated=truncated))
    rows = torch.tensor(truncated)
    on = cfg(kl=0.2, entropy=0.1, mask_truncated=True)
    tot = totals(batch, on, norm_len=5)
    assert tot.tokens == int(batch.completion_mask[~rows].sum()) < int(batch.completion_mask.sum())
    loss, stats, grad = loss_and_grad(policy, batch, on, tot)
    assert stats["tokens"] == tot.tokens
    assert torch.all(grad[rows] == 0) and grad[~rows].abs().sum() > 0
    # The loss is that of the untruncated rows alone (the same totals, so the same token mean).
    kept = batch.select(torch.nonzero(~rows).squeeze(-1))
    alone, _, _ = loss_and_grad(policy, kept, cfg(kl=0.2, entropy=0.1), tot)
    torch.testing.assert_close(loss, alone)
    # Without the option the truncated rows train and count.
    off = cfg(kl=0.2, entropy=0.1)
    assert totals(batch, off, norm_len=5).tokens == int(batch.completion_mask.sum())
    _, _, grad_off = loss_and_grad(policy, batch, off, totals(batch, off, norm_len=5))
    assert grad_off[rows].abs().sum() > 0


def test_tokens_outside_the_loss_mask_get_no_gradient_and_are_not_counted():
    policy = TablePolicy(6, 5, seed=5)
    batch = with_reference(policy, table_batch(seed=5))
    keep = torch.ones_like(batch.completion_mask)
    keep[:, 1] = 0  # an environment's token at position 1 of every row: attended, not trained on
    batch.loss_mask = keep
    config = cfg(kl=0.3, entropy=0.2)
    tot = totals(batch, config, norm_len=5)
    assert tot.tokens == int((batch.completion_mask * keep).sum())
    _, stats, grad = loss_and_grad(policy, batch, config, tot)
    assert torch.all(grad[:, 1] == 0)
    trained = (batch.completion_mask * keep).bool()
    assert torch.all(grad.abs().sum(-1)[trained] > 0)
    assert stats["tokens"] == tot.tokens


def test_stored_old_logprobs_set_the_ratio_and_the_clip():
    policy = TablePolicy(6, 5, seed=6)
    batch = table_batch(seed=6)
    m = batch.completion_mask.bool()
    g = torch.Generator().manual_seed(0)
    delta = torch.where(torch.rand(batch.completion_ids.shape, generator=g) < 0.5, 0.5, -0.5)
    batch.old_logprobs = logp_of(policy, batch).detach() - delta  # ratio e^{±0.5}, outside [0.8, 1.2]
    _, stats, grad = loss_and_grad(policy, batch, cfg(), totals(batch, cfg(), norm_len=5))
    assert stats["token/ratio/mean"] == pytest.approx(float(delta.exp()[m].sum()), rel=1e-5)
    # PPO clips where the advantage pushes the ratio further out: A > 0 with ρ > 1 + ε, A < 0 with ρ < 1 − ε.
    clipped = (batch.advantages * delta > 0) & m
    assert 0 < int(clipped.sum()) < int(m.sum())
    assert stats["token/clip_fraction"] == int(clipped.sum())
    assert torch.all(grad.abs().sum(-1)[clipped] == 0) and torch.all(grad.abs().sum(-1)[m & ~clipped] > 0)


def test_clip_higher_and_dual_clip_bound_the_loss_where_they_should():
    # One token per row, each row a case; ε = 0.2, ε_high = 0.28, dual clip c = 3.
    advantages = torch.tensor([1.0, -1.0, -1.0, 1.0, -1.0])
    ratios = torch.tensor([1.25, 0.75, math.exp(2.0), math.exp(2.0), 1.1])
    # l = max(−Aρ, −A clip(ρ, 0.8, 1.28)), then min(l, −A c) where A < 0:
    expected = torch.tensor([-1.25, 0.8, 3.0, -1.28, 1.1])  # within ε_high, below 1 − ε, dual, above 1 + ε_high, within
    bounded = torch.tensor([False, True, True, True, False])  # the loss no longer depends on ρ there
    policy = TablePolicy(5, 1, seed=8)
    batch = table_batch(5, 1, seed=8)
    batch.advantages = advantages[:, None]
    batch.old_logprobs = logp_of(policy, batch).detach() - ratios.log()[:, None]
    config = cfg(agg="seq-mean-token-sum", epsilon=0.2, epsilon_high=0.28, dual_clip=3.0)
    loss, stats, grad = loss_and_grad(policy, batch, config, totals(batch, config, norm_len=1))
    assert float(loss) == pytest.approx(float(expected.mean()), rel=1e-5)
    assert stats["token/clip_fraction"] == int(bounded.sum())
    assert torch.all(grad[bounded] == 0) and torch.all(grad[~bounded].abs().sum(-1) > 0)


def test_gspo_on_fresh_data_has_the_reinforce_gradient_of_each_token():
    # s_{i,t} = sg(s_i)·exp(logp_t − sg(logp_t)) with s_i = 1 on fresh data: ∇l_t = −A_t ∇logp_t.
    policy = TablePolicy(6, 5, seed=9)
    batch = table_batch(seed=9)
    m = batch.completion_mask.float()
    config = cfg(policy="gspo")
    _, _, grad = loss_and_grad(policy, batch, config, totals(batch, config, norm_len=5))
    policy.table.grad = None
    (-(batch.advantages * logp_of(policy, batch) * m).sum() / m.sum()).backward()
    torch.testing.assert_close(grad, policy.table.grad, atol=1e-6, rtol=1e-5)


def test_logged_statistics_are_means_over_trained_tokens_and_optimiser_steps():
    policy = TablePolicy(6, 5, seed=7)
    batch = with_reference(policy, table_batch(seed=7))
    m = batch.completion_mask.float()
    assert m.sum() < m.numel()  # there is padding to leave out
    config = cfg(kl=0.1, entropy=0.1)
    tot = totals(batch, config, norm_len=5)
    policy_loss, _, _ = loss_and_grad(policy, batch, cfg(), tot)  # the logged loss is the policy term alone
    sums: dict[str, float] = {}
    for _pass in range(2):  # two optimiser steps over the same data, each in two micro-batches
        for micro in batch.split(4):
            _, stats, _ = loss_and_grad(policy, micro, config, tot)
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + v
    out = reduce_stats(sums, optimizer_steps=2)
    assert out["loss"] == pytest.approx(float(policy_loss), rel=1e-5)  # per optimiser step
    whole, _, _ = loss_and_grad(policy, batch, config, tot)  # loss/total: the objective with KL and entropy
    assert out["loss/total"] == pytest.approx(float(whole), rel=1e-5)
    assert abs(out["loss/total"] - out["loss"]) > 1e-3
    h = entropy_of(policy, batch)
    assert out["entropy"] == pytest.approx(float((h * m).sum() / m.sum()), rel=1e-5)
    kl = k3_by_hand(logp_of(policy, batch).detach(), batch.ref_logprobs)
    assert out["kl"] == pytest.approx(float((kl * m).sum() / m.sum()), rel=1e-5)
    assert out["ratio/mean"] == pytest.approx(1.0) and out["clip_fraction"] == 0.0


# --- invariants, over many random batches (plain seeded loops: no extra dependency) ----------------

@pytest.mark.parametrize("agg", AGG_MODES)
def test_the_micro_batch_split_does_not_change_the_summed_loss_or_gradient(agg):
    for seed in range(6):
        g = torch.Generator().manual_seed(100 + seed)
        n = int(torch.randint(3, 9, (1,), generator=g))
        truncated = (torch.rand(n, generator=g) < 0.3).tolist()
        policy = TablePolicy(n, 6, seed=seed)
        batch = with_reference(policy, table_batch(n, 6, seed=seed, truncated=truncated), seed=seed)
        batch.old_logprobs = logp_of(policy, batch).detach() + 0.3 * torch.randn(n, 6, generator=g)
        batch.loss_mask = (torch.rand(n, 6, generator=g) < 0.8).long()
        config = cfg(kl=0.3, entropy=0.1, agg=agg, mask_truncated=seed % 2 == 0)
        tot = totals(batch, config, norm_len=7)
        full, _, g_full = loss_and_grad(policy, batch, config, tot)
        for size in (1, 2, 3):
            parts = [loss_and_grad(policy, micro, config, tot) for micro in batch.split(size)]
            torch.testing.assert_close(sum(p[0] for p in parts), full, atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(sum(p[2] for p in parts), g_full, atol=1e-6, rtol=1e-5)


def test_group_relative_advantages_have_zero_group_mean_and_unit_group_std():
    flat = spread = 0
    for seed in range(25):
        g = torch.Generator().manual_seed(seed)
        sizes = torch.randint(1, 6, (int(torch.randint(1, 6, (1,), generator=g)),), generator=g)
        group_ids = torch.repeat_interleave(torch.arange(len(sizes)) * 7 + 3, sizes)  # sparse ids
        n, t = len(group_ids), 4
        lengths = torch.randint(1, t + 1, (n,), generator=g)
        mask = (torch.arange(t) < lengths[:, None]).long()
        rewards = torch.randint(0, 3, (n,), generator=g).float() / 2  # {0, 0.5, 1}: flat groups happen
        token_rewards = torch.zeros(n, t)
        token_rewards[torch.arange(n), lengths - 1] = rewards
        for name, adv in [(f"grpo/{s}", grpo_advantages(token_rewards, mask, group_ids, scale=s))
                          for s in ("group", "batch", "none")] + [("rloo", rloo_advantages(token_rewards, mask, group_ids))]:
            assert torch.isfinite(adv).all(), (seed, name)
            assert torch.all(adv[mask == 0] == 0), (seed, name)
            per_seq = adv[:, 0]
            assert torch.allclose(adv, per_seq[:, None] * mask), (seed, name)  # one value per sequence
            for gid in group_ids.unique():
                a, r = per_seq[group_ids == gid], rewards[group_ids == gid]
                assert abs(float(a.mean())) < 1e-5, (seed, name)
                if len(a) == 1 or torch.all(r == r[0]):
                    assert torch.all(a == 0), (seed, name)
                    flat += 1
                elif name == "grpo/group":
                    assert float(a.std()) == pytest.approx(1.0, rel=1e-4), (seed, name)
                    spread += 1
    assert flat > 0 and spread > 0, (flat, spread)  # both kinds of group were drawn and checked


# --- the optimisation loop ---------------------------------------------------------------------------

def rows(n: int) -> RolloutBatch:
    return table_batch(n, 2)


def test_the_learner_clips_the_gradient_norm_and_starts_every_step_from_a_zero_gradient():
    g = torch.tensor([6.0, 8.0, 0.0])  # |g| = 10

    def learner(w, max_norm):
        return Learner([w], OptimConfig(name="sgd", lr=1.0, warmup_steps=0, max_grad_norm=max_norm), total_steps=10)

    def loss_fn(w):
        return lambda micro, mini, _p, _j: ((w * g).sum() * len(micro) / len(mini), {"calls": 1.0})

    w = torch.nn.Parameter(torch.zeros(3))
    sums, norms = learner(w, 1.0).optimise(rows(4), loss_fn(w), micro_batch_size=3)  # two micro-batches, one step
    assert norms == pytest.approx([10.0]) and sums == {"calls": 2.0}
    torch.testing.assert_close(w.detach(), -g / 10)  # the step of a gradient clipped to norm 1
    # Two passes in mini-batches of 2 rows: four optimiser steps, each from its own gradient only.
    w = torch.nn.Parameter(torch.zeros(3))
    sums, norms = learner(w, 100.0).optimise(rows(4), loss_fn(w), passes=2, mini_batch_size=2, micro_batch_size=1)
    assert norms == pytest.approx([10.0] * 4) and sums == {"calls": 8.0}
    torch.testing.assert_close(w.detach(), -4 * g)


def train_rows(run_dir):
    return [r for r in read_metrics(run_dir) if "loss" in r]


def test_the_logged_lr_follows_linear_warmup_then_linear_decay(tmp_path):
    lr, warmup, steps = 1e-3, 2, 5
    recipe = mini_recipe(optim={"lr": lr, "warmup_steps": warmup, "schedule": "linear"}, train={"steps": steps},
                         eval={"size": 0})
    Trainer(recipe, tmp_path / "r", log=lambda m: None).run()
    # η_t = η (t + 1)/W during warm-up, then η (1 − (t − W)/(T − W)).
    expected = [lr * ((t + 1) / warmup if t < warmup else 1 - (t - warmup) / (steps - warmup)) for t in range(steps)]
    assert [r["lr"] for r in train_rows(tmp_path / "r")] == pytest.approx(expected, rel=1e-9)


# --- the loop's wiring --------------------------------------------------------------------------------

def varied(completion, problem, **_):
    """A reward in {0, ½, 1} that differs within groups, so the mini model has something to learn."""
    return (len(completion) % 3) / 2


class Probe(Method):
    """Records what the hooks are handed; ``mask_tail`` > 0 makes ``annotate`` exclude each
    row's last ``mask_tail`` completion tokens from the loss (an environment's closing tokens)."""

    last: "Probe | None" = None

    def __init__(self, mask_tail: int = 0):
        self.mask_tail = mask_tail
        self.calls: list[tuple[str, int, int]] = []
        self.seen: list[dict] = []

    def setup(self, ctx):
        self.policy, self.recipe = ctx.policy, ctx.recipe
        Probe.last = self

    def annotate(self, batch, step):
        if self.mask_tail:
            lengths = batch.completion_mask.sum(-1)
            keep = torch.ones_like(batch.completion_mask)
            for i, n in enumerate(lengths.tolist()):
                if n > self.mask_tail:
                    keep[i, n - self.mask_tail:n] = 0
            batch.loss_mask = keep
        r = self.recipe
        self.calls.append(("annotate", step, batch.policy_version))
        self.logp_before = batch_logprobs(self.policy, batch, r.train.micro_batch_size, r.rollout.temperature,
                                          r.train.share_prompt)
        self.weights_before = [p.detach().clone() for p in self.policy.parameters()]
        return {}

    def after_update(self, batch, step):
        self.calls.append(("after_update", step, batch.policy_version))
        moved = any(not torch.equal(a, p.detach()) for a, p in zip(self.weights_before, self.policy.parameters()))
        self.seen.append({"batch": batch, "logp_before": self.logp_before, "moved": moved})
        return {"probe/after_update": 1.0}


@pytest.fixture
def probe():
    METHODS._items["_probe"] = Probe
    Probe.last = None
    yield lambda: Probe.last
    del METHODS._items["_probe"]


def test_hooks_run_around_every_update_and_policy_versions_count_optimiser_steps(tmp_path, probe):
    recipe = mini_recipe(methods=[{"name": "_probe"}], rewards=[{"name": varied}], eval={"size": 0},
                         train={"steps": 2, "num_iterations": 2, "mini_batch_size": 8}, optim={"warmup_steps": 0})
    Trainer(recipe, tmp_path / "r", log=lambda m: None).run()
    p = probe()
    assert [c[:2] for c in p.calls] == [("annotate", 0), ("after_update", 0), ("annotate", 1), ("after_update", 1)]
    assert all(s["moved"] for s in p.seen)  # after_update sees the policy after its optimiser steps
    # 4 prompts × 4 samples = 16 rows, 8 per mini-batch, 2 passes: 4 optimiser steps per training step.
    rows_ = train_rows(tmp_path / "r")
    assert [r["policy_version"] for r in rows_] == [4, 8]
    assert [c[2] for c in p.calls if c[0] == "annotate"] == [0, 4]  # each batch records the version that sampled it
    assert all(r["probe/after_update"] == 1.0 for r in rows_)


def test_a_second_pass_takes_its_ratio_against_the_policy_that_sampled(tmp_path, probe):
    recipe = mini_recipe(methods=[{"name": "_probe"}], rewards=[{"name": varied}], eval={"size": 0},
                         train={"steps": 1, "num_iterations": 2}, optim={"lr": 1e-2, "warmup_steps": 0})
    Trainer(recipe, tmp_path / "r", log=lambda m: None).run()
    seen = probe().seen[0]
    assert seen["batch"].old_logprobs is not None
    torch.testing.assert_close(seen["batch"].old_logprobs, seen["logp_before"])
    row = train_rows(tmp_path / "r")[0]
    assert abs(row["ratio/mean"] - 1.0) > 1e-4  # the second pass saw the policy move away from π_old


def test_the_reference_log_probs_feed_the_kl(tmp_path):
    recipe = mini_recipe(rewards=[{"name": varied}], loss={"kl": {"coef": 0.1}}, eval={"size": 0},
                         train={"steps": 2}, optim={"lr": 1e-2, "warmup_steps": 0})
    Trainer(recipe, tmp_path / "r", log=lambda m: None).run()
    kl = [r.get("kl") for r in train_rows(tmp_path / "r")]
    assert kl[0] == pytest.approx(0.0, abs=1e-6) and kl[1] > 1e-5  # the reference is the starting policy


def test_kl_in_the_reward_is_subtracted_from_the_token_rewards(tmp_path, probe):
    coef = 0.5
    recipe = mini_recipe(methods=[{"name": "_probe"}], rewards=[{"name": varied}], eval={"size": 0},
                         loss={"kl": {"coef": coef, "in_reward": True}}, train={"steps": 2},
                         optim={"lr": 1e-2, "warmup_steps": 0})
    Trainer(recipe, tmp_path / "r", log=lambda m: None).run()
    assert len(probe().seen) > 1, "the probe did not see the second step"
    for step, seen in enumerate(probe().seen):
        b = seen["batch"]
        m = b.response_mask.float()
        kl = k3_by_hand(seen["logp_before"], b.ref_logprobs) * m
        # r'_t = r_t − β·k3_t on every trained token, the outcome r on the last one.
        torch.testing.assert_close(b.token_rewards, outcome_token_rewards(b) - coef * kl, atol=1e-6, rtol=1e-5)
        if step == 1:
            assert kl.abs().max() > 1e-4  # by the second step the policy has left the reference


def test_credit_uses_the_response_mask_when_a_loss_mask_is_set(tmp_path, probe):
    recipe = mini_recipe(methods=[{"name": "_probe", "mask_tail": 2}], rewards=[{"name": varied}], eval={"size": 0},
                         advantage={"name": "reinforce_pp_baseline"}, train={"steps": 1})
    Trainer(recipe, tmp_path / "r", log=lambda m: None).run()
    b = probe().seen[0]["batch"]
    r = b.response_mask.bool()
    assert (b.completion_mask.bool() & ~r).any()  # the loss mask removes attended tokens
    assert len(set(b.rewards.tolist())) > 1
    # The outcome reward sits on each row's last trained token: the row's score is its reward.
    torch.testing.assert_close((b.token_rewards * r).sum(-1), b.rewards)
    assert torch.all(b.token_rewards[~r] == 0)
    # REINFORCE++-baseline whitens over exactly the trained tokens; nothing leaks outside them.
    assert torch.all(b.advantages[~r] == 0)
    a = b.advantages[r]
    assert abs(float(a.mean())) < 1e-5 and float(a.var()) == pytest.approx(1.0, rel=1e-4)


def test_the_micro_batch_split_does_not_change_a_training_step(tmp_path):
    logged = []
    for micro in (16, 3):
        recipe = mini_recipe(rewards=[{"name": varied}], eval={"size": 0}, train={"steps": 1, "micro_batch_size": micro},
                             loss={"agg": "token-mean", "entropy_coef": 0.05})
        Trainer(recipe, tmp_path / str(micro), log=lambda m: None).run()
        logged.append(train_rows(tmp_path / str(micro))[0])
    a, b = logged
    assert a["grad_norm"] > 0
    for key in ("loss", "grad_norm", "entropy"):
        assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key


def test_the_prompt_sampler_observes_every_sampled_group(tmp_path):
    steps, prompts, g = 2, 4, 4
    recipe = mini_recipe(sampler={"name": "learnability"}, rewards=[{"name": varied}], eval={"size": 0},
                         train={"steps": steps})
    trainer = Trainer(recipe, tmp_path / "r", log=lambda m: None)
    trainer.run()
    stats = trainer.sampler.stats
    assert sum(n for _, n in stats.values()) == steps * prompts * g
    rewarded = sum(r["reward/mean"] * prompts * g for r in train_rows(tmp_path / "r"))
    assert sum(s for s, _ in stats.values()) == pytest.approx(rewarded, rel=1e-6)
    assert not math.isclose(rewarded, 0.0)
