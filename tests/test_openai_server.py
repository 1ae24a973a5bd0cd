"""The OpenAI-compatible endpoint over the policy (``reasonrl.policy.openai_server``): what a
client sends and gets back, and the token ids it keeps per conversation, on SmolLM2's real
tokenizer and chat template (ChatML: a reply is closed by ``<|im_end|>\\n``, pad == EOS).

The sampler is scripted: its replies are token ids chosen *not* to be what the tokenizer makes
of their text (one id per character), so a conversation whose ids came from re-tokenising the
returned text would differ from the ids sampled."""

import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from reasonrl.policy.openai_server import PolicyServer

from helpers import Scripted, char_ids, smollm2_tokenizer

MODEL = "reasonrl-policy"


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


def post(server, path, body, timeout=30, headers=None):
    req = urllib.request.Request(server.base_url + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def turn_of(text: str) -> int:
    return text.count("<|im_start|>assistant")


def test_a_two_turn_chat_trains_on_the_sampled_ids_and_the_templates_boundary(tok):
    sampler = Scripted(tok, lambda ctx: f"guess {10 * turn_of(ctx) + 2}")
    with PolicyServer(sampler, MODEL, batch_window_s=0.0) as server:
        first = [{"role": "user", "content": "Pick a number."}]
        status, r1 = post(server, "/chat/completions", {"model": MODEL, "messages": first, "logprobs": True})
        assert status == 200 and r1["choices"][0]["message"]["content"] == "guess 12"
        assert r1["choices"][0]["finish_reason"] == "stop"
        prompt = tok(tok.apply_chat_template(first, tokenize=False, add_generation_prompt=True),
                     add_special_tokens=False)["input_ids"]
        sampled1 = char_ids(tok, "guess 12") + [tok.eos_token_id]
        assert r1["prompt_token_ids"] == prompt and r1["choices"][0]["token_ids"] == sampled1
        assert [c["logprob"] for c in r1["choices"][0]["logprobs"]["content"]] == pytest.approx([-0.01 * k for k in range(1, 10)])

        second = [*first, {"role": "assistant", "content": "guess 12"}, {"role": "user", "content": "Higher."}]
        status, r2 = post(server, "/chat/completions", {"model": MODEL, "messages": second})
        assert status == 200 and r2["choices"][0]["message"]["content"] == "guess 22"
        conv = server.conversation(r2["choices"][0]["conversation_id"])
        assert conv.id == r1["choices"][0]["conversation_id"] and conv.turns == 2 and r2["id"] == f"chatcmpl-{conv.id}-2"

    # What the template writes after the reply: its boundary ("\n"; the EOS the model sampled
    # is <|im_end|> itself) and the new user turn, tokenised on their own.
    boundary = tok("\n<|im_start|>user\nHigher.<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    sampled2 = char_ids(tok, "guess 22") + [tok.eos_token_id]
    ids, logps, mask = conv.block()
    assert conv.prompt_ids == prompt
    assert ids == sampled1 + boundary + sampled2
    assert mask == [1] * len(sampled1) + [0] * len(boundary) + [1] * len(sampled2)
    assert logps[:9] == pytest.approx([-0.01 * k for k in range(1, 10)]) and logps[9:9 + len(boundary)] == [0.0] * len(boundary)
    # The second turn was sampled from exactly these ids, and they are not the template's own
    # rendering of the conversation (re-tokenised text, and its "\n" after the reply).
    assert sampler.calls[1] == [prompt + sampled1 + boundary]
    retokenised = tok(tok.apply_chat_template(second, tokenize=False, add_generation_prompt=True),
                      add_special_tokens=False)["input_ids"]
    assert retokenised != sampler.calls[1][0]


def test_a_reply_cut_at_max_tokens_gets_the_templates_end_of_turn_as_context(tok):
    sampler = Scripted(tok, lambda ctx: "a long answer", eos=False)
    with PolicyServer(sampler, MODEL, batch_window_s=0.0) as server:
        first = [{"role": "user", "content": "Go."}]
        _, r1 = post(server, "/chat/completions", {"model": MODEL, "messages": first, "max_tokens": 6})
        assert r1["choices"][0]["finish_reason"] == "length" and r1["choices"][0]["message"]["content"] == "a long"
        _, r2 = post(server, "/chat/completions", {"model": MODEL, "max_tokens": 6, "messages": [
            *first, {"role": "assistant", "content": "a long"}, {"role": "user", "content": "More."}]})
        conv = server.conversation(r2["choices"][0]["conversation_id"])
    ids, _, mask = conv.block()
    boundary = tok("<|im_end|>\n<|im_start|>user\nMore.<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    assert ids == char_ids(tok, "a long") + boundary + char_ids(tok, "a long")
    assert mask == [1] * 6 + [0] * len(boundary) + [1] * 6


def test_completions_continue_by_prompt_text_and_n_forks_conversations(tok):
    sampler = Scripted(tok, lambda ctx: f" x{ctx.count('x')}")
    with PolicyServer(sampler, MODEL, batch_window_s=0.0) as server:
        status, r1 = post(server, "/completions", {"model": MODEL, "prompt": "Count:", "n": 2, "logprobs": 1})
        assert status == 200 and [c["text"] for c in r1["choices"]] == [" x0", " x0"]
        a, b = (c["conversation_id"] for c in r1["choices"])
        assert a != b and r1["choices"][0]["logprobs"]["token_logprobs"] == pytest.approx([-0.01, -0.02, -0.03, -0.04])
        _, r2 = post(server, "/completions", {"model": MODEL, "prompt": "Count: x0 and"})
        assert r2["choices"][0]["text"] == " x1"
        _, r3 = post(server, "/completions", {"model": MODEL, "prompt": "Count: x0 and"})
        conv2, conv3 = (server.conversation(r["choices"][0]["conversation_id"]) for r in (r2, r3))
    # Each of the two forks is continued once; neither was re-tokenised.
    assert {conv2.id, conv3.id} == {a, b}
    sampled = char_ids(tok, " x0") + [tok.eos_token_id]
    assert conv2.block()[0] == sampled + tok(" and", add_special_tokens=False)["input_ids"] + char_ids(tok, " x1") + [tok.eos_token_id]
    assert conv2.prompt_ids == tok("Count:")["input_ids"]


def test_concurrent_requests_are_sampled_in_one_batch_each_answered_for_its_own_prompt(tok):
    sampler = Scripted(tok, lambda ctx: ctx.rsplit("user\n", 1)[1].split("<|im_end|>")[0].upper())
    answers = {}

    def ask(k):
        answers[k] = post(server, "/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": f"word{k}"}]})

    with PolicyServer(sampler, MODEL, batch_window_s=0.5) as server:
        threads = [threading.Thread(target=ask, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert {k: a[1]["choices"][0]["message"]["content"] for k, a in answers.items()} == {k: f"WORD{k}" for k in range(8)}
    assert len(sampler.calls) == 1 and len(sampler.calls[0]) == 8
    # sorted by their ids, whatever order they arrived in
    assert sampler.calls[0] == sorted(sampler.calls[0])


def test_requests_the_policy_cannot_serve_get_openai_style_errors(tok):
    sampler = Scripted(tok, lambda ctx: "ok")
    with PolicyServer(sampler, MODEL, max_context=64, batch_window_s=0.0) as server:
        msg = [{"role": "user", "content": "hi"}]
        status, r = post(server, "/chat/completions", {"model": "gpt-4o", "messages": msg})
        assert status == 404 and r["error"]["code"] == "model_not_found" and "reasonrl-policy" in r["error"]["message"]
        status, r = post(server, "/chat/completions", {"model": MODEL, "messages": msg, "max_tokens": 60})
        assert status == 400 and r["error"]["code"] == "context_length_exceeded" and "64" in r["error"]["message"]
        status, r = post(server, "/chat/completions", {"model": MODEL, "messages": []})
        assert status == 400 and r["error"]["code"] == "invalid_messages"
        status, r = post(server, "/chat/completions", {"model": MODEL, "messages": msg, "n": 0})
        assert status == 400 and r["error"]["code"] == "invalid_n"
        status, r = post(server, "/embeddings", {"model": MODEL})
        assert status == 404
        req = urllib.request.Request(server.base_url + "/completions", b"{not json", {"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=10)
        assert err.value.code == 400
        with urllib.request.urlopen(server.base_url + "/models", timeout=10) as r:
            assert json.loads(r.read())["data"][0]["id"] == MODEL
    assert sampler.calls == []  # nothing refused reached the sampler


def test_a_slow_or_failing_sampler_is_an_answer_not_a_hang(tok):
    with PolicyServer(Scripted(tok, lambda ctx: "ok", delay=3.0), MODEL, request_timeout_s=0.5, batch_window_s=0.0) as server:
        start = time.monotonic()
        status, r = post(server, "/completions", {"model": MODEL, "prompt": "Hi"})
        assert status == 504 and r["error"]["code"] == "timeout" and time.monotonic() - start < 2.5
    with PolicyServer(Scripted(tok, lambda ctx: "ok", fail=True), MODEL, batch_window_s=0.0) as server:
        status, r = post(server, "/completions", {"model": MODEL, "prompt": "Hi"})
        assert status == 500 and "fell over" in r["error"]["message"]
        assert isinstance(server.error, RuntimeError)


def test_tool_calls_are_parsed_and_the_conversation_goes_on_after_the_tool_answers(tok):
    call = '<tool_call>{"name": "calc", "arguments": {"expr": "6*7"}}</tool_call>'
    sampler = Scripted(tok, lambda ctx: f"Let me compute. {call}" if "tool\n" not in ctx else "It is 42.")
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}}}}]
    with PolicyServer(sampler, MODEL, batch_window_s=0.0) as server:
        first = [{"role": "user", "content": "6*7?"}]
        _, r1 = post(server, "/chat/completions", {"model": MODEL, "messages": first, "tools": tools})
        c1 = r1["choices"][0]
        assert c1["finish_reason"] == "tool_calls" and c1["message"]["content"] == "Let me compute."
        [tc] = c1["message"]["tool_calls"]
        assert tc["function"] == {"name": "calc", "arguments": '{"expr": "6*7"}'} and tc["type"] == "function"
        # as an OpenAI client sends the reply back: extra fields, the call with an index
        back = {"role": "assistant", "content": "Let me compute.", "refusal": None,
                "tool_calls": [{**tc, "index": 0}]}
        _, r2 = post(server, "/chat/completions", {"model": MODEL, "tools": tools, "messages": [
            *first, back, {"role": "tool", "tool_call_id": tc["id"], "content": "42"}]})
        assert r2["choices"][0]["message"] == {"role": "assistant", "content": "It is 42."}
        assert r2["choices"][0]["conversation_id"] == c1["conversation_id"]
        conv = server.conversation(c1["conversation_id"])
    boundary = tok("\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    assert conv.block()[0] == (char_ids(tok, f"Let me compute. {call}") + [tok.eos_token_id] + boundary
                               + char_ids(tok, "It is 42.") + [tok.eos_token_id])


def test_streamed_answers_and_sessions(tok):
    sampler = Scripted(tok, lambda ctx: "four")
    with PolicyServer(sampler, MODEL, batch_window_s=0.0) as server:
        body = {"model": MODEL, "stream": True, "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": "2+2?"}]}
        req = urllib.request.Request(server.base_url + "/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json", "X-Session-ID": "trace-7"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.headers["Content-Type"] == "text/event-stream"
            lines = [line for line in r.read().decode().split("\n\n") if line]
        assert lines[-1] == "data: [DONE]"
        events = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
        assert all(e["object"] == "chat.completion.chunk" for e in events)
        assert "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"]) == "four"
        assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]] == [None, "stop"]
        assert events[-1]["usage"]["completion_tokens"] == 5 and events[-1]["choices"] == []
        _, r = post(server, "/chat/completions", {"model": MODEL, "messages": [
            {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "four"}, {"role": "user", "content": "Sure?"}]},
            headers={"X-Session-ID": "trace-7"})
        [conv] = server.session("trace-7")
        assert conv.turns == 2 and conv.session == "trace-7" and r["choices"][0]["conversation_id"] == conv.id
        assert server.session("trace-8") == []


def test_a_stop_string_written_back_by_the_client_is_not_added_twice(tok):
    sampler = Scripted(tok, lambda ctx: "[7*5]" if "=35" not in ctx else "done")
    with PolicyServer(sampler, MODEL, batch_window_s=0.0) as server:
        _, r1 = post(server, "/completions", {"model": MODEL, "prompt": "Q:", "stop": ["]"]})
        c1 = r1["choices"][0]
        assert (c1["text"], c1["finish_reason"], c1["stop_reason"]) == ("[7*5", "stop", "]")
        # the calculator's client appends the closing tag it knows was sampled, then the answer
        _, r2 = post(server, "/completions", {"model": MODEL, "prompt": "Q:[7*5]=35", "stop": ["]"]})
        assert r2["choices"][0]["conversation_id"] == c1["conversation_id"] and r2["choices"][0]["stop_reason"] is None
        conv = server.conversation(c1["conversation_id"])
    first = char_ids(tok, "[7*5]") + [tok.eos_token_id]
    assert conv.block()[0] == first + tok("=35", add_special_tokens=False)["input_ids"] + char_ids(tok, "done") + [tok.eos_token_id]
