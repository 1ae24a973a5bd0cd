import json

import pytest
import torch

from reasonrl.config import ConfigError
from reasonrl.registry import TASKS
from reasonrl.metrics_log import read_metrics
from reasonrl.train.trainer import Trainer

from helpers import comparable, crash_at_step, mini_recipe, run_cli, weights


def test_resume_reproduces_an_uninterrupted_run(tmp_path, monkeypatch):
    recipe = mini_recipe(loss={"kl": {"coef": 0.05}}, train={"num_iterations": 2})
    straight = Trainer(recipe, tmp_path / "a", log=lambda m: None).run()

    with crash_at_step(monkeypatch, 2):
        Trainer(recipe, tmp_path / "b", log=lambda m: None).run()
    resumed = Trainer(recipe, tmp_path / "b", resume=True, log=lambda m: None).run()

    assert comparable(read_metrics(tmp_path / "a")) == comparable(read_metrics(tmp_path / "b"))
    wa, wb = weights(tmp_path / "a"), weights(tmp_path / "b")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert straight["final_accuracy"] == resumed["final_accuracy"]
    assert resumed["base_accuracy"] == straight["base_accuracy"]


def test_run_folder_contents_and_metrics(tmp_path):
    # The untrained mini model earns no reward; the entropy bonus is what moves it away from the reference.
    recipe = mini_recipe(log={"plots": True}, loss={"kl": {"coef": 0.1, "estimator": "k3"}, "entropy_coef": 0.05})
    summary = Trainer(recipe, tmp_path / "r", log=lambda m: None).run()
    run = tmp_path / "r"
    for name in ("metrics.jsonl", "summary.json", "recipe.json", "final_model/config.json"):
        assert (run / name).exists(), name
    for plot in ("reward", "accuracy", "entropy", "kl", "response_length"):
        assert (run / "plots" / f"{plot}.png").stat().st_size > 1000
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000002", "step_000004"]
    on_disk = json.loads((run / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary))
    assert 0 <= summary["base_accuracy"] <= 1 and 0 <= summary["final_accuracy"] <= 1
    assert summary["wall_seconds"] > 0
    rows = read_metrics(run)
    train_rows = [r for r in rows if "loss" in r]
    assert [r["step"] for r in train_rows] == [1, 2, 3, 4]
    for key in ("reward/mean", "reward/exact_answer", "entropy", "kl", "clip_fraction", "response_length/mean",
                "zero_variance_group_fraction", "perf/sample_tokens_per_s", "perf/train_tokens_per_s"):
        assert key in train_rows[0], key
    # With one optimisation pass π_old = π_θ, so no token can be clipped.
    assert all(r["clip_fraction"] == 0.0 for r in train_rows)
    assert train_rows[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # policy == reference before the first update
    assert train_rows[-1]["kl"] > 0


def test_reference_model_only_with_kl(tmp_path):
    t = Trainer(mini_recipe(), tmp_path / "x", log=lambda m: None)
    t._setup()
    assert t.ref_policy is None
    t = Trainer(mini_recipe(loss={"kl": {"coef": 0.1}}), tmp_path / "y", log=lambda m: None)
    t._setup()
    assert t.ref_policy is not None


def test_micro_batch_split_does_not_change_the_update(tmp_path):
    results = []
    for i, micro in enumerate((16, 3)):
        recipe = mini_recipe(train={"steps": 1, "micro_batch_size": micro}, eval={"size": 0},
                             loss={"agg": "seq-mean-token-mean", "entropy_coef": 0.1})
        Trainer(recipe, tmp_path / str(i), log=lambda m: None).run()
        results.append(weights(tmp_path / str(i)))
        assert read_metrics(tmp_path / str(i))[-1]["grad_norm"] > 0  # the update is not empty
    a, b = results
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=1e-5)


def test_dynamic_sampling_drops_uninformative_groups(tmp_path):
    recipe = mini_recipe(rollout={"dynamic_sampling": True, "max_sampling_rounds": 3},
                         rewards=[{"name": "format"}], train={"steps": 2}, eval={"size": 0},
                         optim={"lr": 1e-3, "warmup_steps": 0, "schedule": "linear"})
    trainer = Trainer(recipe, tmp_path / "d", log=lambda m: None)
    summary = trainer.run()
    rows = [r for r in read_metrics(tmp_path / "d") if r["step"] > 0]
    # An untrained model never writes a well-formed solution: every group is flat, so
    # every round is used and every step is skipped instead of training on zero advantages.
    assert all(r["sampling_rounds"] == 3 and r["zero_variance_group_fraction"] == 1.0 for r in rows)
    assert all(r.get("skipped") == 1 for r in rows)
    # A skipped step still advances the LR schedule: linear decay over 2 steps, 1e-3 then 5e-4.
    assert [r["lr"] for r in rows] == pytest.approx([1e-3, 5e-4])
    assert summary["steps"] == 2


@pytest.fixture
def empty_task():
    class Empty:
        name = "empty"

        def train_problems(self, step, count, seed):
            return []

        def eval_problems(self, count):
            return []

    TASKS._items["_empty"] = Empty
    yield
    del TASKS._items["_empty"]


def test_empty_task_is_a_clear_error_and_writes_nothing(tmp_path, empty_task):
    with pytest.raises(ConfigError, match="task '_empty' has no training problems"):
        Trainer(mini_recipe(task={"name": "_empty"}), tmp_path / "e", log=lambda m: None).run()
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize("text, expected", [
    ("train: {steps: 3\n", "not valid YAML"),
    ("advantage: {name: grop}\n", "Did you mean 'grpo'"),
    ("task: {name: arithmetic, max_operand: 0}\n", "max_operand must be >= 1"),
    ("rollout: {num_generation: 4}\n", "Did you mean 'num_generations'"),
])
def test_cli_bad_input_exits_2_and_leaves_nothing(tmp_path, text, expected):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(text + "model: {tiny: {hidden_size: 32, num_layers: 1, num_heads: 2, warmup_steps: 1}}\n")
    out = run_cli("train", str(recipe), "-o", str(tmp_path / "run"), cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert expected in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "run").exists()
