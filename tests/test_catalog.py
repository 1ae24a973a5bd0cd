"""The component catalog (``reasonrl.catalog``): every registry, complete in a fresh process, each
component with its parameters and defaults read from its signature; ``reasonrl list`` /
``describe`` print it, and ``docs/components.md`` is its Markdown, checked here against the code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from reasonrl import catalog, registry
from reasonrl.cli import main
from reasonrl.registry import ADVANTAGES, REWARDS, UnknownNameError

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "components.md"

# The stages issue 35 names, by their catalog names.
ISSUE_STAGES = ("advantages", "losses", "corrections", "rewards", "tasks", "envs", "samplers", "methods", "optimisers")


def _shipped(reg) -> list[str]:
    """The names reasonrl itself registers (test modules of the same session register their own)."""
    return [name for name, obj in reg.items() if obj.__module__.startswith("reasonrl.")]


def _python(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300,
                          cwd=ROOT).stdout


def test_a_fresh_process_lists_every_component_without_importing_them():
    """``names()``, ``items()``, iteration and ``in`` load the components first: a process that imported
    only the registry sees the same advantages (and rewards) as this one, which imported them all."""
    out = _python("from reasonrl.registry import ADVANTAGES, REWARDS\n"
                  "print(' '.join(ADVANTAGES.names())); print(' '.join(n for n, _ in REWARDS.items()))\n"
                  "print('gae' in ADVANTAGES, len(list(ADVANTAGES)))")
    advantages, rewards, last = out.splitlines()
    assert advantages.split() == _shipped(ADVANTAGES)
    assert {"grpo", "rloo", "gae", "copc", "novelty", "fsg_span"} <= set(advantages.split())
    assert rewards.split() == _shipped(REWARDS) and len(rewards.split()) >= 24
    assert last == f"True {len(_shipped(ADVANTAGES))}"


def test_a_failed_load_is_retried_not_left_half_done(monkeypatch):
    """A component module that fails to import fails every listing, never a listing that silently
    lacks the components after it."""
    class Broken:
        def load(self):
            raise ImportError("simulated broken component package")

    monkeypatch.setattr(registry, "_components_loaded", False)
    monkeypatch.setattr(registry, "entry_points", lambda group: [Broken()])
    for _ in range(2):
        with pytest.raises(ImportError, match="simulated broken"):
            ADVANTAGES.names()


def test_every_stage_of_the_recipe_is_in_the_catalog_and_complete():
    stages = {s.name: s for s in catalog.stages()}
    assert set(ISSUE_STAGES) <= set(stages)
    assert len(stages) == len(catalog.stages()), "two registries share a stage name"
    for name in ISSUE_STAGES:
        s = stages[name]
        assert [e.name for e in catalog.entries(s)] == s.registry.names(), name
    # The registries a method package declares for its own plugins are found too.
    assert {"advisors", "fsg_judges", "citation_validators"} <= set(stages)
    assert catalog.stage("advantage").name == "advantages"  # the recipe section is an alias


def test_parameters_and_defaults_come_from_the_signature():
    grpo = catalog.find("grpo", "advantages")[0]
    assert [(p.name, p.default) for p in grpo.params] == [("scale", "group"), ("eps", 1e-6)]
    assert grpo.framework_args == ("token_rewards", "response_mask", "group_ids")
    assert grpo.origin == "core" and grpo.module == "reasonrl.algos.advantages" and grpo.kind == "function"
    assert grpo.recipe == "advantage: {name: grpo, scale: group, eps: 1e-06}"
    assert grpo.summary.startswith("GRPO group-relative advantage")
    # A reward's completion, problem, num_tokens, truncated are the pipeline's; its own parameters stay.
    overlong = {p.name: p for p in catalog.find("soft_overlong")[0].params}
    assert list(overlong) == ["max_len", "buffer_len", "penalty_factor"]
    assert overlong["max_len"].required and overlong["penalty_factor"].default == 1.0
    assert catalog.find("exact_answer")[0].params == ()
    # A batch key the advantage reads (gae's values, its ``consumes``) is not a parameter either.
    assert [p.name for p in catalog.find("gae")[0].params] == ["gamma", "lam", "whiten"]
    # A dataclass's default_factory is called; bounds come from Range annotations.
    sampler = {p.name: p for p in catalog.find("learnability")[0].params}
    assert sampler["pool"].default == 4 and sampler["pool"].bounds == "≥ 1"
    # A method configured by a section of its own shows that section's fields.
    teacher = catalog.find("residual_teacher")[0]
    assert [p.name for p in teacher.params][:3] == ["model", "lora", "update"] and teacher.recipe.startswith("teacher: {")
    assert teacher.origin == "method residual" and teacher.page == "docs/methods/residual_advantage.md"


def test_a_name_in_several_stages_is_found_in_each():
    found = {e.stage.name: e for e in catalog.find("grpo_dropout")}
    assert set(found) == {"advantages", "selectors"}
    assert found["selectors"].recipe.startswith("selection: [{name: grpo_dropout, variant: balance")
    with pytest.raises(UnknownNameError, match=r"no component named 'gpro'\. Did you mean .*'grpo'"):
        catalog.find("gpro")


def test_reasonrl_list_prints_entries_with_parameters_and_defaults(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # the text wraps to the terminal: wide enough for one line a summary
    assert main(["list", "advantages"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"advantages ({len(ADVANTAGES.names())} advantage estimators)")
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.lstrip().startswith("grpo "))
    assert "GRPO group-relative advantage" in lines[at]
    assert "scale: group · eps: 1e-06  [core]" in lines[at + 1]
    assert "rewards (" not in out  # one stage only
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ISSUE_STAGES:
        assert f"\n{name} (" in out or out.startswith(f"{name} (")
    assert "soft_overlong" in out and "max_len: REQUIRED · buffer_len: REQUIRED · penalty_factor: 1.0" in out


def test_reasonrl_list_refuses_an_unknown_stage(capsys):
    assert main(["list", "advantagez"]) == 2
    err = capsys.readouterr().err
    assert "unknown stage 'advantagez'; stages: tasks, samplers" in err and "Did you mean 'advantages'?" in err


def test_reasonrl_describe_prints_the_docstring_and_the_parameter_table(capsys):
    assert main(["describe", "grpo"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("grpo: advantage estimator (stage advantages), function "
                          "reasonrl.algos.advantages.grpo_advantages [core]")
    assert "recipe: advantage: {name: grpo, scale: group, eps: 1e-06}" in out
    assert "Dr. GRPO" in out  # the whole docstring, not its first line only
    table = out[out.index("parameter  type"):].splitlines()
    assert table[1].split()[0] == "scale" and table[1].split()[-2:] == ["group", "-"]
    assert table[2].split() == ["eps", "float", "1e-06", "-"]
    assert "``" not in out  # reStructuredText markup is removed for the terminal
    assert main(["describe", "none"]) == 0  # a policy loss and an off-policy correction
    out = capsys.readouterr().out
    assert "none: policy loss (stage losses)" in out and "none: off-policy correction (stage corrections)" in out


def test_reasonrl_describe_an_unknown_name_exits_2_with_a_hint(capsys):
    assert main(["describe", "gpro"]) == 2
    err = capsys.readouterr().err
    assert "no component named 'gpro'" in err and "'grpo'" in err
    assert main(["describe", "grpo", "--stage", "rewards"]) == 2
    assert "no component named 'grpo' in stage rewards" in capsys.readouterr().err


def test_markdown_tables_list_every_shipped_component():
    text = catalog.markdown()
    assert "| `grpo` | `scale`: `group`, `eps`: `1e-06` | GRPO group-relative advantage" in text
    rewards = text[text.index("\n## rewards\n"):text.index("\n## token_rewards\n")]
    assert rewards.count("\n| `") == len(_shipped(REWARDS))
    assert "| `bot_grpo` |" in text and "method `bot_grpo`, [docs](methods/bot_grpo.md)" in text


def test_docs_components_md_is_the_catalog():
    """``docs/components.md`` is generated; regenerate it when a component or its docstring changes."""
    out = subprocess.run([sys.executable, "-m", "reasonrl.cli", "list", "--markdown"], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert DOCS.read_text(encoding="utf-8") == out.stdout, \
        f"docs/components.md is out of date: run `{catalog.GENERATE_DOCS}` and commit it"
