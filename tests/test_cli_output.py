"""What the command line says: ``--version``, help text for every option with no raw markup, the
run folder at the start of ``reasonrl train`` and the report command at its end, the Ctrl-C hint
(naming the real folder; nothing to resume before the first checkpoint), and ``--resume`` with
``--set train.steps=N`` running a run further while every other ``--set`` is refused."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
from importlib.metadata import version

import pytest

from reasonrl.cli import build_parser, main
from reasonrl.metrics_log import read_metrics
from reasonrl.train.trainer import Trainer

from helpers import mini_recipe

MARKUP = ("`", "**")


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"reasonrl {version('reasonrl')}"


def _parsers(parser: argparse.ArgumentParser, path: str = "reasonrl"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def test_every_option_has_help_text_without_markup():
    parsers = list(_parsers(build_parser()))
    assert {"reasonrl train", "reasonrl list", "reasonrl describe", "reasonrl eval", "reasonrl fuse"} <= {p for p, _ in parsers}
    for path, parser in parsers:
        for action in parser._actions:
            what = f"{path} {'/'.join(action.option_strings) or action.dest}"
            if isinstance(action, argparse._SubParsersAction):
                for choice in action._choices_actions:  # the one-line help of each command
                    assert choice.help and not any(m in choice.help for m in MARKUP), f"{path} {choice.dest}"
                continue
            assert action.help and action.help.strip(), f"{what} has no help text"
            assert not any(m in action.help for m in MARKUP), f"{what}: markup in {action.help!r}"
        text = parser.format_help()  # the description and epilog too, as printed
        assert not any(m in text for m in MARKUP), f"{path} --help shows markup"


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory):
    """A 2-step run of the mini model through the command line, a checkpoint after each step; the
    recipe file, the run folder and what the command printed."""
    base = tmp_path_factory.mktemp("cli_output")
    recipe = base / "two.yaml"
    raw = mini_recipe(train={"steps": 2, "checkpoint_every": 1, "keep_checkpoints": 5, "threads": 1},
                      eval={"size": 0}).to_dict()
    recipe.write_text(json.dumps(raw))  # JSON is YAML
    run = base / "run"
    err = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stderr(err):
        # As conftest's autouse fixture does for each test: mini models go to the session's cache.
        mp.setenv("REASONRL_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
        code = main(["train", str(recipe), "-o", str(run)])
    assert code == 0, err.getvalue()
    return recipe, run, err.getvalue()


def _copy(run, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(run, dst)
    return dst


def test_train_prints_the_run_folder_first_and_the_report_command_last(two_steps):
    _, run, err = two_steps
    lines = err.strip().splitlines()
    assert lines[0] == f"reasonrl: run folder {run}"
    assert lines[-1].startswith(f"reasonrl: done; report: reasonrl report {run}")


def test_resume_can_extend_train_steps(two_steps, tmp_path, capsys):
    run = _copy(two_steps[1], tmp_path)
    assert main(["train", "--resume", str(run), "--set", "train.steps=3"]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines()[0] == f"reasonrl: resuming {run}" and "train.steps 2 -> 3" in err
    assert json.loads(out.strip().splitlines()[-1])["steps"] == 3
    assert [r["step"] for r in read_metrics(run) if "lr" in r] == [1, 2, 3]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000001", "step_000002", "step_000003"]
    # recipe.json says 3 now: a later plain --resume, the report and the checkpoints agree.
    assert json.loads((run / "recipe.json").read_text())["train"]["steps"] == 3
    assert json.loads((run / "summary.json").read_text())["steps"] == 3


def test_the_python_api_extends_a_run_as_the_cli_does(two_steps, tmp_path):
    from reasonrl import train
    from reasonrl.params import ConfigError

    run = _copy(two_steps[1], tmp_path)
    with pytest.raises(ConfigError, match="on --resume only train.steps may be set"):
        train(None, run, resume=True, overrides=["optim.lr=1e-3"], log=lambda _: None)
    summary = train(None, run, resume=True, overrides=["train.steps=3"], log=lambda _: None)
    assert summary["steps"] == 3 and json.loads((run / "recipe.json").read_text())["train"]["steps"] == 3


def test_resume_refuses_any_other_key_and_fewer_steps_than_done(two_steps, tmp_path, capsys):
    run = _copy(two_steps[1], tmp_path)
    before = (run / "recipe.json").read_text()
    assert main(["train", "--resume", str(run), "--set", "train.steps=3", "--set", "optim.lr=1e-3"]) == 2
    err = capsys.readouterr().err
    assert "--set optim.lr: a resumed run keeps its recipe; on --resume only train.steps may be set" in err
    assert main(["train", "--resume", str(run), "--set", "train.steps=1"]) == 2
    err = capsys.readouterr().err
    assert "--set train.steps=1: the run has done 2 steps" in err and "train.steps must be at least 2" in err
    assert (run / "recipe.json").read_text() == before  # nothing refused was written
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000001", "step_000002"]


def _interrupt_at(monkeypatch, step: int) -> None:
    original = Trainer.train_step

    def interrupted(self, s):
        if s == step:
            raise KeyboardInterrupt
        return original(self, s)

    monkeypatch.setattr(Trainer, "train_step", interrupted)


def test_ctrl_c_before_the_first_checkpoint_says_there_is_nothing_to_resume(two_steps, tmp_path, monkeypatch, capsys):
    _interrupt_at(monkeypatch, 0)
    run = tmp_path / "fresh"
    assert main(["train", str(two_steps[0]), "-o", str(run)]) == 130
    err = capsys.readouterr().err
    assert f"reasonrl: interrupted; nothing to resume yet: {run} has no checkpoint" in err
    assert "--resume" not in err


def test_ctrl_c_after_a_checkpoint_names_the_real_run_folder(two_steps, tmp_path, monkeypatch, capsys):
    run = _copy(two_steps[1], tmp_path)
    _interrupt_at(monkeypatch, 2)  # resumed at step 2, run to 4, stopped in the step after the checkpoint
    assert main(["train", "--resume", str(run), "--set", "train.steps=4"]) == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (f"reasonrl: interrupted; the last checkpoint is step_000002: "
                                            f"resume with reasonrl train --resume {run}")
