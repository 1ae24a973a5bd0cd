"""FSG-RL's teacher group judge (``fsg_verifier``'s ``teacher``; methods/fsg/judge.py): λ_teach·t in R
and λ_teach·t_n in R_n by hand, the seed of (step, row), failing judges, the ``reference`` judge's
differential tests in the sandbox, the ``openai_chat`` judge against a local stub, recipe errors."""

import json
import zlib
from types import SimpleNamespace

import pytest
import torch

from reasonrl.methods.fsg.advantage import SPAN_REWARDS_KEY
from reasonrl.config import load_recipe
from reasonrl.methods.fsg.method import FSGVerifier
from reasonrl.params import ConfigError
from reasonrl.policy.char_tokenizer import build_char_tokenizer
from reasonrl.methods.fsg.judge import FSG_JUDGES
from reasonrl.methods.fsg.execute import verify
from reasonrl.methods.fsg.judge import (FSGJudge, FSGJudgeError, Judgment, OpenAIChatJudge, ReferenceJudge,
                                        parse_reply)
from reasonrl.methods.fsg.parse import parse_completion
from reasonrl.methods.fsg.task import ALPHABET, KINDS, FunctionGraphTask, build_problem
from reasonrl.metrics_log import read_metrics
from reasonrl.train.trainer import Trainer

from helpers import (BAD_TAG, IDS, MINI_TINY, PENS, RECIPES, RIGHT, WRONG_F2, FSGPolicy, Stub, fsg_batch,
                     fsg_scripted_samples)


class Fixed(FSGJudge):
    """Hands back ``Fixed.answer`` (or raises it), recording the seed and group of every call."""

    answer: list | Exception = []
    calls: list = []

    def judge(self, problem, completions, parsed, verdicts, seed):
        Fixed.calls.append((seed, list(completions)))
        if isinstance(Fixed.answer, Exception):
            raise Fixed.answer
        return Fixed.answer


FSG_JUDGES.register("fixed_test")(Fixed)
LOG: list[str] = []


def _verifier(**kwargs):
    method = FSGVerifier(**kwargs)
    method.setup(SimpleNamespace(policy=FSGPolicy(build_char_tokenizer(ALPHABET)), recipe=None, log=LOG.append))
    return method


def test_the_teachers_scores_enter_r_and_r_n_by_hand():
    Fixed.answer = [Judgment(0.8, {"main": 1.0, "f1": 0.5}), Judgment(0.2), Judgment(1.0, {"f2": 0.0})]
    Fixed.calls = []
    method = _verifier(teacher="fixed_test")  # λ_teach = 0.25, the reference's teacher runs
    batch = fsg_batch(method.tokenizer, PENS, [RIGHT, WRONG_F2, BAD_TAG], [0, 0, 0])
    metrics = method.annotate(batch, 3)
    # Without the teacher R = [4.3, 1.325, 0] (test_fsg); R gains F·0.25·t: 0.25·0.8, 0.25·0.2, and 0 (F = 0).
    torch.testing.assert_close(batch.rewards, torch.tensor([4.5, 1.375, 0.0]))
    # R_n gains 0.25·t_n, a node the judge left out taking t (f2 of row 0: 0.8; every node of row 1: 0.2).
    want = torch.tensor([[3.675 + 0.25, 3.05 + 0.125, 3.075 + 0.2],
                         [1.21875 + 0.05, 0.96875 + 0.05, 0.6625 + 0.05],
                         [0.0, 0.0, 0.0]])  # F = 0: every R_n is 0, whatever the judge said
    torch.testing.assert_close(batch.aux[SPAN_REWARDS_KEY], want)
    assert metrics["fsg/teacher"] == pytest.approx(2 / 3) and metrics["fsg/teacher_failed"] == 0.0
    assert 0.0 <= metrics["fsg/teacher_s"] <= metrics["fsg/verify_s"]
    # One call for the group, seeded from (run seed 0, step 3, the group's first row 0): the same on a rerun.
    assert Fixed.calls == [(zlib.crc32(b"0:3:0"), [RIGHT, WRONG_F2, BAD_TAG])]
    method.annotate(fsg_batch(method.tokenizer, PENS, [RIGHT, WRONG_F2, BAD_TAG], [0, 0, 0]), 3)
    method.annotate(fsg_batch(method.tokenizer, PENS, [RIGHT, RIGHT, WRONG_F2], [5, 5, 6]), 4)
    assert [seed for seed, _ in Fixed.calls] == [zlib.crc32(b"0:3:0")] * 2 + [zlib.crc32(b"0:4:0"),
                                                                             zlib.crc32(b"0:4:2")]
    assert Fixed.calls[-1][1] == [WRONG_F2]  # the second group alone
    assert "fsg/teacher" not in _verifier().annotate(fsg_batch(method.tokenizer, PENS, [RIGHT], [0]), 0)


def test_a_failing_judge_zeroes_its_group_or_stops_the_run():
    parsed = [parse_completion(c, IDS) for c in (RIGHT, WRONG_F2)]
    method = _verifier(teacher="fixed_test", teacher_workers=1)
    for answer, message in ((FSGJudgeError("server down"), "server down"),
                            ([Judgment(1.5)], "expected a list of 2 Judgment"),
                            ([Judgment(1.5), Judgment(0.0)], r"judgment 0's score must be a number in \[0, 1\], got 1.5"),
                            ([Judgment(1.0, {"f9": 1.0}), Judgment(0.0)], r"unknown node\(s\) \['f9'\]")):
        Fixed.answer = answer
        t, t_n, failed = method.teach([RIGHT, WRONG_F2], [PENS] * 2, parsed, [None] * 2, [0, 0], 0)
        assert (t, t_n, failed) == ([0.0, 0.0], [[0.0] * 3] * 2, 1)  # fail open, as the reference
        assert LOG[-1].startswith("step 0: fsg_verifier teacher 'fixed_test' failed on a group") and message[:6] in LOG[-1]
        with pytest.raises(FSGJudgeError, match=message):
            _verifier(teacher="fixed_test", teacher_fail_open=False).teach(
                [RIGHT, WRONG_F2], [PENS] * 2, parsed, [None] * 2, [0, 0], 0)


def test_a_judge_of_ones_own_file(tmp_path):
    (tmp_path / "judge.py").write_text(
        "from reasonrl.methods.fsg.judge import Judgment\n"
        "class Half:\n"
        "    def __init__(self, score=0.5):\n"
        "        self.score = score\n"
        "    def judge(self, problem, completions, parsed, verdicts, seed):\n"
        "        return [Judgment(self.score, {'f1': 1.0}) for _ in completions]\n")
    method = _verifier(teacher=f"{tmp_path}/judge.py:Half", teacher_params={"score": 0.25})
    assert method.teach([RIGHT], [PENS], [None], [None], [0], 0) == ([0.25], [[0.25, 1.0, 0.25]], 0)


def test_the_reference_judge_scores_reference_solutions_1_and_careless_nodes_less():
    judge = ReferenceJudge()
    for kind in ("pens", "seats", "eggs"):
        problem, careless = next((p, c) for p in FunctionGraphTask(kinds=[kind]).train_problems(0, 16, 11)
                                 if (c := build_problem(KINDS[kind], p.meta["values"], careless=True).solution)
                                 != p.solution)  # a problem whose mistake has a natural value
        group = [problem.solution, careless]
        ids = [n["id"] for n in problem.meta["graph"]["nodes"]]
        right, wrong = judge.judge(problem, group, [parse_completion(c, ids) for c in group], None, seed=7)
        assert right == Judgment(1.0, {i: 1.0 for i in ids})
        bad = f"f{KINDS[kind].careless[0] + 1}"  # the helper with the wrong operator; main's code is still right
        right_nodes = [i for i in ids if i != bad]
        assert right_nodes, ids
        assert wrong.nodes[bad] < 1.0 and all(wrong.nodes[i] == 1.0 for i in right_nodes)
        assert wrong.score == pytest.approx(sum(wrong.nodes.values()) / len(ids)) and wrong.score < 1.0
    # main is tested against the reference helpers, scaled and shifted at random: a commutative argument
    # swap agrees, a miscopied number and a hard-coded answer do not; refused or missing code scores 0.
    group = [RIGHT.replace("f1(3,4)", "f1(4,3)"), RIGHT.replace(",5)#", ",6)#"), RIGHT.replace("f2(f1(3,4),5)", "7"),
             RIGHT.replace("return a*b", "import os;return a*b"), "junk"]
    got = judge.judge(PENS, group, [parse_completion(c, IDS) for c in group], None, seed=7)
    assert [j.nodes for j in got] == [{"main": 1.0, "f1": 1.0, "f2": 1.0}, {"main": 0.0, "f1": 1.0, "f2": 1.0},
                                      {"main": 0.0, "f1": 1.0, "f2": 1.0}, {"main": 1.0, "f1": 0.0, "f2": 1.0},
                                      {"main": 0.0, "f1": 0.0, "f2": 0.0}]
    with pytest.raises(FSGJudgeError, match=r"needs problem.meta\['graph'\]\['reference'\].*missing: \['f2'\]"):
        graph = {**PENS.meta["graph"], "reference": {"main": "", "f1": ""}}
        judge.judge(type(PENS)(PENS.prompt, PENS.answer, meta={"graph": graph}), [RIGHT], [None], None, seed=0)


def test_fsg_verifier_with_the_reference_judge_by_hand():
    method = _verifier(teacher="reference", teacher_params={"inputs": 4})
    batch = fsg_batch(method.tokenizer, PENS, [RIGHT, WRONG_F2], [0, 0])
    metrics = method.annotate(batch, 0)
    # RIGHT: t = 1. WRONG_F2: f2 = x+c disagrees with x-c on every draw (c >= 1): t_n = (1, 1, 0), t = 2/3.
    torch.testing.assert_close(batch.rewards, torch.tensor([4.3 + 0.25, 1.325 + 0.25 * 2 / 3]))
    torch.testing.assert_close(batch.aux[SPAN_REWARDS_KEY][1], torch.tensor([1.21875 + 0.25, 0.96875 + 0.25, 0.6625]))
    assert metrics["fsg/teacher"] == pytest.approx(5 / 6)


@pytest.fixture(scope="module")
def verdicts():
    return verify([RIGHT, WRONG_F2], [PENS] * 2)


def _reply(*judgments):
    return json.dumps({"rollout_judgments": list(judgments), "group_lesson": "x-c, not x+c"})


def test_the_openai_chat_judge_sends_the_group_and_reads_its_scores(verdicts, monkeypatch):
    reply = _reply({"index": 1, "overall_score": 0.25, "node_scores": {"f2": 0.0}, "diagnosis": "adds"},
                   {"index": 0, "overall_score": 1, "node_scores": {"main": 1.0, "f1": 1.0, "f2": 1.0}})
    server = Stub(reply=f"```json\n{reply}\n```")  # a Markdown fence is dropped, as the reference does
    try:
        monkeypatch.setenv("FSG_JUDGE_TEST_KEY", "sk-judge")
        judge = OpenAIChatJudge(base_url=server.url, model="teacher-model", api_key_env="FSG_JUDGE_TEST_KEY")
        got = judge.judge(PENS, [RIGHT, WRONG_F2], [parse_completion(c, IDS) for c in (RIGHT, WRONG_F2)],
                          verdicts, seed=42)
        assert got == [Judgment(1.0, {"main": 1.0, "f1": 1.0, "f2": 1.0}), Judgment(0.25, {"f2": 0.0})]
        path, headers, body = server.requests[0]
    finally:
        server.close()
    assert path == "/v1/chat/completions" and headers["Authorization"] == "Bearer sk-judge"
    assert {k: body[k] for k in ("model", "temperature", "max_tokens", "seed")} == \
        {"model": "teacher-model", "temperature": 0.0, "max_tokens": 2048, "seed": 42}
    assert [m["role"] for m in body["messages"]] == ["system", "user"] and "response_format" not in body
    user = json.loads(body["messages"][1]["content"])
    assert user["problem"] == PENS.prompt
    assert user["function_graph"]["nodes"][1] == {"id": "f1", "signature": "f1(a,b)", "question": "pens"}
    assert user["function_graph"]["edges"][0] == {"source": "f1", "target": "f2", "relation": "uses_value"}
    assert [c["solution"] for c in user["candidates"]] == [RIGHT, WRONG_F2]
    # The coarse public summary: what ran and how many hidden tests passed, never the tests themselves.
    assert user["candidates"][1]["execution"] == {"format_ok": True, "nodes": {
        "main": {"executable": True, "unit_tests_passed": "1/1"},
        "f1": {"executable": True, "unit_tests_passed": "3/3", "property_tests_passed": "1/1"},
        "f2": {"executable": True, "unit_tests_passed": "0/3", "property_tests_passed": "0/1"}}}
    assert "expected" not in body["messages"][1]["content"] and "return a*b#" not in body["messages"][1]["content"]


@pytest.mark.parametrize("content, message", [
    ("I think candidate 0 is best.", "the reply is not a JSON object"),
    (json.dumps({"scores": [1, 0]}), r"the reply needs a list 'rollout_judgments'.*got \['scores'\]"),
    (_reply({"index": 0, "overall_score": 1}, {"index": 0, "overall_score": 1}), r"rollout_judgments\[1\]\.index must"),
    (_reply({"index": 0, "overall_score": "high"}, {"index": 1, "overall_score": 0}),
     r"rollout_judgments\[0\]\.overall_score must be a number in \[0, 1\], got 'high'"),
    (_reply({"index": 0, "overall_score": 1, "node_scores": {"f9": 1}}, {"index": 1, "overall_score": 0}),
     r"rollout_judgments\[0\]\.node_scores has unknown node id\(s\) \['f9'\]; the graph's: main, f1, f2"),
    (_reply({"index": 1, "overall_score": 0.5, "node_scores": {"f1": 2}}),
     r"rollout_judgments\[0\]\.node_scores\.f1 must be a number in \[0, 1\], got 2"),
    (_reply({"index": 1, "overall_score": 0.5}), r"the reply has no judgment for candidate\(s\) \[0\]"),
])
def test_a_malformed_reply_is_a_clear_error(content, message):
    with pytest.raises(FSGJudgeError, match="FSG judge openai_chat: " + message):
        parse_reply(content, 2, IDS, "FSG judge openai_chat")


def test_the_openai_chat_judge_fails_clearly_on_http_errors_and_bad_replies(verdicts):
    broken, chatty = Stub(status=500), Stub(reply="Candidate 0 looks right.")
    try:
        parsed = [parse_completion(c, IDS) for c in (RIGHT, WRONG_F2)]
        with pytest.raises(FSGJudgeError, match=r"FSG judge openai_chat: POST http://127\.0\.0\.1:\d+/v1/chat/"
                                                r"completions returned HTTP 500 Internal Server Error"):
            OpenAIChatJudge(base_url=broken.url, model="m", retries=0).judge(PENS, [RIGHT, WRONG_F2], parsed,
                                                                             verdicts, seed=0)
        with pytest.raises(FSGJudgeError, match="not a JSON object"):
            OpenAIChatJudge(base_url=chatty.url, model="m").judge(PENS, [RIGHT, WRONG_F2], parsed, verdicts, seed=0)
    finally:
        broken.close()
        chatty.close()


BAD = [
    ({"teacher": "referense"}, "unknown FSG judge 'referense'.*Did you mean 'reference'"),
    ({"teacher": "reference", "teacher_params": {"input": 3}},
     r"unknown parameter 'teacher_params\.input'; allowed: inputs.*Did you mean 'inputs'"),
    ({"teacher": "reference", "teacher_params": {"inputs": 0}}, r"teacher_params\.inputs must be >= 1"),
    ({"teacher": "reference", "teacher_params": {"low": 5, "high": 2}}, "low must be <= teacher_params.high"),
    ({"teacher": "openai_chat"}, r"needs teacher_params\.base_url"),
    ({"teacher_params": {"inputs": 3}}, "teacher_params is set but teacher is not"),
    ({"lambda_teach": 1.0}, "lambda_teach weighs the teacher judge's scores, and teacher is not set"),
    ({"teacher": "reference", "lambda_teach": -1}, "lambda_teach must be >= 0"),
]


@pytest.mark.parametrize("params, message", BAD, ids=[m[:30] for _, m in BAD])
def test_bad_teacher_settings_are_recipe_errors(params, message):
    with pytest.raises(ConfigError, match=message):
        load_recipe(RECIPES / "fsg_rl.yaml", [f"methods=[{json.dumps({'name': 'fsg_verifier', **params})}]"])


def test_a_teacher_recipe_loads():
    line = {"name": "fsg_verifier", "teacher": "reference", "teacher_params": {"inputs": 4}, "lambda_teach": 0.5}
    recipe = load_recipe(RECIPES / "fsg_rl.yaml", [f"methods=[{json.dumps(line)}]"])
    assert recipe.methods[0].params["teacher_params"] == {"inputs": 4}


def test_the_recipe_trains_with_the_reference_teacher(tmp_path, monkeypatch):
    fsg_scripted_samples(monkeypatch)  # even rows: the reference solution; odd rows: the careless one
    line = {"name": "fsg_verifier", "teacher": "reference", "teacher_params": {"inputs": 2}}
    overrides = [f"model.tiny.{k}={v}" for k, v in MINI_TINY.items()] + [
        f"methods=[{json.dumps(line)}]", "train.steps=2", "train.prompts_per_step=2", "rollout.num_generations=2",
        "eval.size=2", "eval.max_new_tokens=8", "log.plots=false", "log.progress=false"]
    Trainer(load_recipe(RECIPES / "fsg_rl.yaml", overrides), tmp_path / "run", log=lambda m: None).run()
    rows = [r for r in read_metrics(tmp_path / "run") if r["step"] > 0 and "fsg/teacher" in r]
    assert len(rows) == 2
    for row in rows:  # half the rows are reference solutions (t = 1), half careless ones (one helper of 1-3 wrong)
        assert 0.75 <= row["fsg/teacher"] <= 1.0 and row["fsg/teacher_failed"] == 0.0 and row["fsg/teacher_s"] > 0
