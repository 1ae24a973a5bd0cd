"""``reasonrl eval`` end to end on the embedded mini model."""

import json

from reasonrl.cli import main
from reasonrl.evaluate.metrics import pass_at_k
from reasonrl.policy.tiny import TinySpec, load_tiny_policy

from helpers import MINI_TINY


def test_eval_writes_recomputable_metrics_and_is_deterministic(tmp_path, capsys):
    model = tmp_path / "model"
    load_tiny_policy(TinySpec(**MINI_TINY)).save(model)
    args = ["eval", "--model", str(model), "--task", "arithmetic", "--n", "4", "--k", "2", "--size", "6",
            "--max-new-tokens", "12", "--seed", "3"]
    assert main(args + ["-o", str(tmp_path / "a.json")]) == 0
    assert main(args + ["-o", str(tmp_path / "b.json")]) == 0
    a = json.loads((tmp_path / "a.json").read_text())["arithmetic"]
    b = json.loads((tmp_path / "b.json").read_text())["arithmetic"]
    assert a["per_problem"] == b["per_problem"] and a["metrics"] == b["metrics"]
    rows, m = a["per_problem"], a["metrics"]
    assert len(rows) == 6 and set(m) >= {"avg@4", "pass@1", "pass@2", "maj@1", "maj@2", "greedy",
                                          "response_length", "token_entropy", "format_failure_rate", "distinct_correct@4"}
    expected = sum(pass_at_k(4, r["correct"], 2) for r in rows) / 6
    assert abs(m["pass@2"]["mean"] - expected) < 1e-12
    assert m["pass@1"]["mean"] == m["avg@4"]["mean"] or abs(m["pass@1"]["mean"] - m["avg@4"]["mean"]) < 1e-12
    assert m["avg@4"]["ci_low"] <= m["avg@4"]["mean"] <= m["avg@4"]["ci_high"]
    assert 0 <= m["format_failure_rate"] <= 1 and m["token_entropy"] > 0
    assert m["distinct_correct@4"] == sum(r["distinct_correct"] for r in rows) / 6
    assert all(r["distinct_correct"] <= r["correct"] for r in rows)
    # eval.json keeps what the model wrote: the n sampled completions (their correctness in the
    # same order, judged by the task's exact answer) and the greedy one
    from reasonrl.rewards.basic import extract_answer
    for r in rows:
        assert len(r["completions"]) == 4 and all(isinstance(t, str) for t in r["completions"])
        assert [extract_answer(t) == r["answer"] for t in r["completions"]] == r["sample_correct"]
        assert isinstance(r["greedy_completion"], str)
        assert (extract_answer(r["greedy_completion"]) == r["answer"]) == r["greedy"]
    out = capsys.readouterr().out
    assert "pass@2" in out and "problems/s" in out


def test_eval_rejects_unknown_task_parameter(tmp_path, capsys):
    code = main(["eval", "--model", "tiny", "--task", "arithmetic", "--task-param", "max_operandd=5"])
    assert code == 2 and "Did you mean 'max_operand'" in capsys.readouterr().err


def test_stop_strings_given_on_the_command_line_end_every_completion(tmp_path):
    model = tmp_path / "model"
    load_tiny_policy(TinySpec(**MINI_TINY)).save(model)
    args = ["eval", "--model", str(model), "--task", "arithmetic", "--n", "4", "--k", "2", "--size", "6",
            "--max-new-tokens", "12", "--seed", "3"]
    assert main(args + ["-o", str(tmp_path / "plain.json")]) == 0
    assert main(args + ["--stop", "#", "-o", str(tmp_path / "stop.json")]) == 0
    plain = json.loads((tmp_path / "plain.json").read_text())["arithmetic"]["per_problem"]
    cut = json.loads((tmp_path / "stop.json").read_text())["arithmetic"]["per_problem"]
    texts = lambda rows: [t for r in rows for t in [*r["completions"], r["greedy_completion"]]]  # noqa: E731
    assert any("#" in t for t in texts(plain))  # the mini model writes the answer marker ...
    assert not any("#" in t for t in texts(cut))  # ... which --stop now cuts, with what follows
    assert texts(cut) == [t.split("#")[0] for t in texts(plain)]  # the same samples (same seed), cut at '#'


def test_a_recipe_gives_the_task_its_scoring_and_sampling_and_flags_win(tmp_path, capsys):
    model = tmp_path / "model"
    load_tiny_policy(TinySpec(**MINI_TINY)).save(model)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("task: {name: arithmetic, max_operand: 5}\nrollout: {max_new_tokens: 12, stop: ['#']}\n"
                      "eval: {reward: exact_answer}\n")
    common = ["eval", "--model", str(model), "--n", "4", "--k", "2", "--size", "6", "--seed", "3"]
    flags = common + ["--task", "arithmetic", "--task-param", "max_operand=5", "--max-new-tokens", "12",
                      "--stop", "#", "--reward", "exact_answer"]
    assert main(flags + ["-o", str(tmp_path / "flags.json")]) == 0
    assert main(common + ["--recipe", str(recipe), "-o", str(tmp_path / "recipe.json")]) == 0
    by_flags = json.loads((tmp_path / "flags.json").read_text())["arithmetic"]
    by_recipe = json.loads((tmp_path / "recipe.json").read_text())["arithmetic"]
    assert by_recipe["task_params"] == {"max_operand": 5} and by_recipe["reward"] == "exact_answer"
    assert by_recipe["per_problem"] == by_flags["per_problem"]  # the same problems, cut at '#', 12 tokens
    # a flag beside the recipe wins: --stop '=' replaces the recipe's '#'
    plain = common + ["--task", "arithmetic", "--task-param", "max_operand=5", "--max-new-tokens", "12"]
    assert main(plain + ["-o", str(tmp_path / "plain.json")]) == 0
    assert main(common + ["--recipe", str(recipe), "--stop", "=", "-o", str(tmp_path / "eq.json")]) == 0
    texts = lambda name: [t for r in json.loads((tmp_path / name).read_text())["arithmetic"]["per_problem"]  # noqa: E731
                          for t in r["completions"]]
    assert texts("eq.json") == [t.split("=")[0] for t in texts("plain.json")]
    assert any("=" in t for t in texts("plain.json")) and any("#" in t for t in texts("eq.json"))  # both acted
    # neither --task nor --recipe: exit 2 with the reason
    assert main(common) == 2 and "give --task NAME or --recipe RECIPE.yaml" in capsys.readouterr().err
