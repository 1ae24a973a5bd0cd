"""``reasonrl`` command line: train, quickstart.

Exit codes: 0 success, 2 bad input (recipe, arguments, data), 1 anything else.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from reasonrl.config import ConfigError, Recipe, load_recipe, recipe_from_dict
from reasonrl.registry import UnknownNameError


def _run_dir(recipe: Recipe, recipe_path: str | None) -> Path:
    name = recipe.run_name or (Path(recipe_path).stem if recipe_path else "run")
    return Path(recipe.output_dir) / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def cmd_train(args: argparse.Namespace) -> int:
    from reasonrl.train.trainer import RECIPE_FILE, Trainer

    if args.resume:
        run_dir = Path(args.resume)
        saved = run_dir / RECIPE_FILE
        if not saved.is_file():
            raise ConfigError(f"--resume {run_dir}: not a run folder (no {RECIPE_FILE})")
        recipe = recipe_from_dict(json.loads(saved.read_text()), str(saved))
        if args.set:
            raise ConfigError("--set cannot change a run being resumed; start a new run instead")
    else:
        if not args.recipe:
            raise ConfigError("train needs a RECIPE.yaml (or --resume RUN_DIR)")
        recipe = load_recipe(args.recipe, args.set)
        run_dir = Path(args.output) if args.output else _run_dir(recipe, args.recipe)
        if run_dir.exists() and any(run_dir.iterdir()):
            raise ConfigError(f"output folder {run_dir} is not empty; use --resume {run_dir} to continue it")
    summary = Trainer(recipe, run_dir, resume=bool(args.resume)).run()
    print(json.dumps({k: summary[k] for k in ("run_dir", "steps", "base_accuracy", "final_accuracy", "wall_seconds")}))
    return 0


def cmd_quickstart(args: argparse.Namespace) -> int:
    from reasonrl.quickstart import quickstart

    quickstart(seed=args.seed, output=args.output, overrides=args.set)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="reasonrl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="run a recipe")
    train.add_argument("recipe", nargs="?", help="recipe YAML file")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a recipe value, e.g. --set optim.lr=1e-4 (repeatable)")
    train.add_argument("--resume", metavar="RUN_DIR", help="continue a stopped run from its last checkpoint")
    train.add_argument("-o", "--output", help="run folder (default: output_dir/<recipe>-<time>)")
    train.set_defaults(func=cmd_train)

    quick = sub.add_parser("quickstart", help="warm up the embedded model, train it with GRPO, compare")
    quick.add_argument("--seed", type=int, default=0)
    quick.add_argument("-o", "--output", default="runs/quickstart")
    quick.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    quick.set_defaults(func=cmd_quickstart)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, UnknownNameError, FileNotFoundError, ImportError) as exc:
        # ImportError: an optional extra the recipe needs; its message names the pip command.
        print(f"reasonrl: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("reasonrl: interrupted; resume with `reasonrl train --resume RUN_DIR`", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
