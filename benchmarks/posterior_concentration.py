"""The posterior concentration phenomenon on the embedded model (RLCPR, docs/methods/rlcpr.md).

RLCPR's premise (INFERRED; paper: RLCPR, verifier-free RL with probability-based rewards, not located): along a trace z the model's probability of
the reference answer, p_t = π(y* | x, z_{≤t}), concentrates (saturates near 0 or 1) well
before the trace ends, so the probability rewards of a group's traces agree more and more
the further in they are read, and the group-relative signal fades.

Measured here: G traces per prompt sampled from the embedded model; each trace is cut at
fractions f of its length T (0 = the empty trace, 1 = the whole trace, before ``####``), and
after its k-th ``;`` step (a fraction may cut a step in half, which the model never saw); at
each cut the probability reward r = mean_j π(y*_j | x, z_{≤fT}, ####, y*_{<j}) (one
teacher-forced forward, ``methods.rlcpr.answer_probabilities``, the reward ``rlcpr`` trains
on); then, per prompt, the unbiased std of its G rewards, averaged over prompts. At f = 0 every
row of a group is the same sequence (std 0); the phenomenon is a std that rises as the traces
diverge and then falls back as they settle, ending below its peak. Also reported: the mean
reward, and the share of rewards saturated (< 0.1 or > 0.9).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/posterior_concentration.py [--prompts 64] [--g 8] [--seed 0]
        [--model-dir RUN/final_model]     # a trained policy instead of the embedded one

The last line is machine-readable (JSON).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from reasonrl.algos.masked import group_stats
from reasonrl.config import load_recipe
from reasonrl.train.channel_mask import eval_mode
from reasonrl.methods.rlcpr.method import answer_probabilities, split_trace
from reasonrl.policy.factory import build_policy
from reasonrl.rollout.episodes import sample_problems
from reasonrl.tasks.base import build_task

ROOT = Path(__file__).resolve().parents[1]
FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)
STEPS = (0, 1, 2, 3)  # cut after the k-th ';' step (fewer steps: the whole trace)
MARKER = "####"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--g", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model-dir", default=None, help="a saved policy (a run's final_model) to measure instead")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    overrides = [f"model.path={args.model_dir}", "model.backend=hf"] if args.model_dir else []
    recipe = load_recipe(ROOT / "recipes" / "rlcpr.yaml", overrides)
    policy = build_policy(recipe.model, log=lambda m: None)
    task = build_task(recipe)
    problems = task.train_problems(10_000, args.prompts, args.seed)  # a step no recipe run reaches first
    generator = torch.Generator().manual_seed(args.seed)
    samples = sample_problems(policy, problems, args.g, recipe.rollout.max_new_tokens, 1.0, generator)
    tok = policy.tokenizer
    marker = tok(MARKER, add_special_tokens=False)["input_ids"]
    cuts = [("f", f) for f in FRACTIONS] + [("step", k) for k in STEPS]
    jobs_by_f: dict[tuple, list] = {c: [] for c in cuts}
    lengths = []
    for i in range(len(samples.texts)):
        ids = [t for t, m in zip(samples.completion_ids[i].tolist(), samples.completion_mask[i].tolist()) if m]
        if ids and ids[-1] == tok.eos_token_id:
            ids = ids[:-1]
        trace_len, bounds = split_trace(tok.batch_decode([[t] for t in ids]), MARKER, ";")
        lengths.append(trace_len)
        answer = tok(problems[i // args.g].answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        for kind, x in cuts:  # a fraction of the tokens (may cut mid-step), or whole steps
            cut = round(x * trace_len) if kind == "f" else bounds[min(x, len(bounds) - 1)]
            jobs_by_f[(kind, x)].append((i, ids[:cut] + marker, answer))
    group_ids = torch.arange(len(problems)).repeat_interleave(args.g)
    first = torch.arange(0, len(group_ids), args.g)
    rows = []
    with eval_mode(policy.model):
        for kind, x in cuts:
            prob, _ = answer_probabilities(policy, samples.prompt_ids, samples.prompt_mask, jobs_by_f[(kind, x)],
                                           micro=64)
            std = group_stats(prob.double(), group_ids)[1][first]
            rows.append({"cut": f"{x:.2f} of T" if kind == "f" else f"step {x}",
                         "mean_group_std": float(std.mean()), "mean_reward": float(prob.mean()),
                         "saturated": float(((prob < 0.1) | (prob > 0.9)).float().mean())})
    print(f"{len(problems)} prompts x {args.g} traces, mean trace length {sum(lengths) / len(lengths):.1f} tokens")
    print(f"{'cut at':>10} {'group std':>10} {'reward':>8} {'saturated':>10}")
    for r in rows:
        print(f"{r['cut']:>10} {r['mean_group_std']:>10.4f} {r['mean_reward']:>8.4f} {r['saturated']:>10.3f}")
    by_f = rows[:len(FRACTIONS)]
    peak = max(by_f, key=lambda r: r["mean_group_std"])
    print(json.dumps({"benchmark": "posterior_concentration", "prompts": len(problems), "g": args.g,
                      "seed": args.seed, "rows": rows, "peak_cut": peak["cut"],
                      "end_over_peak_std": by_f[-1]["mean_group_std"] / max(peak["mean_group_std"], 1e-12)}))


if __name__ == "__main__":
    main()
