"""reasonrl.policy.attention: grouped key/value heads inside torch's CPU kernel, the same attention."""

import json
import math

import pytest
import torch
import transformers.integrations.sdpa_attention as hf_sdpa
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from reasonrl.policy.attention import SDPA_GQA, sdpa_gqa
from reasonrl.policy.char_tokenizer import build_char_tokenizer
from reasonrl.policy.hf import HFPolicy
from reasonrl.policy.tiny import SMOLLM2_ARCHITECTURE

from helpers import mini_policy


def gqa_policy(seed: int = 0) -> HFPolicy:
    """SmolLM2's head layout (9 query heads over 3 key/value heads) at a test's size."""
    tok = build_char_tokenizer()
    arch = {**SMOLLM2_ARCHITECTURE, "hidden_size": 72, "head_dim": 8, "intermediate_size": 64, "num_hidden_layers": 2}
    config = LlamaConfig(**arch, vocab_size=len(tok), pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id)
    torch.manual_seed(seed)
    return HFPolicy(LlamaForCausalLM(config), tok)


def grouped_batch(policy):
    """Two prompts of different lengths (left padding), two completions each: the shared-prompt
    training pass, whose suffix and completion forwards attend through a mask."""
    gen = torch.Generator().manual_seed(0)
    s = policy.sample(["12+7=", "3*(4+5)="], 2, 6, 1.0, generator=gen)
    return s, torch.tensor([0, 0, 1, 1])


def logprobs_and_grads(policy, samples, groups):
    policy.model.zero_grad(set_to_none=True)
    logp, _ = policy.completion_logprobs(samples.prompt_ids, samples.prompt_mask, samples.completion_ids,
                                         samples.completion_mask, group_ids=groups)
    (logp * samples.completion_mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in policy.model.named_parameters()}
    return logp.detach(), grads


def test_the_policy_runs_grouped_heads_in_the_kernel_and_transformers_would_have_copied_them(monkeypatch):
    policy = gqa_policy()
    assert policy.model.config._attn_implementation == SDPA_GQA
    samples, groups = grouped_batch(policy)
    copies = []
    real_repeat = hf_sdpa.repeat_kv
    monkeypatch.setattr(hf_sdpa, "repeat_kv", lambda x, n: copies.append(x.shape) or real_repeat(x, n))
    logprobs_and_grads(policy, samples, groups)
    assert copies == []  # every masked training forward took the kernel's grouped heads
    policy.model.set_attn_implementation("sdpa")
    logprobs_and_grads(policy, samples, groups)
    assert copies  # transformers' own path copies the key/value heads for these calls


def test_grouped_heads_in_the_kernel_give_transformers_log_probs_and_gradients():
    policy = gqa_policy()
    samples, groups = grouped_batch(policy)
    logp, grads = logprobs_and_grads(policy, samples, groups)
    policy.model.set_attn_implementation("sdpa")
    ref_logp, ref_grads = logprobs_and_grads(policy, samples, groups)
    torch.testing.assert_close(logp, ref_logp, rtol=0, atol=1e-6)
    for name, g in grads.items():
        # The key/value gradients sum the three query heads inside the kernel instead of over copies.
        torch.testing.assert_close(g, ref_grads[name], rtol=1e-5, atol=1e-6, msg=name)


def test_sdpa_gqa_is_the_attention_formula_with_query_head_h_reading_key_head_h_over_groups():
    torch.manual_seed(0)
    b, h, k, q_len, t, d = 2, 6, 2, 3, 5, 4
    query, key, value = torch.randn(b, h, q_len, d), torch.randn(b, k, t, d), torch.randn(b, k, t, d)
    allowed = torch.ones(b, 1, q_len, t, dtype=torch.bool)
    allowed[0, :, :, :2] = False  # left padding of row 0
    allowed[:, :, 0, 4] = False  # a causal cut
    module = torch.nn.Module()
    module.num_key_value_groups = h // k
    out, weights = sdpa_gqa(module, query, key, value, allowed, scaling=0.5)
    assert weights is None and out.shape == (b, q_len, h, d)
    for head in range(h):
        kv = head // (h // k)
        scores = query[:, head] @ key[:, kv].transpose(-1, -2) * 0.5
        probs = torch.softmax(scores.masked_fill(~allowed[:, 0], -math.inf), dim=-1)
        torch.testing.assert_close(out[:, :, head], probs @ value[:, kv], rtol=0, atol=1e-6)


def test_a_model_without_grouped_heads_is_transformers_sdpa_to_the_bit():
    policy = mini_policy()  # the embedded model's layout: as many key/value heads as query heads
    samples, groups = grouped_batch(policy)
    logp, grads = logprobs_and_grads(policy, samples, groups)
    policy.model.set_attn_implementation("sdpa")
    ref_logp, ref_grads = logprobs_and_grads(policy, samples, groups)
    assert torch.equal(logp, ref_logp)
    assert all(torch.equal(g, ref_grads[n]) for n, g in grads.items())


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_only_sdpa_is_switched_and_a_saved_model_loads_anywhere_as_sdpa(tmp_path, implementation):
    config = LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, attn_implementation=implementation)
    policy = HFPolicy(LlamaForCausalLM(config), build_char_tokenizer())
    want = SDPA_GQA if implementation == "sdpa" else "eager"
    assert policy.model.config._attn_implementation == want
    policy.model.save_pretrained(tmp_path)
    assert SDPA_GQA not in json.loads((tmp_path / "config.json").read_text()).values()
    assert AutoModelForCausalLM.from_pretrained(tmp_path).config._attn_implementation == "sdpa"

