"""SFT on a task's worked solutions, with the language-drift metrics of a GRPO run logged along it.

The control of the drift comparison (arXiv 2610.02015: RLVR lets the chain of thought drift
without bound, SFT keeps it bounded; ``docs/methods/drift.md``). It takes a GRPO recipe (e.g.
``recipes/drift_grpo.yaml``) and spends the same budget on supervised learning instead:

- step k trains on the worked (correct) solutions of the very problems GRPO's uniform sampler
  draws at step k (``task.train_problems(k, prompts_per_step, seed)``), one optimiser step of the
  recipe's ``optim`` (same learning rate and schedule over ``train.steps``) on the token-mean
  cross-entropy of the solution tokens, as ``reasonrl.train.sft`` defines it;
- on steps k with k % every == 0 it samples ``rollout.num_generations`` completions of those
  prompts from the current policy, as GRPO would, and logs ``reward/mean`` and the drift metrics
  of ``reasonrl.methods.drift.method`` (same names, same reference: the initial weights) in row k + 1;
- ``eval/*`` at the start, every ``eval.every`` steps and at the end, as the Trainer does.

The output folder is laid out as a run folder (``metrics.jsonl``, ``recipe.json`` with
``loss.policy: none``, ``summary.json``, ``final_model``; ``sft.json`` says it was SFT), so
``reasonrl report`` and ``benchmarks/drift_readability.py`` read it like a GRPO run::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sft_run.py recipes/drift_grpo.yaml \\
        --set train.threads=1 --set train.seed=1 -o runs/drift/sft_s1
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from reasonrl.batch import RolloutBatch
from reasonrl.config import ConfigError, load_recipe
from reasonrl.methods.drift.measure import ANSWER_MARK, drift_summary, reasoning_nll
from reasonrl.evaluate.evaluator import Evaluator
from reasonrl.fsutil import atomic_write_text
from reasonrl.policy.factory import build_policy
from reasonrl.registry import REWARDS
from reasonrl.tasks.base import build_task
from reasonrl.metrics_log import MetricsWriter
from reasonrl.train.optim import Learner
from reasonrl.train.sft import SFTExample, examples_batch
from reasonrl.train.trainer import seed_everything


def drift_settings(recipe) -> tuple[int, str]:
    """The recipe's ``drift`` method's ``every`` and ``marker`` (10 and ``####`` without one)."""
    for entry in recipe.methods:
        if entry.name == "drift":
            return int(entry.params.get("every", 10)), str(entry.params.get("marker", ANSWER_MARK))
    return 10, ANSWER_MARK


def solution_examples(policy, problems) -> list[SFTExample]:
    """Each problem's worked solution as the response, ended by EOS (as a sampled answer ends)."""
    tok = policy.tokenizer
    if any(not p.solution for p in problems):
        raise ConfigError("sft_run: the task's problems have no worked solution (Problem.solution) to imitate")
    return [SFTExample(p.prompt, tuple(tok(p.solution, add_special_tokens=False)["input_ids"]) + (tok.eos_token_id,))
            for p in problems]


def measure(policy, reference, problems, recipe, generator, marker: str) -> dict[str, float]:
    """``reward/mean`` and ``drift/*`` of G fresh samples per problem from ``policy``."""
    g = recipe.rollout.num_generations
    samples = policy.sample([p.prompt for p in problems], g, recipe.rollout.max_new_tokens,
                            recipe.rollout.temperature, generator=generator)
    reward = REWARDS.get(recipe.eval.reward)
    rows = [p for p in problems for _ in range(g)]
    rewards = [reward(t, p) for t, p in zip(samples.texts, rows)]
    nll, lengths = reasoning_nll(reference, samples.prompt_ids, samples.prompt_mask, samples.completion_ids,
                                 samples.completion_mask, marker, group_ids=torch.arange(len(problems)).repeat_interleave(g))
    return {"reward/mean": sum(rewards) / len(rewards), **{f"drift/{k}": v for k, v in drift_summary(nll, lengths).items()}}


def run(recipe, out: Path, every: int, marker: str = ANSWER_MARK, log=print) -> dict:
    r = recipe
    if r.train.threads:
        torch.set_num_threads(r.train.threads)
    generator = seed_everything(r.train.seed)
    task = build_task(r)
    evaluator = Evaluator(r, task)
    policy = build_policy(r.model, log=log)
    reference = policy.sampling_copy()  # the initial weights, frozen: the drift reference
    learner = Learner(policy.parameters(), r.optim, r.train.steps)
    out.mkdir(parents=True, exist_ok=True)
    saved = r.to_dict()
    saved["loss"] = {**saved.get("loss", {}), "policy": "none"}  # no policy-gradient term: SFT only
    atomic_write_text(out / "recipe.json", json.dumps(saved, indent=1))
    atomic_write_text(out / "sft.json", json.dumps({"kind": "sft", "targets": "task worked solutions",
                                                    "examples_per_step": r.train.prompts_per_step,
                                                    "drift_every": every}, indent=1))
    writer = MetricsWriter(out)
    started = time.perf_counter()
    base = evaluator(policy) if evaluator.problems else None
    if base is not None:
        writer.write(0, {f"eval/{k}": v for k, v in base.metrics.items()})

    def loss_fn(micro: RolloutBatch, mini: RolloutBatch, _pass: int, _j: int):
        # reasonrl.train.sft's loss: the mini-batch's token-mean NLL of the response tokens
        mask = micro.completion_mask.float()
        logp, _ = policy.completion_logprobs(micro.prompt_ids, micro.prompt_mask, micro.completion_ids,
                                             micro.completion_mask, None, temperature=1.0)
        nll = -(logp * mask).sum()
        return nll / max(1, int(mini.completion_mask.sum())), {"nll": float(nll.detach()), "tokens": float(mask.sum())}

    try:
        for step in range(r.train.steps):
            problems = task.train_problems(step, r.train.prompts_per_step, r.train.seed)
            metrics = measure(policy, reference, problems, r, generator, marker) if step % every == 0 else {}
            policy.model.eval()  # as in the policy update: no dropout
            sums, norms = learner.optimise(examples_batch(policy, solution_examples(policy, problems)), loss_fn,
                                           micro_batch_size=r.train.micro_batch_size or 64)
            metrics.update({"sft/loss": sums["nll"] / max(sums["tokens"], 1.0), "grad_norm": sum(norms) / len(norms),
                            "lr": learner.end_step()})
            if r.eval.every and (step + 1) % r.eval.every == 0 and step + 1 < r.train.steps:
                metrics.update({f"eval/{k}": v for k, v in evaluator(policy).metrics.items()})
            writer.write(step + 1, metrics)
        final = evaluator(policy) if evaluator.problems else None
        if final is not None:
            writer.write(r.train.steps, {f"eval/{k}": v for k, v in final.metrics.items()})
    finally:
        writer.close()
    policy.save(out / "final_model")
    summary = {"run_dir": str(out), "steps": r.train.steps,
               "base_accuracy": base.metrics.get("accuracy") if base else None,
               "final_accuracy": final.metrics.get("accuracy") if final else None,
               "base_eval": base.metrics if base else {}, "final_eval": final.metrics if final else {},
               "base_eval_per_problem": base.per_problem if base else {},
               "final_eval_per_problem": final.per_problem if final else {},
               "wall_seconds": round(time.perf_counter() - started, 2)}
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=1))
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe", help="a GRPO recipe: its task, model, optim, train and eval sections are used")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="recipe overrides")
    ap.add_argument("--every", type=int, help="measure drift every N steps (default: the recipe's drift method's)")
    ap.add_argument("-o", "--output", required=True, help="output (run) folder; must not exist or be empty")
    args = ap.parse_args(argv)
    try:
        recipe = load_recipe(args.recipe, args.set)
        out = Path(args.output)
        if out.exists() and any(out.iterdir()):
            raise ConfigError(f"output folder {out} is not empty")
        every, marker = drift_settings(recipe)
        every = args.every if args.every is not None else every
        if every < 1:
            raise ConfigError(f"--every must be >= 1, got {every}")
        summary = run(recipe, out, every, marker, log=lambda m: print(m, file=sys.stderr))
    except ConfigError as exc:
        print(f"sft_run: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({k: summary[k] for k in ("run_dir", "steps", "base_accuracy", "final_accuracy", "wall_seconds")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
