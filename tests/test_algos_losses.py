"""Policy losses (ppo_clip, gspo, cispo) and loss aggregation."""

import math

import pytest
import torch
from torch.testing import assert_close

from reasonrl.algos.losses import AGG_MODES, PolicyLossOutput, aggregate, cispo_loss, gspo_loss, ppo_clip_loss
from reasonrl.registry import POLICY_LOSSES


def from_ratios(ratios):
    """logprobs with requires_grad and old_logprobs = 0, so exp(logp - old) = ratio."""
    logp = torch.log(torch.tensor([ratios], dtype=torch.float32)).requires_grad_(True)
    return logp, torch.zeros_like(logp)


def test_registered_names():
    assert POLICY_LOSSES.get("ppo_clip") is ppo_clip_loss
    assert POLICY_LOSSES.get("gspo") is gspo_loss
    assert POLICY_LOSSES.get("cispo") is cispo_loss


# ----------------------------------------------------------------------------- ppo_clip


def test_ppo_clip_symmetric_hand_computed():
    logp, old = from_ratios([1.1, 1.5, 0.5, 0.5, 1.5])
    adv = torch.tensor([[1.0, 1.0, -1.0, 1.0, -1.0]])
    out = ppo_clip_loss(logp, old, adv, torch.ones(1, 5), epsilon=0.2)
    assert isinstance(out, PolicyLossOutput)
    # l = max(-A ρ, -A clip(ρ, 0.8, 1.2)):
    #  ρ=1.1 A=+1: max(-1.1, -1.1) = -1.1  unclipped
    #  ρ=1.5 A=+1: max(-1.5, -1.2) = -1.2  clipped high
    #  ρ=0.5 A=-1: max( 0.5,  0.8) =  0.8  clipped low
    #  ρ=0.5 A=+1: max(-0.5, -0.8) = -0.5  unclipped (pessimistic branch is the raw one)
    #  ρ=1.5 A=-1: max( 1.5,  1.2) =  1.5  unclipped
    assert_close(out.loss, torch.tensor([[-1.1, -1.2, 0.8, -0.5, 1.5]]))
    assert_close(out.clipped, torch.tensor([[0.0, 1.0, 1.0, 0.0, 0.0]]))
    assert_close(out.ratio, torch.tensor([[1.1, 1.5, 0.5, 0.5, 1.5]]))
    # gradient d l / d logp = -A ρ on unclipped tokens, 0 on clipped ones
    out.loss.sum().backward()
    assert_close(logp.grad, torch.tensor([[-1.1, 0.0, 0.0, -0.5, 1.5]]))


def test_ppo_clip_higher_asymmetric():
    logp, old = from_ratios([1.25, 1.3, 0.75])
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    out = ppo_clip_loss(logp, old, adv, torch.ones(1, 3), epsilon=0.2, epsilon_high=0.28)
    # band [0.8, 1.28]: ρ=1.25 A=+1 inside -> -1.25 (symmetric ε=0.2 would clip to -1.2)
    #                   ρ=1.3  A=+1 -> max(-1.3, -1.28) = -1.28 clipped
    #                   ρ=0.75 A=-1 -> max(0.75, 0.8) = 0.8 clipped (lower bound still 1-ε)
    assert_close(out.loss, torch.tensor([[-1.25, -1.28, 0.8]]))
    assert_close(out.clipped, torch.tensor([[0.0, 1.0, 1.0]]))
    sym = ppo_clip_loss(logp, old, adv, torch.ones(1, 3), epsilon=0.2)
    assert_close(sym.loss[0, 0], torch.tensor(-1.2))


def test_ppo_dual_clip():
    logp, old = from_ratios([4.0, 2.0, 4.0])
    adv = torch.tensor([[-1.0, -1.0, 1.0]])
    out = ppo_clip_loss(logp, old, adv, torch.ones(1, 3), epsilon=0.2, dual_clip=3.0)
    # ρ=4 A=-1: standard max(4, 1.2) = 4, dual min(4, -A c = 3) = 3, clipped
    # ρ=2 A=-1: standard 2 < 3 -> 2, not clipped
    # ρ=4 A=+1: dual clip only applies for A<0 -> max(-4, -1.2) = -1.2, clipped high
    assert_close(out.loss, torch.tensor([[3.0, 2.0, -1.2]]))
    assert_close(out.clipped, torch.tensor([[1.0, 0.0, 1.0]]))
    out.loss.sum().backward()
    # dual-clipped token is a constant -> no gradient; ρ=2 token: -A ρ = 2
    assert_close(logp.grad, torch.tensor([[0.0, 2.0, 0.0]]))
    without = ppo_clip_loss(logp, old, adv, torch.ones(1, 3), epsilon=0.2)
    assert_close(without.loss, torch.tensor([[4.0, 2.0, -1.2]]))


@pytest.mark.parametrize("c", [1.0, 0.5])
def test_ppo_dual_clip_must_exceed_one(c):
    logp, old = from_ratios([1.0])
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_clip_loss(logp, old, torch.ones(1, 1), torch.ones(1, 1), dual_clip=c)


def test_ppo_log_ratio_clamped_to_20():
    logp = torch.tensor([[100.0, -100.0]])
    out = ppo_clip_loss(logp, torch.zeros(1, 2), torch.tensor([[-1.0, 1.0]]), torch.ones(1, 2))
    assert_close(out.ratio, torch.tensor([[math.exp(20.0), math.exp(-20.0)]]))
    assert torch.isfinite(out.loss).all()


@pytest.mark.parametrize("name", ["ppo_clip", "gspo", "cispo"])
def test_clip_fraction_zero_when_on_policy(name):
    torch.manual_seed(0)
    logp = -torch.rand(4, 7) * 3
    adv = torch.randn(4, 7) * 5
    mask = torch.ones(4, 7)
    mask[1, 4:] = 0
    out = POLICY_LOSSES.get(name)(logp, logp.clone(), adv, mask)
    assert out.clipped.sum().item() == 0.0
    assert torch.equal(out.ratio, mask)


@pytest.mark.parametrize(
    "name,params",
    [
        ("ppo_clip", {}),
        ("ppo_clip", {"epsilon_high": 0.28, "dual_clip": 3.0}),
        ("gspo", {}),
        ("gspo", {"epsilon": 0.2, "epsilon_high": 0.2}),
        ("cispo", {}),
        ("tic_grpo", {}),
        ("tic_grpo", {"epsilon_high": 0.5}),
        ("gmc_grpo", {"group_ids": torch.tensor([0, 0, 0, 1, 1])}),
        ("gmc_grpo", {"epsilon": 0.0, "group_ids": torch.tensor([0, 0, 0, 1, 1])}),
    ],
)
def test_padding_never_leaks(name, params):
    torch.manual_seed(1)
    B, T = 5, 6
    mask = (torch.rand(B, T) < 0.6).float()
    mask[:, 0] = 1.0
    base_logp = -torch.rand(B, T) * 2
    old = base_logp + 0.3 * torch.randn(B, T)
    adv = torch.randn(B, T)
    fn = POLICY_LOSSES.get(name)

    def run(lp, o, a):
        lp = lp.clone().requires_grad_(True)
        out = fn(lp, o, a, mask, **params)
        aggregate(out.loss, mask, "token-mean").backward()
        return out, lp.grad

    ref, ref_grad = run(base_logp, old, adv)
    pad = mask == 0
    g_logp, g_old, g_adv = base_logp.clone(), old.clone(), adv.clone()
    g_logp[pad], g_old[pad], g_adv[pad] = float("nan"), float("inf"), 1e6
    out, grad = run(g_logp, g_old, g_adv)
    for field in ("loss", "clipped", "ratio"):
        assert_close(getattr(out, field), getattr(ref, field))
        assert torch.all(getattr(out, field)[pad] == 0)
    for key, value in out.extra.items():  # a loss's own per-token statistics (GMC's cap, scale, ESS)
        assert_close(value, ref.extra[key])
        assert torch.all(value[pad] == 0), key
    assert_close(grad, ref_grad)
    assert torch.all(grad[pad] == 0)


# ----------------------------------------------------------------------------- gspo


def test_gspo_hand_computed_value_and_grad():
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    # row 0 log-ratios [0.1,-0.1,0.3] -> mean 0.1 -> s = e^0.1 = 1.105171 > 1.0004 -> clipped, A=+1 -> l = -1.0004
    # row 1 log-ratios [2e-4, 0, pad] -> mean 1e-4 -> s = e^1e-4 = 1.0001 inside [0.9997,1.0004], A=-2 -> l = 2.0002
    old = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.5, 0.0]])
    log_ratio = torch.tensor([[0.1, -0.1, 0.3], [2e-4, 0.0, 7.0]])
    logp = (old + log_ratio).requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]])
    out = gspo_loss(logp, old, adv, mask)
    s0, s1 = math.exp(0.1), math.exp(1e-4)
    assert_close(out.ratio, torch.tensor([[s0, s0, s0], [s1, s1, 0.0]]))
    assert_close(out.loss, torch.tensor([[-1.0004, -1.0004, -1.0004], [2.0 * s1, 2.0 * s1, 0.0]]))
    assert_close(out.clipped, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    out.loss.sum().backward()
    # GSPO-token: d l_t / d logp_t = -A s (each token only through its own logp); clipped row has none
    assert_close(logp.grad, torch.tensor([[0.0, 0.0, 0.0], [2.0 * s1, 2.0 * s1, 0.0]]))


def trl_sequence_level_loss(logp, old, adv_seq, mask, eps_low, eps_high):
    """TRL importance_sampling_level="sequence" with loss_type="grpo", transcribed."""
    log_ratio = logp - old
    log_w = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(log_w)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    a = adv_seq.unsqueeze(-1)
    per_token = -torch.min(coef_1 * a, coef_2 * a)
    return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()


def test_gspo_matches_trl_sequence_level_under_seq_mean_token_mean():
    torch.manual_seed(2)
    B, T = 6, 8
    mask = (torch.rand(B, T) < 0.7).float()
    mask[:, 0] = 1.0
    old = -torch.rand(B, T) * 2
    logp0 = old + 0.05 * torch.randn(B, T)
    adv_seq = torch.randn(B)
    eps_low, eps_high = 0.005, 0.008  # narrow enough that some sequences are clipped and some not

    a = logp0.clone().requires_grad_(True)
    out = gspo_loss(a, old, adv_seq.unsqueeze(-1).expand(B, T), mask, epsilon=eps_low, epsilon_high=eps_high)
    ours = aggregate(out.loss, mask, "seq-mean-token-mean")
    ours.backward()

    b = logp0.clone().requires_grad_(True)
    theirs = trl_sequence_level_loss(b, old, adv_seq, mask, eps_low, eps_high)
    theirs.backward()

    assert 0 < out.clipped[:, 0].sum() < B
    assert_close(ours, theirs)
    assert_close(a.grad, b.grad * mask)


# ----------------------------------------------------------------------------- cispo


def test_cispo_value_and_grad():
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    ratios = torch.tensor([[0.5, 1.0, 6.0]])
    old = logp.detach() - torch.log(ratios)
    adv = torch.tensor([[2.0, -1.0, 1.0]])
    out = cispo_loss(logp, old, adv, torch.ones(1, 3))  # cap = 1 + 4.0 = 5
    # l = -min(ρ,5)·A·logp: -(0.5)(2)(-1) = 1.0; -(1)(-1)(-2) = -2.0; -(5)(1)(-0.5) = 2.5
    assert_close(out.loss, torch.tensor([[1.0, -2.0, 2.5]]))
    assert_close(out.clipped, torch.tensor([[0.0, 0.0, 1.0]]))
    assert_close(out.ratio, torch.tensor([[0.5, 1.0, 6.0]]))
    out.loss.sum().backward()
    # the weight is stop-gradient: d l / d logp = -min(ρ,5)·A = [-1, 1, -5] (nonzero even where truncated)
    assert_close(logp.grad, torch.tensor([[-1.0, 1.0, -5.0]]))


def test_cispo_offset_convention():
    logp = torch.tensor([[-0.5]], requires_grad=True)
    old = logp.detach() - math.log(6.0)
    out = cispo_loss(logp, old, torch.ones(1, 1), torch.ones(1, 1), epsilon_high=0.28)
    # cap 1.28: l = -1.28·1·(-0.5) = 0.64
    assert_close(out.loss, torch.tensor([[0.64]]))


# ----------------------------------------------------------------------------- aggregation

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


def test_aggregate_hand_computed():
    # valid entries: row0 [1,2], row1 [4]
    assert_close(aggregate(LOSS, MASK, "token-mean"), torch.tensor(7 / 3))  # (1+2+4)/3
    assert_close(aggregate(LOSS, MASK, "seq-mean-token-mean"), torch.tensor(2.75))  # (1.5 + 4)/2
    assert_close(aggregate(LOSS, MASK, "seq-mean-token-sum"), torch.tensor(3.5))  # (3 + 4)/2
    assert_close(aggregate(LOSS, MASK, "seq-mean-token-sum-norm"), torch.tensor(7 / 6))  # 7/(2·3)
    assert_close(aggregate(LOSS, MASK, "seq-mean-token-sum-norm", norm_len=7), torch.tensor(0.5))  # 7/(2·7)
    assert_close(aggregate(LOSS, MASK, "token-mean", total_tokens=10), torch.tensor(0.7))
    assert_close(aggregate(LOSS, MASK, "seq-mean-token-mean", total_seqs=4), torch.tensor(1.375))  # 5.5/4


def test_aggregate_empty_rows_and_empty_mask():
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    assert_close(aggregate(LOSS, mask, "token-mean"), torch.tensor(1.5))  # 3/2
    assert_close(aggregate(LOSS, mask, "seq-mean-token-mean"), torch.tensor(0.75))  # (1.5 + 0)/2: empty row counts
    for mode in AGG_MODES:
        assert aggregate(LOSS, torch.zeros(2, 3), mode).item() == 0.0


def test_aggregate_ignores_padding_values():
    garbage = LOSS.clone()
    garbage[MASK == 0] = float("nan")
    for mode in AGG_MODES:
        assert_close(aggregate(garbage, MASK, mode), aggregate(LOSS, MASK, mode))


def test_aggregate_unknown_mode_suggests_closest():
    with pytest.raises(ValueError, match="Did you mean 'seq-mean-token-mean'") as exc:
        aggregate(LOSS, MASK, "seq_mean_token_mean")
    assert "token-mean, seq-mean-token-mean" in str(exc.value)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_aggregate_micro_batch_split_invariance(mode):
    torch.manual_seed(3)
    B, T = 8, 5
    x = torch.randn(B, T)
    mask = (torch.rand(B, T) < 0.6).float()
    mask[2] = 0.0  # a fully masked row
    mask[5] = 1.0
    w_full = torch.randn(B, T, requires_grad=True)
    totals = dict(total_tokens=mask.sum().item(), total_seqs=B, norm_len=T + 3)

    full = aggregate(w_full * x, mask, mode, **totals)
    full.backward()

    w_micro = w_full.detach().clone().requires_grad_(True)
    parts = []
    for sl in (slice(0, 3), slice(3, 5), slice(5, 8)):
        part = aggregate(w_micro[sl] * x[sl], mask[sl], mode, **totals)
        part.backward()  # gradient accumulation
        parts.append(part.detach())

    assert_close(torch.stack(parts).sum(), full.detach())
    assert_close(w_micro.grad, w_full.grad)


def test_local_token_mean_is_not_split_invariant():
    # guards the test above: without the global totals, micro-batch sums do differ
    full = aggregate(LOSS, MASK, "token-mean")
    split = aggregate(LOSS[:1], MASK[:1], "token-mean") + aggregate(LOSS[1:], MASK[1:], "token-mean")
    assert abs(full.item() - split.item()) > 1e-3
