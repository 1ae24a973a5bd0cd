"""The Python API: train from a script or notebook, with your own functions in the recipe.

    from reasonrl import train

    def short_answer(completion, problem, **_):
        return float(completion.endswith("####" + problem.answer))

    summary = train({"rewards": [{"name": short_answer}], "train": {"steps": 5}})

A recipe is a ``Recipe``, a dict (the YAML mapping, where any name may also be a
Python function or class) or the path of a YAML file. Errors in it raise
``ConfigError`` before anything is written.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

# The loader, not reasonrl.config: importing the API stays free of torch; the components a recipe
# names register on the first lookup (reasonrl.registry.load_components).
from reasonrl.fsutil import atomic_write_text
from reasonrl.params import ConfigError
from reasonrl.recipe import apply_override, flatten, load_recipe, recipe_from_dict
from reasonrl.sections import Recipe

__all__ = ["train", "resumed_recipe"]

RESUMABLE = ("train.steps",)  # the one key a resumed run may change: it extends (or shortens) the run


def default_run_dir(recipe: Recipe, recipe_path: str | None) -> Path:
    """``output_dir/<run_name, or the recipe file's stem, or "run">-<time>``: where a run goes
    when no folder is given (``reasonrl train`` and :func:`train` alike)."""
    name = recipe.run_name or (Path(recipe_path).stem if recipe_path else "run")
    return Path(recipe.output_dir) / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def train(recipe: Recipe | dict[str, Any] | str | Path | None, run_dir: str | Path | None = None, *,
          overrides: list[str] | None = None, resume: bool = False,
          log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Train with ``recipe`` and return the run's summary (what ``summary.json`` holds:
    ``run_dir``, ``steps``, ``base_accuracy``, ``final_accuracy``, ``base_eval``,
    ``final_eval``, ``wall_seconds``, ...).

    ``run_dir``: the run folder (default ``output_dir/<run_name or recipe file stem or
    "run">-<time>``, as ``reasonrl train``); it must be empty or absent unless resuming.
    ``overrides``: ``["optim.lr=1e-4", ...]``, as ``--set``. ``resume=True`` continues the
    stopped run in ``run_dir`` from its last checkpoint: ``recipe`` is then None (the run's
    ``recipe.json`` is used; a function passed directly from a script resolves when the
    script defines it at top level) or the same recipe again (with the same Python
    functions), checked against ``recipe.json``. ``log``: receives progress messages
    (default: printed to stderr).
    """
    from reasonrl.train.trainer import RECIPE_FILE, Trainer

    if resume:
        if run_dir is None:
            raise ConfigError("train(resume=True) needs the run_dir of the run to continue")
        if overrides and recipe is not None:
            raise ConfigError("train(resume=True) takes overrides (train.steps only) or a recipe, not both")
        saved_path = Path(run_dir) / RECIPE_FILE
        if not saved_path.is_file():
            raise ConfigError(f"resume: {run_dir} is not a run folder (no {RECIPE_FILE})")
        saved = json.loads(saved_path.read_text())
        if recipe is None:  # overrides: as `--resume --set train.steps=N` (resumed_recipe)
            built = resumed_recipe(Path(run_dir), overrides or [], RECIPE_FILE, write=True, talks=False)
        else:
            built, _ = _as_recipe(recipe, None)
            _check_same(built, saved, saved_path)
        run_dir = Path(run_dir)
    else:
        if recipe is None:
            raise ConfigError("train() needs a recipe (a Recipe, a dict or a YAML path), or resume=True")
        built, recipe_path = _as_recipe(recipe, overrides)
        run_dir = Path(run_dir) if run_dir is not None else default_run_dir(built, recipe_path)
        if run_dir.exists() and any(run_dir.iterdir()):
            raise ConfigError(f"run folder {run_dir} is not empty; pass resume=True to continue it")
    if built.train.nproc > 1:  # several learner ranks (docs/scaling.md)
        if built.train.engine != "ray":
            raise ConfigError(f"train.nproc={built.train.nproc} with train.engine: torchrun starts processes from "
                              "the command line: reasonrl train RECIPE --nproc N (or train.engine: ray from Python)")
        from reasonrl.train.ray_ranks import run_on_ray

        return run_on_ray(built, run_dir, resume=resume)
    return Trainer(built, run_dir, resume=resume, log=log).run()


def _as_recipe(recipe: Recipe | dict[str, Any] | str | Path, overrides: list[str] | None) -> tuple[Recipe, str | None]:
    """A validated Recipe, and the YAML path it came from (names the default run folder)."""
    if isinstance(recipe, (str, Path)):
        return load_recipe(recipe, overrides), str(recipe)
    if isinstance(recipe, Recipe):
        raw, where = recipe.to_dict(), "recipe"
    elif isinstance(recipe, dict):
        raw, where = _copy_sections(recipe), "recipe dict"  # overrides leave the caller's dict alone
    else:
        raise ConfigError(f"train(): a recipe is a Recipe, a dict or a YAML path, got {type(recipe).__name__}")
    for item in overrides or []:
        apply_override(raw, item)
    return recipe_from_dict(raw, where), None


def _copy_sections(node: Any) -> Any:
    """A copy of the dicts and lists of a recipe tree; the values (functions too) are shared."""
    if isinstance(node, dict):
        return {k: _copy_sections(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_copy_sections(v) for v in node]
    return node


def _check_same(recipe: Recipe, saved: dict[str, Any], saved_path: Path) -> None:
    given = flatten(json.loads(json.dumps(recipe.to_dict())))
    before = flatten(saved)
    differ = sorted(k for k in given.keys() | before.keys() if given.get(k) != before.get(k))
    if differ:
        shown = "; ".join(f"{k}: {before.get(k, '(absent)')!r} -> {given.get(k, '(absent)')!r}" for k in differ[:5])
        raise ConfigError(f"resume: the recipe differs from the run's {saved_path} ({shown}); resume with the "
                          "same recipe (or None, to use the saved one), or start a new run")


def resumed_recipe(run_dir: Path, overrides: list[str], recipe_file: str, write: bool, talks: bool):
    """The recipe of the run in ``run_dir`` (its ``recipe.json``), with ``train.steps`` changed when
    ``overrides`` (``--set``) says so, and no other key: a resumed run continues the same recipe.
    The new ``train.steps`` must be at least the steps already done (the last checkpoint's); it is
    written back to ``recipe.json`` (by the ``write`` process), so a later plain ``--resume``, the
    report and the checkpoints all see the longer run. The learning-rate schedule is computed over
    the new total, so a decaying one (linear, cosine) changes from the resumed step on."""
    from reasonrl.train.checkpoint import list_checkpoints

    saved = run_dir / recipe_file
    if not saved.is_file():
        raise ConfigError(f"--resume {run_dir}: not a run folder (no {recipe_file})")
    raw = json.loads(saved.read_text())
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if key not in RESUMABLE:
            raise ConfigError(f"--set {key}: a resumed run keeps its recipe; on --resume only "
                              f"{', '.join(RESUMABLE)} may be set (to change {key}, start a new run)")
        apply_override(raw, item)
    recipe = recipe_from_dict(raw, f"{saved} with --set" if overrides else str(saved))
    before = json.loads(saved.read_text()).get("train", {}).get("steps")
    if recipe.train.steps == before:
        return recipe
    checkpoints = list_checkpoints(run_dir)
    done = int(checkpoints[-1].name.removeprefix("step_")) if checkpoints else 0
    if recipe.train.steps < done:
        raise ConfigError(f"--set train.steps={recipe.train.steps}: the run has done {done} steps (its last checkpoint, "
                          f"{checkpoints[-1]}); train.steps must be at least {done}")
    if talks:
        print(f"reasonrl: train.steps {before} -> {recipe.train.steps}", file=sys.stderr, flush=True)
        if recipe.optim.schedule != "constant":
            print(f"reasonrl: note: optim.schedule {recipe.optim.schedule} now spans {recipe.train.steps} steps, so the "
                  f"learning rate from step {done} on differs from the {before}-step run's", file=sys.stderr, flush=True)
    if write and checkpoints:  # without one the Trainer refuses the resume: the folder stays as it was
        atomic_write_text(saved, json.dumps(recipe.to_dict(), indent=1))
    return recipe
