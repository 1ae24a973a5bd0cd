"""User code in recipes ("file.py:fn", "package.module:fn", callables, plugins) and the Python API."""

import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
import types
import uuid
from pathlib import Path

import pytest
import yaml

import reasonrl
from reasonrl import api
from reasonrl.config import ConfigError, load_recipe, recipe_from_dict
from reasonrl.registry import ADVANTAGES, POLICY_LOSSES, REWARDS, TASKS, TOKEN_REWARDS, UserCodeError
from reasonrl.metrics_log import read_metrics
from reasonrl.train.trainer import Trainer

from helpers import MINI_TINY, comparable, crash_at_step, mini_recipe, run_cli

ROOT = Path(__file__).resolve().parents[1]


def quiet(_msg):
    pass


def step_rows(run_dir):
    return [r for r in read_metrics(run_dir) if r["step"] > 0 and "loss" in r]


def write(path: Path, *parts: str) -> Path:
    """Write the dedented ``parts`` (each indented as it is written here) to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(textwrap.dedent(part) for part in parts))
    return path


REWARD_FILE = """
    def constant(completion, problem, *, value=0.25, **_):
        return value


    def helper():
        pass


    LIMIT = 3
"""

# A loss as a user would write one: plain policy gradient with the importance ratio.
PLAIN_PG = """
    def plain_pg(logprobs, old_logprobs, advantages, response_mask):
        CALLS["loss"] += 1
        ratio = torch.exp(logprobs - old_logprobs)
        valid = response_mask.bool()
        zero = torch.zeros_like(ratio)
        return PolicyLossOutput(loss=torch.where(valid, -advantages * ratio, zero), clipped=zero,
                                ratio=torch.where(valid, ratio, zero))
"""


# --- names of files and modules ---------------------------------------------------------


def test_reward_from_a_file_trains_logs_its_values_and_is_stored_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "user" / "my_rewards.py", REWARD_FILE)
    recipe = mini_recipe(rewards=[{"name": "exact_answer"}, {"name": "user/my_rewards.py:constant", "value": 0.75}],
                         train={"steps": 2}, eval={"size": 4})
    name = f"{tmp_path / 'user' / 'my_rewards.py'}:constant"
    assert recipe.rewards[1].name == name and recipe.rewards[1].params == {"value": 0.75}

    Trainer(recipe, tmp_path / "run", log=quiet).run()
    rows = [r for r in step_rows(tmp_path / "run") if "reward/constant" in r]  # named by its function, not its path
    assert len(rows) == 2  # the filter matches every step
    assert all(r["reward/constant"] == 0.75 for r in rows)  # the file's function with the recipe's parameter
    assert all(r["reward/mean"] >= 0.75 for r in rows)
    saved = json.loads((tmp_path / "run" / "recipe.json").read_text())
    assert saved["rewards"][1]["name"] == name and os.path.isabs(name)

    monkeypatch.chdir(tmp_path / "user")  # the saved recipe resolves from any directory
    assert recipe_from_dict(saved, "recipe.json").rewards[1].name == name


def test_user_parameters_are_checked_against_the_signature(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "my_rewards.py", REWARD_FILE)
    write(tmp_path / "credit.py", """
        def centred(token_rewards, response_mask, group_ids, *, scale="none"):
            return token_rewards
    """)
    with pytest.raises(ConfigError, match=r"rewards\[0\]\.valu'.*Did you mean 'value'"):
        recipe_from_dict({"rewards": [{"name": "my_rewards.py:constant", "valu": 1.0}]})
    with pytest.raises(ConfigError, match=r"advantage\.scael'.*allowed: scale.*Did you mean 'scale'"):
        recipe_from_dict({"advantage": {"name": "credit.py:centred", "scael": "group"}})


def test_package_module_name(tmp_path, monkeypatch):
    pkg = f"rrl_user_pkg_{uuid.uuid4().hex[:8]}"
    write(tmp_path / pkg / "__init__.py", "")
    write(tmp_path / pkg / "scoring.py", """
        def half(completion, problem, **_):
            return 0.5
    """)
    monkeypatch.syspath_prepend(str(tmp_path))
    name = f"{pkg}.scoring:half"
    recipe = mini_recipe(rewards=[{"name": name}], train={"steps": 1}, eval={"size": 0})
    assert recipe.rewards[0].name == name  # a module name is stored as written
    assert REWARDS.get(name) is importlib.import_module(f"{pkg}.scoring").half
    Trainer(recipe, tmp_path / "run", log=quiet).run()
    assert [r[f"reward/{name}"] for r in step_rows(tmp_path / "run")] == [0.5]


def test_task_advantage_selector_and_policy_loss_from_a_file(tmp_path):
    path = write(tmp_path / "components.py", """
        from dataclasses import dataclass

        import torch

        from reasonrl.algos.advantages import grpo_advantages
        from reasonrl.algos.losses import PolicyLossOutput
        from reasonrl.tasks.arithmetic import ArithmeticTask

        CALLS = {"task": 0, "advantage": 0, "selector": 0, "loss": 0}


        @dataclass
        class SmallSums(ArithmeticTask):
            max_operand: int = 5

            def train_problems(self, step, count, seed):
                CALLS["task"] += 1
                return super().train_problems(step, count, seed)


        def centred(token_rewards, response_mask, group_ids, *, scale="none"):
            CALLS["advantage"] += 1
            return grpo_advantages(token_rewards, response_mask, group_ids, scale=scale)


        def keep_all(batch, *, step):
            CALLS["selector"] += 1
            return batch, {"kept": float(len(batch))}
    """, PLAIN_PG)
    ref = lambda symbol: f"{path}:{symbol}"  # noqa: E731
    recipe = mini_recipe(task={"name": ref("SmallSums"), "max_operand": 4},
                         advantage={"name": ref("centred"), "scale": "group"},
                         selection=[{"name": ref("keep_all")}], loss={"policy": ref("plain_pg")},
                         train={"steps": 2}, eval={"size": 4})
    Trainer(recipe, tmp_path / "run", log=quiet).run()

    calls = sys.modules[TASKS.get(ref("SmallSums")).__module__].CALLS
    assert calls["task"] >= 2 and calls["advantage"] == 2 and calls["selector"] == 2 and calls["loss"] >= 2
    task = TASKS.get(ref("SmallSums"))(max_operand=4)
    assert all(max(map(int, re.findall(r"\d+", p.prompt))) <= 9 for p in task.train_problems(0, 8, 0))
    rows = step_rows(tmp_path / "run")
    assert [r[f"selection/{ref('keep_all')}/kept"] for r in rows] == [16.0, 16.0]  # 4 prompts × G=4


def test_plugin_registers_components_by_decorator(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tag = uuid.uuid4().hex[:8]
    reward, loss = f"plugin_quarter_{tag}", f"plugin_pg_{tag}"
    write(tmp_path / "plugins" / "mine.py", f"""
        import torch

        from reasonrl.algos.losses import PolicyLossOutput
        from reasonrl.registry import POLICY_LOSSES, REWARDS

        CALLS = {{"loss": 0}}


        @REWARDS.register("{reward}")
        def quarter(completion, problem, **_):
            return 0.25

    """, PLAIN_PG.replace("    def plain_pg", f'    @POLICY_LOSSES.register("{loss}")\n    def plain_pg', 1))
    recipe = mini_recipe(plugins=["plugins/mine.py"], rewards=[{"name": reward}], loss={"policy": loss},
                         train={"steps": 1}, eval={"size": 0})
    assert recipe.plugins == [str(tmp_path / "plugins" / "mine.py")]  # stored absolute
    Trainer(recipe, tmp_path / "run", log=quiet).run()
    assert [r[f"reward/{reward}"] for r in step_rows(tmp_path / "run")] == [0.25]
    assert POLICY_LOSSES.get(loss).__globals__["CALLS"]["loss"] >= 1
    # Imported once per process: loading the recipe again re-registers nothing (no duplicate error).
    assert recipe_from_dict(recipe.to_dict()).plugins == recipe.plugins

    with pytest.raises(ConfigError, match=r"plugins\[0\]: plugin 'nope\.py': file not found: " + re.escape(str(tmp_path / "nope.py"))):
        recipe_from_dict({"plugins": ["nope.py"]})
    with pytest.raises(ConfigError, match=r"'plugins' must be a list"):
        recipe_from_dict({"plugins": "plugins/mine.py"})


# --- errors -----------------------------------------------------------------------------

MINE = {"mine.py": REWARD_FILE}


@pytest.mark.parametrize("files, section, name, expected", [
    ({}, "rewards", "missing.py:score", ["file not found: {tmp}/missing.py", "'{tmp}/missing.py:score'"]),
    ({"notes.txt": "score = 1\n"}, "rewards", "notes.txt:score", ["{tmp}/notes.txt is not a .py file"]),
    ({"broken.py": "x = 1\ndef score(:\n    pass\n"}, "rewards", "broken.py:score",
     ["syntax error in {tmp}/broken.py:2: ", "'{tmp}/broken.py:score'"]),
    ({"raises.py": "import os\nraise RuntimeError('no GPU here')\n"}, "rewards", "raises.py:score",
     ["importing {tmp}/raises.py raised RuntimeError: no GPU here (line 2)"]),
    ({}, "rewards", "no_such_pkg_rrl.rewards:score",
     ["module 'no_such_pkg_rrl.rewards' is not importable", "No module named 'no_such_pkg_rrl'"]),
    (MINE, "rewards", "mine.py:constnt",
     ["file {tmp}/mine.py has no 'constnt'; its public callables: constant, helper.", "Did you mean 'constant'"]),
    (MINE, "rewards", "mine.py:constant.nope", ["has no 'constant.nope'"]),
    (MINE, "rewards", "mine.py:LIMIT", ["'{tmp}/mine.py:LIMIT' is an int (3), not callable"]),
    (MINE, "task", "mine.py:constant", ["task '{tmp}/mine.py:constant' is a function, but a task must be a class"]),
    ({}, "rewards", "mine.py:", ["write 'path/to/file.py:NAME' or 'package.module:NAME'"]),
    ({}, "rewards", "os:path.<locals>.f", ["passed to reasonrl directly", "Pass the same object again"]),
])
def test_user_code_errors_name_file_symbol_and_problem(tmp_path, monkeypatch, files, section, name, expected):
    monkeypatch.chdir(tmp_path)
    for file, text in files.items():
        write(tmp_path / file, text)
    raw = {"rewards": [{"name": name}]} if section == "rewards" else {"task": {"name": name}}
    recipe = write(tmp_path / "recipe.yaml", yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as err:
        load_recipe(recipe)
    msg = str(err.value)
    assert msg.startswith(f"{recipe}: {section}{'[0]' if section == 'rewards' else ''}.name: "), msg
    for part in expected:
        assert part.format(tmp=tmp_path) in msg, msg


def test_errors_are_user_code_errors_of_the_registry(tmp_path):
    with pytest.raises(UserCodeError, match="file not found") as err:
        REWARDS.get(f"{tmp_path}/missing.py:score")
    assert isinstance(err.value, KeyError)  # an UnknownNameError, as every unknown name
    with pytest.raises(UserCodeError, match="not importable"):
        ADVANTAGES.get("no_such_pkg_rrl:fn")


def test_cli_user_code_error_exits_2_and_leaves_nothing(tmp_path):
    write(tmp_path / "my_rewards.py", REWARD_FILE)
    recipe = write(tmp_path / "bad.yaml", """
        rewards: [{name: "my_rewards.py:constnt"}]
        model: {tiny: {hidden_size: 32, num_layers: 1, num_heads: 2, warmup_steps: 1}}
    """)
    out = run_cli("train", str(recipe), "-o", str(tmp_path / "run"), cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert f"{tmp_path / 'my_rewards.py'}" in out.stderr and "'constnt'" in out.stderr
    assert "Did you mean 'constant'" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "run").exists()


# --- Python objects passed directly -------------------------------------------------------


def test_callable_passed_directly_trains_and_resumes_through_the_api(tmp_path, monkeypatch):
    def bonus(completion, problem, **_):
        return 0.5 if "=" in completion else 0.0

    name = f"{bonus.__module__}:{bonus.__qualname__}"
    assert "<locals>" in name  # a closure: the generated name says so

    def recipe(**train):
        return mini_recipe(rewards=[{"name": "exact_answer"}, {"name": bonus, "weight": 0.5}],
                           train={"steps": 4, **train}, eval={"size": 8})

    assert recipe().rewards[1].name == name
    straight = api.train(recipe(), tmp_path / "a", log=quiet)

    with crash_at_step(monkeypatch, 2):
        api.train(recipe(), tmp_path / "b", log=quiet)
    with pytest.raises(ConfigError, match="run folder .* is not empty; pass resume=True"):
        api.train(recipe(), tmp_path / "b", log=quiet)
    with pytest.raises(ConfigError, match=r"the recipe differs .*train\.steps: 4 -> 5"):
        api.train(recipe(steps=5), tmp_path / "b", resume=True, log=quiet)
    resumed = api.train(recipe(), tmp_path / "b", resume=True, log=quiet)

    rows_a, rows_b = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    assert comparable(rows_a) == comparable(rows_b)
    assert sum(f"reward/{name}" in r for r in rows_b) == 4
    assert resumed["final_accuracy"] == straight["final_accuracy"] and resumed["steps"] == 4
    assert json.loads((tmp_path / "b" / "recipe.json").read_text())["rewards"][1]["name"] == name


def test_passed_objects_get_distinct_names_and_the_latest_wins():
    def make(value):
        return lambda completion, problem, **_: value

    first, second = make(1.0), make(2.0)
    r = recipe_from_dict({"rewards": [{"name": first}, {"name": second}]})
    a, b = (x.name for x in r.rewards)
    assert b == f"{a}#2" and REWARDS.get(a) is first and REWARDS.get(b) is second
    third = make(3.0)
    assert recipe_from_dict({"rewards": [{"name": third}]}).rewards[0].name == a
    assert REWARDS.get(a) is third  # a redefined function (a notebook cell run again) replaces the old one
    # Anywhere a name goes: here a policy loss given as a function.
    loss = POLICY_LOSSES.get("ppo_clip")
    assert recipe_from_dict({"loss": {"policy": loss}}).loss.policy == "reasonrl.algos.losses:ppo_clip_loss"


def test_main_names_resolve_only_in_a_script_that_defines_them(monkeypatch):
    main = types.ModuleType("__main__")
    exec("def scripted(completion, problem, **_):\n    return 1.0\n", main.__dict__)
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert REWARDS.get("__main__:scripted") is main.scripted  # e.g. train(None, run_dir, resume=True) in the script
    with pytest.raises(UserCodeError, match="defined in a script or notebook .*resume=True"):
        REWARDS.get("__main__:other")
    cli = types.ModuleType("__main__")
    cli.__spec__ = importlib.util.find_spec("reasonrl.cli")
    cli.main = main.scripted
    monkeypatch.setitem(sys.modules, "__main__", cli)
    with pytest.raises(UserCodeError, match="cannot be imported here"):  # never the CLI's own functions
        TOKEN_REWARDS.get("__main__:main")


# --- the Python API and the README ------------------------------------------------------


def test_import_reasonrl_is_cheap_and_exports_the_api():
    code = ("import sys, inspect, reasonrl\n"
            "assert 'torch' not in sys.modules and 'reasonrl.config' not in sys.modules\n"
            "from reasonrl import train, Recipe, load_recipe, recipe_from_dict\n"
            "assert 'torch' not in sys.modules\n"
            "assert list(inspect.signature(train).parameters)[:2] == ['recipe', 'run_dir']\n"
            "import reasonrl.train.progress as p\n"  # the subpackage of the same name still imports
            "from reasonrl import train as again\n"
            "assert again is train and p is reasonrl.train.progress and 'torch' not in sys.modules\n"
            "print(Recipe.__name__, load_recipe.__name__, recipe_from_dict.__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["Recipe", "load_recipe", "recipe_from_dict"]
    # Here the trainer is imported (at the top of this file): the name is still the function.
    assert callable(reasonrl.train) and reasonrl.train.trainer.Trainer is Trainer


def readme_python_example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Python API\n", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


# The README example as written, on the mini model (a smaller, faster run than the embedded one).
MINI_PRELUDE = f"""
import runpy, sys
import reasonrl.api

_train = reasonrl.api.train
def _mini(recipe, *args, overrides=None, **kwargs):
    mini = [f"model.tiny.{{k}}={{v}}" for k, v in {MINI_TINY!r}.items()]
    return _train(recipe, *args, overrides=mini + list(overrides or []), **kwargs)
reasonrl.api.train = _mini
runpy.run_path(sys.argv[1], run_name="__main__")
"""


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("readme")
    (work / "example.py").write_text(readme_python_example())
    env = {**os.environ, "REASONRL_CACHE": str(tmp_path_factory.getbasetemp() / "cache")}
    out = subprocess.run([sys.executable, "-c", MINI_PRELUDE, "example.py"], cwd=work, env=env,
                         capture_output=True, text=True)
    return work, env, out


def test_readme_python_api_example_runs(readme_run):
    work, _, out = readme_run
    assert out.returncode == 0, out.stderr
    runs = list((work / "runs").iterdir())
    assert len(runs) == 1 and str(runs[0].name) in out.stdout  # the CLI's default folder naming
    summary = json.loads((runs[0] / "summary.json").read_text())
    assert summary["steps"] >= 1 and 0 <= summary["final_accuracy"] <= 1
    saved = json.loads((runs[0] / "recipe.json").read_text())
    names = [r["name"] for r in saved["rewards"]]
    assert any(n.startswith("__main__:") for n in names), names
    assert all(any(f"reward/{n}" in r for r in read_metrics(runs[0])) for n in names)


def test_cli_resume_of_a_run_whose_reward_lived_in_main_says_use_the_api(readme_run):
    work, env, _ = readme_run
    (run,) = (work / "runs").iterdir()
    out = subprocess.run([sys.executable, "-m", "reasonrl.cli", "train", "--resume", str(run)], cwd=work, env=env,
                         capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert "__main__:" in out.stderr and "defined in a script or notebook" in out.stderr
    assert "reasonrl.train(recipe, run_dir, resume=True)" in out.stderr
