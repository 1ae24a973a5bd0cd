"""Shared work in the training forward (``reasonrl.policy.prefix``): a common prompt prefix run
once, and rows split into length buckets. Hand-computed plans, then equality with the row-by-row
pass (log-probs, entropies and gradients) on the mini model, with a padding token equal to EOS
as SmolLM2's."""

import os
import subprocess
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from reasonrl.metrics_log import read_metrics
from reasonrl.policy.hf import HFPolicy
from reasonrl.policy.prefix import common_prefix, completion_lengths, fork_cache, length_buckets, prompt_pass
from reasonrl.train.trainer import Trainer

from helpers import assert_shared_pass_equals_row_pass, mini_policy, mini_recipe, require_interpreter, weights

# Every prompt starts with the same 20 characters (a few-shot template's role), then differs,
# in length too.
SHOTS = "1+1=2;2+2=4;3+3=6;4+"
PROMPTS = [SHOTS + "4;", SHOTS + "4;(3+4)*5;", SHOTS + "4;12*9+20;"]


def test_common_prefix_by_hand():
    ids = torch.tensor([[0, 0, 5, 6, 7, 8], [5, 6, 7, 9, 1, 2]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    # Shortest row 4 tokens: at most 3 shared, and [5, 6, 7] are.
    assert common_prefix(ids, mask, min_len=2) == 3
    assert common_prefix(ids, mask, min_len=4) == 0  # fewer than min_len shared: not worth a call
    assert common_prefix(ids[:1], mask[:1], min_len=1) == 0  # one prompt: nothing to share
    other = torch.tensor([[0, 0, 5, 6, 7, 8], [5, 6, 1, 9, 1, 2]])
    assert common_prefix(other, mask, min_len=1) == 2
    first_differs = torch.tensor([[0, 0, 4, 6, 7, 8], [5, 6, 7, 9, 1, 2]])
    assert common_prefix(first_differs, mask, min_len=1) == 0


def test_completion_lengths_end_at_the_last_attended_token():
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    assert completion_lengths(mask).tolist() == [2, 3, 0, 4]


def test_length_buckets_minimise_padded_tokens_plus_calls():
    lengths = torch.tensor([9, 2, 8, 3])
    # 1 bucket: 4*9 + 5 = 41; {2,3},{8,9}: 2*3 + 2*9 + 2*5 = 34; 3 buckets: 2 + 3 + 18 + 15 = 38.
    buckets = length_buckets(lengths, max_buckets=4, overhead=5)
    assert [b.tolist() for b in buckets] == [[1, 3], [2, 0]]
    assert [b.tolist() for b in length_buckets(lengths, 4, overhead=0)] == [[1], [3], [2], [0]]
    assert [b.tolist() for b in length_buckets(lengths, 4, overhead=100)] == [[1, 3, 2, 0]]
    assert [b.tolist() for b in length_buckets(lengths, 1, overhead=0)] == [[1, 3, 2, 0]]
    # Every row lands in exactly one bucket.
    rows = torch.cat(length_buckets(torch.randint(1, 30, (50,)), 4, 3)).sort().values
    assert torch.equal(rows, torch.arange(50))


def test_prompt_pass_with_a_shared_prefix_gives_each_prompts_own_logits():
    pol = mini_policy(pad_is_eos=True)
    ids, mask = pol.encode_prompts(PROMPTS)
    assert common_prefix(ids, mask) >= 16
    with torch.no_grad():
        last, _, layout, last_pos = prompt_pass(pol.model, ids, mask)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        plain = pol.model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1]
    torch.testing.assert_close(last, plain, atol=1e-5, rtol=1e-5)
    assert torch.equal(last_pos, mask.sum(1) - 1)
    assert torch.equal(layout.sum(1), mask.sum(1))  # the layout attends to each prompt's tokens, no more


@pytest.mark.parametrize("buckets", [1, 3])
def test_shared_prefix_and_length_buckets_equal_the_row_by_row_pass(buckets):
    pol = mini_policy(seed=2, pad_is_eos=True)
    pol.bucket_overhead = 0  # the mini model would never split: force the buckets
    s = pol.sample(PROMPTS, 4, 10, temperature=1.0, generator=torch.Generator().manual_seed(3), stop=["*"])
    lengths = completion_lengths(s.completion_mask)
    assert len(set(lengths.tolist())) >= 3  # rows of several lengths, so the buckets differ
    lp_b, ent_b = assert_shared_pass_equals_row_pass(pol, s, torch.arange(len(PROMPTS)).repeat_interleave(4),
                                                     length_buckets=buckets)
    if buckets > 1:  # positions after the longest row of a row's bucket are not computed
        width = torch.zeros_like(lengths)
        for rows in length_buckets(lengths.clamp(min=1), buckets, overhead=0):
            width[rows] = lengths[rows].clamp(min=1).max()
        assert len(set(width.tolist())) == buckets
        after = torch.arange(s.completion_ids.shape[1]) >= width.unsqueeze(1)
        assert after.any() and (lp_b[after] == 0).all() and (ent_b[after] == 0).all()


def test_completion_logits_with_a_shared_prefix_equal_the_row_by_row_logits():
    pol = mini_policy(seed=1)
    s = pol.sample(PROMPTS, 2, 6, temperature=1.0, generator=torch.Generator().manual_seed(0))
    args = (s.prompt_ids, s.prompt_mask, s.completion_ids, s.completion_mask)
    with torch.no_grad():
        rows = pol.completion_logits(*args)
        shared = pol.completion_logits(*args, group_ids=torch.arange(len(PROMPTS)).repeat_interleave(2))
    m = s.completion_mask.bool()
    assert shared.shape == rows.shape
    torch.testing.assert_close(shared[m], rows[m], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("decoder", ["hf", "fused"])
def test_sampling_after_a_shared_prefix_logs_the_scoring_pass_logprobs(decoder):
    """The sampler's prefill runs the common prefix once too; the decode steps continue that
    layout, so the behaviour log-probs still equal the row-by-row scoring pass."""
    pol = mini_policy(seed=1, pad_is_eos=True, decoder=decoder)
    s = pol.sample(PROMPTS, 4, 10, temperature=1.0, generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        logp, _ = pol.completion_logprobs(s.prompt_ids, s.prompt_mask, s.completion_ids, s.completion_mask)
    m = s.completion_mask.bool()
    assert m.sum() > 20
    torch.testing.assert_close(s.sample_logprobs[m], logp[m], atol=1e-4, rtol=1e-4)


def test_one_bucket_chosen_is_the_unbucketed_pass_to_the_bit():
    """Where a forward call costs more than the padding it would save (the embedded model's
    case), the rows stay in their own order at full width: the numbers of length_buckets 1."""
    pol = mini_policy(seed=2)
    s = pol.sample(PROMPTS, 4, 10, temperature=1.0, generator=torch.Generator().manual_seed(3), stop=["*"])
    groups = torch.arange(len(PROMPTS)).repeat_interleave(4)
    args = (s.prompt_ids, s.prompt_mask, s.completion_ids, s.completion_mask)
    assert pol._bucket_overhead() > s.completion_ids.numel()
    with torch.no_grad():
        one = pol.completion_logprobs(*args, group_ids=groups, with_entropy=True, length_buckets=1)
        four = pol.completion_logprobs(*args, group_ids=groups, with_entropy=True, length_buckets=4)
    assert torch.equal(one[0], four[0]) and torch.equal(one[1], four[1])


@pytest.mark.parametrize("buckets", [4, 0], ids=["buckets", "packed"])
def test_a_training_step_in_length_buckets_makes_the_same_update(tmp_path, monkeypatch, buckets):
    """train.length_buckets through the trainer (0: the packed forward, tests/test_packed.py): the
    loss (its totals, the entropy bonus, the micro-batch split) and so the update are those of one
    padded forward."""
    monkeypatch.setattr(HFPolicy, "_bucket_overhead", lambda self: 0)  # the mini model would never split
    results = []
    for i, buckets in enumerate((1, buckets)):
        recipe = mini_recipe(train={"steps": 1, "micro_batch_size": 6, "length_buckets": buckets}, eval={"size": 0},
                             loss={"agg": "seq-mean-token-mean", "entropy_coef": 0.1},
                             rollout={"num_generations": 4, "max_new_tokens": 24, "stop": ["*"]})
        Trainer(recipe, tmp_path / str(i), log=lambda m: None).run()
        results.append((weights(tmp_path / str(i)), read_metrics(tmp_path / str(i))[-1]))
    (a, ma), (b, mb) = results
    assert ma["grad_norm"] > 0 and ma["response_length/max"] > ma["response_length/mean"]  # rows of several lengths
    assert mb["entropy"] == pytest.approx(ma["entropy"], rel=1e-5)
    assert mb["grad_norm"] == pytest.approx(ma["grad_norm"], rel=1e-4)
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=1e-5)


def test_prompt_pass_under_the_older_transformers_cache_name():
    """transformers 5.2x renamed the KV cache ``past_key_values`` -> ``cache``; pyproject admits
    both, and the GPU machine's 5.17 has the old name (its first gpu_check failed on it). The vLLM
    side environment pins transformers < 5.20: there the prefix-shared pass equals the plain one."""
    python = require_interpreter(os.environ.get("REASONRL_VLLM_PYTHON"), "vLLM side-environment",
                                 "make vllm-env", ".venv-vllm")
    src = str(Path(__file__).resolve().parents[1] / "src")
    script = (
        "import torch\n"
        "from transformers import LlamaConfig, LlamaForCausalLM\n"
        "from reasonrl.policy.prefix import _CACHE_NAME, prompt_pass\n"
        "torch.manual_seed(0)\n"
        "m = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,"
        " num_attention_heads=4, num_key_value_heads=2)).eval()\n"
        "ids = torch.cat([torch.randint(1, 50, (1, 20)).repeat(3, 1), torch.randint(1, 50, (3, 4))], 1)\n"
        "mask = torch.ones_like(ids); mask[0, :2] = 0\n"
        "shared, plain = prompt_pass(m, ids, mask, 16)[0], prompt_pass(m, ids, mask, 10**6)[0]\n"
        "print(_CACHE_NAME, float((shared - plain).abs().max()))\n")
    out = subprocess.run([python, "-c", script], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": src})
    assert out.returncode == 0, out.stderr[-2000:]
    name, diff = out.stdout.split()
    assert name == "past_key_values" and float(diff) < 1e-5


def test_a_two_thread_shared_prompt_backward_repeats_to_the_bit():
    """The cache rows a group's completions share: their gradients add up in row order, not by
    parallel atomic adds (transformers' ``keys[rows, ...]`` backward at > 1 thread gave 40
    distinct sums in 40 tries), so a 2-thread run repeats exactly."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.manual_seed(0)
        keys = torch.randn(2, 4, 60, 32, requires_grad=True)
        values = torch.randn(2, 4, 60, 32, requires_grad=True)
        rows = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1] * 8)
        weights = torch.randn(len(rows), 4, 60, 32)  # a different gradient for every copy of a row
        seen = set()
        for _ in range(10):
            cache = DynamicCache()
            cache.update(keys, values, 0)
            fork = fork_cache(cache, rows)
            keys.grad = values.grad = None
            (fork.layers[0].keys * weights).sum().backward()
            seen.add(keys.grad.numpy().tobytes())
            torch.testing.assert_close(fork.layers[0].keys, keys[rows], rtol=0, atol=0)
        assert len(seen) == 1
    finally:
        torch.set_num_threads(threads)
