"""A new user's mistakes: each exits 2 with a message naming the key or path, and no run folder."""

import pytest

from helpers import run_cli

MINI = "model: {tiny: {hidden_size: 32, num_layers: 1, num_heads: 2, warmup_steps: 1}}\n"


@pytest.mark.parametrize("text, expected", [
    ("loss: {epsilon: -0.1}\n" + MINI, "loss.epsilon must be >= 0, got -0.1"),
    ("loss: {dual_clip: 0.5}\n" + MINI, "loss.dual_clip must be > 1, got 0.5"),
    ("model: {backend: hf, path: /nonexistent/model}\n",
     "model /nonexistent/model: no such folder (/nonexistent/model), and it is not a hub id"),
    ("rollout: {num_generations: 100000000}\n" + MINI,
     "rollout.num_generations=100000000 × train.prompts_per_step=16 = 1,600,000,000 sequences per step need about"),
    ("", "the recipe is empty"),
    ("# only a comment\n", "the recipe is empty"),
    ("optim: {lr: 0}\n" + MINI, "optim.lr must be > 0, got 0"),
    ("rewards: [{name: exact_answer, timeout_s: 0}]\n" + MINI, "rewards[0].timeout_s must be > 0"),
], ids=["epsilon", "dual_clip", "model-path", "num_generations", "empty", "comment-only", "lr", "timeout"])
def test_bad_recipe_exits_2_and_leaves_nothing(tmp_path, text, expected):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(text)
    out = run_cli("train", str(recipe), "-o", str(tmp_path / "run"), cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert expected in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert not (tmp_path / "run").exists()


def test_non_utf8_recipe_and_data_files(tmp_path):
    recipe = tmp_path / "latin1.yaml"
    recipe.write_bytes("# caf\xe9\ntrain: {steps: 1}\n".encode("latin-1"))
    out = run_cli("train", str(recipe), "-o", str(tmp_path / "run"), cwd=tmp_path)
    assert out.returncode == 2 and "latin1.yaml: not UTF-8 text" in out.stderr, out.stderr
    data = tmp_path / "data.jsonl"
    data.write_bytes(b'{"prompt": "1+1;", "answer": "2"}\n{"prompt": "caf\xe9", "answer": "3"}\n')
    recipe = tmp_path / "data.yaml"
    recipe.write_text(f"task: {{name: dataset, train_path: {data}, eval_path: {data}}}\n" + MINI)
    out = run_cli("train", str(recipe), "-o", str(tmp_path / "run"), cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert f"{data}, line 2: not UTF-8 text (byte 16 of the line is 0xe9" in out.stderr, out.stderr
    assert not (tmp_path / "run").exists()
    (tmp_path / "data.json").write_bytes(b'[\n{"prompt": "a", "answer": "1"},\n{"prompt": "\xff", "answer": "2"}\n]')
    from reasonrl.tasks.files import read_rows

    with pytest.raises(ValueError, match=r"data.json, line 3: not UTF-8 text \(byte 13 of the line is 0xff"):
        read_rows(str(tmp_path / "data.json"))


def test_eval_of_a_missing_model_exits_2(tmp_path):
    out = run_cli("eval", "--model", "/nonexistent", "--task", "arithmetic", "--size", "2", "--n", "1",
                  "-o", str(tmp_path / "e.json"), cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "model /nonexistent: no such folder" in out.stderr and "not a hub id" in out.stderr
    assert not (tmp_path / "e.json").exists()


def test_a_missing_folder_under_a_local_folder_is_named_not_fetched_from_the_hub(tmp_path, monkeypatch):
    """'runs/x' also fits the hub's 'org/name'; with a local runs/ it is a mistyped folder."""
    from reasonrl.policy.loading import resolve_model_path

    (tmp_path / "runs").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"^model runs/teacher: no such folder \(.*runs/teacher\); runs is "
                                                 r"a local folder, so it is not read as a hub id$"):
        resolve_model_path("runs/teacher", None, "float32", str(tmp_path / "cache"))
    assert resolve_model_path("HuggingFaceTB/SmolLM2-135M", None, "float32", str(tmp_path / "cache")) == \
        "HuggingFaceTB/SmolLM2-135M"  # no such local folder: a hub id, left to the loader
