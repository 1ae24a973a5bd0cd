"""ARG (adaptive reference guidance): the paper's criterion (reference surprisal, one-sample
estimate, EXP3) and the ablation's selector, prefix length and prefix weight by hand; guided rows
only for all-failure groups, the fallback to the reference, prefix tokens attended but out of the
loss (context) or weighted; the exact KL term by enumeration; the method in the Trainer (split
invariance, exact resume, bit-identical to GRPO when no group all-fails)."""

import math

import pytest
import torch

from reasonrl.methods.arg.maths import (all_failure_groups, check_bins, exp3_probs, exp3_update, expected_ratio,
                                        prefix_length, prefix_weights, reinforce_update, same_text, sample_bin,
                                        selector_entropy, selector_probs, selector_reward, suffix_surprisal,
                                        surprisal_reward, update_baseline)
from reasonrl.methods.arg.selectors import Exp3Selector, Observation, SuccessTargetSelector
from reasonrl.batch import RolloutBatch
from reasonrl.config import ConfigError
from reasonrl.methods.arg.method import AdaptiveReferenceGuidance
from reasonrl.hooks import MethodContext
from reasonrl.rewards.scorer import Scores
from reasonrl.problem import Problem
from reasonrl.metrics_log import read_metrics
from reasonrl.train.objective import TermInputs
from reasonrl.train.trainer import Trainer

from helpers import mini_policy, mini_recipe, straight_and_resumed

# -- the maths by hand ---------------------------------------------------------------------------


def test_selector_update_by_hand_two_and_three_bins():
    # Two bins, uniform q = [1/2, 1/2]; bin 0 succeeded at p̂ = 0.5 (u = 0), bin 1 at 0 (u = −1/4).
    u = selector_reward(torch.tensor([0.5, 0.0]), 0.5)
    assert u.tolist() == [0.0, -0.25]
    # First step: the baseline is this step's mean, −1/8; the step is
    # ½[(+1/8)(e0 − q) + (−1/8)(e1 − q)] = ½[(1/16, −1/16) + (1/16, −1/16)] = (1/16, −1/16).
    psi = reinforce_update(torch.zeros(2, dtype=torch.float64), [0, 1], u, baseline=-0.125, lr=1.0)
    assert psi.tolist() == pytest.approx([0.0625, -0.0625], abs=1e-15)
    assert update_baseline(None, -0.125, 0.9) == -0.125
    # Three bins, ψ = (0, ln 2, 0): q = (1/4, 1/2, 1/4). Bin 1 chosen, p̂ = 0.3 → u = −0.04;
    # baseline −0.1, η = 2: ψ' = ψ + 2 · 0.06 · (e1 − q) = ψ + (−0.03, 0.06, −0.03).
    psi = torch.tensor([0.0, math.log(2), 0.0], dtype=torch.float64)
    assert selector_probs(psi).tolist() == pytest.approx([0.25, 0.5, 0.25])
    u = selector_reward(0.3, 0.5)
    assert float(u) == pytest.approx(-0.04)
    new = reinforce_update(psi, [1], u.view(1), baseline=-0.1, lr=2.0)
    assert new.tolist() == pytest.approx([-0.03, math.log(2) + 0.06, -0.03], abs=1e-12)
    assert update_baseline(-0.1, -0.04, 0.9) == pytest.approx(0.9 * -0.1 + 0.1 * -0.04)
    assert expected_ratio(selector_probs(psi), [0.0, 0.4, 0.8]) == pytest.approx(0.25 * 0 + 0.5 * 0.4 + 0.25 * 0.8)
    assert selector_entropy(torch.full((4,), 0.25)) == pytest.approx(math.log(4))
    # No guided group: no step.
    assert torch.equal(reinforce_update(psi, [], torch.zeros(0), 0.0, 1.0), psi)


def test_reference_surprisal_and_the_one_sample_estimate_by_hand():
    # Reference of 4 tokens (the last one EOS) with probabilities 1/2, 1/4, 1/2, 1.
    logp = torch.tensor([0.5, 0.25, 0.5, 1.0]).log()
    # S(ℓ) = −Σ_{t ≥ ℓ} log p_t: S(0) = ln 2 + ln 4 + ln 2 = ln 16, S(2) = ln 2, S(3) = 0.
    assert suffix_surprisal(logp, 0) == pytest.approx(math.log(16))
    assert suffix_surprisal(logp, 1) == pytest.approx(math.log(8))
    assert suffix_surprisal(logp, 2) == pytest.approx(math.log(2))
    assert suffix_surprisal(logp, 3) == pytest.approx(0.0, abs=1e-7)
    # u_j = 1[passes ∧ differs] · S(ℓ): of 4 continuations one passes and differs, one passes but
    # repeats the reference, two fail: ū = S(1)/4 = ln 8 / 4, x = ū / S(0) = (3 ln 2 / 4) / (4 ln 2) = 3/16.
    u, x = surprisal_reward([True, True, False, False], [True, False, True, False], math.log(8), math.log(16))
    assert u == pytest.approx(math.log(8) / 4) and x == pytest.approx(3 / 16)
    assert surprisal_reward([True], [True], 0.0, 0.0) == (0.0, 0.0)  # a certain reference: nothing to learn
    assert same_text("3+4=7; 7*5=35", "3+4=7;  7*5=35\n") and not same_text("3+4=7;7*5=35", "3+4=7; 7*5=35")


def test_exp3_by_hand():
    # B = 2, γ = 0.2, w uniform: p = 0.8 · ½ + 0.2 / 2 = ½ each.
    p = exp3_probs(torch.zeros(2, dtype=torch.float64), 0.2)
    assert p.tolist() == pytest.approx([0.5, 0.5])
    # Observations (bin 0, x = 0.5) and (bin 0, x = 0.25): log w_0 += 0.2 · 0.5 / (0.5 · 2) + 0.2 · 0.25 / (0.5 · 2)
    # = 0.15; shifted so the max is 0: (0, −0.15).
    lw = exp3_update(torch.zeros(2, dtype=torch.float64), [0, 0], [0.5, 0.25], p, 0.2)
    assert lw.tolist() == pytest.approx([0.0, -0.15])
    q = exp3_probs(lw, 0.2)
    w0 = 1 / (1 + math.exp(-0.15))
    assert q.tolist() == pytest.approx([0.8 * w0 + 0.1, 0.8 * (1 - w0) + 0.1])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        exp3_update(lw, [1], [1.5], q, 0.2)
    # The selector object: one step's draws from one p, then all its observations.
    sel = Exp3Selector(2, gamma=0.2)
    assert sel.update([Observation(0, 0.5, 1.0), Observation(0, 0.25, 0.5)]) == pytest.approx(0.375)
    assert sel.probs().tolist() == pytest.approx(q.tolist())
    ablation = SuccessTargetSelector(2, target=0.5, lr=1.0)
    ablation.update([Observation(0, 0.0, 0.5), Observation(1, 1.0, 0.0)])  # only p̂ matters to it
    assert ablation.logits.tolist() == pytest.approx([0.0625, -0.0625], abs=1e-15)  # the hand step above


def test_sample_bin_follows_q_and_the_generator():
    psi = torch.tensor([0.0, math.log(3.0)], dtype=torch.float64)  # q = (1/4, 3/4)
    draws = [sample_bin(psi, torch.Generator().manual_seed(s)) for s in range(2000)]
    assert sum(draws) / len(draws) == pytest.approx(0.75, abs=0.04)
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    assert [sample_bin(psi, g1) for _ in range(20)] == [sample_bin(psi, g2) for _ in range(20)]


def test_prefix_length_and_bins():
    assert prefix_length(0.3, 22) == 6  # ⌊6.6⌋
    assert prefix_length(0.29, 100) == 29  # 28.999999999999996 in floats
    assert prefix_length(0.0, 22) == 0 and prefix_length(0.9, 10) == 9
    assert prefix_length(0.9, 40, max_len=31) == 31  # the room the completion budget leaves
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        prefix_length(1.0, 10)
    check_bins([0.0, 0.5])
    for bad, msg in (([], "at least one"), ([0.0, 1.0], r"\[0, 1\)"), ([0.5, 0.2], "increasing")):
        with pytest.raises(ValueError, match=msg):
            check_bins(bad)


def test_prefix_weight_by_hand():
    pol = torch.tensor([[0.2, 0.6, 0.3]]).log()
    ref = torch.tensor([[0.4, 0.3, 0.3]]).log()
    # ratios 0.5, 2, 1 → clip(·, 0, 1) = 0.5, 1, 1; with c = 1.5: 0.5, 1.5, 1.
    assert prefix_weights(pol, ref, 1.0).tolist()[0] == pytest.approx([0.5, 1.0, 1.0], abs=1e-6)
    assert prefix_weights(pol, ref, 1.5).tolist()[0] == pytest.approx([0.5, 1.5, 1.0], abs=1e-6)
    with pytest.raises(ValueError, match="clip"):
        prefix_weights(pol, ref, 0.0)


def test_all_failure_groups():
    rewards = torch.tensor([0.0, 0.0, 0.0, 1.0, -0.5, 0.0])
    gids = torch.tensor([3, 3, 5, 5, 8, 8])
    assert all_failure_groups(rewards, gids) == [3, 8]
    assert all_failure_groups(rewards, gids, threshold=-1.0) == []


# -- extend_batch on a hand-built batch ----------------------------------------------------------

SOLUTION = "3+4=7;7*5=35;####35"  # 19 tokens under the char tokenizer


def fake_scorer(calls=None):
    """Reward 1 for a text that ends with ``####<answer>`` (the verifier), else 0."""
    def score(texts, problems, num_tokens, truncated, group_size=1):
        if calls is not None:
            calls.append(list(texts))
        total = [float(t.endswith("####" + p.answer)) for t, p in zip(texts, problems)]
        return Scores(total=total, per_function={"exact_answer": total}, failures={"exact_answer": 0})
    return score


def hand_batch(policy, problems, rewards, g=4):
    """``len(problems)`` groups of ``g`` rows, each completion the token '1' then EOS."""
    tok = policy.tokenizer
    rows = [p for p in problems for _ in range(g)]
    ids, mask = policy.encode_prompts([p.prompt for p in rows])
    one = tok("1", add_special_tokens=False)["input_ids"][0]
    n = len(rows)
    comp = torch.tensor([[one, tok.eos_token_id]] * n)
    return RolloutBatch(prompt_ids=ids, prompt_mask=mask, completion_ids=comp, completion_mask=torch.ones_like(comp),
                        group_ids=torch.arange(len(problems)).repeat_interleave(g) + 10,
                        rewards=torch.tensor(rewards, dtype=torch.float32), truncated=torch.zeros(n, dtype=torch.bool),
                        sample_logprobs=-0.5 * torch.ones(n, 2),
                        meta={"problem": rows, "prompt": [p.prompt for p in rows], "completion": ["1"] * n,
                              "answer": [p.answer for p in rows], "reward/exact_answer": list(rewards)})


def arg_method(policy, recipe, calls=None, **params):
    m = AdaptiveReferenceGuidance(**params)
    m.setup(MethodContext(recipe=recipe, policy=policy, run_dir=None, log=lambda s: None,
                          scorer=fake_scorer(calls), task=None, generator=torch.Generator().manual_seed(0)))
    return m


PROBLEMS = [Problem("(3+4)*5;", "35", SOLUTION), Problem("(1+1)*2;", "4", "1+1=2;2*2=4;####4"),
            Problem("(2+2)*2;", "8", ""), Problem("(5+1)*2;", "12", "5+1=6;6*2=13;####13")]


def test_only_all_failure_groups_with_a_verified_solution_are_guided():
    policy, recipe = mini_policy(), mini_recipe(rollout={"max_new_tokens": 24})
    # Group 10 all fails (solution verified), 11 has a success, 12 all fails without a
    # solution, 13 all fails with a solution that fails its own verifier.
    rewards = [0.0] * 4 + [0, 1, 0, 0] + [0.0] * 4 + [0.0] * 4
    batch = hand_batch(policy, PROBLEMS, rewards)
    calls = []
    m = arg_method(policy, recipe, calls, bins=[0.5], beta=0.0, fallback=False, mix_failed=False)
    out, metrics = m.extend_batch(batch, 0)
    assert metrics["arg/guided_groups"] == 1 and metrics["arg/unverified_groups"] == 2
    assert metrics["arg/all_fail_fraction"] == 0.75
    assert calls[0] == [SOLUTION, "5+1=6;6*2=13;####13"]  # each solution verified once
    assert len(out) == 16 and out.group_ids.tolist() == batch.group_ids.tolist()  # replaced in place, same ids
    # Unguided groups keep their rows exactly; all of them are trained (loss_mask 1).
    for i in range(4, 16):
        assert torch.equal(out.completion_ids[i, :2], batch.completion_ids[i]) and out.meta["completion"][i] == "1"
        assert out.loss_mask[i, :2].tolist() == [1, 1]
    # Guided rows: the task prompt, then the first ⌊0.5 · 19⌋ = 9 solution tokens, attended but
    # not trained (option i); the continuation is trained.
    tok = policy.tokenizer
    prefix = tok(SOLUTION[:9], add_special_tokens=False)["input_ids"]
    for i in range(4):
        assert torch.equal(out.prompt_ids[i], batch.prompt_ids[i])
        assert out.completion_ids[i, :9].tolist() == prefix
        assert out.completion_mask[i, :9].tolist() == [1] * 9
        n = int(out.completion_mask[i].sum())
        assert n > 9 and out.loss_mask[i, :n].tolist() == [0] * 9 + [1] * (n - 9)
        assert out.meta["completion"][i].startswith(SOLUTION[:9])
        assert out.meta["completion"][i] == tok.decode(out.completion_ids[i, :n], skip_special_tokens=True)
    assert calls[1] == out.meta["completion"][:4]  # scored as prefix ⊕ continuation text
    # The prefix is attended: the continuation's log-probs depend on it.
    g = out.select([0])
    cut = out.select([0])
    cut.completion_mask = cut.completion_mask.clone()
    cut.completion_mask[0, :9] = 0
    with torch.no_grad():
        lp = policy.completion_logprobs(g.prompt_ids, g.prompt_mask, g.completion_ids, g.completion_mask)[0]
        lp_cut = policy.completion_logprobs(cut.prompt_ids, cut.prompt_mask, cut.completion_ids, cut.completion_mask)[0]
    assert not torch.allclose(lp[0, 9:n], lp_cut[0, 9:n])
    # The prefix tokens' behaviour log-probs are π_old's; the continuation's stay as sampled.
    assert torch.allclose(out.sample_logprobs[0, :9], lp[0, :9], atol=1e-5)
    assert out.is_weights is None  # option (i) leaves the correction weights alone


def test_weighted_prefix_gets_the_clipped_ratio_and_the_loss_mask():
    policy, recipe = mini_policy(), mini_recipe(rollout={"max_new_tokens": 24})
    batch = hand_batch(policy, PROBLEMS[:2], [0.0] * 4 + [0, 1, 0, 0])
    m = arg_method(policy, recipe, bins=[0.5], prefix_mode="weighted", clip=1.0, beta=0.0, fallback=False)
    m.ref = mini_policy(seed=1)  # a reference different from the policy, so w_t varies
    out, metrics = m.extend_batch(batch, 0)
    # mix_failed: group 10 keeps its 4 failed rows, followed by its 4 guided rows.
    assert len(out) == 12 and out.group_ids.tolist() == [10] * 8 + [11] * 4
    assert torch.equal(out.completion_ids[:4, :2], batch.completion_ids[:4])
    guided = out.select([4, 5, 6, 7])
    with torch.no_grad():
        args = (guided.prompt_ids, guided.prompt_mask, guided.completion_ids, guided.completion_mask)
        pol, ref = policy.completion_logprobs(*args)[0], m.ref.completion_logprobs(*args)[0]
    want = (pol[:, :9] - ref[:, :9]).exp().clamp(max=1.0)
    assert torch.allclose(guided.is_weights[:, :9], want, atol=1e-5)
    assert (want < 1).any()
    n = guided.completion_mask.sum(-1)
    assert all(guided.is_weights[r, 9:int(n[r])].eq(1).all() for r in range(4))
    assert guided.loss_mask[:, :9].eq(1).all()  # option (ii): the prefix is trained
    kept = out.completion_mask.bool() & (torch.arange(12) // 4 != 1).unsqueeze(-1)
    assert out.is_weights[kept].eq(1).all()  # every token of the unguided rows counts fully
    assert metrics["arg/prefix_weight"] == pytest.approx(float(want.mean()), abs=1e-5)


def even_scorer(texts, problems, num_tokens, truncated, group_size=1):
    """2 for the reference solution itself, 1 for a text of even length (a coin flip the
    continuations of the mini model land on either side of), else 0."""
    total = [2.0 if t == p.solution else float(len(t) % 2 == 0) for t, p in zip(texts, problems)]
    return Scores(total=total, per_function={"exact_answer": total}, failures={"exact_answer": 0})


def test_fallback_rows_are_the_reference_and_the_selector_learns_the_criterion():
    policy, recipe = mini_policy(), mini_recipe(rollout={"max_new_tokens": 24})
    batch = hand_batch(policy, PROBLEMS[:2], [0.0] * 8 + [0, 1] + [0] * 6, g=8)
    m = AdaptiveReferenceGuidance(bins=[0.3, 0.6], gamma=0.5, beta=0.0, num_guided=8)  # fallback and mix_failed by default
    m.setup(MethodContext(recipe=recipe, policy=policy, run_dir=None, log=lambda s: None, scorer=even_scorer,
                          task=None, generator=torch.Generator().manual_seed(3)))
    m.ref = mini_policy(seed=1)  # a reference different from the policy, so w_t varies
    out, metrics = m.extend_batch(batch, 0)
    # Group 10 keeps its 8 failed rollouts, followed by its 8 guided rows; group 11 is untouched.
    assert out.group_ids.tolist() == [10] * 16 + [11] * 8
    assert out.rewards[:8].eq(0).all() and torch.equal(out.completion_ids[:8, :2], batch.completion_ids[:8])
    tok = policy.tokenizer
    ref_ids = tok(SOLUTION, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    rb = out.select([8])
    rb.completion_ids = torch.tensor([ref_ids])
    rb.completion_mask = torch.ones(1, len(ref_ids), dtype=torch.long)
    with torch.no_grad():
        args = (rb.prompt_ids, rb.prompt_mask, rb.completion_ids, rb.completion_mask)
        pol, ref = policy.completion_logprobs(*args)[0][0], m.ref.completion_logprobs(*args)[0][0]
    rho = metrics["arg/rho_mean"]
    ell = int(rho * 19 + 1e-9)  # ⌊ρ L⌋ of the 19 solution tokens
    guided = out.select(list(range(8, 16)))
    falls = [bool(guided.rewards[j] == 2.0) for j in range(8)]
    assert 0 < sum(falls) < 8, "the coin flip should give both outcomes"
    hits = 0
    for j in range(8):
        n = int(guided.completion_mask[j].sum())
        if falls[j]:  # the reference in place of a failed continuation: every token trained, weighted
            assert guided.completion_ids[j, :n].tolist() == ref_ids and guided.meta["completion"][j] == SOLUTION
            assert guided.loss_mask[j, :n].eq(1).all()
            assert torch.allclose(guided.sample_logprobs[j, :n], pol, atol=1e-5)
            assert torch.allclose(guided.is_weights[j, :n], (pol - ref).exp().clamp(max=1.0), atol=1e-5)
        else:  # a passing continuation: prefix attended, out of the loss, weight 1
            assert guided.rewards[j] == 1.0 and len(guided.meta["completion"][j]) % 2 == 0
            assert guided.completion_ids[j, :ell].tolist() == ref_ids[:ell]
            assert guided.loss_mask[j, :n].tolist() == [0] * ell + [1] * (n - ell)
            assert torch.allclose(guided.sample_logprobs[j, :ell], pol[:ell], atol=1e-5)
            assert guided.is_weights[j, :n].eq(1).all()
            hits += guided.meta["completion"][j] != SOLUTION
    assert (pol - ref).exp().lt(1).any() and out.is_weights[:8][out.completion_mask[:8].bool()].eq(1).all()
    assert metrics["arg/fallback_share"] == sum(falls) / 8
    # The criterion: ū = (#pass ∧ differ / G) · S(ℓ), x = ū / S(0); EXP3 (γ = ½, p = ½ each) adds
    # γ x / (p B) = x / 2 to the chosen bin's log-weight.
    s_ell, s_full = float(-pol[ell:].double().sum()), float(-pol.double().sum())
    assert metrics["arg/surprisal"] == pytest.approx(s_ell, rel=1e-5)
    assert metrics["arg/criterion_u"] == pytest.approx(hits / 8 * s_ell, rel=1e-5)
    x = hits / 8 * s_ell / s_full
    b = [0.3, 0.6].index(rho)
    want = torch.zeros(2, dtype=torch.float64)
    want[b] = x / 2
    assert m.selector.log_weights.tolist() == pytest.approx((want - want.max()).tolist(), abs=1e-6)
    assert x > 0
    # A checkpoint of the other selector is refused with the fix.
    with pytest.raises(ValueError, match="selector: success_target"):
        m.load_state_dict({"logits": torch.zeros(2), "baseline": None})


def test_nothing_to_guide_leaves_the_batch_unchanged():
    policy, recipe = mini_policy(), mini_recipe()
    batch = hand_batch(policy, PROBLEMS[:2], [0.0] * 4 + [0, 1, 0, 0])
    del batch.meta["problem"]  # rows without their problems: nothing to verify against
    m = arg_method(policy, recipe, beta=0.0)
    out, metrics = m.extend_batch(batch, 0)
    assert out is batch and out.loss_mask is None and metrics["arg/guided_groups"] == 0
    assert metrics["arg/unverified_groups"] == 1
    ok = hand_batch(policy, PROBLEMS[:1], [1.0, 0, 0, 0])
    out, metrics = m.extend_batch(ok, 0)
    assert out is ok and metrics["arg/all_fail_fraction"] == 0


# -- the exact KL term ---------------------------------------------------------------------------


class StubRef:
    def __init__(self, logits):
        self.logits = logits

    def completion_logits(self, *args):
        return self.logits


def test_exact_kl_term_by_enumeration():
    p = torch.tensor([[[0.5, 0.25, 0.25], [0.2, 0.3, 0.5]]], dtype=torch.float64)  # π_θ at two positions
    q = torch.tensor([[[0.25, 0.25, 0.5], [0.6, 0.2, 0.2]]], dtype=torch.float64)  # π_ref
    kl = [sum(p[0, t, a] * math.log(p[0, t, a] / q[0, t, a]) for a in range(3)).item() for t in range(2)]
    m = AdaptiveReferenceGuidance(beta=0.5)
    m.recipe, m.ref = mini_recipe(), StubRef(q.log())
    logits = p.log().clone().requires_grad_(True)
    micro = RolloutBatch(prompt_ids=torch.ones(1, 1, dtype=torch.long), prompt_mask=torch.ones(1, 1, dtype=torch.long),
                         completion_ids=torch.zeros(1, 2, dtype=torch.long), completion_mask=torch.ones(1, 2),
                         group_ids=torch.zeros(1, dtype=torch.long), rewards=torch.zeros(1),
                         truncated=torch.zeros(1, dtype=torch.bool))
    for mask, tokens, want in (([1.0, 1.0], 2, 0.5 * (kl[0] + kl[1]) / 2), ([1.0, 0.0], 1, 0.5 * kl[0])):
        inputs = TermInputs(micro=micro, mini=micro, logits=logits, logprobs=torch.zeros(1, 2),
                            mask=torch.tensor([mask], dtype=torch.float64), temperature=1.0,
                            agg=dict(mode="token-mean", total_tokens=tokens, total_seqs=1, norm_len=2))
        loss, stats = m.loss_term(inputs)
        assert loss.item() == pytest.approx(want, abs=1e-12)
        assert stats["token/arg/kl"] == pytest.approx(sum(k * w for k, w in zip(kl, mask)), abs=1e-12)
    loss.backward()
    assert logits.grad is not None and logits.grad[0, 1].abs().sum() == 0  # masked position: no gradient
    m.beta = 0.0
    assert m.loss_term(inputs)[0].item() == 0.0


def test_recipe_rules():
    def methods(**p):
        return [{"name": "arg", **p}]
    with pytest.raises(ConfigError, match="loss.kl.coef"):
        mini_recipe(methods=methods(), loss={"kl": {"coef": 0.01}})
    with pytest.raises(ConfigError, match="dynamic_sampling"):
        mini_recipe(methods=methods(), rollout={"dynamic_sampling": True})
    with pytest.raises(ConfigError, match="off_policy"):
        mini_recipe(methods=methods(prefix_mode="weighted", fallback=False), off_policy={"name": "tis"})
    with pytest.raises(ConfigError, match="fallback: true.*off_policy"):
        mini_recipe(methods=methods(), off_policy={"name": "tis"})
    with pytest.raises(ConfigError, match="selector"):
        mini_recipe(methods=methods(selector="thompson"))
    mini_recipe(methods=methods(fallback=False), off_policy={"name": "tis"})  # nothing in is_weights: allowed
    with pytest.raises(ConfigError, match="bins"):
        mini_recipe(methods=methods(bins=[0.2, 1.0]))
    with pytest.raises(ConfigError, match="prefix_mode"):
        mini_recipe(methods=methods(prefix_mode="both"))
    mini_recipe(methods=methods(beta=0.0), loss={"kl": {"coef": 0.01}})  # no exact KL: the estimator may stay


# -- the method in the Trainer -------------------------------------------------------------------

def starts_like_solution(completion, problem, **_):
    """A toy verifier the mini model can pass only with guidance: the completion opens with the
    reference solution's first two characters (a prefix of ρ ≥ 0.1 hands them over) and, a coin
    flip for the selector to see, has an even length; the reference solution itself passes."""
    return float(completion == problem.solution
                 or (completion.startswith(problem.solution[:2]) and len(completion) % 2 == 0))


# The mini model never passes on its own: every group all-fails. Guided rows pass about half
# the time at ρ ≥ 0.1 and never at ρ = 0, so the selector sees different success rates per bin; the length penalty
# makes the rewards within a guided group differ, so the policy loss is not zero.
COMMON = {"train": {"steps": 2}, "eval": {"size": 0},
          "rewards": [{"name": starts_like_solution}, {"name": "soft_overlong", "max_len": 32, "buffer_len": 24}]}
ARG = {"name": "arg", "prefix_mode": "weighted", "beta": 0.05}


def final_weights(run_dir):
    from safetensors.torch import load_file

    return load_file(str(run_dir / "final_model" / "model.safetensors"))


def test_the_update_does_not_depend_on_the_micro_batch_split(tmp_path):
    weights, rows = {}, {}
    for mb in (16, 4):
        r = mini_recipe(methods=[ARG], **{**COMMON, "train": {"steps": 2, "micro_batch_size": mb}})
        Trainer(r, tmp_path / str(mb), log=lambda m: None).run()
        weights[mb] = final_weights(tmp_path / str(mb))
        rows[mb] = [x for x in read_metrics(tmp_path / str(mb)) if "loss" in x]
    assert all(torch.allclose(weights[16][k], weights[4][k], atol=1e-6) for k in weights[16])
    assert all(r["arg/guided_groups"] > 0 and r["arg/kl"] > -1e-6 for r in rows[16])
    assert rows[16][-1]["arg/kl"] > 0  # the policy moved away from π_ref after the first step
    assert rows[16][-1]["arg/expected_rho"] != pytest.approx(0.45, abs=1e-9)  # the selector learned


def test_exact_resume(tmp_path, monkeypatch):
    r = mini_recipe(methods=[ARG], **{**COMMON, "train": {"steps": 4, "checkpoint_every": 1}})
    rows = straight_and_resumed(r, tmp_path, monkeypatch)
    rows = [x for x in rows if "loss" in x]
    assert all(x["arg/guided_groups"] > 0 for x in rows)
    assert rows[-1]["arg/expected_rho"] != pytest.approx(0.45, abs=1e-9)  # the selector's state is resumed


def test_no_all_failure_group_and_beta_zero_trains_exactly_like_grpo(tmp_path):
    Trainer(mini_recipe(**COMMON), tmp_path / "grpo", log=lambda m: None).run()
    # Every reward is above −10: no group all-fails, so nothing is guided.
    r = mini_recipe(methods=[{"name": "arg", "beta": 0.0, "success_threshold": -10.0}], **COMMON)
    Trainer(r, tmp_path / "arg", log=lambda m: None).run()
    a, b = final_weights(tmp_path / "grpo"), final_weights(tmp_path / "arg")
    assert all(torch.equal(a[k], b[k]) for k in a)
    rows = [x for x in read_metrics(tmp_path / "arg") if "loss" in x]
    assert rows, "no training step was logged"
    assert all(x["arg/guided_groups"] == 0 and x["arg/expected_rho"] == pytest.approx(0.45) for x in rows)
