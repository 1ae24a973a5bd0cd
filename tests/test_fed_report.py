"""`reasonrl report` on federations' run folders (docs/methods/fed_grpo.md, Output): two tiny
real federations (2 clients x 2 rounds, Flower's simulation) — Fed-GRPO and top-k FedAvg —
are read as runs whose final evaluation is the global model's held-out evaluation after the
last round and whose curve is the rounds' evaluations; `--baseline` compares them. A folder
written before the server wrote `final_eval` is read from its metrics.jsonl."""

import json
import math
import shutil
from pathlib import Path

import pytest

from reasonrl.config import recipe_from_dict

from test_fed_grpo import _fed_recipe

pytest.importorskip("flwr")
ROOT = Path(__file__).resolve().parents[1]


def _federation(recipe_file, out):
    from reasonrl.methods.fed_grpo.apps import simulate

    raw = _fed_recipe(ROOT / "recipes" / recipe_file, out.parent).to_dict()
    raw["methods"][0].update(clients=2, min_clients=2,
                             split={"key": "form", "dominant": 0.8, "groups": [["a+b*c", "c*b+a"],
                                                                               ["(a+b)*c", "c*(a+b)"]]})
    simulate(recipe_from_dict(raw, "test"), out)
    return out


@pytest.fixture(scope="module")
def federations(tmp_path_factory):
    root = tmp_path_factory.mktemp("fed_report")
    try:
        yield (_federation("fed_grpo.yaml", root / "fed_grpo_s0"),
               _federation("fed_avg_topk.yaml", root / "fed_avg_topk_s0"))
    finally:
        ray = pytest.importorskip("ray")
        ray.shutdown()


def test_report_reads_a_federation_as_a_run(federations, tmp_path):
    from reasonrl.evaluate.report import stats_path, write_report
    from reasonrl.evaluate.runs import group_runs, load_run

    grpo_dir, avg_dir = federations
    rows = [json.loads(x) for x in (grpo_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]  # one row per round, round 0 the initial model
    run = load_run(grpo_dir)
    assert run.warnings == [] and run.last_step == 2
    final = run.summary["final_eval"]
    assert final == {k[len("eval/"):]: v for k, v in rows[-1].items() if k.startswith("eval/")}
    assert run.summary["base_eval"] == {k[len("eval/"):]: v for k, v in rows[0].items() if k.startswith("eval/")}
    per_problem = run.summary["final_eval_per_problem"]["accuracy"]
    assert len(per_problem) == 8 and math.fsum(per_problem) / 8 == pytest.approx(final["accuracy"])
    low, high = run.summary["final_eval_ci"]["accuracy"]
    assert low <= final["accuracy"] <= high
    assert [name for name, _ in group_runs([run, load_run(avg_dir)])] == ["fed_grpo", "fed_avg_topk"]

    out = write_report([grpo_dir, avg_dir], tmp_path / "fed.html", baseline="fed_avg_topk", bootstrap=200)
    stats = json.loads(stats_path(out).read_text())
    row = next(r for r in stats if r["metric"] == "accuracy")
    base = load_run(avg_dir).summary["final_eval"]["accuracy"]
    assert row["group"] == "fed_grpo" and row["n_runs"] == 1 and row["n_baseline_runs"] == 1
    assert row["mean"] == pytest.approx(final["accuracy"]) and row["diff"] == pytest.approx(final["accuracy"] - base)
    assert row["resampled"] == "seeds+problems"
    # a zero-width interval (every problem of both runs alike) is n/a with its reason, never [d, d]
    assert row["ci_low"] <= row["diff"] <= row["ci_high"] if row["ci_low"] is not None else "no spread" in row["ci_note"]
    page = out.read_text()
    assert "no finite final" not in page and "accuracy.png" in " ".join(p.name for p in (tmp_path / "fed_files").iterdir())


def test_report_reads_a_federation_folder_without_final_eval(federations, tmp_path):
    """The summary a federation's server wrote before (no final_eval): the last logged round."""
    from reasonrl.evaluate.runs import load_run

    grpo_dir, _ = federations
    old = tmp_path / "fed_grpo_s1"
    shutil.copytree(grpo_dir, old)
    summary = json.loads((old / "summary.json").read_text())
    legacy = {k: summary[k] for k in ("run_dir", "rounds", "clients", "base_accuracy", "final_accuracy",
                                       "accuracy_by_round", "bytes_by_round")}
    (old / "summary.json").write_text(json.dumps(legacy))
    run = load_run(old)
    assert run.summary["final_eval"] == summary["final_eval"] and run.summary["base_eval"] == summary["base_eval"]
    assert len(run.warnings) == 1 and "the last one in metrics.jsonl (step 2)" in run.warnings[0]
