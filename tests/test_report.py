"""``reasonrl report``: two tiny runs produced here, a crashed run, seed groups."""

import json
import re
import shutil

import pytest

from reasonrl.cli import main
from reasonrl.config import flatten
from reasonrl.evaluate.report import write_report
from reasonrl.evaluate.runs import differing_keys, group_runs, load_run
from reasonrl.train.trainer import Trainer

from helpers import mini_recipe


def _train(path, **sections):
    Trainer(mini_recipe(**sections), path, log=lambda _: None).run()
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    grpo = _train(root / "grpo-s0", eval={"size": 8, "every": 2})
    rloo = _train(root / "rloo-s0", advantage={"name": "rloo"}, loss={"kl": {"coef": 0.05}},
                  eval={"size": 8, "every": 2})
    return root, grpo, rloo


def _images(page: str) -> dict[str, str]:
    return dict(re.findall(r"<img alt='([^']+)' src='(data:image/png;base64,[A-Za-z0-9+/=]+)'>", page))


def test_report_of_two_runs_has_both_names_every_plot_and_the_recipe_diff(runs, tmp_path, capsys):
    _, grpo, rloo = runs
    out = tmp_path / "cmp.html"
    assert main(["report", str(grpo), str(rloo), "-o", str(out)]) == 0
    page = out.read_text()
    assert "grpo-s0" in page and "rloo-s0" in page
    images = _images(page)
    # every standard panel is logged by the rloo run (kl because its coef > 0), embedded and written as a PNG
    for panel in ("reward", "accuracy", "entropy", "kl", "response_length", "clip_fraction", "sampling_throughput",
                  "training_throughput"):
        assert panel in images and len(images[panel]) > 2000
        assert (tmp_path / "cmp_files" / f"{panel}.png").stat().st_size > 1000
    assert "http://" not in page and "https://" not in page  # opens offline
    # the recipe diff names the keys that differ, highlighted
    assert re.search(r"<tr class='changed'><td><code>advantage.name</code></td><td>grpo</td><td>rloo</td>", page)
    assert "loss.kl.coef" in page
    # the final table carries each run's final accuracy with its interval
    final = json.loads((rloo / "summary.json").read_text())
    low, high = final["final_eval_ci"]["accuracy"]
    assert low <= final["final_eval"]["accuracy"] <= high
    assert f"{final['final_eval']['accuracy']:.3f} <small>[{low:.3f}, {high:.3f}]</small>" in page
    assert "Warnings" not in page


def test_single_run_report(runs, tmp_path):
    _, grpo, _ = runs
    out = write_report([grpo], tmp_path / "one.html")
    page = out.read_text()
    assert "grpo-s0" in page and "kl" not in _images(page)  # kl was never logged: no empty panel
    assert "Full recipe of grpo-s0" in page


def test_crashed_run_still_reports_with_a_warning(runs, tmp_path, capsys):
    _, grpo, _ = runs
    crashed = tmp_path / "crashed"
    shutil.copytree(grpo, crashed)
    (crashed / "summary.json").unlink()
    text = (crashed / "metrics.jsonl").read_text()
    (crashed / "metrics.jsonl").write_text(text[: len(text) - 40])  # the last row cut mid-write
    out = tmp_path / "crash.html"
    assert main(["report", str(crashed), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "malformed line" in err and "did not finish" in err
    page = out.read_text()
    assert "Warnings" in page and "did not finish" in page and "reward" in _images(page)
    rows = load_run(crashed).rows
    assert len(rows) == len(text.splitlines()) - 1


def test_not_a_run_folder_is_a_clear_error(tmp_path, capsys):
    assert main(["report", str(tmp_path), "-o", str(tmp_path / "x.html")]) == 2
    assert "not a run folder (no metrics.jsonl)" in capsys.readouterr().err


def test_seeds_of_one_recipe_form_a_group(tmp_path):
    def fake_run(name, seed, lr, threads=0):
        path = tmp_path / name
        path.mkdir()
        recipe = {"train": {"seed": seed, "steps": 2, "threads": threads}, "optim": {"lr": lr}, "run_name": None}
        (path / "recipe.json").write_text(json.dumps(recipe))
        (path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward/mean": s * lr}) + "\n"
                                                    for s in (1, 2)))
        (path / "summary.json").write_text(json.dumps({"final_eval": {"accuracy": 0.5 + seed / 10},
                                                       "wall_seconds": 1.0}))
        return path

    # a-s1 ran on one thread: that changes how fast it ran, not the experiment, so it stays in group a
    paths = [fake_run("a-s0", 0, 1.0), fake_run("a-s1", 1, 1.0, threads=1), fake_run("b-s0", 0, 2.0)]
    runs = [load_run(p) for p in paths]
    groups = group_runs(runs)
    assert [(name, [r.label for r in members]) for name, members in groups] == [("a", ["a-s0", "a-s1"]),
                                                                                  ("b", ["b-s0"])]
    assert differing_keys(runs) == ["optim.lr", "train.seed", "train.threads"]
    page = write_report(paths, tmp_path / "r.html").read_text()
    # group a: accuracies 0.5 and 0.6 → mean 0.55, sample sd 0.0707
    assert "0.550 ± 0.071" in page
    # the seed differs but is not highlighted; the learning rate is
    assert "<tr class='changed'><td><code>optim.lr</code>" in page
    assert "<tr><td><code>train.seed</code>" in page


def test_flatten():
    assert flatten({"a": {"b": 1, "c": {"d": [1, 2]}}, "e": {}}) == {"a.b": 1, "a.c.d": [1, 2], "e": {}}


def test_a_run_from_before_a_new_key_groups_with_its_seeds_run_after_it(tmp_path):
    from reasonrl.config import recipe_from_dict

    new = recipe_from_dict({"train": {"seed": 2}}).to_dict()  # has rollout.source etc. at their defaults
    old = recipe_from_dict({"train": {"seed": 1}}).to_dict()
    del old["rollout"]["source"], old["rollout"]["max_staleness"], old["off_policy"]  # written before they existed
    for name, recipe in (("m-s1", old), ("m-s2", new)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "recipe.json").write_text(json.dumps(recipe))
        (tmp_path / name / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    runs = [load_run(tmp_path / n) for n in ("m-s1", "m-s2")]
    assert [(name, len(members)) for name, members in group_runs(runs)] == [("m", 2)]
    assert differing_keys(runs) == ["train.seed"]
