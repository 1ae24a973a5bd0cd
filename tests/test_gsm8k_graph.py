"""The gsm8k_graph task: FSG-RL function graphs derived from GSM8K's calculator annotations
(docs/methods/fsg_rl.md). The derivation on hand-written rows, graph by graph; skipped rows and
their reasons; real rows whose reference solutions pass the real sandboxed verifier; the recipe."""

import json
from pathlib import Path

import pytest

from reasonrl.config import load_recipe
from reasonrl.registry import REWARDS, TASKS
from reasonrl.methods.fsg.execute import verify
from reasonrl.methods.fsg.parse import parse_completion
from reasonrl.isolation.sandbox import SandboxPool
from reasonrl.methods.fsg.gsm8k_task import GSM8KGraphTask, Unusable, derive_problem

GSM8K = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k"
needs_gsm8k = pytest.mark.skipif(not (GSM8K / "train.jsonl").is_file(), reason=f"no GSM8K data at {GSM8K}")
RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "fsg_gsm8k_smollm2.yaml"


def unit(call, expected):
    return {"call": call, "expected": expected, "kind": "unit"}


def prop(call):
    return {"call": call, "expected": True, "kind": "property"}


def uses(source, target):
    return {"source": source, "target": target, "relation": "uses_value"}


# A chain: 36/3 is a literal step, 36+12 uses its result.
APPLES_Q = "Lena picks 36 apples on Monday and a third as many on Tuesday. How many apples does she pick in the two days?"
APPLES = ("She picks 36/3 = <<36/3=12>>12 apples on Tuesday.\n"
          "In total she picks 36+12 = <<36+12=48>>48 apples in the two days.\n#### 48")
APPLES_GRAPH = {
    "nodes": [
        {"id": "main", "name": "main", "signature": "main()", "desc": "", "tests": [unit("main()", 48)]},
        {"id": "f1", "name": "f1", "signature": "f1(a,b)", "desc": "apples on Tuesday",
         "tests": [unit("f1(36,3)", 12), unit("f1(12,3)", 4), unit("f1(20,4)", 5), prop("f1(12,3)*3==12")]},
        {"id": "f2", "name": "f2", "signature": "f2(a,x1)", "desc": "apples in the two days",
         "tests": [unit("f2(36,12)", 48), unit("f2(3,4)", 7), unit("f2(8,5)", 13), prop("f2(0,7)==7 and f2(6,0)==6")]},
    ],
    "edges": [uses("f1", "f2"), {"source": "f2", "target": "main", "relation": "aggregates_result"}],
    "target_call": "main()",
    "reference": {"main": "def main():x1=f1(36,3);x2=f2(36,x1);return x2#12;48",
                  "f1": "def f1(a,b):return a/b", "f2": "def f2(a,x1):return a+x1"},
}

# Two literal steps feed a three-number step (no single operator: probe tests, no property test);
# a restatement (<<+16=16>>) and a step nothing uses (4+2) are dropped, the rest renumbered;
# 12.5 is passed as written; the last step's text has no words after its result ("step 3").
SHIRTS_Q = "Tom buys 4 shirts at $12.50 each and 2 hats at $8 each. He pays with a $100 bill. How much change does he get?"
SHIRTS = ("The shirts cost 4*12.5 = $<<4*12.5=50>>50 in total.\nThe hats cost 2*8 = $<<2*8=16>>16 in total.\n"
          "The hats alone are $<<+16=16>>16.\nHe buys 4+2 = <<4+2=6>>6 items.\n"
          "His change is 100-50-16 = $<<100-50-16=34>>34.\n#### 34")
SHIRTS_GRAPH = {
    "nodes": [
        {"id": "main", "name": "main", "signature": "main()", "desc": "", "tests": [unit("main()", 34)]},
        {"id": "f1", "name": "f1", "signature": "f1(a,b)", "desc": "in total",
         "tests": [unit("f1(4,12.5)", 50), unit("f1(3,4)", 12), unit("f1(7,2)", 14),
                   prop("f1(1,7)==7 and f1(3,5)==f1(5,3)")]},
        {"id": "f2", "name": "f2", "signature": "f2(a,b)", "desc": "in total",
         "tests": [unit("f2(2,8)", 16), unit("f2(3,4)", 12), unit("f2(7,2)", 14),
                   prop("f2(1,7)==7 and f2(3,5)==f2(5,3)")]},
        {"id": "f3", "name": "f3", "signature": "f3(a,x1,x2)", "desc": "step 3",
         "tests": [unit("f3(100,50,16)", 34), unit("f3(3,4,5)", -6), unit("f3(10,4,9)", -3)]},
    ],
    "edges": [uses("f1", "f3"), uses("f2", "f3"), {"source": "f3", "target": "main", "relation": "aggregates_result"}],
    "target_call": "main()",
    "reference": {"main": "def main():x1=f1(4,12.5);x2=f2(2,8);x3=f3(100,x1,x2);return x3#50;16;34",
                  "f1": "def f1(a,b):return a*b", "f2": "def f2(a,b):return a*b", "f3": "def f3(a,x1,x2):return a-x1-x2"},
}

# A result used twice is one parameter; one parameter is no two-argument operator: probes.
EGGS = "There are 3*4 = <<3*4=12>>12 eggs.\nDoubled that is 12+12 = <<12+12=24>>24 eggs.\n#### 24"


def test_the_derivation_on_hand_written_rows():
    apples = derive_problem(APPLES_Q, APPLES, "48", {"index": 5})
    assert apples.meta == {"index": 5, "form": "2-step", "graph": APPLES_GRAPH}
    assert apples.answer == "48"
    assert apples.prompt == f"main()\nf1(a,b):apples on Tuesday\nf2(a,x1):apples in the two days\n{APPLES_Q}\n"
    assert apples.solution == ("<main>def main():x1=f1(36,3);x2=f2(36,x1);return x2#12;48</main>"
                               "<f1>def f1(a,b):return a/b</f1><f2>def f2(a,x1):return a+x1</f2>")
    shirts = derive_problem(SHIRTS_Q, SHIRTS, "34")
    assert shirts.meta == {"form": "3-step", "graph": SHIRTS_GRAPH}
    assert shirts.prompt.splitlines()[:4] == ["main()", "f1(a,b):in total", "f2(a,b):in total", "f3(a,x1,x2):step 3"]
    eggs = derive_problem("Eggs?", EGGS, "24").meta["graph"]
    assert eggs["nodes"][2]["signature"] == "f2(x1)" and eggs["reference"]["f2"] == "def f2(x1):return x1+x1"
    assert eggs["nodes"][2]["tests"] == [unit("f2(12)", 24), unit("f2(3)", 6), unit("f2(10)", 20)]
    assert eggs["reference"]["main"] == "def main():x1=f1(3,4);x2=f2(x1);return x2#12;24"
    for p in (apples, shirts):  # the completion parses with the verifier's own parser, answer stated
        parsed = parse_completion(p.solution, [n["id"] for n in p.meta["graph"]["nodes"]])
        assert parsed.exact and parsed.answer == p.answer


@pytest.mark.parametrize("worked, answer, reason", [
    ("He has 3 + 4 = 7 apples.\n#### 7", "7", "no_annotations"),
    ("He has <<7=7>>7 apples.\n#### 7", "7", "no_annotations"),           # only a restatement
    ("He has <<3 apples*2=6>>6.\n#### 6", "6", "unparsable"),             # words in the expression
    ("He has <<2**3=8>>8.\n#### 8", "8", "unparsable"),                   # not + - * /
    ("He has <<560//10=56>>56.\n#### 56", "56", "unparsable"),
    ("He has <<3*2>>6.\n#### 6", "6", "unparsable"),                      # no '='
    ("He has <<3*2=six>>6.\n#### 6", "6", "unparsable"),
    ("He has <<3*4=13>>13.\n#### 13", "13", "inconsistent"),
    ("He has <<5/0=0>>0.\n#### 0", "0", "inconsistent"),
    ("He has <<3*4=12>>12, so 15 in all.\n#### 15", "15", "answer_mismatch"),
])
def test_rows_that_break_a_rule_are_skipped_with_their_reason(worked, answer, reason):
    with pytest.raises(Unusable) as caught:
        derive_problem("Q?", worked, answer)
    assert caught.value.reason == reason


def real_rows(count):
    with (GSM8K / "train.jsonl").open() as fh:
        rows = [json.loads(next(fh)) for _ in range(count)]
    out = []
    for row in rows:
        try:
            out.append(derive_problem(row["question"], row["answer"], row["answer"].rpartition("####")[2].strip()))
        except Unusable:
            pass
    return out


WRONG_OP = {"+": "-", "-": "+", "*": "+", "/": "*"}


@needs_gsm8k
def test_reference_solutions_of_real_rows_pass_the_sandboxed_verifier_and_a_wrong_operator_fails():
    problems = real_rows(22) + [derive_problem(SHIRTS_Q, SHIRTS, "34")]
    assert len(problems) >= 20
    wrong = []
    for p in problems:
        graph = p.meta["graph"]
        for n in graph["nodes"][1:]:  # no private test or reference code in the prompt
            assert all(t["call"] not in p.prompt for t in n["tests"]) and graph["reference"][n["id"]] not in p.prompt
        code = graph["reference"]["f1"]
        body = code.split(":return ")[1]
        op = next(c for c in body if c in WRONG_OP)
        wrong.append(p.solution.replace(code, code.replace(f":return {body}", f":return {body.replace(op, WRONG_OP[op], 1)}")))
        assert wrong[-1] != p.solution
    with SandboxPool(2) as pool:
        verdicts = verify([p.solution for p in problems] + wrong, problems + problems, pool=pool)
    for v, p in zip(verdicts, problems):
        assert v.full_success and v.back == 1.0 and v.final == 1.0 and all(v.edges), (p.prompt, v)
    assert verdicts[len(problems) - 1].has_prop == [False, True, True, False]  # SHIRTS: main and f3 have none
    for v, p in zip(verdicts[len(problems):], problems):
        assert v.unit[1] < 1.0 and all(u == 1.0 for u in v.unit[2:]) and not v.full_success, p.solution
    assert REWARDS.get("fsg_full_success")(problems[0].solution, problems[0]) == 1.0


@pytest.fixture(scope="module")
def task():
    if not (GSM8K / "train.jsonl").is_file():
        pytest.skip(f"no GSM8K data at {GSM8K}")
    return GSM8KGraphTask(str(GSM8K), few_shot=2)


def test_the_task_coverage_splits_and_few_shot_prompts(task):
    assert TASKS.get("gsm8k_graph") is GSM8KGraphTask and task.stop_strings == ["\n"]
    assert task.coverage == {
        "train": {"graphs": 6875, "no_annotations": 187, "unparsable": 2, "inconsistent": 0, "answer_mismatch": 409},
        "test": {"graphs": 1192, "no_annotations": 31, "unparsable": 0, "inconsistent": 0, "answer_mismatch": 96},
    }
    train, held_out = task.train_problems(0, 16, 1), task.eval_problems(16)
    assert train == task.train_problems(0, 16, 1) and [p.meta["index"] for p in held_out[:3]] == [0, 1, 2]
    assert {p.meta["split"] for p in held_out} == {"test"}
    exemplars = train[0].prompt.split("\n\n")[:2]
    assert exemplars[0].startswith("main()\nf1(a,b):clips in May\n") and "<main>def main():" in exemplars[1]
    for p in train + held_out:
        own = p.prompt.split("\n\n")[-1]
        assert p.prompt.count("<main>") == 2 and p.solution not in p.prompt and own.startswith("main()\n")
        assert 0 not in [q.meta["index"] for q in train] and task.extract_answer(p.solution, p) == p.answer
    with pytest.raises(ValueError, match="few_shot must be >= 0"):
        GSM8KGraphTask(str(GSM8K), few_shot=-1)


def test_the_recipe_loads():
    recipe = load_recipe(RECIPE)
    assert recipe.task.name == "gsm8k_graph" and recipe.task.params["few_shot"] == 2
    assert (recipe.model.backend, recipe.model.path) == ("hf", "smollm2-135m")
    assert [m.name for m in recipe.methods] == ["fsg_verifier"] and recipe.advantage.name == "fsg_span"
    assert recipe.eval.reward == "fsg_answer" and recipe.loss.kl.coef == 0.03
