"""Off-policy corrections (tis, mis, decoupled_ppo, behaviour_ppo) and offpolicy_metrics."""

import math

import pytest
import torch
from torch.testing import assert_close

from reasonrl.algos.offpolicy import Correction, behaviour_ppo, decoupled_ppo, mis, offpolicy_metrics, tis
from reasonrl.params import ConfigError, check_component_params
from reasonrl.registry import OFF_POLICY

PIPELINE = {"proximal_logprobs", "behaviour_logprobs", "response_mask"}
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def batch():
    """2 rows x 3 tokens, the last token of row 1 padded.

    Behaviour ratios ρ = π_prox/μ: row 0 = [0.5, 3, 1], row 1 = [1.5, 0.25, (pad)]. The padded
    token carries a log-ratio of +5 so a leak would show.
    """
    behaviour = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.7, -3.0]])
    log_r = torch.tensor([[math.log(0.5), math.log(3.0), 0.0], [math.log(1.5), math.log(0.25), 5.0]])
    return behaviour + log_r, behaviour, MASK.clone()


def every_correction():
    yield "behaviour_ppo", behaviour_ppo, {}
    for mode in ("mask", "truncate"):
        for cap in (None, 1.0, 5.0):
            yield f"decoupled_ppo/{mode}/{cap}", decoupled_ppo, {"mode": mode, "cap": cap}
    for fn in (tis, mis):
        for level in ("token", "sequence", "geometric"):
            for cap in (1.0, 2.0):
                yield f"{fn.__name__}/{level}/{cap}", fn, {"level": level, "cap": cap}


ALL = list(every_correction())
IDS = [name for name, _, _ in ALL]
CASES = [(fn, params) for _, fn, params in ALL]

# geometric row ratios: row 0 (0.5·3·1)^(1/3) = 1.5^(1/3) = exp(0.405465/3) = 1.144714
#                       row 1 (1.5·0.25)^(1/2) = 0.375^(1/2) = 0.612372
G0, G1 = 1.144714, 0.612372


def check(out, weights, truncated=None, masked=None, anchor="proximal"):
    assert isinstance(out, Correction)
    assert out.anchor == anchor
    assert out.weights.dtype == torch.float32
    assert_close(out.weights, torch.tensor(weights), rtol=1e-5, atol=1e-6)
    zeros = [[0.0] * 3] * 2
    assert_close(out.truncated, torch.tensor(truncated or zeros))
    assert_close(out.masked, torch.tensor(masked or zeros))


def test_registry_lookup():
    assert OFF_POLICY.get("tis") is tis
    assert OFF_POLICY.get("mis") is mis
    assert OFF_POLICY.get("decoupled_ppo") is decoupled_ppo
    assert OFF_POLICY.get("behaviour_ppo") is behaviour_ppo
    assert {"tis", "mis", "decoupled_ppo", "behaviour_ppo"} <= set(OFF_POLICY.names())


# ----------------------------------------------------------------------------- tis


def test_tis_token_hand_computed():
    out = tis(*batch(), level="token", cap=2.0)
    # w = min(ρ, 2): [0.5, min(3,2)=2, 1] / [1.5, 0.25, pad 0]; only ρ=3 truncated
    check(out, [[0.5, 2.0, 1.0], [1.5, 0.25, 0.0]], truncated=[[0, 1, 0], [0, 0, 0.0]])
    assert_close(out.ratio, torch.tensor([[0.5, 3.0, 1.0], [1.5, 0.25, 0.0]]))


def test_tis_sequence_hand_computed():
    # row ρ_i = exp(Σ log ρ) = Π ρ: row 0 0.5·3·1 = 1.5, row 1 1.5·0.25 = 0.375 (pad e^5 excluded)
    out = tis(*batch(), level="sequence", cap=2.0)
    check(out, [[1.5, 1.5, 1.5], [0.375, 0.375, 0.0]])
    assert_close(out.ratio, torch.tensor([[1.5, 1.5, 1.5], [0.375, 0.375, 0.0]]))
    # cap 1.2: row 0 min(1.5, 1.2) = 1.2 truncated as a whole, row 1 0.375 untouched
    out = tis(*batch(), level="sequence", cap=1.2)
    check(out, [[1.2, 1.2, 1.2], [0.375, 0.375, 0.0]], truncated=[[1, 1, 1], [0, 0, 0.0]])


def test_tis_geometric_hand_computed():
    out = tis(*batch(), level="geometric", cap=2.0)
    check(out, [[G0, G0, G0], [G1, G1, 0.0]])
    # cap 1.1: row 0 min(1.144714, 1.1) = 1.1 truncated, row 1 0.612372 untouched
    out = tis(*batch(), level="geometric", cap=1.1)
    check(out, [[1.1, 1.1, 1.1], [G1, G1, 0.0]], truncated=[[1, 1, 1], [0, 0, 0.0]])


# ----------------------------------------------------------------------------- mis


def test_mis_token_hand_computed():
    # band [1/2.5, 2.5] = [0.4, 2.5]: 0.5 kept, 3 dropped, 1 kept / 1.5 kept, 0.25 dropped
    out = mis(*batch(), level="token", cap=2.5)
    check(out, [[0.5, 0.0, 1.0], [1.5, 0.0, 0.0]], masked=[[0, 1, 0], [0, 1, 0.0]])


def test_mis_sequence_hand_computed():
    # band [0.5, 2]: row 0 ρ = 1.5 kept (w = 1.5 on each token), row 1 ρ = 0.375 < 0.5 dropped whole
    out = mis(*batch(), level="sequence", cap=2.0)
    check(out, [[1.5, 1.5, 1.5], [0.0, 0.0, 0.0]], masked=[[0, 0, 0], [1, 1, 0.0]])
    # band [1/1.2, 1.2] = [0.8333, 1.2]: both rows out (1.5 too high, 0.375 too low)
    out = mis(*batch(), level="sequence", cap=1.2)
    check(out, [[0.0] * 3] * 2, masked=[[1, 1, 1], [1, 1, 0.0]])


def test_mis_geometric_hand_computed():
    # band [1/1.5, 1.5] = [0.6667, 1.5]: row 0 1.144714 kept, row 1 0.612372 < 0.6667 dropped
    out = mis(*batch(), level="geometric", cap=1.5)
    check(out, [[G0, G0, G0], [0.0, 0.0, 0.0]], masked=[[0, 0, 0], [1, 1, 0.0]])


# ----------------------------------------------------------------------------- decoupled / behaviour


def test_decoupled_ppo_mask_hand_computed():
    # AReaL: w = ρ, but 0 where ρ > cap=2 (ρ=3); no lower bound, so ρ=0.25 is kept
    out = decoupled_ppo(*batch(), cap=2.0, mode="mask")
    check(out, [[0.5, 0.0, 1.0], [1.5, 0.25, 0.0]], masked=[[0, 1, 0], [0, 0, 0.0]])
    # default cap 5, mode mask: nothing above 5, w = ρ
    check(decoupled_ppo(*batch()), [[0.5, 3.0, 1.0], [1.5, 0.25, 0.0]])


def test_decoupled_ppo_truncate_and_uncapped():
    out = decoupled_ppo(*batch(), cap=2.0, mode="truncate")
    check(out, [[0.5, 2.0, 1.0], [1.5, 0.25, 0.0]], truncated=[[0, 1, 0], [0, 0, 0.0]])
    for mode in ("mask", "truncate"):
        check(decoupled_ppo(*batch(), cap=None, mode=mode), [[0.5, 3.0, 1.0], [1.5, 0.25, 0.0]])


@pytest.mark.parametrize("cap", [1.0, 1.3, 2.0, 5.0])
def test_decoupled_truncate_equals_token_tis(cap):
    a = decoupled_ppo(*batch(), cap=cap, mode="truncate")
    b = tis(*batch(), level="token", cap=cap)
    for field in ("weights", "ratio", "truncated", "masked"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field
    assert a.anchor == b.anchor == "proximal"


def test_behaviour_ppo():
    out = behaviour_ppo(*batch())
    check(out, MASK.tolist(), anchor="behaviour")
    assert_close(out.ratio, torch.tensor([[0.5, 3.0, 1.0], [1.5, 0.25, 0.0]]))


# ----------------------------------------------------------------------------- invariants


@pytest.mark.parametrize("fn,params", CASES, ids=IDS)
def test_unit_ratio_gives_mask(fn, params):
    behaviour = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.7, -3.0]])
    out = fn(behaviour.clone(), behaviour, MASK, **params)
    assert torch.equal(out.weights, MASK)
    assert torch.equal(out.ratio, MASK)
    assert not out.truncated.any() and not out.masked.any()


@pytest.mark.parametrize("fn,params", CASES, ids=IDS)
def test_padding_never_leaks(fn, params):
    proximal, behaviour, mask = batch()
    ref = fn(proximal, behaviour, mask, **params)
    for p_pad, b_pad in ((float("nan"), float("nan")), (float("inf"), 0.0), (0.0, float("-inf")),
                         (float("inf"), float("inf"))):
        p, b = proximal.clone(), behaviour.clone()
        p[1, 2], b[1, 2] = p_pad, b_pad
        out = fn(p, b, mask, **params)
        for field in ("weights", "ratio", "truncated", "masked"):
            value = getattr(out, field)
            assert torch.isfinite(value).all(), field
            assert value[1, 2] == 0.0, field
            assert torch.equal(value, getattr(ref, field)), field


@pytest.mark.parametrize("fn,params", CASES, ids=IDS)
def test_detached_float32_and_empty_rows(fn, params):
    proximal, behaviour, _ = batch()
    proximal = proximal.double().requires_grad_(True)
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]], dtype=torch.bool)  # row 1 empty
    out = fn(proximal, behaviour.bfloat16(), mask, **params)
    for field in ("weights", "ratio", "truncated", "masked"):
        value = getattr(out, field)
        assert value.dtype == torch.float32 and not value.requires_grad, field
        assert torch.isfinite(value).all() and (value[~mask] == 0).all(), field


def test_huge_log_ratio_is_clamped():
    behaviour = torch.zeros(1, 2)
    proximal = torch.tensor([[100.0, -100.0]])
    out = tis(proximal, behaviour, torch.ones(1, 2), level="token", cap=2.0)
    assert_close(out.ratio, torch.tensor([[math.exp(20.0), math.exp(-20.0)]]))
    assert_close(out.weights, torch.tensor([[2.0, math.exp(-20.0)]]))
    seq = tis(torch.full((1, 3), 30.0), torch.zeros(1, 3), torch.ones(1, 3), level="sequence", cap=2.0)
    assert torch.isfinite(seq.ratio).all()  # Σ = 90 clamped to 20


def test_shape_mismatch_rejected():
    with pytest.raises(ValueError, match="share one"):
        tis(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))


# ----------------------------------------------------------------------------- parameters


def test_params_validated_by_recipe_loader():
    check = lambda fn, params: check_component_params(fn, params, "recipe", "off_policy", PIPELINE)  # noqa: E731
    assert check(tis, {"level": "geometric", "cap": 3}) == {"level": "geometric", "cap": 3.0}
    assert check(decoupled_ppo, {"cap": None, "mode": "truncate"}) == {"cap": None, "mode": "truncate"}
    with pytest.raises(ConfigError, match=r"off_policy\.cap must be >= 1, got 0\.5"):
        check(tis, {"cap": 0.5})
    with pytest.raises(ConfigError, match=r"off_policy\.cap must be >= 1"):
        check(mis, {"cap": 0.9})
    with pytest.raises(ConfigError, match=r"off_policy\.cap must be >= 1"):
        check(decoupled_ppo, {"cap": 0.5})
    with pytest.raises(ConfigError, match=r"off_policy\.level.*Did you mean 'token'"):
        check(tis, {"level": "tokn"})
    with pytest.raises(ConfigError, match=r"off_policy\.mode"):
        check(decoupled_ppo, {"mode": "clip"})
    with pytest.raises(ConfigError, match=r"unknown parameter 'off_policy\.cap'"):
        check(behaviour_ppo, {"cap": 2.0})
    with pytest.raises(ConfigError, match=r"unknown parameter 'off_policy\.clip'.*Did you mean 'cap'"):
        check(tis, {"clip": 2.0})


def test_direct_calls_validate_too():
    with pytest.raises(ValueError, match="cap must be >= 1"):
        tis(*batch(), cap=0.5)
    with pytest.raises(ValueError, match="level must be one of"):
        mis(*batch(), level="tokn")
    with pytest.raises(ValueError, match="mode must be"):
        decoupled_ppo(*batch(), mode="clip")


# ----------------------------------------------------------------------------- metrics


def test_metrics_hand_computed():
    proximal, behaviour, mask = batch()
    correction = tis(proximal, behaviour, mask, level="token", cap=2.0)
    versions = torch.tensor([[3, 3, 2], [1, 1, 0]])  # pad version 0 would give staleness 4
    m = offpolicy_metrics(proximal, behaviour, mask, correction, versions, current_version=4)
    assert all(type(v) is float for v in m.values())
    # staleness over masked tokens: 4 - [3, 3, 2, 1, 1] = [1, 1, 2, 3, 3]: mean 10/5 = 2, max 3
    assert m["offpolicy/staleness_mean"] == pytest.approx(2.0)
    assert m["offpolicy/staleness_max"] == pytest.approx(3.0)
    # k3 = (ρ-1) - ln ρ: 0.5 -> -0.5+0.693147 = 0.193147; 3 -> 2-1.098612 = 0.901388; 1 -> 0;
    # 1.5 -> 0.5-0.405465 = 0.094535; 0.25 -> -0.75+1.386294 = 0.636294; Σ 1.825364 / 5
    assert m["offpolicy/kl_behaviour"] == pytest.approx(0.365073, abs=1e-5)
    # |log ρ| over the masked tokens: ln 4 = 1.386294 (ρ = 0.25) is the largest; the pad's 5 is not
    assert m["offpolicy/max_abs_logp_diff"] == pytest.approx(math.log(4.0))
    # w = [0.5, 2, 1, 1.5, 0.25]: Σw = 5.25, mean 1.05, max 2
    assert m["offpolicy/is_weight_mean"] == pytest.approx(1.05)
    assert m["offpolicy/is_weight_max"] == pytest.approx(2.0)
    assert m["offpolicy/truncated_fraction"] == pytest.approx(0.2)  # 1 of 5
    assert m["offpolicy/masked_fraction"] == pytest.approx(0.0)
    # Σw² = 0.25+4+1+2.25+0.0625 = 7.5625; ESS = 5.25² / (5·7.5625) = 27.5625 / 37.8125 = 0.728926
    assert m["offpolicy/ess"] == pytest.approx(0.728926, abs=1e-5)


def test_metrics_mis_fractions_and_optional_parts():
    proximal, behaviour, mask = batch()
    correction = mis(proximal, behaviour, mask, level="sequence", cap=2.0)
    m = offpolicy_metrics(None, behaviour, mask, correction, 7, current_version=7)
    assert "offpolicy/kl_behaviour" not in m
    assert m["offpolicy/staleness_mean"] == 0.0 and m["offpolicy/staleness_max"] == 0.0
    # w = [1.5, 1.5, 1.5, 0, 0]: masked 2/5; ESS = 4.5² / (5·6.75) = 20.25 / 33.75 = 0.6
    assert m["offpolicy/masked_fraction"] == pytest.approx(0.4)
    assert m["offpolicy/ess"] == pytest.approx(0.6)
    m = offpolicy_metrics(proximal, behaviour, mask, None, torch.zeros(2, 3, dtype=torch.long), 2)
    assert set(m) == {"offpolicy/staleness_mean", "offpolicy/staleness_max", "offpolicy/kl_behaviour",
                      "offpolicy/max_abs_logp_diff"}


def test_metrics_ess_edge_cases():
    z = torch.zeros(2, 3)
    # equal weights: ESS = (n w)² / (n · n w²) = 1
    same = offpolicy_metrics(z, z, MASK, behaviour_ppo(z, z, MASK), 0, 0)
    assert same["offpolicy/ess"] == pytest.approx(1.0)
    assert same["offpolicy/kl_behaviour"] == 0.0
    # every weight 0 -> ESS 0, not NaN
    dropped = mis(torch.full((2, 3), 3.0), z, MASK, level="token", cap=2.0)
    m = offpolicy_metrics(None, z, MASK, dropped, 0, 0)
    assert m["offpolicy/ess"] == 0.0 and m["offpolicy/masked_fraction"] == 1.0


def test_metrics_empty_mask_all_zero():
    proximal, behaviour, _ = batch()
    proximal[0, 0] = float("nan")
    empty = torch.zeros(2, 3)
    correction = tis(proximal, behaviour, empty)
    m = offpolicy_metrics(proximal, behaviour, empty, correction, torch.zeros(2, 3, dtype=torch.long), 5)
    assert len(m) == 9
    assert all(v == 0.0 and type(v) is float for v in m.values()), m


def test_a_source_that_measures_gets_the_metrics_without_a_changed_update():
    """An inference engine's source asks to ``measure``: the proximal pass runs for the metrics
    (KL and max |Δ log p| logged), but without a correction π_old stays sg(π_θ) on a single pass."""
    from helpers import mini_policy, mini_recipe
    from reasonrl.batch import RolloutBatch
    from reasonrl.train.behaviour import prepare_behaviour
    from reasonrl.train.objective import batch_logprobs

    policy, recipe = mini_policy(), mini_recipe()
    out = policy.sample(["1+2=", "3+4="], 2, 6, 1.0, torch.Generator().manual_seed(0))
    n = len(out.completion_ids)
    batch = RolloutBatch(prompt_ids=out.prompt_ids, prompt_mask=out.prompt_mask, completion_ids=out.completion_ids,
                         completion_mask=out.completion_mask, group_ids=torch.arange(n) // 2, rewards=torch.zeros(n),
                         truncated=out.truncated, sample_logprobs=out.sample_logprobs - 0.25 * out.completion_mask)
    assert prepare_behaviour(batch, recipe, policy, 0, source_off_policy=True) == {
        "offpolicy/staleness_mean": 0.0, "offpolicy/staleness_max": 0.0}  # not asked: no extra pass
    m = prepare_behaviour(batch, recipe, policy, 0, source_off_policy=True, measure=True)
    assert batch.old_logprobs is None and batch.is_weights is None
    proximal = batch_logprobs(policy, batch, recipe.train.micro_batch_size, 1.0, recipe.train.share_prompt)
    mask = batch.completion_mask.bool()
    assert m["offpolicy/max_abs_logp_diff"] == pytest.approx(float((proximal - batch.sample_logprobs)[mask].abs().max()))
    assert m["offpolicy/max_abs_logp_diff"] == pytest.approx(0.25, abs=1e-4)  # the shift given to μ
    # k3 at log ρ = 0.25 on every token: e^0.25 − 1 − 0.25 = 0.034025
    assert m["offpolicy/kl_behaviour"] == pytest.approx(0.034025, abs=1e-4)
