"""``reasonrl report``: two tiny runs produced here, a crashed run, seed groups, how groups are
named (by recipe, not by timestamped folder), the one number format, reward-term curves."""

import html
import json
import re
import shutil

import pytest

from reasonrl.cli import main
from reasonrl.config import flatten
from reasonrl.evaluate.plots import MAX_POINTS, Series, ema, panel_series, smoothing
from reasonrl.evaluate.report import stats_path, write_report
from reasonrl.evaluate.runs import differing_keys, group_runs, load_run, number_text, signed_text
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


def _data(page: str) -> dict:
    """The JSON the page's script draws from."""
    found = re.search(r"<script type='application/json' id='rrl-data'>(.*?)</script>", page, re.S)
    assert found, "no page data"
    return json.loads(found.group(1))


def _panels(page: str) -> dict[str, dict]:
    return {p["name"]: p for p in _data(page)["panels"]}


def _offline(page: str) -> bool:
    """Nothing the page loads comes from elsewhere: no remote src/href, no CSS import or url()."""
    return not re.search(r"""(src|href)\s*=\s*['"]?(https?:)?//""", page) and "@import" not in page \
        and "url(http" not in page and "<link" not in page and "<img" not in page


def test_report_of_two_runs_has_both_names_every_plot_and_the_recipe_diff(runs, tmp_path, capsys):
    _, grpo, rloo = runs
    out = tmp_path / "cmp.html"
    assert main(["report", str(grpo), str(rloo), "-o", str(out)]) == 0
    page = out.read_text()
    assert "grpo-s0" in page and "rloo-s0" in page
    panels = _panels(page)
    # every standard panel is logged by the rloo run (kl because its coef > 0): drawn in the page from its
    # data, and written as a PNG beside it
    runs_of = {p: {s["run"] for s in panels[p]["series"]} for p in panels}
    for panel in ("reward", "accuracy", "entropy", "kl", "response_length", "clip_fraction", "sampling_throughput",
                  "training_throughput"):
        assert 1 in runs_of[panel] and (panel == "kl" or runs_of[panel] == {0, 1})
        assert (tmp_path / "cmp_files" / f"{panel}.png").stat().st_size > 1000
    # the page's curve is the metrics.jsonl one: every step's value (6 significant digits)
    (reward,) = [s for s in panels["reward"]["series"] if s["run"] == 1]
    logged = [(r["step"], r["reward/mean"]) for r in load_run(rloo).rows if "reward/mean" in r]
    assert reward["x"] == [step for step, _ in logged]
    assert reward["y"] == pytest.approx([value for _, value in logged], rel=1e-5)
    # one panel per reward term, after the total reward
    names = list(panels)
    assert names[names.index("reward") + 1] == "reward_term_exact_answer"
    assert panels["reward_term_exact_answer"]["keys"] == ["reward/exact_answer"]
    assert [r["label"] for r in _data(page)["runs"]] == ["grpo-s0", "rloo-s0"]
    assert _offline(page)
    # the recipe diff names the keys that differ, highlighted
    assert re.search(r"<tr class='changed'><td><code>advantage.name</code></td><td>grpo</td><td>rloo</td>", page)
    assert "loss.kl.coef" in page
    # the final table carries each run's final accuracy with its interval
    final = json.loads((rloo / "summary.json").read_text())
    low, high = final["final_eval_ci"]["accuracy"]
    assert low <= final["final_eval"]["accuracy"] <= high
    acc = final["final_eval"]["accuracy"]
    assert f"{number_text(acc)} <small>[{number_text(low)}, {number_text(high)}]</small>" in page
    assert "Warnings" not in page


def test_single_run_report(runs, tmp_path):
    _, grpo, _ = runs
    out = write_report([grpo], tmp_path / "one.html")
    page = out.read_text()
    assert "grpo-s0" in page and "kl" not in _panels(page)  # kl was never logged: no empty panel
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
    assert "Warnings" in page and "did not finish" in page and "reward" in _panels(page)
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
    assert "0.55 ± 0.0707" in page
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


def test_one_number_format_by_magnitude():
    cases = [(3e-4, "3e-4"), (1e-4, "1e-4"), (2.5e-5, "2.5e-5"), (-2.5e-5, "-2.5e-5"), (0.001, "0.001"),
             (0.00099999, "1e-3"), (0.0707107, "0.0707"), (0.55, "0.55"), (0.5, "0.5"), (0.1 + 0.2, "0.3"),
             (12.345, "12.3"), (1.234, "1.23"), (400.0, "400"), (1234.6, "1235"), (999999.0, "999999"), (1e6, "1e6"),
             (1.5e7, "1.5e7"), (-0.053, "-0.053"), (0.0, "0"), (-0.0, "0"), (7, "7"), (10**7, "10000000"),
             (float("nan"), "nan"), (float("-inf"), "-inf")]
    for value, text in cases:
        assert number_text(value) == text, value
    assert [signed_text(v) for v in (0.21, -0.0333, 0.0, 3e-4)] == ["+0.21", "-0.0333", "0", "+3e-4"]
    # rounding error of numbers of size 0.2 is 0, a genuinely small number is not
    assert signed_text(-2.78e-17, scale=0.2) == "0" and number_text(1e-14) == "1e-14"


def _fake_run(root, name, recipe, rows=None, final=None, seed=0):
    path = root / name
    path.mkdir(parents=True)
    recipe = {"run_name": None, **recipe, "train": {"seed": seed, "steps": 2, **recipe.get("train", {})}}
    (path / "recipe.json").write_text(json.dumps(recipe))
    rows = rows or [{"step": s, "reward/mean": 0.1 * s} for s in (1, 2)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "summary.json").write_text(json.dumps({"final_eval": {"accuracy": 0.5 if final is None else final},
                                                   "wall_seconds": 1.0}))
    return path


def test_the_recipe_diff_tells_learning_rates_apart(tmp_path):
    paths = [_fake_run(tmp_path, "a", {"optim": {"lr": 3e-4}}), _fake_run(tmp_path, "b", {"optim": {"lr": 1e-4}})]
    page = write_report(paths, tmp_path / "r.html").read_text()
    assert "<tr class='changed'><td><code>optim.lr</code></td><td>3e-4</td><td>1e-4</td></tr>" in page


def test_groups_are_named_by_recipe_not_by_the_timestamped_folder(tmp_path, capsys):
    """`reasonrl train recipes/grpo.yaml` writes runs/grpo-<time>: the group is grpo, so --baseline grpo works."""
    grpo = {"advantage": {"name": "grpo"}}
    dropout = {"advantage": {"name": "grpo_dropout"}}
    paths = [_fake_run(tmp_path, "grpo-20261204-172002", grpo, final=0.5, seed=0),
             _fake_run(tmp_path, "grpo-20261204-172029", grpo, final=0.6, seed=1),
             _fake_run(tmp_path, "grpo_dropout-20261204-172119", dropout, final=0.7)]
    runs = [load_run(p) for p in paths]
    assert [(name, len(m)) for name, m in group_runs(runs)] == [("grpo", 2), ("grpo_dropout", 1)]
    out = tmp_path / "out" / "r.html"
    assert main(["report", *map(str, paths), "-o", str(out), "--baseline", "grpo"]) == 0
    rows = json.loads(stats_path(out).read_text())
    assert [(r["group"], r["baseline"], r["n_baseline_runs"]) for r in rows] == [("grpo_dropout", "grpo", 2)]
    # what worked before still works: a run's folder name picks its group
    for old in ("grpo-20261204-172029", "grpo_dropout-20261204-172119"):
        assert main(["report", *map(str, paths), "-o", str(out), "--baseline", old]) == 0
    assert json.loads(stats_path(out).read_text())[0]["baseline"] == "grpo_dropout"
    capsys.readouterr()


def test_run_name_then_shared_folder_stem_name_a_group(tmp_path):
    named = [_fake_run(tmp_path, "x-1", {"run_name": "mine", "optim": {"lr": 1.0}}, seed=0),
             _fake_run(tmp_path, "y-2", {"run_name": "mine", "optim": {"lr": 1.0}}, seed=1)]
    by_hand = [_fake_run(tmp_path, "grpo-a", {"optim": {"lr": 2.0}}, seed=0),   # reasonrl train ... -o grpo-a
               _fake_run(tmp_path, "grpo-b", {"optim": {"lr": 2.0}}, seed=1)]
    seeds = [_fake_run(tmp_path, "dapo_seed3", {"optim": {"lr": 3.0}}, seed=3),
             _fake_run(tmp_path, "dapo_seed4", {"optim": {"lr": 3.0}}, seed=4)]
    unrelated = [_fake_run(tmp_path, "ab-1", {"optim": {"lr": 4.0}}, seed=0),
                 _fake_run(tmp_path, "cd-1", {"optim": {"lr": 4.0}}, seed=1)]
    groups = group_runs([load_run(p) for p in named + by_hand + seeds + unrelated])
    assert [name for name, _ in groups] == ["mine", "grpo", "dapo", "ab-1"]


def test_two_recipes_under_one_name_are_told_apart_with_a_warning(tmp_path):
    paths = [_fake_run(tmp_path, "first", {"run_name": "same", "optim": {"lr": 1.0}}),
             _fake_run(tmp_path, "second", {"run_name": "same", "optim": {"lr": 2.0}})]
    warnings = []
    groups = group_runs([load_run(p) for p in paths], warn=warnings.append)
    assert [name for name, _ in groups] == ["first", "second"]
    assert len(warnings) == 1 and "2 groups of different recipes would be called 'same'" in warnings[0]


def test_runs_of_a_group_that_share_a_seed_are_warned_about(tmp_path, capsys):
    paths = [_fake_run(tmp_path, f"grpo-2026120{i}-120000", {}, seed=s) for i, s in enumerate((0, 0, 1))]
    out = tmp_path / "r.html"
    assert main(["report", *map(str, paths), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    message = "group 'grpo': 2 runs share train.seed 0 (grpo-20261200-120000, grpo-20261201-120000)"
    assert message in err
    page = out.read_text()
    assert "Warnings" in page and html.escape(message) in page
    # distinct seeds: no warning
    assert main(["report", str(paths[0]), str(paths[2]), "-o", str(out)]) == 0
    assert "share train.seed" not in capsys.readouterr().err


def test_one_panel_per_reward_term(tmp_path):
    rows = [{"step": s, "reward/mean": 0.5 * s, "reward/std": 0.1, "reward/format": 1.0, "reward/exact": 0.25 * s}
            for s in (1, 2, 3)]
    path = _fake_run(tmp_path, "two-terms", {}, rows=rows)
    panels = _panels(write_report([path], tmp_path / "r.html").read_text())
    assert [n for n in panels if n.startswith("reward")] == ["reward", "reward_term_exact", "reward_term_format"]
    (exact,) = panels["reward_term_exact"]["series"]
    assert (exact["x"], exact["y"], exact["s"]) == ([1, 2, 3], [0.25, 0.5, 0.75], None)  # 3 points: drawn as they are
    assert (tmp_path / "r_files" / "reward_term_format.png").is_file()


def test_the_page_thins_long_curves_and_leaves_out_non_finite_values():
    rows = [{"step": s, "m": float(s)} for s in range(1, 3001)] + [{"step": 3001, "m": float("nan")}]
    (curve,) = panel_series(["m"], [Series("r", rows)])
    assert len(curve["x"]) == len(curve["y"]) == len(curve["s"]) == MAX_POINTS
    assert (curve["x"][0], curve["x"][-1]) == (1, 3000) and curve["y"] == [float(x) for x in curve["x"]]
    # the average is taken over every point, then thinned: its last value is the full curve's
    assert curve["s"][-1] == pytest.approx(ema([float(s) for s in range(1, 3001)], smoothing(3000))[-1], rel=1e-5)
    assert panel_series(["absent"], [Series("r", rows)]) == []
