"""Issue 29 items 4 and 8 (data): prompts against the model's context at load, and JSON rows that
used to crash the loader (deep nesting), lose their place (a 5000-digit integer) or pass as "nan"."""

from __future__ import annotations

import json
import types

import pytest
import torch

from helpers import mini_policy, run_cli
from reasonrl.config import recipe_from_dict
from reasonrl.params import ConfigError
from reasonrl.policy.hf import HFPolicy
from reasonrl.tasks.dataset import DatasetTask
from reasonrl.tasks.files import Row, read_rows
from reasonrl.tasks.lengths import context_length, fit_prompt_lengths

DEEP = "[" * 100_000 + "]" * 100_000
OK = '{"prompt": "1+1=", "answer": "2"}'
REFUSED = [  # (file text, the line named, the message after it)
    (OK + '\n{"prompt": ' + DEEP + ', "answer": "1"}\n', "line 2", "JSON nested too deeply"),
    (OK + '\n\n{"prompt": "1+1=", "answer": ' + "7" * 5000 + "}\n", "line 3",
     "an integer of 5000 digits is longer than Python converts (4300 digits); write it as a string"),
    ('{"prompt": "1+1=", "answer": NaN}\n', "line 1", "NaN is not a number JSON allows"),
    (OK + '\n{"prompt": "1+1=", "answer": -Infinity}\n', "line 2", "-Infinity is not a number JSON allows"),
    ('{"prompt": "1+1=", "answer": 1e400}\n', "line 1", "the number 1e400 is too large for a float"),
]


@pytest.mark.parametrize("text, line, message", REFUSED, ids=["deep", "digits", "nan", "infinity", "overflow"])
def test_json_rows_that_crashed_or_passed_are_refused_naming_file_and_line(tmp_path, text, line, message):
    path = tmp_path / "train.jsonl"
    path.write_text(text)
    with pytest.raises(ValueError) as err:  # before: RecursionError, a ValueError naming no file, or "nan"
        read_rows(str(path))
    assert str(err.value).startswith(f"{path}, {line}: {message}"), err.value
    # the same rows in a .json list: the line the row starts on and the row's number
    rows = [json.loads(OK)] * 2
    listed = tmp_path / "train.json"
    listed.write_text("[\n" + json.dumps(rows[0]) + ",\n" + text.strip().splitlines()[-1] + "\n]")
    with pytest.raises(ValueError) as err:
        read_rows(str(listed))
    assert str(err.value).startswith(f"{listed}, line 3 (row 2): {message}"), err.value


def test_json_lists_still_read_and_report_syntax_errors_where_they_are(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(' [ {"prompt": "a", "answer": 1} ,\n {"prompt": "b", "answer": 2.5} ] \n')
    assert [(r.where, r.data["answer"]) for r in read_rows(str(path))] == [("row 1", 1), ("row 2", 2.5)]
    for text in ['[{"a": 1},]', '[{"a": 1}\n {"a": 2}]', '[{"a": 1}] x', '[{"a": 1}']:
        path.write_text(text)
        with pytest.raises(json.JSONDecodeError) as plain:
            json.loads(text)
        e = plain.value  # the same message as when the file was parsed whole
        with pytest.raises(ValueError, match=None) as err:
            read_rows(str(path))
        assert str(err.value) == f"{path}, line {e.lineno}: invalid JSON ({e.msg} at column {e.colno})"
    path.write_text('{"a": 1}')
    with pytest.raises(ValueError, match=r"d.json: expected a JSON list of objects, got dict$"):
        read_rows(str(path))


def test_a_nan_answer_from_any_format_is_refused():
    row = Row({"prompt": "p", "answer": float("nan")}, "t.parquet", "row 3", 2)  # parquet keeps NaN floats
    with pytest.raises(ValueError, match=r"^t.parquet, row 3: field 'answer' is nan; an answer must be a finite"):
        row.answer_text("answer")
    assert Row({"answer": 2.5}, "t.parquet", "row 1", 0).answer_text("answer") == "2.5"


# --- prompt length against the context --------------------------------------------------------

def dataset(tmp_path, prompts):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "answer": "1"}) + "\n" for p in prompts))
    return path, DatasetTask(str(path), str(path))


def fit(task, mode="error", max_new_tokens=24, policy=None, eval_size=4, log=None):
    """Run the load-time check as the trainer does: the mini policy has 64 positions, one token a character."""
    recipe = recipe_from_dict({"rollout": {"max_new_tokens": max_new_tokens, "overlong_prompts": mode}}, "test")
    evaluator = types.SimpleNamespace(problems=task.eval_problems(eval_size), budget=max_new_tokens, task=task)
    fit_prompt_lengths(recipe, policy or mini_policy(), task, evaluator, log or (lambda m: None))
    return evaluator


LONG = "9" * 40 + "+1="  # 43 tokens: with 24 new ones, 67 > 64 positions


def test_an_overlong_prompt_is_refused_naming_file_line_and_lengths(tmp_path):
    assert context_length(mini_policy().model.config) == 64
    path, task = dataset(tmp_path, ["1+1=", LONG, "2+2=", "3" * 41])
    with pytest.raises(ConfigError) as err:
        fit(task)
    assert str(err.value) == (
        f"{path}, line 2: the prompt is 43 tokens; with rollout.max_new_tokens=24 that makes 67, more than the "
        "model's context of 64 tokens (1 more of the 4 training prompts are too long). Shorten the rows, or set "
        "rollout.overlong_prompts to skip or truncate")
    fit(task, max_new_tokens=21)  # 43 + 21 = 64: fits exactly
    with pytest.raises(ConfigError, match="rollout.max_new_tokens=62 leaves 2 of the model's 64 positions for a "
                                          "prompt, which needs at least 4; lower rollout.max_new_tokens"):
        fit(task, max_new_tokens=62)


def test_skip_drops_overlong_rows_and_truncate_keeps_their_end_with_a_count(tmp_path):
    _, task = dataset(tmp_path, ["1+1=", LONG, "2+2=", "3" * 41])
    logged = []
    evaluator = fit(task, "skip", log=logged.append)
    assert len(task._train) == 2 and {p.prompt for p in task.train_problems(0, 8, seed=0)} == {"1+1=", "2+2="}
    assert [p.prompt for p in evaluator.problems] == ["1+1=", "2+2="]
    assert logged[0].startswith("rollout.overlong_prompts=skip: skipped 2 of 4 training prompts longer than the "
                                "40 tokens the model's context of 64 leaves beside rollout.max_new_tokens=24")
    assert logged[1].startswith("rollout.overlong_prompts=skip: skipped 2 of 4 held-out prompts")

    _, task = dataset(tmp_path, ["1+1=", LONG, "2+2=", "3" * 41])
    logged.clear()
    evaluator = fit(task, "truncate", log=logged.append)
    kept = {p.meta["index"]: p.prompt for p in task.train_problems(0, 4, seed=0)}
    assert kept == {0: "1+1=", 1: LONG[-40:], 2: "2+2=", 3: "3" * 40}  # the last 40 characters: the question's end
    assert [p.prompt for p in evaluator.problems] == ["1+1=", LONG[-40:], "2+2=", "3" * 40]
    assert "left-truncated 2 of 4 training prompts" in logged[0]
    fit(task, eval_size=0)  # the training rows truncation kept fit (the evaluator's list was fitted above)


def test_a_huge_row_is_over_length_without_tokenising_it(tmp_path, monkeypatch):
    huge = "7" * 5_000_000  # more than 32 characters per position of a 64-token context
    path, task = dataset(tmp_path, ["1+1=", huge])
    policy = mini_policy()
    longest = []
    encode = policy.encode_prompts
    monkeypatch.setattr(policy, "encode_prompts", lambda ps: (longest.append(max(map(len, ps))), encode(ps))[1])
    with pytest.raises(ConfigError, match=rf"^{path}, line 2: the prompt is 5,000,000 characters, more than 32 per "
                                          "position of the model's context of 64 tokens \\(not tokenised\\)"):
        fit(task, policy=policy, eval_size=2)
    evaluator = fit(task, "truncate", policy=policy, eval_size=2)
    assert sorted(p.prompt for p in task.train_problems(0, 2, seed=0)) == ["1+1=", "7" * 40]
    assert [p.prompt for p in evaluator.problems] == ["1+1=", "7" * 40]
    assert max(longest) <= 64 * 32  # the tokenizer never saw the 5 MB row


class TokenizerOnly(HFPolicy):
    """SmolLM2's tokenizer and config without its weights: all the length check reads."""

    def __init__(self, folder, chat_template=False):
        from transformers import AutoConfig, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(folder)
        tok.pad_token, tok.padding_side = tok.pad_token or tok.eos_token, "left"
        self.tokenizer, self.chat_template, self.device = tok, chat_template, torch.device("cpu")
        self.model = types.SimpleNamespace(config=AutoConfig.from_pretrained(folder))


@pytest.fixture(scope="module")
def smollm2_folder():
    from reasonrl.policy.loading import resolve_model_path

    try:
        return resolve_model_path("smollm2-135m", None, "float32", None)
    except Exception as exc:  # noqa: BLE001 — no GGUF here: skip
        pytest.skip(f"SmolLM2 is not installed: {exc}")


@pytest.mark.parametrize("chat_template", [False, True])
def test_smollm2_lengths_are_the_tokens_the_policy_feeds(tmp_path, smollm2_folder, chat_template):
    policy = TokenizerOnly(smollm2_folder, chat_template)
    assert context_length(policy.model.config) == 8192
    word = " apple"  # one SmolLM2 token
    path, task = dataset(tmp_path, ["What is 2+3?", "Say" + word * 8300 + ".", "Q:" + word * 8000])
    feeds = int(policy.encode_prompts(["Say" + word * 8300 + "."])[1].sum())  # the template's tokens included
    with pytest.raises(ConfigError) as err:
        fit(task, policy=policy, max_new_tokens=256, eval_size=3)
    assert str(err.value).startswith(f"{path}, line 2: the prompt is {feeds:,} tokens; with rollout.max_new_tokens"
                                     f"=256 that makes {feeds + 256:,}, more than the model's context of 8,192 tokens"
                                     " (1 more of the 3 training prompts are too long)"), err.value
    evaluator = fit(task, "truncate", policy=policy, max_new_tokens=256, eval_size=3)
    cut = [int(policy.encode_prompts([p.prompt])[1].sum()) for p in evaluator.problems]
    assert cut[0] < 50 and 8192 - 256 - 3 <= cut[1] <= 8192 - 256 and 8192 - 256 - 3 <= cut[2] <= 8192 - 256
    assert evaluator.problems[1].prompt.endswith(word * 10 + ".")


def test_cli_refuses_an_overlong_row_with_exit_2_and_no_run_folder(tmp_path):
    """Before: the row trained past the embedded model's 64 positions (exit 0). (A deep, NaN or
    5000-digit row is a ValueError of ``read_rows``, above: the path that exits 2 for every bad row.)"""
    data = tmp_path / "long.jsonl"
    data.write_text(OK + "\n" + json.dumps({"prompt": "9" * 40 + "+1=", "answer": "1"}) + "\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"task: {{name: dataset, train_path: {data}, eval_path: {data}}}\n"
                      "rollout: {max_new_tokens: 24, num_generations: 2}\ntrain: {steps: 1, prompts_per_step: 1}\n"
                      "eval: {size: 1}\n")
    out = run_cli("train", str(recipe), "-o", str(tmp_path / "run"), cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert (f"{data}, line 2: the prompt is 43 tokens; with rollout.max_new_tokens=24 that makes 67, more than the "
            "model's context of 64 tokens") in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert not (tmp_path / "run").exists()
