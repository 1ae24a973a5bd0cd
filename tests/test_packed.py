"""The packed training forward (``train.length_buckets: 0``, ``reasonrl.policy.packed``): a layout
worked out by hand, then equality with the row-by-row pass (log-probs, entropies, gradients) on
the mini model and on a Llama with grouped key/value heads, padding token = EOS as SmolLM2's.
A trainer step's update: tests/test_prefix.py; two FSDP2 ranks: tests/test_fsdp.py."""

import pytest
import torch
import torch.nn.functional as F

from reasonrl.params import ConfigError
from reasonrl.policy.attention import packed_unsupported
from reasonrl.policy import packed as packing
from reasonrl.policy.packed import grouped_attention, pack
from reasonrl.policy.prefix import completion_lengths
from reasonrl.train import trainer as trainer_module
from reasonrl.train.trainer import Trainer

from helpers import assert_shared_pass_equals_row_pass, gqa_policy, mini_policy, mini_recipe

SHOTS = "1+1=2;2+2=4;3+3=6;4+"
PROMPTS = [SHOTS + "4;", SHOTS + "4;(3+4)*5;", SHOTS + "4;12*9+20;"]  # a common prefix of >= 16 tokens
DISTINCT = ["7*8=", "(1+2)*3=", "12-5="]  # none


def test_packed_layout_by_hand():
    # Prompts [_ 5 6 7] and [5 6 8 9] share [5 6] (min_prefix 2): suffixes [7] and [8 9].
    prompt_ids = torch.tensor([[0, 5, 6, 7], [5, 6, 8, 9]])
    prompt_mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    # Row 0 (prompt 0) ends after 2 tokens; row 1 (prompt 1) has a hole at 1; row 2 (prompt 0) is empty.
    completion_ids = torch.tensor([[10, 11, 12], [13, 14, 15], [16, 17, 18]])
    completion_mask = torch.tensor([[1, 1, 0], [1, 0, 1], [0, 0, 0]])
    lay = pack(prompt_ids, prompt_mask, completion_ids, completion_mask, torch.tensor([0, 1, 0]), min_prefix=2)
    # [5 6 | 7 | 8 9 | 10 11 | 13 14 15 | 16]: each at its own row's position.
    assert lay.ids.tolist() == [[5, 6, 7, 8, 9, 10, 11, 13, 14, 15, 16]]
    assert lay.positions.tolist() == [[0, 1, 2, 2, 3, 3, 4, 4, 5, 6, 3]]
    assert lay.prefix == 2
    assert lay.suffix_q.tolist() == [[2, 2], [3, 4]]  # prompt 0's second slot is padding
    assert lay.suffix_k.tolist() == [[0, 1, 2, 2], [0, 1, 3, 4]]
    T, F = True, False
    assert lay.suffix_mask[:, 0].tolist() == [[[T, T, T, F], [T, T, T, F]], [[T, T, T, F], [T, T, T, T]]]
    assert lay.completion_q.tolist() == [[5, 6, 5], [7, 8, 9], [10, 10, 10]]
    assert lay.completion_k.tolist() == [[0, 1, 2, 2, 5, 6, 5], [0, 1, 3, 4, 7, 8, 9], [0, 1, 2, 2, 10, 10, 10]]
    assert lay.completion_mask[:, 0].tolist() == [
        [[T, T, T, F, T, F, F], [T, T, T, F, T, T, F], [T, T, T, F, T, T, F]],
        [[T, T, T, T, T, F, F], [T, T, T, T, T, F, F], [T, T, T, T, T, F, T]],  # token 14 is no key
        [[T, T, T, F, F, F, F], [T, T, T, F, F, F, F], [T, T, T, F, F, F, F]]]  # nor 16
    # Outputs: [prefix (2) | suffix slots (2 x 2) | completion slots (3 x 3)].
    assert lay.back.tolist() == [0, 1, 2, 4, 5, 6, 7, 9, 10, 11, 12]
    # Logits at both prompts' last tokens, then at every completion token but each row's last.
    assert lay.keep.tolist() == [2, 4, 5, 7, 8]
    assert lay.predict.tolist() == [0, 2, 1, 3, 4, 0]
    assert lay.targets.tolist() == [10, 11, 13, 14, 15, 16]
    assert lay.dest.tolist() == [0, 1, 3, 4, 5, 6]


@pytest.mark.parametrize("attention", ["kernel", "grouped"])
@pytest.mark.parametrize("prompts", [PROMPTS, DISTINCT], ids=["common-prefix", "no-prefix"])
@pytest.mark.parametrize("model", ["mini", "gqa"])
def test_the_packed_pass_equals_the_row_by_row_pass(model, prompts, attention, monkeypatch):
    """``grouped``: the attention bf16 takes (``grouped_attention``), run here in float32 so that
    the comparison is exact to float32 rounding."""
    if attention == "grouped":
        monkeypatch.setattr(packing, "use_grouped_attention", lambda query, dropout: True)
    pol = mini_policy(seed=2, pad_is_eos=True) if model == "mini" else gqa_policy()
    assert packed_unsupported(pol.model) is None
    s = pol.sample(prompts, 4, 10, temperature=1.0, generator=torch.Generator().manual_seed(3), stop=["*", ";"])
    lengths = completion_lengths(s.completion_mask)
    assert len(set(lengths.tolist())) >= 2  # rows of several lengths: the packing cuts each at its own
    groups = torch.arange(len(prompts)).repeat_interleave(4)
    lp, ent = assert_shared_pass_equals_row_pass(pol, s, groups, length_buckets=0)
    after = torch.arange(s.completion_ids.shape[1]) >= lengths.clamp(min=1).unsqueeze(1)
    assert after.any() and (lp[after] == 0).all() and (ent[after] == 0).all()  # not computed: read 0
    # A hole (a completion token with mask 0) is no key, and the tokens after it keep their
    # positions, as in the padded shared pass (the row-by-row pass would renumber them).
    row = int(lengths.argmax())
    s.completion_mask[row, 1] = 0
    args = (s.prompt_ids, s.prompt_mask, s.completion_ids, s.completion_mask)
    with torch.no_grad():
        padded = pol.completion_logprobs(*args, group_ids=groups, with_entropy=True, length_buckets=1)
        packed = pol.completion_logprobs(*args, group_ids=groups, with_entropy=True, length_buckets=0)
        s.completion_mask[row, 1] = 1
        whole = pol.completion_logprobs(*args, group_ids=groups, with_entropy=True, length_buckets=0)
    m = s.completion_mask.bool()
    torch.testing.assert_close(packed[0][m], padded[0][m], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed[1][m], padded[1][m], atol=1e-5, rtol=1e-5)
    assert (packed[0][row, 2:] - whole[0][row, 2:]).abs()[m[row, 2:]].max() > 1e-4  # the hole is felt


def test_grouped_attention_is_softmax_attention_over_the_grouped_heads():
    """``grouped_attention`` against torch's attention (math kernel, float32) on random inputs with
    3 query heads a key head and a random mask: the same outputs and gradients within float32
    rounding; in bf16 within bf16's."""
    gen = torch.Generator().manual_seed(0)
    q = (3 * torch.randn(2, 6, 5, 8, generator=gen)).requires_grad_()
    k = (3 * torch.randn(2, 2, 7, 8, generator=gen)).requires_grad_()
    v = torch.randn(2, 2, 7, 8, generator=gen).requires_grad_()
    mask = torch.rand(2, 1, 5, 7, generator=gen) < 0.6
    mask[..., 0] = True  # every query reads at least one key
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3, enable_gqa=True)
    got = grouped_attention(q, k, v, mask, 0.3)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    w = torch.randn(want.shape, generator=gen)
    grads_want = torch.autograd.grad((want * w).sum(), (q, k, v))
    grads_got = torch.autograd.grad((got * w).sum(), (q, k, v))
    for a, b in zip(grads_got, grads_want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    half = grouped_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask, 0.3)
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), want, atol=0.1, rtol=0.05)
    assert (want - grouped_attention(q, k, v, torch.ones_like(mask), 0.3)).abs().max() > 0.5  # the mask matters


def test_the_packed_pass_in_bf16_is_as_near_float32_as_the_padded_pass(monkeypatch):
    """Under ``train.precision: bf16`` the packed pass rounds differently from the padded one, by
    as much as bf16 rounds at all: both stay as near the float32 log-probs. Its attention is
    ``grouped_attention`` there (exact in float32: the equality test above, ``grouped``)."""
    calls = []
    monkeypatch.setattr(packing, "grouped_attention",
                        lambda *a, real=packing.grouped_attention: calls.append(torch.is_autocast_enabled("cpu")) or real(*a))
    pol = gqa_policy(seed=1)
    s = pol.sample(PROMPTS * 2, 4, 12, temperature=1.0, generator=torch.Generator().manual_seed(0))
    args = (s.prompt_ids, s.prompt_mask, s.completion_ids, s.completion_mask)
    groups = torch.arange(6).repeat_interleave(4)
    m = s.completion_mask.bool()
    with torch.no_grad():
        exact, _ = pol.completion_logprobs(*args, group_ids=groups, length_buckets=1)
        pol.autocast = torch.bfloat16
        padded, _ = pol.completion_logprobs(*args, group_ids=groups, length_buckets=1)
        packed, _ = pol.completion_logprobs(*args, group_ids=groups, length_buckets=0)
    err_padded, err_packed = (padded - exact).abs()[m].mean(), (packed - exact).abs()[m].mean()
    assert err_padded > 0 and err_packed > 0  # bf16 did round
    assert err_packed < 2 * err_padded
    assert calls and all(calls)  # the packed bf16 pass took it, and only that pass


def test_a_model_that_cannot_pack_takes_the_padded_pass():
    pol = mini_policy(seed=2, pad_is_eos=True)
    pol.model.set_attn_implementation("eager")
    assert "'eager'" in packed_unsupported(pol.model)
    s = pol.sample(PROMPTS, 2, 6, temperature=1.0, generator=torch.Generator().manual_seed(0))
    args = (s.prompt_ids, s.prompt_mask, s.completion_ids, s.completion_mask)
    groups = torch.arange(len(PROMPTS)).repeat_interleave(2)
    with torch.no_grad():
        one = pol.completion_logprobs(*args, group_ids=groups, with_entropy=True, length_buckets=1)
        zero = pol.completion_logprobs(*args, group_ids=groups, with_entropy=True, length_buckets=0)
    assert torch.equal(one[0], zero[0]) and torch.equal(one[1], zero[1])


def test_packing_is_refused_before_the_run_where_the_model_cannot(tmp_path, monkeypatch):
    monkeypatch.setattr(trainer_module, "packed_unsupported", lambda model: "its attention implementation is 'eager'")
    recipe = mini_recipe(train={"steps": 1, "length_buckets": 0}, eval={"size": 0})
    with pytest.raises(ConfigError, match="train.length_buckets: 0 .* 'eager'"):
        Trainer(recipe, tmp_path / "run", log=lambda m: None).run()
    assert not (tmp_path / "run" / "metrics.jsonl").exists()

