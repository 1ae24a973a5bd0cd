"""Throughput of the embedded model: sampling and training tokens/s, and the training
phase's achieved FLOP/s as a fraction of the matmul peak measured in the same run.

Also times transformers' ``model.generate`` on the same prompts as the peer for our
sampler (ratio reported; same batch, same token budget, sampling on).

    .venv/bin/python benchmarks/embedded_throughput.py [--repeats 5] [--threads 2]

The last line is machine-readable.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from reasonrl.policy.tiny import TinySpec, load_tiny_policy
from reasonrl.tasks.arithmetic import ArithmeticTask


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_peak(repeats: int, n: int = 1024) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    seconds = median_time(lambda: [a @ b for _ in range(8)], repeats)
    return 8 * 2 * n**3 / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    policy = load_tiny_policy(TinySpec())
    task = ArithmeticTask()
    prompts = [p.prompt for p in task.train_problems(0, args.prompts, seed=0)]
    g, budget = args.generations, args.max_new_tokens

    gen = torch.Generator().manual_seed(0)
    samples = policy.sample(prompts, g, budget, 1.0, generator=gen)
    ours = median_time(lambda: policy.sample(prompts, g, budget, 1.0, generator=gen), args.repeats)
    sampled_tokens = int(samples.completion_mask.sum())

    tok = policy.tokenizer
    enc = tok(prompts, return_tensors="pt", padding=True)
    ids, mask = enc["input_ids"].repeat_interleave(g, 0), enc["attention_mask"].repeat_interleave(g, 0)

    def hf_generate():
        with torch.no_grad():
            policy.model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                                  max_new_tokens=budget, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)

    peer = median_time(hf_generate, args.repeats)

    input_ids = torch.cat([samples.prompt_ids, samples.completion_ids], 1)
    attention = torch.cat([samples.prompt_mask, samples.completion_mask], 1)
    t = samples.completion_ids.shape[1]

    def train_pass():
        logp, _ = policy.token_logprobs(input_ids, attention, t, with_entropy=True)
        (logp * samples.completion_mask).sum().backward()
        policy.model.zero_grad(set_to_none=True)

    with FlopCounterMode(display=False) as counter:
        train_pass()
    flops = counter.get_total_flops()
    train_seconds = median_time(train_pass, args.repeats)
    peak = matmul_peak(args.repeats)
    achieved = flops / train_seconds

    print(f"sampling   {sampled_tokens / ours:9.0f} completion tokens/s  ({ours * 1000:.0f} ms for {len(prompts)}x{g})")
    print(f"generate() {sampled_tokens / peer:9.0f} tokens/s (transformers model.generate, same batch)")
    print(f"training   {sampled_tokens / train_seconds:9.0f} completion tokens/s fwd+bwd ({train_seconds * 1000:.0f} ms)")
    print(f"training   {achieved / 1e9:9.2f} GFLOP/s achieved; matmul peak {peak / 1e9:.2f} GFLOP/s "
          f"({args.threads} threads) -> {achieved / peak:.1%} of peak")
    print(f"sample_tokens_per_s={sampled_tokens / ours:.0f} generate_ratio={peer / ours:.2f} "
          f"train_tokens_per_s={sampled_tokens / train_seconds:.0f} flops_fraction_of_peak={achieved / peak:.4f}")


if __name__ == "__main__":
    main()
