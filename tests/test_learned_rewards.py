"""Learned rewards (``reasonrl.rewards.learned``): a sequence-classification reward model built
here (equal to the model's own logits, batched or not, normalised by the formulas), and an LLM
judge against a local fake endpoint (scores parsed by hand, a parse failure or a dead endpoint is
0 and a counted failure, never a crash, and a cached reply is never asked for twice)."""

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from transformers import LlamaConfig, LlamaForSequenceClassification

from reasonrl.policy.char_tokenizer import build_char_tokenizer
from reasonrl.problem import Problem
from reasonrl.rewards.learned import llm_judge, parse_score, reward_model
from reasonrl.rewards.scorer import RewardSpec, Scorer

PROBLEM = Problem("(1+2)*3;", "9")


def test_parse_score_takes_the_last_number_after_the_prefix():
    assert parse_score("SCORE: 7") == 7.0
    assert parse_score("first score: 2 ... then **Score:** 8.5\n") == 8.5
    assert parse_score("SCORE: -1") == -1.0
    assert parse_score("I give it 7/10") is None
    assert parse_score("RATING 4", prefix="RATING") == 4.0


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    torch.manual_seed(0)
    tok = build_char_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                      pad_token_id=tok.pad_token_id, num_labels=2)
    model = LlamaForSequenceClassification(cfg).eval()
    folder = tmp_path_factory.mktemp("rm")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder), model, tok


def logits_one_by_one(model, tok, texts):
    out = []
    for t in texts:
        with torch.no_grad():
            out.append(model(**tok([t], return_tensors="pt")).logits[0].float())
    return torch.stack(out)


def test_reward_model_is_the_models_logit_batched_and_normalised(classifier):
    path, model, tok = classifier
    completions = ["1+2=3;3*3=9;####9", "####9", "1+2=3;####8"]
    z = logits_one_by_one(model, tok, [PROBLEM.prompt + c for c in completions])
    kw = {"num_tokens": [1] * 3, "truncated": [False] * 3, "path": path}
    # batched (left-padded to the longest): the same logits as one at a time
    assert reward_model(completions, PROBLEM, **kw) == pytest.approx(z[:, 0].tolist(), abs=1e-5)
    assert reward_model(completions, PROBLEM, **kw, label=1) == pytest.approx(z[:, 1].tolist(), abs=1e-5)
    sig = reward_model(completions, PROBLEM, **kw, normalize="sigmoid", shift=0.1, scale=2.0)
    assert sig == pytest.approx([1 / (1 + math.exp(-(float(v) - 0.1) / 2.0)) for v in z[:, 0]], abs=1e-6)
    tanh = reward_model(completions, PROBLEM, **kw, normalize="tanh")
    assert tanh == pytest.approx([math.tanh(float(v)) for v in z[:, 0]], abs=1e-6)
    with pytest.raises(ValueError, match="label 2 but the model"):
        reward_model(completions, PROBLEM, **kw, label=2)


def test_reward_model_scores_groups_in_the_scorers_workers(classifier):
    path, model, tok = classifier
    texts = ["####9", "####1", "1+2=3;####9", "####4"]
    z = logits_one_by_one(model, tok, [PROBLEM.prompt + c for c in texts])
    with Scorer([RewardSpec("reward_model", 1.0, {"path": path})]) as scorer:
        scores = scorer(texts, [PROBLEM] * 4, [1] * 4, [False] * 4, group_size=2)
        assert scores.total == pytest.approx(z[:, 0].tolist(), abs=1e-5) and scores.failures == {"reward_model": 0}
    with Scorer([RewardSpec("reward_model", 1.0, {"path": "/no/such/model"})]) as scorer:
        scores = scorer(texts, [PROBLEM] * 4, [1] * 4, [False] * 4, group_size=2)
        assert scores.total == [0.0] * 4 and scores.failures == {"reward_model": 4}


class Judge:
    """A fake chat-completions endpoint: replies from ``answer(prompt)``, after ``delay`` s;
    ``fail_first`` requests answer HTTP 500. Records every request body."""

    def __init__(self, answer, delay=0.0, fail_first=0):
        self.answer, self.delay, self.fail_first, self.bodies = answer, delay, fail_first, []
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                judge.bodies.append(body)
                time.sleep(judge.delay)
                if len(judge.bodies) <= judge.fail_first:
                    self.send_response(500)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = json.dumps({"choices": [{"message": {"role": "assistant",
                                                            "content": judge.answer(body["messages"][0]["content"])}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def grade(prompt: str) -> str:
    """7 for a completion with the right answer, 12 (clipped) for '####99', no score for '####0'."""
    completion = prompt.split("ANSWER:\n")[1]
    if completion.endswith("####0"):
        return "I cannot tell."
    return "Sound. SCORE: 12" if completion.endswith("####99") else f"Reasoning ok. SCORE: {7 if completion.endswith('####9') else 2}"


RUBRIC = "Q:\n{question}\nREF:\n{answer}\nANSWER:\n{completion}"


def test_llm_judge_scores_parses_and_counts_what_it_cannot_parse():
    judge = Judge(grade)
    try:
        params = {"base_url": judge.url, "model": "judge", "rubric": RUBRIC}
        with Scorer([RewardSpec("llm_judge", 1.0, params)]) as scorer:
            scores = scorer(["####9", "####4", "####99", "####0"], [PROBLEM] * 4, [1] * 4, [False] * 4)
        assert scores.total == pytest.approx([0.7, 0.2, 1.0, 0.0]) and scores.failures == {"llm_judge": 1}
        asked = sorted(b["messages"][0]["content"] for b in judge.bodies)
        assert asked[0] == "Q:\n(1+2)*3;\nREF:\n9\nANSWER:\n####0"
        assert all(b["model"] == "judge" and b["temperature"] == 0.0 for b in judge.bodies)
    finally:
        judge.close()


def test_llm_judge_caches_replies_in_memory_and_on_disk(tmp_path):
    judge = Judge(grade)
    cache = str(tmp_path / "judge.jsonl")
    try:
        params = {"base_url": judge.url, "model": "judge", "rubric": RUBRIC, "cache_path": cache}
        assert llm_judge("####9", PROBLEM, **params) == pytest.approx(0.7)
        assert llm_judge("####9", PROBLEM, **params) == pytest.approx(0.7)
        assert len(judge.bodies) == 1
        with Scorer([RewardSpec("llm_judge", 1.0, params)]) as scorer:  # fresh workers: read back from the file
            assert scorer(["####9", "####4"], [PROBLEM] * 2, [1] * 2, [False] * 2).total == pytest.approx([0.7, 0.2])
        assert len(judge.bodies) == 2  # only "####4" was new
    finally:
        judge.close()


def test_a_slow_or_failing_judge_is_a_zero_not_a_hang():
    slow = Judge(grade, delay=5.0)
    flaky = Judge(grade, fail_first=1)
    try:
        start = time.monotonic()
        with Scorer([RewardSpec("llm_judge", 1.0, {"base_url": slow.url, "model": "j", "rubric": RUBRIC,
                                                   "request_timeout_s": 0.5, "retries": 0})]) as scorer:
            scores = scorer(["####9"], [PROBLEM], [1], [False])
        assert scores.total == [0.0] and scores.failures == {"llm_judge": 1} and time.monotonic() - start < 4.0
        # one HTTP 500, then an answer: the retry scores it
        assert llm_judge("####9", PROBLEM, base_url=flaky.url, model="j", rubric=RUBRIC, retries=1,
                         retry_wait_s=0.0) == pytest.approx(0.7)
        assert len(flaky.bodies) == 2
        with pytest.raises(ValueError, match="base_url"):
            llm_judge("####9", PROBLEM, model="j")
    finally:
        slow.close()
        flaky.close()
