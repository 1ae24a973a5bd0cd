"""SAVER's claim, measured: greedy grounding accuracy of models at several sparse-view budgets
(docs/methods/saver.md). For each model and each budget b in {N, N/2, N/4, N/8, N/16} (N the
task's ``length``), the same held-out inputs of the ``grounding`` task are shown at b frames and
decoded greedily; reported: mean span IoU (``miou``), the hit rate at IoU ≥ 0.5 with the right
class (``hit``, what ``eval.reward: grounding_hit`` counts) and the class accuracy (``answer``),
each with a 95% bootstrap interval over problems::

    python benchmarks/saver_budgets.py --base recipes/saver.yaml RUNS/saver-s1 RUNS/saver_sparse_only-s1 \\
        -o EVALS/saver_budgets.json

``--base RECIPE`` adds the recipe's starting model (the warmed-up tiny model); a positional
argument is anything ``reasonrl eval --model`` loads (a run folder: its ``final_model``).
The task's parameters come from ``--recipe`` (default: the ``--base`` recipe or
recipes/saver.yaml), with ``budget`` replaced.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from reasonrl.methods.saver.maths import span_iou
from reasonrl.config import load_recipe
from reasonrl.evaluate.accuracy import greedy_texts
from reasonrl.evaluate.metrics import bootstrap_ci
from reasonrl.registry import TASKS
from reasonrl.methods.saver.reward import parse_grounding

FRACTIONS = (1, 2, 4, 8, 16)  # budget = N / fraction


def budget_scores(policy, task_params: dict, budget: int, size: int, max_new_tokens: int) -> dict:
    """Greedy mIoU, hit rate and class accuracy (with intervals) at ``budget`` frames."""
    task = TASKS.get("grounding")(**{**task_params, "budget": budget})
    problems = task.eval_problems(size)
    texts = greedy_texts(policy, problems, max_new_tokens)
    per = {"miou": [], "hit": [], "answer": []}
    for text, problem in zip(texts, problems):
        pred, gold = parse_grounding(text), parse_grounding(problem.answer)
        iou = span_iou(pred[:2] if pred else None, gold[:2])
        right = pred is not None and pred[2] == gold[2]
        per["miou"].append(iou)
        per["hit"].append(float(right and iou >= 0.5))
        per["answer"].append(float(right))
    return {name: {"mean": sum(v) / len(v), "ci": bootstrap_ci(v)} for name, v in per.items()}


def main(argv: list[str] | None = None) -> int:
    import reasonrl.rewards  # noqa: F401  (registration)
    import reasonrl.tasks  # noqa: F401
    from reasonrl.policy.factory import build_policy
    from reasonrl.policy.factory import load_for_eval

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", help="run folders or model paths")
    parser.add_argument("--base", help="also evaluate this recipe's starting model")
    parser.add_argument("--recipe", help="the recipe whose task parameters to use")
    parser.add_argument("--size", type=int, default=200, help="held-out inputs per budget")
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("-o", "--output", help="write the results as JSON here")
    args = parser.parse_args(argv)
    recipe = load_recipe(args.recipe or args.base or "recipes/saver.yaml")
    if recipe.task.name != "grounding":
        parser.error(f"the recipe's task is '{recipe.task.name}', not 'grounding'")
    params = {k: v for k, v in recipe.task.params.items() if k not in ("views", "budget")}
    length = TASKS.get("grounding")(**params).length
    budgets = sorted({max(1, length // f) for f in FRACTIONS}, reverse=True)
    models = ([("base", lambda: build_policy(recipe.model, trainable=False))] if args.base else [])
    models += [(m, lambda m=m: load_for_eval(m)) for m in args.models]
    if not models:
        parser.error("name at least one model (or --base RECIPE)")
    results = {}
    print(f"{'model':<40} " + " ".join(f"{'b=' + str(b):>22}" for b in budgets))
    for name, load in models:
        policy = load()
        results[name] = {b: budget_scores(policy, params, b, args.size, args.max_new_tokens) for b in budgets}
        for metric in ("miou", "hit", "answer"):
            cells = " ".join(f"{results[name][b][metric]['mean']:>8.3f} [{results[name][b][metric]['ci'][0]:.2f},"
                             f"{results[name][b][metric]['ci'][1]:.2f}]" for b in budgets)
            print(f"{name[-33:] + ' ' + metric:<40} {cells}", flush=True)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps({"length": length, "budgets": budgets, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
