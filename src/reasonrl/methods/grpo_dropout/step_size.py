"""How large a step GRPODropout takes against GRPO: the measurement behind the learning rate
of the matched-step arms (``docs/methods/grpo_dropout.md``, "Step size")::

    python -m reasonrl.methods.grpo_dropout.step_size recipes/grpo.yaml recipes/grpo_dropout.yaml \\
        --lr 1e-4 3e-4 --steps 3 --set train.threads=1

For each recipe and learning rate: a fresh policy from the recipe (its seed, so every arm
samples the same first batch), ``steps`` training steps with the recipe's own schedule
(warm-up and decay over its ``train.steps``), and per step:

- ``grad_norm``: the gradient norm before clipping. With ``token-mean`` aggregation dropping
  rows shrinks the loss's denominator, so this is where "fewer rows, larger steps" shows: it
  is the ratio SGD's update would scale by;
- ``update_norm``: ‖θ_{t+1} − θ_t‖, what the optimiser actually moved. AdamW divides each
  coordinate by the root of its second moment, so a gradient scaled by a constant moves the
  weights by the same amount (on the first step exactly lr per coordinate with a non-zero
  gradient): the grad-norm ratio does not carry over to AdamW's step;
- ``rows``: the rows trained on.

Nothing is written but the printed table (one JSON line per arm and step with ``--json``).
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path
from typing import Any

import torch

from reasonrl.recipe import load_recipe
from reasonrl.train.trainer import Trainer

__all__ = ["measure", "main"]


def measure(recipe_path: str | Path, lr: float, steps: int, overrides: list[str] | None = None) -> list[dict[str, Any]]:
    """Per-step ``grad_norm``, ``update_norm`` and ``rows`` of ``steps`` training steps of
    ``recipe_path`` at learning rate ``lr`` (``overrides`` as ``--set``), from a fresh policy."""
    recipe = load_recipe(recipe_path, [*(overrides or []), f"optim.lr={lr!r}"])
    if not 1 <= steps <= recipe.train.steps:
        raise ValueError(f"steps must be in 1..train.steps={recipe.train.steps}, got {steps}")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder:
        trainer = Trainer(recipe, Path(folder) / "run", log=lambda _msg: None)
        trainer.setup()
        try:
            params = trainer.learner.parameters
            trainer.source.start(trainer.state.policy_version, 0)
            for step in range(steps):
                before = [p.detach().clone() for p in params]
                metrics = trainer.train_step(step)
                with torch.no_grad():
                    moved = math.sqrt(sum(float((p - b).double().square().sum()) for p, b in zip(params, before)))
                trainer.source.publish(trainer.policy, trainer.state.policy_version, step + 1)
                rows.append({"recipe": str(recipe_path), "lr": lr, "step": step + 1,
                             "rows": metrics.get("train/rows", 0), "grad_norm": metrics.get("grad_norm", math.nan),
                             "update_norm": moved, "step_lr": metrics.get("lr", math.nan)})
        finally:
            trainer.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reasonrl.methods.grpo_dropout.step_size",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("recipes", nargs="+", help="recipe files (e.g. recipes/grpo.yaml recipes/grpo_dropout.yaml)")
    parser.add_argument("--lr", type=float, nargs="+", required=True, help="learning rates to measure each recipe at")
    parser.add_argument("--steps", type=int, default=1, help="training steps per arm (default 1)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--json", action="store_true", help="one JSON line per arm and step instead of a table")
    args = parser.parse_args(argv)
    if not args.json:
        print(f"{'recipe':<28} {'lr':>8} {'step':>4} {'rows':>5} {'grad_norm':>10} {'update_norm':>12}")
    for path in args.recipes:
        for lr in args.lr:
            for row in measure(path, lr, args.steps, args.overrides):
                if args.json:
                    print(json.dumps(row), flush=True)
                else:
                    print(f"{Path(path).name:<28} {lr:>8.1e} {row['step']:>4} {row['rows']:>5} "
                          f"{row['grad_norm']:>10.4f} {row['update_norm']:>12.6f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
