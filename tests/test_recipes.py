"""Every shipped recipe loads and trains for two steps (on the mini model, for speed)."""

from pathlib import Path

import pytest

from reasonrl.config import load_recipe
from reasonrl.train.metrics import read_metrics
from reasonrl.train.trainer import Trainer

from helpers import MINI_TINY

RECIPES = sorted((Path(__file__).resolve().parents[1] / "recipes").glob("*.yaml"))
TINY = [p for p in RECIPES if load_recipe(p).model.backend == "tiny"]


def test_the_issue_recipes_exist():
    names = {p.stem for p in RECIPES}
    assert {"grpo", "dr_grpo", "rloo", "reinforce_pp", "dapo", "gspo", "smollm2_gsm8k", "smollm2_arithmetic"} <= names


@pytest.mark.parametrize("path", TINY, ids=lambda p: p.stem)
def test_recipe_runs(path, tmp_path):
    overrides = [f"model.tiny.{k}={v}" for k, v in MINI_TINY.items()]
    if load_recipe(path).teacher is not None:  # a mini teacher too, not the 1500-step one
        overrides += [f"teacher.model.tiny.{k}={v}" for k, v in MINI_TINY.items()]
    overrides += ["train.steps=2", "train.prompts_per_step=4", "eval.size=8", "log.plots=false",
                  "log.progress=false", "rollout.max_sampling_rounds=1"]
    recipe = load_recipe(path, overrides)
    summary = Trainer(recipe, tmp_path / "run", log=lambda m: None).run()
    assert summary["steps"] == 2
    rows = [r for r in read_metrics(tmp_path / "run") if r["step"] > 0 and "reward/mean" in r]
    assert len(rows) == 2
