"""Sampler levers on the mini model: partial rollouts (``refresh``), weights as plain tensors,
and a bfloat16 sampling copy beside the float32 learner. (Compaction's equivalence to the
uncompacted decode batch is in the conformance suite.)"""

import pytest
import torch

from reasonrl.policy.hf import position_ids_from_mask
from reasonrl.policy.prefix import cache_kw, cache_of

from helpers import mini_policy

PROMPTS = ["(3+4)*5;", "1+2*3;", "12*9+20;"]
NORM = "model.norm.weight"  # the final norm: it moves the logits but no position's keys/values


def joined(s):
    return torch.cat([s.prompt_ids, s.completion_ids], 1), torch.cat([s.prompt_mask, s.completion_mask], 1)


def score(pol, s, temperature=1.0):
    ids, mask = joined(s)
    with torch.no_grad():
        return pol.token_logprobs(ids, mask, s.completion_ids.shape[1], temperature=temperature)[0]


class SwapAt:
    """A fake ``refresh``: call 0 precedes the prefill, call j the decode forward that samples
    token j; at call ``at`` it loads ``new`` weights into ``pol`` and bumps the version 3 -> 4."""

    def __init__(self, pol, new, at):
        self.pol, self.new, self.at, self.calls, self.version = pol, new, at, 0, 3

    def __call__(self):
        if self.calls == self.at:
            self.pol.set_weights(self.new)
            self.version = 4
        self.calls += 1
        return self.version


def perturbed(state, keys, seed=0, scale=0.5):
    g = torch.Generator().manual_seed(seed)
    return {k: v + scale * v.abs().mean() * torch.randn(v.shape, generator=g) if k in keys else v.clone()
            for k, v in state.items()}


COMPACT = pytest.mark.parametrize("compact", [True, False], ids=["compact", "full-batch"])
DECODER = pytest.mark.parametrize("decoder", ["hf", "fused"])


@DECODER
@COMPACT
def test_token_versions_and_behaviour_logprobs_follow_a_swap_between_tokens(compact, decoder):
    pol = mini_policy(seed=1, decoder=decoder)
    old = pol.sampling_copy()  # the weights before the swap, for scoring
    new = perturbed(pol.weights(), {NORM})
    at = 4
    refresh = SwapAt(pol, new, at)
    s = pol.sample(PROMPTS, 4, 12, temperature=1.0, generator=torch.Generator().manual_seed(0),
                   refresh=refresh, compact=compact)
    m = s.completion_mask.bool()
    t = s.completion_ids.shape[1]
    assert refresh.calls == t  # once before the prefill, once before each of the t - 1 decode forwards
    expected = torch.where(torch.arange(t) >= at, 4, 3).expand_as(m)
    assert s.token_versions.dtype == torch.long
    assert torch.equal(s.token_versions, torch.where(m, expected, 0))
    before, after = m.clone(), m.clone()
    before[:, at:] = False
    after[:, :at] = False
    assert before.any() and after.any()
    # Only the final norm moved, so the kept KV cache equals a fresh pass's under either weights:
    # each token's behaviour log-prob is a fresh score under the weights that sampled it.
    lp_old, lp_new = score(old, s), score(pol, s)
    torch.testing.assert_close(s.sample_logprobs[before], lp_old[before], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(s.sample_logprobs[after], lp_new[after], atol=2e-5, rtol=1e-5)
    assert (lp_old[after] - lp_new[after]).abs().max() > 1e-2  # the swap did change the distribution


@DECODER
def test_the_kv_cache_of_older_weights_is_kept_after_a_swap(decoder):
    """The fused decoder packs its weights at the prefill: this also checks that it repacks them
    when the version changes (the tokens after the swap follow the new weights)."""
    pol = mini_policy(seed=1, decoder=decoder)
    old = pol.sampling_copy()
    new = perturbed(pol.weights(), set(pol.weights()))  # every tensor moves, keys/values included
    at = 4
    s = pol.sample(PROMPTS, 4, 12, temperature=1.0, generator=torch.Generator().manual_seed(0),
                   refresh=SwapAt(pol, new, at))
    m = s.completion_mask.bool()
    before = m & (torch.arange(m.shape[1]) < at)
    torch.testing.assert_close(s.sample_logprobs[before], score(old, s)[before], atol=2e-5, rtol=1e-5)
    # Reference for the tokens after the swap: the old weights feed the prompt and the tokens fed
    # before it (0 .. at-2), the new weights the rest, through one cache.
    p = s.prompt_ids.shape[1]
    ids, mask = joined(s)
    pos = position_ids_from_mask(mask)
    with torch.no_grad():
        head = old.model(input_ids=ids[:, :p + at - 1], attention_mask=mask[:, :p + at - 1],
                         position_ids=pos[:, :p + at - 1], use_cache=True)
        tail = pol.model(input_ids=ids[:, p + at - 1:], attention_mask=mask, position_ids=pos[:, p + at - 1:],
                         **cache_kw(cache_of(head)), use_cache=True).logits[:, :-1]
    ref = torch.log_softmax(tail.float(), -1).gather(-1, s.completion_ids[:, at:, None]).squeeze(-1)
    after = m[:, at:]
    assert after.any()
    torch.testing.assert_close(s.sample_logprobs[:, at:][after], ref[after], atol=2e-5, rtol=1e-5)
    fresh = score(pol, s)[:, at:]  # a fresh pass under the new weights recomputes the cache: not the same
    assert (fresh[after] - ref[after]).abs().max() > 1e-3


def test_without_refresh_there_are_no_token_versions():
    s = mini_policy().sample(PROMPTS, 2, 6, generator=torch.Generator().manual_seed(0))
    assert s.token_versions is None


def test_weights_round_trip_exactly_and_name_bad_keys():
    a, b = mini_policy(seed=0), mini_policy(seed=1)
    w = a.weights()
    assert a.model.config.tie_word_embeddings and "lm_head.weight" not in w  # no tied duplicate
    assert all(t.device.type == "cpu" and not t.requires_grad for t in w.values())
    w["model.norm.weight"].add_(1.0)  # copies: the model is untouched
    assert not torch.equal(w["model.norm.weight"], a.model.model.norm.weight)
    w = a.weights()
    b.set_weights(w)
    for k, v in b.weights().items():
        assert torch.equal(v, w[k]), k
    s = a.sample(PROMPTS, 2, 8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(score(a, s), score(b, s))
    assert b.model.lm_head.weight is b.model.model.embed_tokens.weight  # the tie survives
    with pytest.raises(ValueError, match=r"missing \['model.norm.weight'\].*unexpected \['bogus'\]"):
        b.set_weights({**{k: v for k, v in w.items() if k != "model.norm.weight"}, "bogus": torch.zeros(1)})
    with pytest.raises(ValueError, match="shape of model.norm.weight"):
        b.set_weights({**w, "model.norm.weight": torch.zeros(1)})


def test_set_weights_casts_to_the_models_dtype():
    a = mini_policy()
    w16 = {k: v.to(torch.bfloat16) for k, v in a.weights().items()}
    a.set_weights(w16)
    for k, v in a.weights().items():
        assert v.dtype == torch.float32 and torch.equal(v, w16[k].float()), k


def test_lora_weights_are_the_adapters_only():
    from reasonrl.config import LoraConfig
    from reasonrl.policy.lora import apply_lora

    def lora(seed):
        pol = mini_policy(seed=0)
        pol.model = apply_lora(pol.model, LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"]))
        with torch.no_grad():
            g = torch.Generator().manual_seed(seed)
            for name, p in pol.model.named_parameters():
                if "lora_B" in name:
                    p.copy_(0.05 * torch.randn(p.shape, generator=g))
        return pol

    a, b = lora(1), lora(2)
    w = a.weights()
    assert w and all("lora_" in k for k in w)
    s = a.sample(PROMPTS, 2, 8, generator=torch.Generator().manual_seed(0))
    assert not torch.equal(score(a, s), score(b, s))
    b.set_weights(w)
    assert torch.equal(score(a, s), score(b, s))


def test_sampling_copy_is_separate_and_samples_like_the_learner():
    pol = mini_policy()
    twin = pol.sampling_copy()
    assert twin.model is not pol.model and twin.tokenizer is pol.tokenizer
    assert not twin.model.training
    # requires_grad is kept as the learner's (sampling runs under no_grad anyway): with it off,
    # torch's CPU linear takes another kernel and the copy would differ in the last bits.
    assert [p.requires_grad for p in twin.model.parameters()] == [p.requires_grad for p in pol.model.parameters()]
    a = pol.sample(PROMPTS, 3, 10, generator=torch.Generator().manual_seed(0))
    b = twin.sample(PROMPTS, 3, 10, generator=torch.Generator().manual_seed(0))
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.sample_logprobs, b.sample_logprobs)
    with torch.no_grad():
        pol.model.model.norm.weight.mul_(2.0)  # the learner moves; the copy does not
    assert not torch.equal(twin.model.model.norm.weight, pol.model.model.norm.weight)
    twin.set_weights(pol.weights())
    assert torch.equal(twin.model.model.norm.weight, pol.model.model.norm.weight)


def test_bfloat16_sampling_copy_is_close_to_float32_scoring():
    pol = mini_policy(seed=1)
    twin = pol.sampling_copy("bfloat16")
    assert all(p.dtype == torch.bfloat16 for p in twin.model.parameters())
    assert all(p.dtype == torch.float32 for p in pol.model.parameters())
    s = twin.sample(PROMPTS * 2, 4, 16, temperature=1.0, generator=torch.Generator().manual_seed(0), stop=["*"])
    m = s.completion_mask.bool()
    assert m.sum() > 50 and s.sample_logprobs.dtype == torch.float32
    assert (s.sample_logprobs[m] < 0).all()
    gap = (s.sample_logprobs - score(pol, s))[m].abs()
    # Measured: mean 5e-4, max 3e-3 (bfloat16 rounding, not a bug); zero would mean no bfloat16 at all.
    assert 0 < gap.max() < 5e-2 and gap.mean() < 5e-3, (float(gap.mean()), float(gap.max()))
    twin.set_weights(pol.weights())  # float32 weights cast into the bfloat16 copy
    assert all(p.dtype == torch.bfloat16 for p in twin.model.parameters())
    with pytest.raises(ValueError, match="dtype must be float32, bfloat16, float16 or int8, got 'float8'"):
        pol.sampling_copy("float8")
