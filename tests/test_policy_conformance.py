"""The backend conformance suite, run on the embedded (mini) model, with its own tokenizer and
with one whose padding token is its EOS (SmolLM2's case: pad_token_id == eos_token_id == 2)."""

import pytest
import torch

from reasonrl.policy.hf import token_logprobs_and_entropy
from reasonrl.policy.loading import load_hf_policy

from helpers import assert_every_masked_token_was_sampled, assert_shared_pass_equals_row_pass, joined, mini_policy

PROMPTS = ["(3+4)*5;", "1+2*3;", "12*9+20;"]


PAD_IS_EOS = pytest.mark.parametrize("pad_is_eos", [False, True], ids=["pad!=eos", "pad==eos"])
# The sampling loop's two decode steps (rollout.decoder): every sampling contract holds for both.
DECODER = pytest.mark.parametrize("decoder", ["hf", "fused"])


@DECODER
@PAD_IS_EOS
def test_sample_shapes_masks_and_truncation(pad_is_eos, decoder):
    pol = mini_policy(pad_is_eos=pad_is_eos, decoder=decoder)
    s = pol.sample(PROMPTS, 4, 10, temperature=1.0, generator=torch.Generator().manual_seed(0))
    n = len(PROMPTS) * 4
    assert s.completion_ids.shape[0] == n and len(s.texts) == n and s.completion_ids.shape[1] <= 10
    eos, pad = pol.tokenizer.eos_token_id, pol.tokenizer.pad_token_id
    for row, m, trunc in zip(s.completion_ids, s.completion_mask, s.truncated):
        k = int(m.sum())
        assert m[:k].all() and not m[k:].any()  # contiguous prefix
        assert (row[k:] == pad).all()
        assert trunc == (row[k - 1] != eos)
        assert not (row[: k - 1] == eos).any()  # nothing after the first EOS counts
    assert torch.equal(s.prompt_ids[0], s.prompt_ids[3])  # rows i*G..i*G+G-1 share prompt i


@DECODER
@PAD_IS_EOS
def test_sampling_logprobs_match_the_scoring_pass(pad_is_eos, decoder):
    pol = mini_policy(pad_is_eos=pad_is_eos, decoder=decoder)
    s = pol.sample(PROMPTS, 3, 12, temperature=0.7, generator=torch.Generator().manual_seed(1))
    ids, mask = joined(s)
    logp, ent = pol.token_logprobs(ids, mask, s.completion_ids.shape[1], temperature=0.7, with_entropy=True)
    m = s.completion_mask.bool()
    torch.testing.assert_close(logp[m], s.sample_logprobs[m], atol=2e-5, rtol=1e-5)
    assert (ent[m] > 0).all()


def test_logits_only_at_completion_positions_equal_the_full_pass():
    pol = mini_policy()
    s = pol.sample(PROMPTS, 2, 8, temperature=1.0, generator=torch.Generator().manual_seed(2))
    ids, mask = joined(s)
    t = s.completion_ids.shape[1]
    fast, _ = pol.token_logprobs(ids, mask, t)
    from reasonrl.policy.hf import position_ids_from_mask

    full = pol.model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    slow, _ = token_logprobs_and_entropy(full[:, -t - 1:-1], ids[:, -t:], 1.0, False)
    torch.testing.assert_close(fast, slow)


def test_shared_prefill_equals_separate_prompts_when_greedy():
    pol = mini_policy()
    grouped = pol.sample(PROMPTS, 3, 10, temperature=0.0)
    separate = pol.sample([p for p in PROMPTS for _ in range(3)], 1, 10, temperature=0.0)
    assert grouped.texts == separate.texts


def test_gradients_flow_and_save_load_round_trip(tmp_path):
    pol = mini_policy()
    s = pol.sample(PROMPTS, 2, 8, generator=torch.Generator().manual_seed(3))
    ids, mask = joined(s)
    logp, _ = pol.token_logprobs(ids, mask, s.completion_ids.shape[1])
    (logp * s.completion_mask).sum().backward()
    grads = [p.grad for p in pol.parameters()]
    assert all(g is not None for g in grads) and any(g.abs().sum() > 0 for g in grads)
    pol.save(tmp_path / "m")
    again = load_hf_policy(tmp_path / "m")
    with torch.no_grad():
        a, _ = pol.token_logprobs(ids, mask, s.completion_ids.shape[1])
        b, _ = again.token_logprobs(ids, mask, s.completion_ids.shape[1])
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert again.tokenizer.decode(again.tokenizer("7*8=56;")["input_ids"]) == "7*8=56;"


def test_empty_prompt_is_rejected():
    import pytest

    with pytest.raises(ValueError, match="empty prompt"):
        mini_policy().sample(["1+2;", ""], 2, 4)


@DECODER
@PAD_IS_EOS
def test_stop_strings_end_completions_and_are_cut_from_the_text(pad_is_eos, decoder):
    pol = mini_policy(pad_is_eos=pad_is_eos, decoder=decoder)
    s = pol.sample(PROMPTS, 8, 16, temperature=1.0, generator=torch.Generator().manual_seed(4), stop=["*"])
    eos = pol.tokenizer.eos_token_id
    stopped = 0
    for text, row, m, trunc in zip(s.texts, s.completion_ids, s.completion_mask, s.truncated):
        assert "*" not in text
        tokens = row[: int(m.sum())]
        raw = pol.tokenizer.decode(tokens, skip_special_tokens=True)
        if raw.endswith("*"):  # ended by the stop string: its token is kept, the text cut
            stopped += 1
            assert not trunc and text == raw[:-1]
        else:
            assert trunc == (tokens[-1] != eos)
    assert stopped > 0  # the untrained model emits '*' often enough for this to bite
    assert stopped < len(s.texts)  # and some rows end otherwise (EOS or the budget), so both branches are checked


def test_chat_template_wraps_prompts_as_a_user_turn():
    pol = mini_policy()
    pol.tokenizer.chat_template = "{% for m in messages %}({{ m['content'] }}){% endfor %}{% if add_generation_prompt %}={% endif %}"
    pol.chat_template = True
    ids, _ = pol.encode_prompts(["1+2;"])
    assert pol.tokenizer.decode(ids[0], skip_special_tokens=True) == "(1+2;)="


def test_shared_prompt_pass_equals_the_row_by_row_pass_with_gradients():
    pol = mini_policy()
    s = pol.sample(PROMPTS, 4, 10, temperature=1.0, generator=torch.Generator().manual_seed(5))
    assert_shared_pass_equals_row_pass(pol, s, torch.arange(len(PROMPTS)).repeat_interleave(4))


@DECODER
@PAD_IS_EOS
def test_every_masked_token_was_sampled_at_eos_stop_and_budget(pad_is_eos, decoder):
    pol = mini_policy(seed=1, pad_is_eos=pad_is_eos, decoder=decoder)
    stop = ["*"]
    s = pol.sample(PROMPTS * 4, 8, 12, temperature=1.0, generator=torch.Generator().manual_seed(6), stop=stop)
    ends = assert_every_masked_token_was_sampled(pol, s, stop)
    assert min(ends.values()) > 0, ends  # each way of ending occurs, so each branch was checked


def _assert_same_samples(a, b, atol=1e-5):
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.completion_mask, b.completion_mask)
    assert torch.equal(a.truncated, b.truncated) and a.texts == b.texts
    torch.testing.assert_close(a.sample_logprobs, b.sample_logprobs, atol=atol, rtol=1e-5)


@DECODER
@PAD_IS_EOS
def test_compaction_samples_exactly_what_the_full_batch_samples(pad_is_eos, decoder):
    """Rows that end leave the decode batch; the generator is consumed as before, so the same
    tokens come out, for rows ending at EOS, at a stop string and at the budget."""
    pol = mini_policy(seed=1, pad_is_eos=pad_is_eos, decoder=decoder)
    stop = ["*"]
    runs = [pol.sample(PROMPTS * 4, 8, 12, temperature=1.0, generator=torch.Generator().manual_seed(6), stop=stop,
                       compact=compact) for compact in (False, True)]
    _assert_same_samples(*runs)
    ends = assert_every_masked_token_was_sampled(pol, runs[1], stop)
    assert min(ends.values()) > 0, ends
    # And at another temperature without stop strings (rows end at EOS or the budget).
    a, b = (pol.sample(PROMPTS * 2, 4, 24, temperature=0.7, generator=torch.Generator().manual_seed(7),
                       compact=compact) for compact in (False, True))
    assert (~a.truncated).any() and a.truncated.any()
    _assert_same_samples(a, b)
