"""SURGE's choices without the test set: the validation split disjoint from the test split, the
anchor / donor / cell choices by hand, and the sweep's per-arm folders read by ``reasonrl report
--baseline``."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from reasonrl.evaluate.report import stats_path, write_report
from reasonrl.methods.surge.select import Scored, choose_anchor, choose_cell, choose_donor, split_eval_problems
from reasonrl.problem import Problem
from reasonrl.tasks.arithmetic import ArithmeticTask

ROOT = Path(__file__).resolve().parents[1]


def test_validation_is_disjoint_from_test_and_test_is_what_training_scores():
    task = ArithmeticTask()
    validation, test = split_eval_problems(task, 200, 150)
    assert [p.prompt for p in test] == [p.prompt for p in task.eval_problems(200)]  # `eval.size: 200`'s problems
    assert [p.prompt for p in validation] == [p.prompt for p in task.eval_problems(350)[200:]]
    assert len(validation) == 150 and not {p.prompt for p in validation} & {p.prompt for p in test}
    train = {p.prompt for step in range(20) for p in task.train_problems(step, 64, 0)}
    assert not train & {p.prompt for p in validation}  # held-out: never a training prompt
    with pytest.raises(ValueError, match="lower --val-size"):
        split_eval_problems(task, 200, 10 ** 6)
    with pytest.raises(ValueError, match="val_size >= 1"):
        split_eval_problems(task, 200, 0)

    class Repeats:  # a task whose held-out list repeats a problem across the boundary
        def eval_problems(self, count):
            return [Problem(prompt=f"q{i % 3}", answer="0") for i in range(count)]

    with pytest.raises(ValueError, match="in both the test and the validation split"):
        split_eval_problems(Repeats(), 3, 3)

    class Shuffles:  # a task whose eval_problems(n) is not a prefix of eval_problems(n + m)
        def eval_problems(self, count):
            return [Problem(prompt=f"q{count}-{i}", answer="0") for i in range(count)]

    with pytest.raises(ValueError, match="not in a fixed order"):
        split_eval_problems(Shuffles(), 3, 3)


CKPTS = [Scored("ckpt20", greedy=0.70, length=23.1, avg=0.60, step=20),
         Scored("ckpt40", greedy=0.80, length=23.4, avg=0.70, step=40),
         Scored("ckpt60", greedy=0.80, length=23.5, avg=0.72, step=60),
         Scored("ckpt80", greedy=0.78, length=23.0, avg=0.71, step=80),
         Scored("ckpt100", greedy=0.79, length=23.0, avg=0.70, step=100)]


def test_anchor_donor_and_cell_by_hand():
    anchor = choose_anchor(CKPTS)
    assert anchor.name == "ckpt60"  # 0.80 twice: the later step
    # Shorter than 23.5: ckpt20 (23.1), ckpt40 (23.4), ckpt80 and ckpt100 (23.0, tied): the tie goes
    # to the more accurate ckpt100 (0.79 > 0.78).
    assert choose_donor(CKPTS, anchor).name == "ckpt100"
    tied = [Scored("a", 0.5, 20.0, step=10), Scored("b", 0.5, 20.0, step=30), Scored("anchor", 0.9, 25.0, step=50)]
    assert choose_donor(tied, tied[2]).name == "b"  # equal length and accuracy: the later
    assert choose_donor(CKPTS, CKPTS[1]).name == "ckpt100"  # below ckpt40's 23.4: 23.1, 23.0, 23.0
    with pytest.raises(ValueError, match="no checkpoint of the run answers shorter than the anchor ckpt20"):
        choose_donor(CKPTS[:1] + [Scored("x", 0.9, 24.0)], CKPTS[0])
    with pytest.raises(ValueError, match="no candidate"):
        choose_anchor([])
    cells = [Scored("r0.5_g0.5", 0.86, 23.3, 0.75), Scored("r0.5_g1", 0.86, 23.3, 0.76),
             Scored("r0.9_g0.5", 0.86, 23.3, 0.76), Scored("r0.7_g1", 0.84, 23.3, 0.80)]
    assert choose_cell(cells).name == "r0.5_g1"  # best greedy, then avg@n, then sweep order
    with pytest.raises(ValueError, match="no fused models"):
        choose_cell([])


def _sweep_module():
    spec = importlib.util.spec_from_file_location("surge_sweep", ROOT / "benchmarks" / "surge_sweep.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _numbers(greedy: list[float], length: float) -> dict:
    return {"greedy": sum(greedy) / len(greedy), "greedy_ci": [0.0, 1.0], "avg": sum(greedy) / len(greedy) / 2,
            "length": length, "per_problem_greedy": greedy, "per_problem_avg": [g / 2 for g in greedy]}


def test_the_per_arm_folders_make_a_report_against_the_anchor(tmp_path):
    sweep = _sweep_module()
    folders = []
    for seed, (anchor, surge) in enumerate([([1, 0, 1, 0], [1, 1, 1, 0]), ([1, 0, 0, 0], [1, 1, 0, 0]),
                                            ([0, 1, 1, 0], [1, 1, 1, 1])], start=1):
        report = {"n": 2, "chosen": f"r0.5_g{seed}", "controls": ["random"], "anchor": "A", "donor": "D",
                  "rows": [{"model": "anchor", "path": "A", "test": _numbers(anchor, 23.0)},
                           {"model": "donor", "path": "D", "test": _numbers(anchor, 22.0)},
                           {"model": "r0.9_g1", "path": "F0", "test": _numbers(surge, 22.5)},  # not chosen: no folder
                           {"model": f"r0.5_g{seed}", "path": "F", "test": _numbers(surge, 22.5)},
                           {"model": f"r0.5_g{seed}_random", "path": "R", "test": _numbers(anchor, 22.5)}]}
        folders += sweep.write_report_runs(report, tmp_path / f"seed{seed}", seed)
    assert sorted({f.name.rsplit("-", 1)[0] for f in folders}) == ["anchor", "donor", "surge", "surge_random"]
    summary = json.loads((tmp_path / "seed2" / "report" / "surge-s2" / "summary.json").read_text())
    assert summary["final_eval"]["accuracy"] == 0.5 and summary["surge"]["chosen_cell"] == "r0.5_g2"
    out = tmp_path / "surge.html"
    write_report(folders, out, baseline="anchor", bootstrap=200)
    rows = json.loads(stats_path(out).read_text())
    rows = rows["rows"] if isinstance(rows, dict) else rows
    surge = next(r for r in rows if r["group"] == "surge" and r["metric"] == "accuracy")
    # The three seeds chose different cells and still form one group: anchor 0.5, 0.25, 0.5; surge 0.75, 0.5, 1.
    assert surge["n_runs"] == 3 and surge["baseline"] == "anchor" and surge["resampled"] == "seeds+problems"
    assert surge["diff"] == pytest.approx((0.75 + 0.5 + 1.0) / 3 - (0.5 + 0.25 + 0.5) / 3)
