"""Data-backed tasks: gsm8k, the generic dataset loader, reasoning-gym, and their error messages."""

from __future__ import annotations

import json
import pickle
import sys
import types
from pathlib import Path

import pytest

import reasonrl.tasks  # noqa: F401  (registers every task)
from reasonrl.evaluate.evaluator import answer_extractor
from reasonrl.registry import REWARDS, TASKS
from reasonrl.tasks.dataset import DatasetTask
from reasonrl.tasks.files import read_rows, stream_indices
from reasonrl.tasks.gsm8k import GSM8KTask

GSM8K = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k"
needs_gsm8k = pytest.mark.skipif(not (GSM8K / "train.jsonl").is_file(), reason=f"no GSM8K data at {GSM8K}")

ROW = {"question": "What is 2+3?", "answer": "2+3 = <<2+3=5>>5\n#### 5"}


def jsonl(*rows) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


def gsm8k_folder(tmp_path: Path, train: str, test: str | None = None) -> Path:
    (tmp_path / "train.jsonl").write_text(train)
    (tmp_path / "test.jsonl").write_text(jsonl(ROW) if test is None else test)
    return tmp_path


@pytest.fixture(scope="module")
def gsm8k() -> GSM8KTask:
    if not (GSM8K / "train.jsonl").is_file():
        pytest.skip(f"no GSM8K data at {GSM8K}")
    return GSM8KTask(str(GSM8K))


# --- gsm8k on the real data ------------------------------------------------

def test_gsm8k_is_registered_with_its_recipe_params():
    assert TASKS.get("gsm8k") is GSM8KTask and TASKS.get("dataset") is DatasetTask
    assert "reasoning_gym" in TASKS and "reasoning_gym" in REWARDS


@needs_gsm8k
def test_gsm8k_counts_and_first_rows(gsm8k):
    epoch = gsm8k.train_problems(0, 7473, seed=0)
    assert sorted(p.meta["index"] for p in epoch) == list(range(7473))
    first = next(p for p in epoch if p.meta["index"] == 0)
    assert first.answer == "72" and first.meta == {"index": 0, "split": "train"}
    assert first.prompt.startswith("Question: Natalia sold clips") and first.prompt.endswith("?\nAnswer:")
    # calculator annotations removed, final line kept verbatim
    assert first.solution == ("Natalia sold 48/2 = 24 clips in May.\n"
                              "Natalia sold 48+24 = 72 clips altogether in April and May.\n#### 72")
    assert len(gsm8k.eval_problems(1319)) == 1319
    with pytest.raises(ValueError, match="asked for 1320 eval problems; .*test.jsonl has 1319"):
        gsm8k.eval_problems(1320)


@needs_gsm8k
def test_gsm8k_answers_drop_thousands_commas(gsm8k):
    raw = [json.loads(line) for line in (GSM8K / "train.jsonl").read_text().splitlines()]
    i = next(i for i, r in enumerate(raw) if "," in r["answer"].rpartition("####")[2])
    problem = next(p for p in gsm8k.train_problems(0, 7473, 0) if p.meta["index"] == i)
    assert problem.answer == raw[i]["answer"].rpartition("####")[2].replace(",", "").strip()
    assert "," not in problem.answer and problem.answer.replace(".", "").lstrip("-").isdigit()


@needs_gsm8k
def test_gsm8k_eval_is_the_first_test_rows_in_order(gsm8k):
    raw = [json.loads(line) for line in (GSM8K / "test.jsonl").read_text().splitlines()[:5]]
    problems = gsm8k.eval_problems(5)
    assert [p.meta for p in problems] == [{"index": i, "split": "test"} for i in range(5)]
    assert [p.prompt for p in problems] == [f"Question: {r['question']}\nAnswer:" for r in raw]
    assert problems[0].answer == "18"
    assert gsm8k.eval_problems(5) == problems


@needs_gsm8k
def test_gsm8k_few_shot_prompt_structure_and_exemplar_exclusion():
    task = GSM8KTask(str(GSM8K), few_shot=3)
    raw = [json.loads(line) for line in (GSM8K / "train.jsonl").read_text().splitlines()[:3]]
    exemplar = (f"Question: {raw[0]['question']}\nAnswer: Natalia sold 48/2 = 24 clips in May.\n"
                "Natalia sold 48+24 = 72 clips altogether in April and May.\n#### 72\n\n")
    epoch = task.train_problems(0, 7470, seed=1)
    assert sorted(p.meta["index"] for p in epoch) == list(range(3, 7473))  # exemplars never trained on
    for p in epoch[:50] + task.eval_problems(20):
        assert p.prompt.startswith(exemplar)
        assert p.prompt.count("Question: ") == 4 and p.prompt.endswith("\nAnswer:")
        *shots, final = p.prompt.split("\n\nQuestion: ")
        assert [s.split("\nAnswer:")[0].removeprefix("Question: ") for s in shots] == [r["question"] for r in raw]
        assert "<<" not in p.prompt
    assert task.stop_strings == ["\n\nQuestion:", "\n\n"]


@needs_gsm8k
def test_gsm8k_stream_is_deterministic_and_epoch_wise():
    task = GSM8KTask(str(GSM8K), max_train=10)
    assert task.train_problems(3, 4, seed=0) == task.train_problems(3, 4, seed=0)
    assert task.train_problems(3, 4, seed=0) != task.train_problems(4, 4, seed=0)
    assert task.train_problems(0, 10, seed=0) != task.train_problems(0, 10, seed=1)
    for epoch in range(3):  # steps of 5 over 10 rows: each epoch is two steps, no repeats inside
        idx = [p.meta["index"] for s in (2 * epoch, 2 * epoch + 1) for p in task.train_problems(s, 5, seed=0)]
        assert sorted(idx) == list(range(10))
    # a step straddling an epoch boundary still never repeats within one epoch
    positions = [i for s in range(3) for i in stream_indices(10, s, 3, seed=0)]
    assert len(set(positions[:9])) == 9


def test_stop_strings_follow_template_and_separator(tmp_path):
    task = GSM8KTask(str(gsm8k_folder(tmp_path, jsonl(ROW, ROW))), template="Q: {question}\nA:",
                     shot_separator="\n###\n", few_shot=1)
    assert task.stop_strings == ["\n###\nQ:", "\n###\n"]
    prompt = task.train_problems(0, 1, 0)[0].prompt
    assert prompt == "Q: What is 2+3?\nA: 2+3 = 5\n#### 5\n###\nQ: What is 2+3?\nA:"


# --- bad input: every message names the file and the line ------------------

@pytest.mark.parametrize("bad_line, expected", [
    ("{not json", r"line 3: invalid JSON"),
    ('["a", "list"]', r"line 3: expected a JSON object, got list"),
    ('{"q": "x", "answer": "#### 1"}', r"line 3: missing field 'question'; the row has fields: q, answer"),
    ('{"question": "", "answer": "#### 1"}', r"line 3: field 'question' must be a non-empty string"),
    ('{"question": 7, "answer": "#### 1"}', r"line 3: field 'question' must be a non-empty string"),
    ('{"question": "x", "answer": "5"}', r"line 3: field 'answer' has no '####"),
    ('{"question": "x", "answer": "so ####  "}', r"line 3: field 'answer' has nothing after '####'"),
])
def test_gsm8k_bad_rows_name_file_and_line(tmp_path, bad_line, expected):
    # line 2 is blank: skipped, but line numbers stay those of the file
    folder = gsm8k_folder(tmp_path, jsonl(ROW) + "\n" + bad_line + "\n")
    with pytest.raises(ValueError, match=r"train\.jsonl, " + expected):
        GSM8KTask(str(folder))


def test_missing_and_empty_files_say_which_path(tmp_path):
    with pytest.raises(ValueError, match=r"nowhere/train\.jsonl does not exist \(tried /.*nowhere/train\.jsonl\)"):
        GSM8KTask(str(tmp_path / "nowhere"))
    folder = gsm8k_folder(tmp_path, jsonl(ROW), test="\n  \n")
    with pytest.raises(ValueError, match=r"test\.jsonl has no rows"):
        GSM8KTask(str(folder))


def test_template_errors(tmp_path):
    folder = str(gsm8k_folder(tmp_path, jsonl(ROW)))
    with pytest.raises(ValueError, match=r"train\.jsonl, line 1: template .* refers to field 'topic'"):
        GSM8KTask(folder, template="{question} ({topic})")
    with pytest.raises(ValueError, match=r"empty or positional field reference '\{\}'"):
        GSM8KTask(folder, template="Question: {}")
    with pytest.raises(ValueError, match=r"must contain '\{question\}'"):
        GSM8KTask(folder, template="Question: {answer}")
    with pytest.raises(ValueError, match="few_shot=1 leaves no training rows"):
        GSM8KTask(folder, few_shot=1)


# --- the generic loader ----------------------------------------------------

ROWS = [
    {"q": "Add 1 and 2.", "a": "steps\n#### 3", "s": "1+2=3", "topic": "sums"},
    {"q": "Add 2 and 2.", "a": "more steps\n####  4 ", "s": "2+2=4", "topic": "sums"},
]


def write_rows(path: Path, rows: list[dict]) -> str:
    if path.suffix == ".jsonl":
        path.write_text(jsonl(*rows))
    elif path.suffix == ".json":
        path.write_text(json.dumps(rows, indent=1))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet"])
def test_dataset_field_mapping_and_answer_regex(tmp_path, suffix):
    if suffix == ".parquet":
        pytest.importorskip("pyarrow")
    train = write_rows(tmp_path / f"train{suffix}", ROWS)
    test = write_rows(tmp_path / f"test{suffix}", ROWS[:1])
    task = DatasetTask(train, test, prompt_field="q", answer_field="a", solution_field="s",
                       template="[{topic}] {prompt}", answer_regex=r"####\s*(.+)$")
    problems = sorted(task.train_problems(0, 2, seed=0), key=lambda p: p.meta["index"])
    assert [p.prompt for p in problems] == ["[sums] Add 1 and 2.", "[sums] Add 2 and 2."]
    assert [p.answer for p in problems] == ["3", "4"]
    assert [p.solution for p in problems] == ["1+2=3", "2+2=4"]
    assert [p.meta for p in problems] == [{"index": 0, "split": "train"}, {"index": 1, "split": "train"}]
    assert task.eval_problems(1)[0].meta == {"index": 0, "split": "eval"}
    with pytest.raises(ValueError, match=r"asked for 2 eval problems; .*test.* has 1"):
        task.eval_problems(2)


def test_dataset_defaults_and_numeric_answers(tmp_path):
    train = write_rows(tmp_path / "t.json", [{"prompt": "six times seven", "answer": 42}])
    task = DatasetTask(train, train)
    (p,) = task.train_problems(5, 1, seed=3)
    assert (p.prompt, p.answer, p.solution) == ("six times seven", "42", "")


def test_dataset_bad_input_names_file_and_row(tmp_path):
    good = write_rows(tmp_path / "good.jsonl", ROWS)
    nonlist = tmp_path / "obj.json"
    nonlist.write_text('{"prompt": "x"}')
    with pytest.raises(ValueError, match=r"obj\.json: expected a JSON list of objects, got dict"):
        DatasetTask(str(nonlist), good)
    rows = tmp_path / "rows.json"
    rows.write_text('[{"prompt": "x", "answer": "1"}, 3]')
    with pytest.raises(ValueError, match=r"rows\.json, row 2: expected a JSON object, got int"):
        DatasetTask(str(rows), good)
    broken = tmp_path / "broken.json"
    broken.write_text('[\n{"prompt": "x",\n}]')
    with pytest.raises(ValueError, match=r"broken\.json, line 3: invalid JSON"):
        DatasetTask(str(broken), good)
    with pytest.raises(ValueError, match=r"good\.jsonl, line 1: missing field 'prompt'; the row has fields: q, a, s, topic"):
        DatasetTask(good, good)
    with pytest.raises(ValueError, match=r"good\.jsonl, line 1: answer_regex .* does not match field 'a'"):
        DatasetTask(good, good, prompt_field="q", answer_field="a", answer_regex=r"ANSWER: (\d+)")
    with pytest.raises(ValueError, match=r"good\.jsonl, line 1: template .* refers to field 'level'"):
        DatasetTask(good, good, prompt_field="q", answer_field="a", template="{prompt} {level}")
    with pytest.raises(ValueError, match=r"unsupported kind '\.csv'"):
        (tmp_path / "x.csv").write_text("a,b\n")
        DatasetTask(str(tmp_path / "x.csv"), good)
    with pytest.raises(ValueError, match="not a valid regex"):
        DatasetTask(good, good, prompt_field="q", answer_field="a", answer_regex="(")


def test_parquet_without_pyarrow_or_pandas_names_the_install(tmp_path, monkeypatch):
    path = tmp_path / "t.parquet"
    path.write_bytes(b"PAR1")
    for mod in ("pyarrow", "pyarrow.parquet", "pandas"):
        monkeypatch.setitem(sys.modules, mod, None)  # makes `import mod` raise ImportError
    with pytest.raises(ImportError, match=r"t\.parquet needs pyarrow \(or pandas\): pip install pyarrow"):
        read_rows(str(path))


def test_hf_spec_loads_offline_from_cache(monkeypatch):
    calls = []
    config = types.SimpleNamespace(HF_HUB_OFFLINE=False)

    def load_dataset(name, cfg, split):
        calls.append((name, cfg, split, config.HF_HUB_OFFLINE))
        return [{"prompt": "p1", "answer": "a1"}, {"prompt": "p2", "answer": "a2"}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset, config=config))
    task = DatasetTask("hf:org/data", "hf:org/data:main:test")
    assert calls == [("org/data", None, "train", True), ("org/data", "main", "test", True)]
    assert config.HF_HUB_OFFLINE is False  # offline only for the load itself
    assert task.eval_problems(2)[1].prompt == "p2"


def test_hf_spec_without_datasets_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ImportError, match=r"hf:org/data needs the 'datasets' package: pip install datasets"):
        read_rows("hf:org/data")


# --- reasoning-gym ---------------------------------------------------------

SMALL = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def test_reasoning_gym_task_and_reward():
    pytest.importorskip("reasoning_gym")
    from reasonrl.rewards.reasoning_gym import reasoning_gym_score

    task = TASKS.get("reasoning_gym")(dataset="basic_arithmetic", size=60, eval_size=30, seed=4, config=SMALL)
    train = task.train_problems(0, 60, seed=0)
    evals = task.eval_problems(30)
    # a small problem space: disjoint indices alone would collide, the task guarantees no overlap
    assert not {p.prompt for p in train} & {p.prompt for p in evals}
    assert task.train_problems(2, 7, seed=0) == task.train_problems(2, 7, seed=0)
    assert task.train_problems(2, 7, seed=0) != task.train_problems(3, 7, seed=0)
    assert all(p.meta["split"] == "eval" and 60 <= p.meta["index"] < 90 for p in evals)
    p = train[0]
    assert p.prompt.startswith("Question: Calculate ") and p.answer == p.meta["entry"]["answer"]
    assert pickle.loads(pickle.dumps(p)) == p and json.dumps(p.meta)
    assert reasoning_gym_score(f"thinking... <answer>{p.answer}</answer>", p) == 1.0
    assert reasoning_gym_score(f"steps\n#### {p.answer}", p) == 1.0
    assert reasoning_gym_score("<answer>123456</answer>", p) == 0.0
    assert reasoning_gym_score("no answer at all", p) == 0.0
    # the evaluator's majority vote and format failures read the answer as the reward does
    extract = answer_extractor("reasoning_gym", task)
    assert extract("1 + 2 = 3. <answer>-3</answer>", p) == "-3" and extract("steps\n#### 7", p) == "7"
    assert extract("no answer at all", p) is None


def test_reasoning_gym_recipe_errors():
    pytest.importorskip("reasoning_gym")
    from reasonrl.tasks.reasoning_gym import ReasoningGymTask

    with pytest.raises(ValueError, match="unknown reasoning-gym dataset 'basic_arithmetc'.*basic_arithmetic"):
        ReasoningGymTask("basic_arithmetc")
    with pytest.raises(ValueError, match="rejected its config"):
        ReasoningGymTask("basic_arithmetic", config={"min_terms": 0})
    with pytest.raises(ValueError, match="task.config sets seed"):
        ReasoningGymTask("basic_arithmetic", config={"seed": 1})
    with pytest.raises(ValueError, match="may only use \\{question\\}"):
        ReasoningGymTask("basic_arithmetic", template="{question} {answer}")


def test_reasoning_gym_missing_package_names_the_install(monkeypatch):
    from reasonrl.rewards import reasoning_gym as rg_reward

    monkeypatch.setattr(rg_reward, "_GENERATORS", {})
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)
    with pytest.raises(ImportError, match="pip install reasoning-gym"):
        TASKS.get("reasoning_gym")(dataset="basic_arithmetic", size=5, eval_size=1)
