"""The quickstart prints its before/after table and ends by writing the HTML report."""

import json

from reasonrl.quickstart import quickstart

from helpers import MINI_TINY


def test_quickstart_writes_table_and_report(tmp_path, capsys):
    overrides = [f"model.tiny.{k}={v}" for k, v in MINI_TINY.items()]
    overrides += ["train.steps=2", "train.prompts_per_step=4", "eval.size=8", "log.progress=false"]
    summary = quickstart(seed=3, output=str(tmp_path), overrides=overrides)
    out = capsys.readouterr().out
    assert "held-out greedy" in out and "before" in out and "after" in out
    report = tmp_path / "seed3" / "report.html"
    assert f"report: {report}" in out
    page = report.read_text()
    assert "reasonrl quickstart (seed 3)" in page and "id='rrl-plots'" in page and '"name":"reward"' in page
    assert summary["steps"] == 2
    # recipes/grpo.yaml with rows without advantage left out of the learner (the same update)
    assert json.loads((tmp_path / "seed3" / "recipe.json").read_text())["train"]["skip_zero_advantage"] is True
