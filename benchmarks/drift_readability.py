"""Cross-run readability of the chain of thought, and its reference perplexity (language drift).

arXiv 2610.02015 (Sullivan & Koller) finds that RLVR runs from different seeds read each other's
chains of thought worse than their own ("mutual readability"): drift directions are seed-
specific. The protocol here is INFERRED (``reasonrl.methods.drift.measure``, ``docs/methods/drift.md``):

0. for every WRITER that is a run folder, its logged ``drift/ref_nll``, ``reward/mean`` and
   ``eval/accuracy`` along training (``writers.<run>.curves`` in the output; ``reasonrl report``
   plots the rewards and accuracies, not the drift);
1. every WRITER (a run folder, ``base`` = the recipe's initial model, or ``solutions`` = the
   task's worked solutions) writes a greedy completion of each held-out problem; its accuracy
   and the reference perplexity of its reasoning (under ``--reference``, default ``base``) are
   reported;
2. each READER (default: the writers that are models, plus ``base``) continues every writer's
   reasoning truncated at each fraction f (of its characters), greedily, and is scored;
3. for a reader B that is also a writer, acc(B | A's CoT) − acc(B | B's own CoT) per writer A,
   with a 95% paired bootstrap interval over problems.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/drift_readability.py runs/drift/grpo_s0 runs/drift/grpo_s1 \\
        base solutions --recipe recipes/drift_grpo.yaml --fraction 0.5 -o drift_readability.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from reasonrl.config import ConfigError, load_recipe
from reasonrl.evaluate.accuracy import greedy_texts
from reasonrl.methods.drift.measure import drift_summary, readability, text_reasoning_nll
from reasonrl.evaluate.metrics import bootstrap_ci
from reasonrl.fsutil import atomic_write_text
from reasonrl.registry import REWARDS
from reasonrl.rollout.collect import stop_strings
from reasonrl.tasks.base import build_task

BASE, SOLUTIONS = "base", "solutions"


def load_model(name: str, recipe, cache: dict):
    """``base``: the recipe's model as built at the start of a run; else what ``reasonrl eval
    --model`` accepts (a run folder's ``final_model``, a model folder, ``tiny``)."""
    if name not in cache:
        if name == BASE:
            from reasonrl.policy.factory import build_policy

            cache[name] = build_policy(recipe.model, trainable=False)
        else:
            from reasonrl.policy.factory import load_for_eval

            if name != "tiny" and not Path(name).exists():
                raise ConfigError(f"model '{name}': no such run or model folder (or use '{BASE}', '{SOLUTIONS}', 'tiny')")
            cache[name] = load_for_eval(name)
        cache[name].model.eval()
    return cache[name]


def curves(run_dir: str) -> dict[str, dict[int, float]]:
    """A run's logged drift and accuracy along training (``metrics.jsonl``): per metric, step → value."""
    from reasonrl.metrics_log import read_metrics

    out: dict[str, dict[int, float]] = {}
    for row in read_metrics(Path(run_dir)):
        for key in ("drift/ref_nll", "drift/reasoning_tokens", "eval/accuracy"):
            if row.get(key) is not None:
                out.setdefault(key, {})[int(row["step"])] = row[key]
        if row.get("drift/ref_nll") is not None and row.get("reward/mean") is not None:
            out.setdefault("reward/mean", {})[int(row["step"])] = row["reward/mean"]  # the measured batch's
    return out


def compare(writers: list[str], readers: list[str], fractions: list[float], recipe, size: int,
            reference: str = BASE, max_new_tokens: int | None = None, per_problem: bool = False,
            log=print) -> dict:
    task = build_task(recipe)
    problems = task.eval_problems(size)
    reward = REWARDS.get(recipe.eval.reward)
    is_correct = lambda text, p: reward(text, p) == 1.0  # noqa: E731
    stop = stop_strings(recipe, task)
    budget = max_new_tokens or recipe.eval.max_new_tokens or recipe.rollout.max_new_tokens
    cache: dict = {}
    ref = load_model(reference, recipe, cache)
    out: dict = {"problems": len(problems), "fractions": fractions, "reference": reference, "writers": {},
                 "readability": {}, "mutual": {}}
    written: dict[str, tuple[list[str], list[bool]]] = {}
    for w in writers:
        texts = ([p.solution for p in problems] if w == SOLUTIONS
                 else greedy_texts(load_model(w, recipe, cache), problems, budget, stop=stop))
        correct = [is_correct(t, p) for t, p in zip(texts, problems)]
        nll, lengths = text_reasoning_nll(ref, [p.prompt for p in problems], texts)
        written[w] = (texts, correct)
        acc = [float(c) for c in correct]
        out["writers"][w] = {"accuracy": sum(acc) / len(acc), "ci": list(bootstrap_ci(acc)),
                             **drift_summary(nll, lengths)}
        if per_problem:
            out["writers"][w]["texts"] = texts
        if (Path(w) / "metrics.jsonl").is_file():
            out["writers"][w]["curves"] = curves(w)
        log(f"writer {w}: accuracy {out['writers'][w]['accuracy']:.3f}, reference NLL of its reasoning "
            f"{out['writers'][w]['ref_nll']:.3f} (ppl {out['writers'][w]['ref_ppl']:.2f})")
    rows: dict[tuple[str, str, float], list[bool]] = {}
    for b in readers:
        reader = load_model(b, recipe, cache)
        for w in writers:
            for f in fractions:
                res = readability(reader, problems, written[w][0], f, is_correct=is_correct, max_new_tokens=budget,
                                  stop=stop, writer_correct=written[w][1])
                rows[(b, w, f)] = [r["correct"] for r in res["per_problem"]]
                if not per_problem:
                    res.pop("per_problem")
                out["readability"].setdefault(b, {}).setdefault(w, {})[str(f)] = res
                log(f"reader {b} <- writer {w} @ f={f}: accuracy {res['accuracy']:.3f} "
                    f"[{res['ci'][0]:.3f}, {res['ci'][1]:.3f}]")
    for b in readers:  # B on A's reasoning against B on its own, paired over problems
        for w in writers:
            if b == w or b not in writers:
                continue
            for f in fractions:
                diff = [float(x) - float(y) for x, y in zip(rows[(b, w, f)], rows[(b, b, f)])]
                out["mutual"].setdefault(b, {}).setdefault(w, {})[str(f)] = {
                    "difference": sum(diff) / len(diff), "ci": list(bootstrap_ci(diff))}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("writers", nargs="+", help=f"run folders, model folders, '{BASE}' or '{SOLUTIONS}'")
    ap.add_argument("--readers", nargs="*", help=f"default: the writers that are models, and '{BASE}'")
    ap.add_argument("--recipe", required=True, help="the recipe whose task, eval reward and model ('base') are used")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--fraction", type=float, nargs="+", default=[0.5], help="fractions of the reasoning kept")
    ap.add_argument("--size", type=int, default=200, help="held-out problems")
    ap.add_argument("--reference", default=BASE, help="the model whose perplexity of each writer's reasoning is reported")
    ap.add_argument("--max-new-tokens", type=int)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--per-problem", action="store_true", help="keep every text, prefix and continuation")
    ap.add_argument("-o", "--output", default="drift_readability.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        if any(not 0.0 <= f <= 1.0 for f in args.fraction):
            raise ConfigError(f"--fraction values must be in [0, 1], got {args.fraction}")
        if args.size < 1:
            raise ConfigError(f"--size must be >= 1, got {args.size}")
        readers = args.readers or [w for w in args.writers if w != SOLUTIONS] + ([BASE] if BASE not in args.writers else [])
        if SOLUTIONS in readers:
            raise ConfigError(f"'{SOLUTIONS}' is a writer only; a reader must be a model")
        recipe = load_recipe(args.recipe, args.set)
        result = compare(args.writers, readers, args.fraction, recipe, args.size, args.reference,
                         args.max_new_tokens, args.per_problem, log=lambda m: print(m, file=sys.stderr))
    except (ConfigError, ValueError) as exc:
        print(f"drift_readability: error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(result, indent=1))
    print(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
