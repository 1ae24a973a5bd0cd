"""Every shipped recipe loads and trains for two steps (on the mini model, for speed)."""

import json
from pathlib import Path

import pytest
import yaml

from reasonrl.config import load_recipe
from reasonrl.metrics_log import read_metrics
from reasonrl.train.trainer import Trainer

from helpers import MINI_TINY, recipe_diff

RECIPES = sorted((Path(__file__).resolve().parents[1] / "recipes").glob("*.yaml"))
# A verifiers environment's recipe runs in tests/test_verifiers.py (it needs the verifiers worker),
# an OpenEnv one in tests/test_openenv.py (it needs a server).
TINY = [p for p in RECIPES if load_recipe(p).model.backend == "tiny" and load_recipe(p).task.name != "verifiers"
        and (load_recipe(p).env is None or load_recipe(p).env.name != "openenv")]


def test_the_issue_recipes_exist():
    names = {p.stem for p in RECIPES}
    assert {"grpo", "dr_grpo", "rloo", "reinforce_pp", "dapo", "gspo", "smollm2_gsm8k", "smollm2_arithmetic",
            "smollm2_grpo", "grpo_async"} <= names


@pytest.mark.parametrize("path", TINY, ids=lambda p: p.stem)
def test_recipe_runs(path, tmp_path):
    overrides = [f"model.tiny.{k}={v}" for k, v in MINI_TINY.items()]
    if load_recipe(path).teacher is not None:  # a mini teacher too, not the 1500-step one
        overrides += [f"teacher.model.tiny.{k}={v}" for k, v in MINI_TINY.items()]
    raw_methods = [dict(m) for m in yaml.safe_load(path.read_text()).get("methods") or []]
    for entry in raw_methods:  # a tiny model a method owns (a distillation teacher) is a mini one too
        for key, value in entry.items():
            if isinstance(value, dict) and value.get("backend") == "tiny":
                entry[key] = {**value, "tiny": {**value.get("tiny", {}), **MINI_TINY}}
    if raw_methods:
        overrides.append("methods=" + json.dumps(raw_methods))
    env = load_recipe(path).env
    if env is not None and env.name == "advisor" and env.params.get("advisor", "tiny") == "tiny":
        overrides += [f"env.advisor_params.tiny.{k}={v}" for k, v in MINI_TINY.items()]  # a mini advisor too
    overrides += ["train.steps=2", "train.prompts_per_step=4", "eval.size=8", "log.plots=false",
                  "log.progress=false", "rollout.max_sampling_rounds=1"]
    if "rounds_per_step" in load_recipe(path).sampler.params:  # a rollout budget reserves one group per round
        overrides.append("sampler.rounds_per_step=1")
    recipe = load_recipe(path, overrides)
    summary = Trainer(recipe, tmp_path / "run", log=lambda m: None).run()
    assert summary["steps"] == 2
    rows = [r for r in read_metrics(tmp_path / "run") if r["step"] > 0 and "reward/mean" in r]
    assert len(rows) == 2


def test_smollm2_grpo_recipe_scores_its_own_format():
    """The SmolLM2 recipe's prompt shows answers as `<answer>N</answer>` and cuts at the line
    end; reasoning-gym's scorer must give 1 to that format with the right sum and 0 to a
    wrong sum or an untagged one (what the base model often writes), and the shots' sums hold."""
    pytest.importorskip("reasoning_gym")
    from reasonrl.registry import REWARDS
    from reasonrl.train.trainer import build_task

    recipe = load_recipe(Path(__file__).resolve().parents[1] / "recipes" / "smollm2_grpo.yaml")
    assert recipe.rollout.stop == ["\n"] and recipe.eval.reward == "reasoning_gym"
    task = build_task(recipe)
    train, held_out = task.train_problems(0, 32, 1), task.eval_problems(recipe.eval.size)
    assert len(held_out) == 200 and not {p.prompt for p in train} & {p.prompt for p in held_out}
    score = REWARDS.get("reasoning_gym")
    for problem in train[:8]:
        a, b = map(int, problem.meta["entry"]["question"].removeprefix("Calculate ").rstrip(".").split(" + "))
        assert problem.answer == str(a + b) and problem.prompt.endswith(f"Calculate {a} + {b}.\nAnswer:")
        assert score(f" <answer>{a + b}</answer>", problem) == 1.0
        assert score(f" <answer>{a + b + 1}</answer>", problem) == 0.0
        assert score(f" {a + b}", problem) == 0.0
    assert "12 + 7?\nAnswer: <answer>19</answer>" in train[0].prompt and "9 - 4?\nAnswer: <answer>5</answer>" in train[0].prompt


def test_the_smollm2_lora_recipe_differs_from_smollm2_grpo_in_lora_its_lr_and_the_decoder():
    """Issue 33's LoRA lever is judged against recipes/smollm2_grpo.yaml: nothing else may differ."""
    assert recipe_diff("smollm2_grpo_lora", "smollm2_grpo") == {
        "model.lora.r", "model.lora.alpha", "model.lora.dropout", "model.lora.target_modules", "optim.lr",
        "rollout.decoder"}
    lora = load_recipe(Path(__file__).resolve().parents[1] / "recipes" / "smollm2_grpo_lora.yaml")
    assert lora.rollout.decoder == "fused" and lora.optim.lr == 1e-4 and lora.model.lora.r == 16


def test_the_smollm2_bf16_recipe_differs_from_smollm2_grpo_in_its_precisions_and_their_correction():
    assert recipe_diff("smollm2_grpo_bf16", "smollm2_grpo") == {
        "train.precision", "rollout.dtype", "rollout.decoder", "off_policy.name", "off_policy.level", "off_policy.cap"}
