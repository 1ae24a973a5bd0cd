"""Sampler levers on SmolLM2-135M-Instruct (offline): batch compaction and a bfloat16 sampler.

(a) The issue's measurement: 2 prompts x 4 samples, up to 512 new tokens, temperature 1, one
    prompt that makes its rows stop early. Milliseconds per decode step against the rows in
    the decode batch, and the fraction of decoded row-steps that were real tokens, without and
    with compaction (same seed: the same tokens must come out).
(b) Sampling tokens/s at batch 8 (1 prompt x 8, 128 new tokens) for float32 without compaction
    (the sampler before issue 10), float32 with compaction, a bfloat16 sampling copy with
    compaction, and the fused Llama decoder (``rollout.decoder: fused``) in float32 and bfloat16
    and over int8 weights (``rollout.dtype: int8``: quantised at every sampling call, included);
    the runs are interleaved and repeated, and the ratios are of medians from this one run.
(c) What the bfloat16 samplers cost in behaviour-learner mismatch: their sample_logprobs against
    float32 scoring of the same tokens (k3 KL over tokens, max |delta|).

Absolute times depend on the machine and its load; compare the ratios.

    .venv/bin/python benchmarks/sampler_levers.py [--threads 2] [--repeats 3]

The last line is machine-readable.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import torch

from reasonrl.policy.loading import load_hf_policy

EARLY = "What is 7 + 5? Reply with the number only."  # its rows end after a few tokens
LONG = "Write a long, detailed story about a lighthouse keeper and a storm."  # its rows run on
BATCH8 = "Give me three tips for learning to cook, with a sentence on each."


class StepClock:
    """Times each decode step through the sampler's ``refresh`` hook (called before every decode
    forward) and records the rows of each forward with a forward pre-hook on the model."""

    def __init__(self, model):
        self.rows: list[int] = []
        self.stamps: list[float] = []
        self.handle = model.register_forward_pre_hook(self._pre, with_kwargs=True)

    def _pre(self, module, args, kwargs):
        self.rows.append(int(kwargs["input_ids"].shape[0]))

    def __call__(self) -> int:
        self.stamps.append(time.perf_counter())
        return 0

    def finish(self):
        self.stamps.append(time.perf_counter())
        self.handle.remove()
        # stamps[0] precedes the prefill; stamps[j] (j >= 1) decode forward j, whose rows are rows[j].
        return [(self.rows[j], self.stamps[j + 1] - self.stamps[j]) for j in range(1, len(self.rows))]


def measure_steps(policy, prompts, g, budget, seed, compact):
    clock = StepClock(policy.model)
    start = time.perf_counter()
    s = policy.sample(prompts, g, budget, 1.0, generator=torch.Generator().manual_seed(seed), refresh=clock,
                      compact=compact)
    wall = time.perf_counter() - start
    steps = clock.finish()
    # Row-steps decoded: the prefill's logits sample all N rows, then each forward's rows.
    row_steps = s.completion_ids.shape[0] + sum(r for r, _ in steps[: s.completion_ids.shape[1] - 1])
    return s, steps, row_steps, wall


def part_a(policy, budget, seed):
    print(f"(a) 2 prompts x 4 samples, up to {budget} new tokens, temperature 1")
    results = {}
    for compact in (False, True):
        s, steps, row_steps, wall = measure_steps(policy, [EARLY, LONG], 4, budget, seed, compact)
        real = int(s.completion_mask.sum())
        by_rows = defaultdict(list)
        for rows, sec in steps:
            by_rows[rows].append(sec * 1e3)
        table = ", ".join(f"{r} rows: {statistics.median(v):.0f} ms (x{len(v)})" for r, v in sorted(by_rows.items()))
        name = "compacted" if compact else "full batch"
        print(f"  {name:10s}: {wall:6.1f} s, {s.completion_ids.shape[1]} steps, real tokens {real}/{row_steps} "
              f"decoded row-steps = {real / row_steps:.2f}; ms/step by rows in the batch: {table}")
        results[compact] = (s, wall, real / row_steps)
    lengths = results[False][0].completion_mask.sum(-1).tolist()
    same = torch.equal(results[False][0].completion_ids, results[True][0].completion_ids)
    print(f"  completion lengths {lengths}; identical tokens with and without compaction: {same}")
    return results[False][1] / results[True][1], results[False][2], same


def part_b(policy, bf16, fused32, fused16, fused8, budget, repeats, seed):
    print(f"(b) batch 8 (1 prompt x 8), {budget} new tokens, temperature 1, {repeats} repeats (median)")
    configs = {"fp32 (today)": (policy, False), "fp32+compaction": (policy, True), "bf16+compaction": (bf16, True),
               "fp32 fused": (fused32, True), "bf16 fused": (fused16, True), "int8 fused": (fused8, True)}
    for pol, compact in configs.values():  # warm-up (kernel selection, first-call allocations)
        pol.sample([BATCH8], 8, 4, 1.0, generator=torch.Generator().manual_seed(seed), compact=compact)
    rates, samples = defaultdict(list), defaultdict(list)
    for r in range(repeats):
        for name, (pol, compact) in configs.items():  # interleaved, so drift in load hits all alike
            start = time.perf_counter()
            s = pol.sample([BATCH8], 8, budget, 1.0, generator=torch.Generator().manual_seed(seed + r), compact=compact)
            rates[name].append(int(s.completion_mask.sum()) / (time.perf_counter() - start))
            samples[name].append(s)
    for r in range(repeats):
        assert torch.equal(samples["fp32 (today)"][r].completion_ids, samples["fp32+compaction"][r].completion_ids)
    today = statistics.median(rates["fp32 (today)"])
    for name, values in rates.items():
        s = samples[name][0]
        real = int(s.completion_mask.sum()) / s.completion_mask.numel()
        print(f"  {name:16s}: {statistics.median(values):6.1f} tokens/s (runs: {', '.join(f'{v:.1f}' for v in values)}), "
              f"x{statistics.median(values) / today:.2f} of today; first run's real-token fraction {real:.2f}")
    speedups = {name: statistics.median(v) / today for name, v in rates.items()}
    return speedups, {name: samples[name] for name in ("bf16+compaction", "bf16 fused", "fp32 fused", "int8 fused")}


def part_c(policy, name, bf16_samples):
    deltas = []
    for s in bf16_samples:
        ids = torch.cat([s.prompt_ids, s.completion_ids], 1)
        mask = torch.cat([s.prompt_mask, s.completion_mask], 1)
        with torch.no_grad():
            learner, _ = policy.token_logprobs(ids, mask, s.completion_ids.shape[1])
        m = s.completion_mask.bool()
        deltas.append(learner[m] - s.sample_logprobs[m])  # log p_learner - log p_behaviour
    d = torch.cat(deltas)
    k3 = (d.exp() - 1 - d).mean()  # k3 estimate of KL(behaviour || learner), tokens drawn from behaviour
    print(f"(c) {name} sampler vs fp32 scoring over {d.numel()} sampled tokens: k3 KL {float(k3):.2e}, "
          f"mean |delta| {float(d.abs().mean()):.2e}, max |delta| {float(d.abs().max()):.2e}")
    return float(k3), float(d.abs().max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens-a", type=int, default=512)
    ap.add_argument("--tokens-b", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-a", action="store_true", help="skip (a), the long-tail case (minutes)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    policy = load_hf_policy("smollm2-135m")
    policy.chat_template = True  # the Instruct model answers a user turn, and ends it with EOS
    bf16 = policy.sampling_copy("bfloat16")
    fused16 = policy.sampling_copy("bfloat16")
    fused16.decoder = "fused"
    fused32 = policy.sampling_copy()
    fused32.decoder = "fused"
    policy.decoder = "fused"  # an int8 copy is made from a fused policy (rollout.dtype: int8 needs it)
    fused8 = policy.sampling_copy("int8")
    policy.decoder = "hf"
    print(f"SmolLM2-135M-Instruct, {args.threads} threads, vocab {policy.model.config.vocab_size}")
    wall_ratio, real_before, same = (float("nan"),) * 2 + (True,) if args.skip_a else part_a(policy, args.tokens_a, args.seed)
    speedups, low = part_b(policy, bf16, fused32, fused16, fused8, args.tokens_b, args.repeats, args.seed)
    mismatch = {name: part_c(policy, name, s) for name, s in low.items()}
    kl, max_delta = mismatch["bf16+compaction"]
    print(f"sampler_speedup_int8_fused={speedups['int8 fused']:.2f} kl_int8_fused={mismatch['int8 fused'][0]:.2e} "
          f"sampler_speedup_bf16_fused={speedups['bf16 fused']:.2f} sampler_speedup_fp32_fused={speedups['fp32 fused']:.2f} "
          f"kl_bf16_fused={mismatch['bf16 fused'][0]:.2e} kl_fp32_fused={mismatch['fp32 fused'][0]:.2e} "
          f"sampler_speedup_bf16={speedups['bf16+compaction']:.2f} "
          f"sampler_speedup_compaction={speedups['fp32+compaction']:.2f} kl_bf16={kl:.2e} "
          f"max_dlogp_bf16={max_delta:.2e} long_tail_wall_ratio={wall_ratio:.2f} real_fraction_full={real_before:.2f} "
          f"compaction_identical={int(same)} threads={args.threads}")


if __name__ == "__main__":
    main()
