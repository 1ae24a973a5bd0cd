"""``samples.jsonl``: what the model wrote, per step and evaluation (reasonrl.train.samples)."""

import json

import pytest
import torch

from reasonrl.batch import RolloutBatch
from reasonrl.metrics_log import read_metrics
from reasonrl.train.samples import SAMPLES_FILE, stop_reasons
from reasonrl.train.trainer import Trainer

from helpers import comparable, crash_at_step, mini_recipe

EMBEDDED = {"backend": "tiny", "tiny": {}}  # the shipped model: base accuracy ~0.5, so groups disagree


def recipe(**log):
    return mini_recipe(model=EMBEDDED, rewards=[{"name": "exact_answer"}, {"name": "format", "weight": 0.5}],
                       eval={"size": 12, "every": 2, "reward": "exact_answer"},
                       log={"plots": False, "progress": False, "samples_per_step": 8, "samples_eval": 5, **log})


def rows(run):
    return [json.loads(line) for line in (run / SAMPLES_FILE).read_text().splitlines()]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("samples") / "run"
    Trainer(recipe(), path, log=lambda _: None).run()
    return path


def test_train_rows_are_whole_groups_with_their_terms_and_advantages(run):
    train = [r for r in rows(run) if r["split"] == "train"]
    assert sorted({r["step"] for r in train}) == [1, 2, 3, 4]  # numbered as metrics.jsonl's rows
    g = 4  # mini_recipe's rollout.num_generations
    for step in range(1, 5):
        at = [r for r in train if r["step"] == step]
        assert len(at) == 8  # two whole groups of 4
        groups = {}
        for r in at:
            groups.setdefault(r["group"], []).append(r)
        assert all(len(v) == g for v in groups.values())
        for members in groups.values():
            assert len({m["prompt"] for m in members}) == 1
            for m in members:
                # the scalar reward is the weighted sum of the written terms
                assert m["reward"] == pytest.approx(m["rewards"]["exact_answer"] + 0.5 * m["rewards"]["format"], abs=1e-6)
                assert m["correct"] == (m["rewards"]["exact_answer"] == 1.0)
                assert m["stop_reason"] in {"eos", "stop", "length"}
                assert m["length"] >= 1 and isinstance(m["completion"], str)
            # GRPO, scale group: (r - mean) / (std + 1e-6), std unbiased, on every token alike
            rewards = torch.tensor([m["reward"] for m in members])
            expected = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
            got = torch.tensor([m["advantage"] for m in members])
            assert torch.allclose(got, expected, atol=1e-4), (got, expected)
    # rewards moved within some group: the advantages checked above are not all zero
    assert any(abs(r["advantage"]) > 0.1 for r in train)


def test_eval_rows_are_the_same_prompts_at_every_evaluation(run):
    evals = [r for r in rows(run) if r["split"] == "eval"]
    assert sorted({r["step"] for r in evals}) == [0, 2, 4]  # base, every 2 steps, final
    by_step = {s: [r for r in evals if r["step"] == s] for s in (0, 2, 4)}
    assert all(len(v) == 5 for v in by_step.values())
    assert [r["prompt"] for r in by_step[0]] == [r["prompt"] for r in by_step[4]]
    assert [r.get("final", False) for r in by_step[4]] == [True] * 5
    summary = json.loads((run / "summary.json").read_text())
    assert [float(r["correct"]) for r in by_step[0]] == summary["base_eval_per_problem"]["accuracy"][:5]
    assert [float(r["correct"]) for r in by_step[4]] == summary["final_eval_per_problem"]["accuracy"][:5]


def test_samples_leave_every_number_of_the_run_unchanged(tmp_path, run):
    Trainer(recipe(samples_per_step=0, samples_eval=0), tmp_path / "off", log=lambda _: None).run()
    assert not (tmp_path / "off" / SAMPLES_FILE).exists()
    assert comparable(read_metrics(tmp_path / "off")) == comparable(read_metrics(run))


def test_resume_after_a_crash_writes_the_same_samples(tmp_path, monkeypatch, run):
    with crash_at_step(monkeypatch, 3):  # checkpoint at step 2; step 3's rows are written again
        Trainer(recipe(), tmp_path / "b", log=lambda _: None).run()
    Trainer(recipe(), tmp_path / "b", resume=True, log=lambda _: None).run()
    assert rows(tmp_path / "b") == rows(run)


def test_the_file_stops_at_its_size_limit(tmp_path, capsys):
    small = recipe(samples_max_mb=0.003)
    small.train.steps, small.eval.size = 2, 0
    Trainer(small, tmp_path / "r", log=lambda _: None).run()
    size = (tmp_path / "r" / SAMPLES_FILE).stat().st_size
    assert 0 < size <= 0.003 * 2**20
    assert "reached log.samples_max_mb=0.003" in capsys.readouterr().err


def test_stop_reasons_by_hand():
    eos = 9
    batch = RolloutBatch(
        prompt_ids=torch.ones(3, 2, dtype=torch.long), prompt_mask=torch.ones(3, 2, dtype=torch.long),
        completion_ids=torch.tensor([[4, eos, 0], [4, 5, 6], [4, 5, 0]]),
        completion_mask=torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 0]]),
        group_ids=torch.zeros(3, dtype=torch.long), rewards=torch.zeros(3),
        truncated=torch.tensor([False, True, False]))
    assert stop_reasons(batch, eos) == ["eos", "length", "stop"]
