"""CARing evaluation and stage 1 (CARing, coverage reward with semantic IDs; docs/methods/caring.md).

``eval``: a model on a ``next_visit`` recipe's held-out problems. Ranked top-K lists from the
trie-constrained beam (``reasonrl.methods.caring.decoding``; with ``--chains M``: M sampled
reasoning chains fused by RRF), then Recall@k, oracle-cardinality weighted F1, decoding tokens
per label (the label's tokens + EOS, mean over the vocabulary), the share of invalid outputs of
free greedy decoding and of the constrained beam (0 by construction; counted, not assumed)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/caring_eval.py eval --recipe recipes/caring_sid.yaml \\
        --model runs/caring_sid-s0 --size 200 --beam 20 --out /tmp/caring/sid_s0.json

``--model`` is a run folder, a checkpoint, a model folder, or omitted (the recipe's own
starting model: the warmed-up embedded model).

``stage1``: add the SID tokens to an HF model, run the alignment SFT, save the folder that a
recipe's ``model.path`` then trains::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/caring_eval.py stage1 --model smollm2-135m \\
        --task '{"vocabulary": "icd10cm", "prefixes": ["I2", "E1", "J4"], "sid_style": "token",
                 "prompt_style": "text"}' --count 512 --epochs 1 --out /tmp/caring/smollm2_sid

The last stdout line is the JSON result.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch


def evaluate(args) -> dict:
    from reasonrl.methods.caring.semantic_ids import recall_at_k, weighted_f1
    from reasonrl.config import load_recipe
    from reasonrl.policy.factory import build_policy
    from reasonrl.policy.factory import load_for_eval
    from reasonrl.methods.caring.decoding import multi_chain_rank, rank_labels
    from reasonrl.tasks.base import build_task

    recipe = load_recipe(args.recipe, args.set or [])
    task = build_task(recipe)
    if task.name != "next_visit":
        raise SystemExit(f"--recipe must use task next_visit, not {task.name!r}")
    policy = load_for_eval(args.model) if args.model else build_policy(recipe.model)
    policy.chat_template = recipe.model.chat_template
    problems = task.eval_problems(args.size)
    prompts, labels = [p.prompt for p in problems], task.valid_labels()
    gold = [set(p.meta["labels"]) for p in problems]
    start = time.perf_counter()
    if args.chains > 0:
        ranked, _ = multi_chain_rank(policy, prompts, labels, chains=args.chains, think_end=args.think_end,
                                     max_chain_tokens=args.chain_tokens, beam_size=args.beam,
                                     generator=torch.Generator().manual_seed(args.seed))
    else:
        ranked = rank_labels(policy, prompts, labels, beam_size=args.beam)
    beam_s = time.perf_counter() - start
    free = policy.sample(prompts, 1, recipe.rollout.max_new_tokens, 0.0, stop=recipe.rollout.stop or None)
    valid = set(labels)
    tok = policy.tokenizer
    out = {
        "recipe": str(args.recipe), "model": args.model or "recipe", "size": len(problems), "beam": args.beam,
        "chains": args.chains, "label_format": task.label_format,
        **{f"recall@{k}": statistics.fmean(recall_at_k(r, g, k) for r, g in zip(ranked, gold)) for k in args.ks},
        "weighted_f1": weighted_f1(ranked, gold),
        "tokens_per_label": statistics.fmean(len(tok(x, add_special_tokens=False)["input_ids"]) + 1 for x in labels),
        "invalid_rate_free": statistics.fmean(task.extract_answer(t, p) is None for t, p in zip(free.texts, problems)),
        "invalid_rate_trie": statistics.fmean(x not in valid for r in ranked for x in r),
        "hit_rate_free_greedy": statistics.fmean(t.strip() in g for t, g in zip(free.texts, gold)),
        "sid_collision_rate_before": task.sid_stats["collision_rate_before"],
        "beam_seconds": beam_s,
    }
    return out


def stage1(args) -> dict:
    from reasonrl.config import OptimConfig
    from reasonrl.policy.loading import load_hf_policy
    from reasonrl.methods.caring.sid_tokens import prepare_sid_model
    from reasonrl.methods.caring.next_visit import NextVisitTask

    task = NextVisitTask(**json.loads(args.task))
    policy = load_hf_policy(args.model)
    stats = prepare_sid_model(policy, task, args.out, OptimConfig(lr=args.lr, warmup_steps=10, schedule="cosine"),
                              init=args.init, count=args.count, epochs=args.epochs, seed=args.seed,
                              log=lambda m: print(m, file=sys.stderr))
    return {"out": str(args.out), **stats, **task.sid_stats}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("eval")
    e.add_argument("--recipe", required=True)
    e.add_argument("--model")
    e.add_argument("--set", action="append", help="recipe override key=value (repeatable)")
    e.add_argument("--size", type=int, default=200)
    e.add_argument("--beam", type=int, default=20)
    e.add_argument("--ks", type=lambda s: [int(x) for x in s.split(",")], default=[1, 5, 10, 20])
    e.add_argument("--chains", type=int, default=0, help="reasoning chains fused by RRF (0: one beam on the prompt)")
    e.add_argument("--think-end", default="</think>")
    e.add_argument("--chain-tokens", type=int, default=128)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--out")
    s = sub.add_parser("stage1")
    s.add_argument("--model", required=True)
    s.add_argument("--task", default="{}", help="NextVisitTask parameters as JSON")
    s.add_argument("--out", required=True)
    s.add_argument("--init", choices=["mean", "text"], default="text")
    s.add_argument("--count", type=int, default=512)
    s.add_argument("--epochs", type=int, default=1)
    s.add_argument("--lr", type=float, default=1e-4)
    s.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.cmd == "eval":
        if max(args.ks) > args.beam:
            raise SystemExit(f"--ks {max(args.ks)} exceeds --beam {args.beam}: the ranked list holds --beam labels")
        result = evaluate(args)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    else:
        result = stage1(args)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
