"""GRPODropout: entropy push, the per-group selection rules, recentring, adapters, one run."""

import json
import math
import random

import pytest
import torch

from reasonrl.methods.grpo_dropout import stages as gd
from reasonrl.algos.advantages import grpo_advantages
from reasonrl.batch import RolloutBatch
from reasonrl.registry import ADVANTAGES, SELECTORS
from reasonrl.metrics_log import read_metrics
from reasonrl.train.trainer import Trainer

from helpers import mini_recipe, recipe_diff

# ---------------------------------------------------------------- the worked group (G = 8)
# Rewards 1,1,1,1,0,0,0,0: mean 1/2, unbiased std sqrt(8·(1/4)/7) = sqrt(2/7) = 0.534522,
# so A = ±a with a = 0.5 / (0.534522 + 1e-6) = 0.935413.
# Surprisals s = −ℓ = 0.05 0.25 0.8 0.75 | 0.35 0.4 0.6 0.8, sum 1.85 + 2.15 = 4, Ĥ = 0.5,
# s − Ĥ = −0.45 −0.25 0.3 0.25 | −0.15 −0.1 0.1 0.3, and P = A (s − Ĥ) flips the last four:
# P / a = −0.45 −0.25 0.3 0.25 | 0.15 0.1 −0.1 −0.3        (Σ P/a = 0.8 − 1.1 = −0.3)
REWARDS = [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
SURPRISAL = [0.05, 0.25, 0.8, 0.75, 0.35, 0.4, 0.6, 0.8]
A = 0.5 / (math.sqrt(2 / 7) + 1e-6)
PUSH_OVER_A = [-0.45, -0.25, 0.3, 0.25, 0.15, 0.1, -0.1, -0.3]


def worked(variant="balance", **kw):
    rewards = torch.tensor(REWARDS)
    seq_lp = -torch.tensor(SURPRISAL, dtype=torch.float64)
    return gd.grpo_dropout_select(rewards, seq_lp, torch.zeros(8, dtype=torch.long), variant=variant, **kw)


def test_entropy_push_on_the_worked_group():
    _, push, adv = worked()
    assert adv.tolist() == pytest.approx([A] * 4 + [-A] * 4, rel=1e-9)
    assert push.tolist() == pytest.approx([A * p for p in PUSH_OVER_A], rel=1e-9)
    # (1/G) Σ P = −Cov(A, ℓ): population covariance, A has zero mean.
    ell = -torch.tensor(SURPRISAL, dtype=torch.float64)
    assert float(push.mean()) == pytest.approx(-float((adv * (ell - ell.mean())).mean()), rel=1e-9)
    assert float(push.sum()) == pytest.approx(-0.3 * A, rel=1e-9)


def test_entropy_push_uses_each_groups_own_centre():
    # Group 0: A = (+1, −1), s = (1, 3), Ĥ = 2 → P = (1·(−1), −1·(1)) = (−1, −1).
    # Group 1: A = (2, −2), s = (0, 0) → P = 0.
    push = gd.entropy_push(torch.tensor([1.0, -1.0, 2.0, -2.0]), torch.tensor([-1.0, -3.0, 0.0, 0.0]),
                           torch.tensor([5, 5, 9, 9]))
    assert push.tolist() == [-1.0, -1.0, 0.0, 0.0]


def test_sequence_logprob_avg_and_sum_ignore_padding():
    lp = torch.tensor([[-1.0, -2.0, float("nan")], [-0.5, 7.0, 7.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert gd.sequence_logprob(lp, mask, "avg").tolist() == [-1.5, -0.5]  # (−1 −2)/2, −0.5/1
    assert gd.sequence_logprob(lp, mask, "sum").tolist() == [-3.0, -0.5]


def test_balance_drops_only_the_most_negative_push():
    # pos = {2,3,4,5}, Σ = 0.8a; negatives least negative first: 6 (−0.1), 1 (−0.25), 7 (−0.3), 0 (−0.45).
    # Running sum: 0.7a, 0.45a, 0.15a (all > 0, kept), then 0.15a − 0.45a < 0 → stop: row 0 dropped,
    # the most probable correct answer (ℓ = −0.05).
    kept, push, _ = worked("balance")
    assert kept.tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert float(push[kept].sum()) == pytest.approx(0.15 * A, rel=1e-9)


def test_threshold_at_a1_and_a_half():
    # a = 1: target 0.8a; the first negative already gives 0.7a ≤ 0.8a → every negative push dropped.
    kept, _, _ = worked("threshold", step=0, total_steps=5)
    assert kept.tolist() == [2, 3, 4, 5]
    # step 2 of 5: a = 1 + (0 − 1)(3 − 1)/(5 − 1) = 0.5, target 0.4a: 0.7a keep 6, 0.45a keep 1,
    # 0.15a ≤ 0.4a stop.
    kept, _, _ = worked("threshold", step=2, total_steps=5)
    assert kept.tolist() == [1, 2, 3, 4, 5, 6]
    # The last step has a = 0: identical to balance.
    assert worked("threshold", step=4, total_steps=5)[0].tolist() == worked("balance")[0].tolist()


def test_threshold_schedule():
    assert gd.threshold_ratio(0, 5) == 1.0
    assert gd.threshold_ratio(2, 5) == 0.5
    assert gd.threshold_ratio(4, 5) == 0.0
    assert gd.threshold_ratio(1, 5, a0=0.8, a1=0.4) == pytest.approx(0.7)  # 0.8 − 0.4·(1/4)
    assert gd.threshold_ratio(0, 1) == 1.0  # one-step run: a0


def test_drop_pos_drops_only_positive_advantage_rollouts():
    # Negative pushes with A > 0 (rows 0 and 1) are always dropped. Greedy over negatives with
    # A ≤ 0: 6 (−0.1) → 0.7a, 7 (−0.3) → 0.4a. Prune candidates (P > 0, A > 0), by P desc: 2 (0.3),
    # 3 (0.25). Subsets: {2} → 0.1a, {3} → 0.15a, {2,3} → −0.15a (invalid) ⇒ drop row 2.
    kept, push, adv = worked("drop_pos")
    assert kept.tolist() == [3, 4, 5, 6, 7]
    assert float(push[kept].sum()) == pytest.approx(0.1 * A, rel=1e-9)
    dropped = sorted(set(range(8)) - set(kept.tolist()))
    assert all(adv[i] > 0 for i in dropped)


def test_drop_pos_respects_min_keep_in_the_subset_search():
    # P = (0.5, 0.4, 0.3, −0.05), A = (1, 1, 1, −1), G = 4, m = 1. The greedy keeps all four
    # (1.2 − 0.05 = 1.15). Candidates (A > 0) 0, 1, 2 by P desc.
    # Smallest sum > 0: drop {0,1,2} → −0.05 (invalid); drop {0,1} → 0.25; {0,2} → 0.35;
    # {1,2} → 0.45; … best {0,1} leaves rows 2, 3 (sum 0.25).
    push = torch.tensor([0.5, 0.4, 0.3, -0.05], dtype=torch.float64)
    adv = torch.tensor([1.0, 1.0, 1.0, -1.0], dtype=torch.float64)
    assert gd.balanced_push_drop_pos_select(push, adv).tolist() == [2, 3]
    # With min_keep = 3 only one row may go: drop 0 → 0.65 is the smallest (dropping one row).
    assert gd.balanced_push_drop_pos_select(push, adv, min_keep=3).tolist() == [1, 2, 3]


def test_min_keep_fills_with_zero_pushes():
    # G = 8, m = 2. pos = {0}: 0.5; the least negative −0.6 would give −0.1 ≤ 0 → no negative.
    # One row < m: fill with zero pushes in index order → row 2.
    push = torch.tensor([0.5, -0.6, 0.0, 0.0, -0.7, -0.8, -0.9, -1.0])
    assert gd.balanced_push_select(push).tolist() == [0, 2]
    assert gd.balanced_push_select(push, min_keep=3).tolist() == [0, 2, 3]
    # No zero push to fill with: the kept set stays below m (adding a negative would break Σ > 0).
    push = torch.tensor([0.5, -0.6, -0.7, -0.8, -0.9, -1.0, -1.1, -1.2])
    assert gd.balanced_push_select(push).tolist() == [0]


def test_single_sign_groups():
    # Only negatives and zeros: no positive, fill zeros (row 0), then negatives least negative first (row 1).
    push = torch.tensor([0.0, -0.1, -0.2, -0.3, -0.4, -0.5, -0.6, -0.7])
    assert gd.balanced_push_select(push).tolist() == [0, 1]
    # Only negatives: the two least negative.
    assert gd.balanced_push_select(torch.tensor([-0.3, -0.1, -0.2, -0.9])).tolist() == [1]  # G = 4, m = 1
    assert gd.balanced_push_select(torch.tensor([-0.3, -0.1, -0.2, -0.9, -1, -1, -1, -1])).tolist() == [1, 2]
    # Only positives: every positive push is kept, whatever m.
    assert gd.balanced_push_select(torch.tensor([0.1, 0.2, 0.0, 0.3, 0.0, 0.0, 0.0, 0.0])).tolist() == [0, 1, 3]
    # One positive, m = 2: fill with the first zero push.
    assert gd.balanced_push_select(torch.tensor([0.0, 0.0, 0.3, 0.0, 0.0, 0.0, 0.0, 0.0])).tolist() == [0, 2]


def test_all_zero_groups_keep_a_seeded_random_subset():
    push = torch.zeros(8)
    picks = {tuple(gd.balanced_push_select(push, key=f"3407:{step}:0").tolist()) for step in range(20)}
    assert all(len(p) == 2 and len(set(p)) == 2 for p in picks)  # m = ⌊8/4⌋ = 2 distinct rows
    assert len(picks) > 1  # the pick depends on the key (step), it is not always the same rows
    again = gd.balanced_push_select(push, key="3407:5:0").tolist()
    assert again == gd.balanced_push_select(push, key="3407:5:0").tolist()
    assert gd.balanced_push_select(torch.zeros(3)).numel() == 1  # m = max(1, ⌊3/4⌋) = 1


@pytest.mark.parametrize("variant", gd.VARIANTS)
def test_kept_push_sum_positive_whenever_a_positive_push_exists(variant):
    gen = torch.Generator().manual_seed(0)
    positive = greedy = 0
    for _ in range(300):
        g = int(torch.randint(2, 11, (1,), generator=gen))
        push = torch.randn(g, generator=gen, dtype=torch.float64)
        push[torch.rand(g, generator=gen) < 0.2] = 0.0
        adv = torch.randn(g, generator=gen, dtype=torch.float64)
        if variant == "drop_pos":
            kept = gd.balanced_push_drop_pos_select(push, adv)
        else:
            kept = gd.balanced_push_select(push, ratio=0.5 if variant == "threshold" else 0.0)
        assert kept.numel() >= 1 and kept.tolist() == sorted(set(kept.tolist()))
        if (push > 0).any():
            assert float(push[kept].sum()) > 0
            positive += 1
        if variant == "balance" and (push > 0).any() and (push < 0).any():
            # Smallest positive sum reachable greedily: the best dropped negative would break it.
            dropped_neg = [float(push[i]) for i in range(g) if i not in kept.tolist() and push[i] < 0]
            if dropped_neg:
                assert float(push[kept].sum()) + max(dropped_neg) <= 1e-12
                greedy += 1
    assert positive > 0, "no draw had a positive push"
    assert variant != "balance" or greedy > 0, "no draw dropped a negative push: the greedy bound went unchecked"


def test_weighted_recentring_modes_by_hand():
    # Kept rewards (1, 0, 0): mean 1/3, unbiased std sqrt(((2/3)² + 2(1/3)²)/2) = sqrt(1/3) = 0.577350,
    # A' = (1.154700, −0.577350, −0.577350). w = softmax(log .5, log .25, log .25) = (.5, .25, .25),
    # E_w A' = 0.5·1.154700 − 0.5·0.577350 = 0.288675 → c = (0.866025, −0.866025, −0.866025).
    tr = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    mask = torch.ones(3, 2)
    gid = torch.zeros(3, dtype=torch.long)
    ell = torch.log(torch.tensor([0.5, 0.25, 0.25]))
    centre = gd.grpo_dropout_advantages(tr, mask, gid, ell, center="weighted_center")
    assert centre[:, 0].tolist() == pytest.approx([0.866025, -0.866025, -0.866025], abs=2e-6)
    # rescale: mean|A'| = 2.309401/3 = 0.769800, mean|c| = 0.866025 → ×0.888889 → ±0.769800.
    rescale = gd.grpo_dropout_advantages(tr, mask, gid, ell, center="weighted_center_rescale")
    assert rescale[:, 1].tolist() == pytest.approx([0.769800, -0.769800, -0.769800], abs=2e-6)
    # standardize: E_w c² = 0.75, sqrt = 0.866025 → (1, −1, −1).
    std = gd.grpo_dropout_advantages(tr, mask, gid, ell, center="weighted_standardize")
    assert std[:, 0].tolist() == pytest.approx([1.0, -1.0, -1.0], abs=2e-6)
    # none = plain GRPO.
    none = gd.grpo_dropout_advantages(tr, mask, gid, ell, center="none")
    assert torch.equal(none, grpo_advantages(tr, mask, gid))


def test_weighted_centre_has_zero_weighted_mean_per_group():
    gen = torch.Generator().manual_seed(1)
    gid = torch.tensor([0, 0, 0, 3, 3, 7, 7, 7, 7, 9])
    adv = torch.randn(10, generator=gen)
    ell = -20 * torch.rand(10, generator=gen)  # sum-basis-sized log-probs: the softmax must stay finite
    out = gd.weighted_recenter(adv, ell, gid, "weighted_center")
    for g in gid.unique():
        rows = gid == g
        w = torch.softmax(ell[rows], 0)
        assert float((w * out[rows]).sum()) == pytest.approx(0.0, abs=1e-6)
        assert torch.allclose(out[rows], adv[rows] - (w * adv[rows]).sum(), atol=1e-6)
    assert out[9] == 0.0  # a singleton group's weighted mean is itself


def test_advantage_is_broadcast_inside_the_mask_only():
    tr = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    out = gd.grpo_dropout_advantages(tr, mask, torch.zeros(2, dtype=torch.long), torch.tensor([-1.0, -1.0]))
    # Equal weights (½, ½): A' = ±0.707106, weighted mean 0 → unchanged.
    assert out.flatten().tolist() == pytest.approx([0.707106, 0.707106, 0.0, -0.707106, 0.0, 0.0], abs=1e-5)


# ---------------------------------------------------------------- the n_update gate
# A second group of 3 rows: R = (1, 0, 0), mean 1/3, unbiased std sqrt(1/3), so
# A = (2/3, −1/3, −1/3)/sqrt(1/3) = (1.154700, −0.577350, −0.577350). Surprisals 0.1 0.5 0.9,
# Ĥ = 0.5, s − Ĥ = (−0.4, 0, 0.4), P = (−0.461880, 0, −0.230940): no positive push, one zero.
# m = max(1, ⌊3/4⌋) = 1, so `balance` keeps the zero push (row 1) alone and drops rows 0 and 2.
SMALL_REWARDS, SMALL_SURPRISAL = [1.0, 0.0, 0.0], [0.1, 0.5, 0.9]


def two_groups(**kw):
    rewards = torch.tensor(REWARDS + SMALL_REWARDS)
    seq_lp = -torch.tensor(SURPRISAL + SMALL_SURPRISAL, dtype=torch.float64)
    gid = torch.tensor([0] * 8 + [1] * 3)
    return gd.grpo_dropout_select(rewards, seq_lp, gid, **kw)


def test_n_update_gate_keeps_groups_no_larger_than_n_update_whole():
    kept, push, _ = two_groups()
    third = 1 / (math.sqrt(1 / 3) + 1e-6)  # GRPO std epsilon 1e-6
    assert push[8:].tolist() == pytest.approx([-0.4 * 2 / 3 * third, 0.0, -0.4 * 1 / 3 * third], rel=1e-6)
    assert kept.tolist() == [1, 2, 3, 4, 5, 6, 7] + [9]  # None: every group judged
    # n_update = 3 (or 7, the authors' balance.env): the 3-row group has no more rows than
    # n_update, so the authors' select_indices returns it whole; the 8-row group is judged as before.
    for n_update in (3, 7):
        assert two_groups(n_update=n_update)[0].tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert two_groups(n_update=2)[0].tolist() == kept.tolist()  # 3 > 2: judged again
    assert two_groups(n_update=8)[0].tolist() == list(range(11))  # n_update ≥ every group: nothing dropped
    assert gd.judged_groups(torch.tensor([8, 3]), 7).tolist() == [True, False]
    assert gd.judged_groups(torch.tensor([8, 3]), None).tolist() == [True, True]


def test_selector_metrics_count_the_gated_and_the_mixed_groups():
    n, t = 11, 2
    ell = [-s for s in SURPRISAL + SMALL_SURPRISAL]
    batch = RolloutBatch(
        prompt_ids=torch.ones(n, 2, dtype=torch.long), prompt_mask=torch.ones(n, 2, dtype=torch.long),
        completion_ids=torch.ones(n, t, dtype=torch.long), completion_mask=torch.ones(n, t, dtype=torch.long),
        group_ids=torch.tensor([0] * 8 + [1] * 3), rewards=torch.tensor(REWARDS + SMALL_REWARDS),
        truncated=torch.zeros(n, dtype=torch.bool), sample_logprobs=torch.tensor(ell).unsqueeze(-1).repeat(1, t),
        meta={"completion": [str(i) for i in range(n)]},
    )
    select = SELECTORS.get("grpo_dropout")
    out, m = select(batch, step=0, total_steps=1)
    assert len(out) == 8 and m["dropped_fraction"] == pytest.approx(3 / 11)  # row 0, rows 8 and 10
    assert m["mixed_dropped_fraction"] == pytest.approx(3 / 11)  # both groups have a non-zero push
    assert m["mixed_dropped_per_group"] == 1.5 and m["mixed_group_fraction"] == 1.0
    assert m["kept_whole_fraction"] == 0.0
    out, m = select(batch, step=0, total_steps=1, n_update=7)
    assert out.meta["completion"] == [str(i) for i in range(1, 11)]
    assert m["dropped_fraction"] == pytest.approx(1 / 11) and m["mixed_dropped_per_group"] == 0.5
    assert m["kept_whole_fraction"] == 0.5  # the 3-row group


# ---------------------------------------------------------------- recipes: arms differing in the method alone

def test_the_matched_lr_arms_differ_from_their_baselines_in_the_method_alone():
    from reasonrl.recipe import load_recipe

    assert recipe_diff("grpo", "grpo_dropout_baseline_lr1e-4") == {"optim.lr"}
    assert recipe_diff("grpo_dropout", "grpo_dropout_lr1e-4") == {"optim.lr"}
    # The method: the selector and the advantage (GRPO's `scale` is GRPO's own parameter).
    method = {"selection", "advantage.name", "advantage.center", "advantage.scale"}
    assert recipe_diff("grpo", "grpo_dropout") == method
    assert recipe_diff("grpo_dropout_baseline_lr1e-4", "grpo_dropout_lr1e-4") == method
    assert load_recipe("recipes/grpo_dropout_lr1e-4.yaml").optim.lr == 1e-4
    # The authors' balance.env: n_update 7 < G = 8, so every full group is judged.
    r = load_recipe("recipes/grpo_dropout.yaml")
    assert r.selection[0].params["n_update"] == 7 < r.rollout.num_generations


def test_the_smollm2_arm_differs_from_smollm2_grpo_in_the_method_alone():
    """Issue 33: GRPODropout on SmolLM2 against GRPO at the same effective step size, which is
    recipes/smollm2_grpo.yaml itself (lr 1e-5): at equal lr the two take AdamW steps of the same
    size (docs/methods/grpo_dropout.md, "Step size"), so no lr-matched baseline recipe is needed."""
    from reasonrl.recipe import load_recipe

    assert recipe_diff("smollm2_grpo", "grpo_dropout_smollm2") == {"selection", "advantage.name", "advantage.center",
                                                                   "advantage.scale"}
    real, toy, grpo = (load_recipe(f"recipes/{name}.yaml") for name in ("grpo_dropout_smollm2", "grpo_dropout",
                                                                          "smollm2_grpo"))
    # the method exactly as the toy recipe sets it: the authors' balance selector and weighted_center
    assert real.selection == toy.selection and real.advantage == toy.advantage
    assert real.optim.lr == grpo.optim.lr == 1e-5
    assert real.selection[0].params["n_update"] == 7 < real.rollout.num_generations


def test_step_size_measures_the_gradient_and_the_update(tmp_path):
    # SGD without momentum or weight decay moves the weights by exactly lr · min(‖g‖, max_grad_norm).
    from reasonrl.methods.grpo_dropout.step_size import measure

    raw = mini_recipe(selection=[{"name": "grpo_dropout"}], advantage={"name": "grpo_dropout"},
                      rewards=[{"name": "soft_overlong", "max_len": 24, "buffer_len": 16}],
                      optim={"name": "sgd", "lr": 0.5, "warmup_steps": 0, "max_grad_norm": 0.05}).to_dict()
    path = tmp_path / "sgd.yaml"
    path.write_text(json.dumps(raw))  # JSON is YAML
    rows = measure(path, 0.5, 2)
    assert [r["step"] for r in rows] == [1, 2]
    moved = False
    for r in rows:
        assert r["step_lr"] == 0.5 and 4 <= r["rows"] <= 16
        assert r["update_norm"] == pytest.approx(0.5 * min(r["grad_norm"], 0.05), rel=1e-4)
        moved |= r["grad_norm"] > 0
    assert moved, "no step had a gradient: the check above was 0 = 0"


# ---------------------------------------------------------------- registered adapters


def toy_batch():
    """Group 10 = the worked group (avg log-prob per row = ℓ, rows of different lengths);
    group 11 = all correct (A ≡ 0, every push zero)."""
    n, t = 16, 4
    lengths = [1 + i % 4 for i in range(n)]
    mask = torch.tensor([[1 if j < lengths[i] else 0 for j in range(t)] for i in range(n)])
    ell = [-s for s in SURPRISAL] + [-0.1 * (i + 1) for i in range(8)]
    sample_lp = torch.tensor([[ell[i] if mask[i, j] else 0.0 for j in range(t)] for i in range(n)])
    return RolloutBatch(
        prompt_ids=torch.ones(n, 2, dtype=torch.long), prompt_mask=torch.ones(n, 2, dtype=torch.long),
        completion_ids=torch.ones(n, t, dtype=torch.long), completion_mask=mask,
        group_ids=torch.tensor([10] * 8 + [11] * 8), rewards=torch.tensor(REWARDS + [1.0] * 8),
        truncated=torch.zeros(n, dtype=torch.bool), sample_logprobs=sample_lp,
        meta={"completion": [str(i) for i in range(n)]},
    )


def test_registered_selector_matches_the_pure_functions():
    batch = toy_batch()
    select = SELECTORS.get("grpo_dropout")
    out, metrics = select(batch, step=3, total_steps=10)
    seq_lp = gd.sequence_logprob(batch.sample_logprobs.double(), batch.completion_mask)
    kept, _, _ = gd.grpo_dropout_select(batch.rewards, seq_lp, batch.group_ids, step=3, total_steps=10)
    assert out.meta["completion"] == [str(i) for i in kept.tolist()]
    assert kept.tolist()[:7] == [1, 2, 3, 4, 5, 6, 7]  # the worked group, as by hand
    assert len(out) == 7 + 2  # plus m = 2 random rows of the all-correct group
    assert torch.allclose(out.aux["seq_logprob"].double(), seq_lp[kept], atol=1e-6)
    assert metrics["dropped_fraction"] == pytest.approx(7 / 16)  # 1 + 6 rows of 16
    assert metrics["mixed_dropped_fraction"] == pytest.approx(1 / 8)  # the all-zero group does not count
    assert metrics["mixed_dropped_per_group"] == 1.0  # one row dropped in the one mixed group
    assert metrics["mixed_group_fraction"] == 0.5 and metrics["kept_whole_fraction"] == 0.0
    assert metrics["push_sum_before"] == pytest.approx(-0.3 * A / 2, rel=1e-6)  # (−0.3a + 0) / 2 groups
    assert metrics["push_sum_after"] == pytest.approx(0.15 * A / 2, rel=1e-6)
    assert metrics["surprisal_before"] > 0 and metrics["surprisal_after"] > 0


def test_selector_falls_back_to_old_logprobs_and_rejects_missing_ones():
    batch = toy_batch()
    batch.old_logprobs, batch.sample_logprobs = batch.sample_logprobs, None
    out, _ = SELECTORS.get("grpo_dropout")(batch, step=0, total_steps=1)
    assert out.meta["completion"][:7] == [str(i) for i in range(1, 8)]
    batch.old_logprobs = None
    with pytest.raises(ValueError, match="sample_logprobs nor old_logprobs"):
        SELECTORS.get("grpo_dropout")(batch, step=0, total_steps=1)


def test_selector_is_deterministic_in_seed_and_step_and_leaves_global_rngs_alone():
    select = SELECTORS.get("grpo_dropout")
    torch_state, py_state = torch.get_rng_state(), random.getstate()
    first = select(toy_batch(), step=4, total_steps=10)[0].meta["completion"]
    assert torch.equal(torch_state, torch.get_rng_state()) and py_state == random.getstate()
    assert select(toy_batch(), step=4, total_steps=10)[0].meta["completion"] == first
    # The all-correct group's random pair changes with the step (and the seed).
    by_step = {tuple(select(toy_batch(), step=s, total_steps=50)[0].meta["completion"][7:]) for s in range(15)}
    by_seed = {tuple(select(toy_batch(), step=4, total_steps=10, seed=s)[0].meta["completion"][7:]) for s in range(15)}
    assert len(by_step) > 1 and len(by_seed) > 1


def test_registered_advantage_matches_the_pure_function():
    batch, _ = SELECTORS.get("grpo_dropout")(toy_batch(), step=0, total_steps=1)
    tr = batch.rewards.unsqueeze(-1) * torch.nn.functional.one_hot(batch.completion_mask.sum(-1) - 1, 4)
    fn = ADVANTAGES.get("grpo_dropout")
    got = fn(tr, batch.completion_mask, batch.group_ids, batch=batch)
    want = gd.grpo_dropout_advantages(tr, batch.completion_mask, batch.group_ids, batch.aux["seq_logprob"])
    assert torch.equal(got, want)
    # Worked group after selection (3 correct, 4 wrong): A' = (4/7)/sqrt(2/7) = 1.069045 and
    # −(3/7)/sqrt(2/7) = −0.801784, then shifted by the same E_w A' for the whole group.
    seq = got.sum(-1) / batch.completion_mask.sum(-1)
    shift = seq[0] - 1.069044
    assert (seq[:7] - shift).tolist() == pytest.approx([1.069044] * 3 + [-0.801783] * 4, abs=2e-5)
    w = torch.softmax(batch.aux["seq_logprob"][:7], 0)
    assert float((w * seq[:7]).sum()) == pytest.approx(0.0, abs=1e-6)
    # Without the selector's aux, ℓ is recomputed from the sample log-probs (same numbers).
    batch.aux.clear()
    assert torch.allclose(fn(tr, batch.completion_mask, batch.group_ids, batch=batch), want, atol=1e-6)


@pytest.mark.parametrize("kwargs, match", [
    ({"variant": "balanced"}, "variant"), ({"basis": "mean"}, "basis"), ({"min_keep": 0}, "min_keep"),
    ({"a0": "high"}, "a0"), ({"eps": -1.0}, "eps"), ({"n_update": 0}, "n_update"), ({"n_update": True}, "n_update"),
    ({"n_update": 2.5}, "n_update"),
])
def test_bad_selector_params_name_the_parameter(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SELECTORS.get("grpo_dropout")(toy_batch(), step=0, total_steps=1, **kwargs)


def test_bad_center_names_the_parameter():
    batch = toy_batch()
    with pytest.raises(ValueError, match="center"):
        ADVANTAGES.get("grpo_dropout")(batch.sample_logprobs, batch.completion_mask, batch.group_ids,
                                       batch=batch, center="mean")


def test_drop_pos_refuses_an_intractable_exhaustive_search():
    push = torch.ones(gd.MAX_EXHAUSTIVE + 1, dtype=torch.float64)
    with pytest.raises(ValueError, match="drop_pos"):
        gd.balanced_push_drop_pos_select(push, torch.ones_like(push))


# ---------------------------------------------------------------- end to end


def test_end_to_end_run_logs_the_selection_metrics(tmp_path):
    # The untrained mini model never answers right; the length penalty (completions past 8 tokens)
    # gives groups mixed rewards, so the mixed-sign path runs, not only the all-zero fallback.
    recipe = mini_recipe(selection=[{"name": "grpo_dropout"}], advantage={"name": "grpo_dropout"},
                         rewards=[{"name": "soft_overlong", "max_len": 24, "buffer_len": 16}])
    summary = Trainer(recipe, tmp_path / "run", log=lambda m: None).run()
    assert summary["steps"] == 4
    rows = [r for r in read_metrics(tmp_path / "run") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        for key in ("dropped_fraction", "push_sum_before", "push_sum_after", "mixed_dropped_fraction",
                    "mixed_dropped_per_group", "kept_whole_fraction"):
            assert f"selection/grpo_dropout/{key}" in r, key
        # 4 prompts × 4 samples; at least m = 1 row per group is kept.
        assert r["train/rows"] == round(16 * (1 - r["selection/grpo_dropout/dropped_fraction"]))
        assert 4 <= r["train/rows"] <= 16
        # Only negative pushes are ever dropped by `balance`: the kept sum never falls.
        assert r["selection/grpo_dropout/push_sum_after"] >= r["selection/grpo_dropout/push_sum_before"] - 1e-9
    assert any(r["reward/std"] > 0 for r in rows)
    assert any(r["selection/grpo_dropout/push_sum_before"] != 0 for r in rows)
