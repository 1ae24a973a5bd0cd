"""Where a SmolLM2-135M GRPO step goes, and what each lever buys: the old and the new path on the
same batch, in one run.

The batch is the one `recipes/smollm2_grpo.yaml` trains on: 8 reasoning-gym-style addition
questions under the recipe's 2-shot template, 8 completions each, sampled by the model itself
(temperature 1, stop at a newline, at most 16 tokens), scored as the recipe scores them (1 for
``<answer>a+b</answer>``) with GRPO's group advantages. A step is sampling + the learner's forward
and backward (``HFPolicy.completion_logprobs`` with entropies, GRPO's policy-gradient term over the
batch's token count, as ``train.objective.micro_batch_loss`` computes it on fresh samples) + one
fused AdamW step.

Learner arms (interleaved, arm order rotating every round, median of ``--repeats``):

  old          the shared-prompt path as it was: each distinct prompt once, its cache expanded to
               the group, completions padded to the longest row (``min_shared_prefix`` off,
               ``length_buckets`` 1);
  prefix       + the prompts' common prefix (the 2-shot template) run once (``reasonrl.policy.prefix``);
  new          + length buckets (``train.length_buckets`` 4, the default): rows sorted by completion
               length, each bucket padded only to its own longest row; + grouped key/value heads
               inside the attention kernel (``reasonrl.policy.attention``; ``old`` and ``prefix`` run
               transformers' ``sdpa``, which copies SmolLM2's 3 key/value heads to its 9 query heads).
  new_sdpa     the new path with transformers' ``sdpa`` (the attention lever alone: ``new`` against this).
  new_1thread  the new path on 1 thread (``train.threads``), to show what the second core gives.
  new_bf16     the new path under ``train.precision: bf16`` (``torch.autocast`` bfloat16 around the
               forward, fp32 weights and gradients): fast only on a CPU with bf16 units
               (AVX512-BF16 or AMX; ``torch.ops.mkldnn._is_mkldnn_bf16_supported()``), 8-30x slower
               without them (``benchmarks/precision.py``).
  new_bf16_sdpa  the same with transformers' ``sdpa`` (the attention lever alone, in bf16).
  new_skip     the new path with rows without advantage left out (``train.skip_zero_advantage``:
               groups whose sampled answers all scored alike; the loss keeps the whole batch's
               token count, so the gradient is the every-row one, compared like the others).
  new_bf16_skip  the same under ``train.precision: bf16``.
  new_packed   the new path with the packed training forward (``train.length_buckets: 0``,
               ``reasonrl.policy.packed``): prefix, suffixes and completions end to end, no padding,
               one product per weight over all of them, attention per segment.
  new_bf16_packed  the same under ``train.precision: bf16``.
  new_lora     the new path training LoRA adapters (``model.lora``: r 16, α 32, all linear layers,
               on a copy of the model) instead of all weights: the backward skips the frozen
               weights' gradients (a third of its FLOPs). Another method, not the same
               numbers: it is a lever only at equal accuracy, which a full seed must show.

Sampler arms, seconds per sampling call on the same prompts: ``hf`` as it was (``rollout.decoder``
hf: transformers' step, ``torch.multinomial``; every prompt prefilled whole), ``hf_prefix`` (the
common prefix prefilled once) and ``fused_prefix`` (+ the fused Llama step with inverse-CDF
draws, ``rollout.decoder: fused``), and ``fused_prefix_lora`` (the same with the LoRA copy: the
adapters merged into the packed weights at each call), and ``fused_prefix_bf16`` (a bfloat16
sampling copy, ``rollout.dtype: bfloat16``, with the fused step). The old step is ``hf`` + ``old``,
the new one ``fused_prefix`` + ``new``, each with the same optimiser step; the bf16 step
``fused_prefix_bf16`` + ``new_bf16``; the LoRA step ``fused_prefix_lora`` + ``new_lora`` + AdamW over
the adapters.

The learner's achieved FLOP/s are counted, not measured: 6 FLOPs per body parameter per token the
arm computes (prompt tokens it runs, completion positions it pads to), plus the LM head's 6·d·V per
completion position (4 instead of 6 with LoRA: no gradient of a frozen weight), against the fp32
matmul peak measured in the same run (a 2048³ ``torch.mm``).
Levers not kept are in docs/scaling.md ("A SmolLM2 step"): bf16 on this AVX2 CPU
(``benchmarks/precision.py``), ``torch.compile`` (``--compile``: it times the first, compiling step
and the next ones; off by default, minutes of compile).

    python benchmarks/learner_levers.py                 # ~4 min on 2 cores
    python benchmarks/learner_levers.py --repeats 5 --compile

Prints a table and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
import warnings

import torch

from peft import LoraConfig, get_peft_model

from reasonrl.algos.advantages import grpo_advantages
from reasonrl.algos.masked import group_inverse
from reasonrl.batch import RolloutBatch
from reasonrl.sections import LossConfig
from reasonrl.train.objective import rows_with_signal
from reasonrl.policy.attention import SDPA_GQA
from reasonrl.policy.loading import load_hf_policy
from reasonrl.policy.prefix import common_prefix, completion_lengths, length_buckets

warnings.filterwarnings("ignore")
TEMPLATE = ("Question: What is 12 + 7?\nAnswer: <answer>19</answer>\n\nQuestion: What is 9 - 4?\nAnswer: "
            "<answer>5</answer>\n\nQuestion: What is {a} + {b}?\nAnswer:")
NO_PREFIX = 10 ** 9


def matmul_peak(n: int = 2048, repeats: int = 5) -> float:
    """fp32 GFLOP/s of an n³ matrix product, the best of ``repeats``."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = min(_timed(lambda: torch.mm(a, b)) for _ in range(repeats))
    return 2 * n ** 3 / best / 1e9


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def learner_flops(policy, batch, arm: dict) -> float:
    """FLOPs of one forward+backward on ``batch`` as the arm lays it out (see the module docstring)."""
    cfg = policy.model.config
    d, vocab = cfg.hidden_size, cfg.vocab_size
    body = sum(p.numel() for p in policy.model.parameters()) - vocab * d  # tied embedding/LM head
    p_ids, p_mask, c_ids, c_mask, groups = batch
    inverse, num_groups = group_inverse(groups)
    first = torch.unique(inverse, return_inverse=False)
    firsts = torch.stack([torch.nonzero(inverse == g)[0, 0] for g in first])
    ids, mask = p_ids[firsts], p_mask[firsts]
    c = common_prefix(ids, mask, arm["min_prefix"])
    prompt_tokens = c + int((mask.sum(1) - c).sum()) if c else int(mask.shape[1] * len(firsts))
    lengths = completion_lengths(c_mask).clamp(min=1)
    if arm["buckets"] == 0:  # packed: every completion cut at its own length
        padded = int(lengths.sum())
    elif arm["buckets"] > 1:
        parts = length_buckets(lengths, arm["buckets"], policy._bucket_overhead())
        padded = sum(len(r) * int(lengths[r].max()) for r in parts) if len(parts) > 1 else c_ids.numel()
    else:
        padded = c_ids.numel()
    per = 4 if arm.get("lora") else 6  # forward 2, input gradient 2, weight gradient 2 (none when frozen)
    return per * body * (prompt_tokens + padded) + per * d * vocab * padded


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compile", action="store_true", help="also time torch.compile of the model (minutes)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    policy = load_hf_policy("smollm2-135m")
    model = policy.model
    g = torch.Generator().manual_seed(args.seed)
    pairs = [(int(torch.randint(1, 100, (1,), generator=g)), int(torch.randint(1, 100, (1,), generator=g)))
             for _ in range(8)]
    prompts = [TEMPLATE.format(a=a, b=b) for a, b in pairs]

    # The LoRA arms' model: a copy, so that the other arms run the plain model, not PEFT's wrappers.
    # PEFT starts B at 0, so its log-probs equal the plain model's until it trains.
    lora_model = get_peft_model(copy.deepcopy(model), LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                                                 target_modules="all-linear"))
    models = {False: model, True: lora_model}
    bf16_sampler = policy.sampling_copy("bfloat16")  # rollout.dtype: bfloat16 (its own cast copy)

    # Sampler arms: the same prompts, each decoder's own random stream; (the policy that samples,
    # its decoder, its shared-prefix threshold, the model it samples with).
    sampler_arms = {"hf": (policy, "hf", NO_PREFIX, model), "hf_prefix": (policy, "hf", policy.min_shared_prefix, model),
                    "fused_prefix": (policy, "fused", policy.min_shared_prefix, model),
                    "fused_prefix_lora": (policy, "fused", policy.min_shared_prefix, lora_model),
                    "fused_prefix_bf16": (bf16_sampler, "fused", policy.min_shared_prefix, bf16_sampler.model)}
    default_prefix = policy.min_shared_prefix
    sampler: dict[str, list[float]] = {k: [] for k in sampler_arms}
    tokens: dict[str, list[int]] = {k: [] for k in sampler_arms}
    samples = None
    snames = list(sampler_arms)
    for r in range(args.repeats):
        for name in snames[r % len(snames):] + snames[:r % len(snames)]:
            sampler_policy, decoder, prefix, sampler_model = sampler_arms[name]
            sampler_policy.decoder, sampler_policy.min_shared_prefix, sampler_policy.model = decoder, prefix, sampler_model
            gen = torch.Generator().manual_seed(args.seed * 100 + r)
            t0 = time.perf_counter()
            s = sampler_policy.sample(prompts, 8, 16, 1.0, gen, stop=["\n"])
            sampler[name].append(time.perf_counter() - t0)
            tokens[name].append(int(s.completion_mask.sum()))
            if name == "hf" and samples is None:
                samples = s
    policy.decoder, policy.min_shared_prefix, policy.model = "hf", default_prefix, model
    groups = torch.arange(8).repeat_interleave(8)
    batch = (samples.prompt_ids, samples.prompt_mask, samples.completion_ids, samples.completion_mask, groups)
    cmask = samples.completion_mask.float()
    rewards = torch.tensor([float(f"<answer>{a + b}</answer>" in text)
                            for (a, b), text in zip([p for p in pairs for _ in range(8)], samples.texts)])
    outcome = torch.zeros_like(cmask)
    outcome[:, 0] = rewards  # the sequence score GRPO normalises within each group
    adv = grpo_advantages(outcome, samples.completion_mask, groups)
    # The skip arms' rows: those with a nonzero advantage, chosen by the trainer's own selection
    # (``aux["row"]`` carries each row's index through it).
    whole = RolloutBatch(*batch, rewards=rewards, truncated=torch.zeros(len(groups), dtype=torch.bool), advantages=adv,
                         aux={"row": torch.arange(len(groups))})
    kept = rows_with_signal(whole, LossConfig()).aux["row"]
    skip_batch = tuple(t[kept] for t in batch)

    arms = {"old": {"min_prefix": NO_PREFIX, "buckets": 1, "threads": args.threads, "attention": "sdpa"},
            "prefix": {"min_prefix": policy.min_shared_prefix, "buckets": 1, "threads": args.threads,
                       "attention": "sdpa"},
            "new": {"min_prefix": policy.min_shared_prefix, "buckets": 4, "threads": args.threads},
            "new_sdpa": {"min_prefix": policy.min_shared_prefix, "buckets": 4, "threads": args.threads,
                         "attention": "sdpa"},
            "new_1thread": {"min_prefix": policy.min_shared_prefix, "buckets": 4, "threads": 1},
            "new_bf16": {"min_prefix": policy.min_shared_prefix, "buckets": 4, "threads": args.threads, "bf16": True},
            "new_bf16_sdpa": {"min_prefix": policy.min_shared_prefix, "buckets": 4, "threads": args.threads,
                              "bf16": True, "attention": "sdpa"},
            "new_skip": {"min_prefix": policy.min_shared_prefix, "buckets": 4, "threads": args.threads, "skip": True},
            "new_bf16_skip": {"min_prefix": policy.min_shared_prefix, "buckets": 4, "threads": args.threads,
                              "bf16": True, "skip": True},
            "new_packed": {"min_prefix": policy.min_shared_prefix, "buckets": 0, "threads": args.threads},
            "new_bf16_packed": {"min_prefix": policy.min_shared_prefix, "buckets": 0, "threads": args.threads,
                                "bf16": True},
            "new_lora": {"min_prefix": policy.min_shared_prefix, "buckets": 4, "threads": args.threads, "lora": True}}
    fwd: dict[str, list[float]] = {k: [] for k in arms}
    bwd: dict[str, list[float]] = {k: [] for k in arms}
    results: dict[str, tuple] = {}
    model.train()
    lora_model.train()

    def learner_step(arm: dict):
        policy.min_shared_prefix = arm["min_prefix"]
        policy.model = models[arm.get("lora", False)]
        policy.autocast = torch.bfloat16 if arm.get("bf16") else None  # what train.precision: bf16 sets
        policy.model.set_attn_implementation(arm.get("attention", SDPA_GQA))
        torch.set_num_threads(arm["threads"])
        policy.model.zero_grad(set_to_none=True)
        rows = kept if arm.get("skip") else slice(None)
        t0 = time.perf_counter()
        logp, ent = policy.completion_logprobs(*(skip_batch if arm.get("skip") else batch)[:4],
                                               group_ids=groups[rows], with_entropy=True, length_buckets=arm["buckets"])
        # GRPO's term at ratio 1 over the whole batch's token count (what the trainer's token-mean does).
        loss = -(logp * adv[rows] * cmask[rows]).sum() / cmask.sum()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        torch.set_num_threads(args.threads)
        policy.min_shared_prefix = default_prefix
        grads = [p.grad.clone() for p in policy.model.parameters() if p.grad is not None]
        if arm.get("skip"):  # every row's log-prob slot, the left-out rows' as the reference has them
            full = torch.full((len(groups), logp.shape[1]), float("nan"))
            full[kept] = logp.detach()
            logp = full
        policy.model.set_attn_implementation(SDPA_GQA)
        policy.model, policy.autocast = model, None
        return t1 - t0, t2 - t1, logp.detach(), grads

    names = list(arms)
    for r in range(args.repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            f, b, logp, grads = learner_step(arms[name])
            fwd[name].append(f)
            bwd[name].append(b)
            results[name] = (logp, grads)
            print(f"  round {r + 1} {name:12s} forward {f:6.2f} s  backward {b:6.2f} s", flush=True)

    # The optimiser step every arm pays alike.
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-9, fused=True)
    learner_step(arms["new"])
    optimizer_s = statistics.median(_timed(opt.step) for _ in range(3))
    opt_lora = torch.optim.AdamW([p for p in lora_model.parameters() if p.requires_grad], lr=1e-9, fused=True)
    learner_step(arms["new_lora"])
    optimizer_lora_s = statistics.median(_timed(opt_lora.step) for _ in range(3))

    compile_row = None
    if args.compile:
        compiled = torch.compile(model, dynamic=True)
        policy.model = compiled
        times = []
        for _ in range(1 + args.repeats):
            f, b, _, _ = learner_step(arms["new"])
            times.append(f + b)
        policy.model = model
        compile_row = {"first_step_s": round(times[0], 1), "step_s": round(statistics.median(times[1:]), 2)}

    peak = matmul_peak()
    ref_logp, ref_grads = results["old"]
    m = samples.completion_mask.bool()
    print(f"\nSmolLM2-135M, {args.threads} threads, batch 8 prompts x 8 completions, "
          f"{int(m.sum())} completion tokens in a {tuple(m.shape)} block, prompts {tuple(samples.prompt_ids.shape)} "
          f"(common prefix {common_prefix(samples.prompt_ids, samples.prompt_mask)} tokens); "
          f"fp32 matmul peak {peak:.0f} GFLOP/s\n")
    print(f"{'arm':12s} {'forward':>8s} {'backward':>9s} {'learner':>8s} {'vs old':>7s} {'GFLOP/s':>8s} "
          f"{'of peak':>8s} {'max|dlogp|':>11s} {'grad rel':>9s}")
    rows = {}
    for name, arm in arms.items():
        f, b = statistics.median(fwd[name]), statistics.median(bwd[name])
        flops = learner_flops(policy, skip_batch if arm.get("skip") else batch, arm)
        logp, grads = results[name]
        computed = m & ~logp.isnan()  # the skip arms compute the kept rows only
        dlogp = float((logp[:, :m.shape[1]] - ref_logp)[computed].abs().max())
        if arm.get("lora"):  # other parameters: no gradient to compare
            num, den = float("nan"), 1.0
        else:
            num = sum(float((a - r).pow(2).sum()) for a, r in zip(grads, ref_grads)) ** 0.5
            den = sum(float(r.pow(2).sum()) for r in ref_grads) ** 0.5
        rows[name] = {"forward_s": round(f, 3), "backward_s": round(b, 3), "learner_s": round(f + b, 3),
                      "gflops": round(flops / (f + b) / 1e9, 1), "peak_fraction": round(flops / (f + b) / 1e9 / peak, 3),
                      "max_dlogp": dlogp, "grad_rel_diff": None if arm.get("lora") else num / den}
        base = statistics.median(fwd["old"]) + statistics.median(bwd["old"])
        print(f"{name:12s} {f:8.2f} {b:9.2f} {f + b:8.2f} {(f + b) / base:7.2f} {rows[name]['gflops']:8.1f} "
              f"{rows[name]['peak_fraction']:8.2f} {dlogp:11.1e} {num / den:9.1e}")
    samp = {k: round(statistics.median(v), 3) for k, v in sampler.items()}
    tok = {k: round(statistics.mean(v), 1) for k, v in tokens.items()}
    print("\nsampler  " + "   ".join(f"{k} {samp[k]:.2f} s ({tok[k]:.0f} tokens)" for k in samp))
    print(f"optimizer (fused AdamW) {optimizer_s:.2f} s")
    step_old = samp["hf"] + rows["old"]["learner_s"] + optimizer_s
    step_new = samp["fused_prefix"] + rows["new"]["learner_s"] + optimizer_s
    step_lora = samp["fused_prefix_lora"] + rows["new_lora"]["learner_s"] + optimizer_lora_s
    step_bf16 = samp["fused_prefix_bf16"] + rows["new_bf16"]["learner_s"] + optimizer_s
    step_skip = samp["fused_prefix"] + rows["new_skip"]["learner_s"] + optimizer_s
    step_bf16_skip = samp["fused_prefix_bf16"] + rows["new_bf16_skip"]["learner_s"] + optimizer_s
    step_packed = samp["fused_prefix"] + rows["new_packed"]["learner_s"] + optimizer_s
    step_bf16_packed = samp["fused_prefix_bf16"] + rows["new_bf16_packed"]["learner_s"] + optimizer_s
    left_out = 1 - len(kept) / len(groups)
    print(f"step  old {step_old:.2f} s   new {step_new:.2f} s   ratio {step_new / step_old:.3f}   "
          f"bf16 {step_bf16:.2f} s   ratio {step_bf16 / step_old:.3f}   "
          f"LoRA {step_lora:.2f} s   ratio {step_lora / step_old:.3f} (another method: see the docstring)")
    print(f"rows without advantage left out ({left_out:.0%} of this batch's rows): step {step_skip:.2f} s   ratio "
          f"{step_skip / step_old:.3f}   bf16 {step_bf16_skip:.2f} s   ratio {step_bf16_skip / step_old:.3f}")
    print(f"packed training forward: step {step_packed:.2f} s   ratio {step_packed / step_old:.3f}   "
          f"bf16 {step_bf16_packed:.2f} s   ratio {step_bf16_packed / step_old:.3f}")
    if compile_row:
        print(f"torch.compile (new path): first step {compile_row['first_step_s']} s, then {compile_row['step_s']} s "
              f"(uncompiled {rows['new']['learner_s']} s)")
    print(json.dumps({"benchmark": "learner_levers", "threads": args.threads, "repeats": args.repeats,
                      "matmul_peak_gflops": round(peak, 1), "completion_tokens": int(m.sum()),
                      "completion_block": list(m.shape), "arms": rows, "sampler_s": samp, "sampler_tokens": tok,
                      "optimizer_s": round(optimizer_s, 3), "step_old_s": round(step_old, 2),
                      "step_new_s": round(step_new, 2), "step_ratio": round(step_new / step_old, 3),
                      "step_bf16_s": round(step_bf16, 2), "step_bf16_ratio": round(step_bf16 / step_old, 3),
                      "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                      "optimizer_lora_s": round(optimizer_lora_s, 3), "step_lora_s": round(step_lora, 2),
                      "step_lora_ratio": round(step_lora / step_old, 3),
                      "rows_left_out": round(left_out, 3), "step_skip_s": round(step_skip, 2),
                      "step_skip_ratio": round(step_skip / step_old, 3), "step_bf16_skip_s": round(step_bf16_skip, 2),
                      "step_bf16_skip_ratio": round(step_bf16_skip / step_old, 3),
                      "step_packed_s": round(step_packed, 2), "step_packed_ratio": round(step_packed / step_old, 3),
                      "step_bf16_packed_s": round(step_bf16_packed, 2),
                      "step_bf16_packed_ratio": round(step_bf16_packed / step_old, 3),
                      "compile": compile_row}))


if __name__ == "__main__":
    main()
