"""The chat-completions client (``isolation/openai_chat.post_chat``) bounds a WHOLE request by
``timeout_s``, not each socket read: servers that trickle the status line, trickle the body or
never answer time out within the deadline (issue 29, item 3); the FSG teacher judge then fails
open and the advisor raises ``AdvisorError``; a normal server and an HTTP proxy still work.

The time bounds below only prove that a request did not hang (a trickling server never ends on
its own); they are not speed targets."""

import json
import socket
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from reasonrl.methods.advisor import OpenAIChatAdvisor
from reasonrl.methods.advisor.advisors import AdvisorError
from reasonrl.methods.fsg.method import FSGVerifier
from reasonrl.methods.fsg.task import ALPHABET
from reasonrl.policy.char_tokenizer import build_char_tokenizer
from reasonrl.isolation.openai_chat import EndpointError, post_chat

from helpers import PENS, RIGHT, WRONG_F2, FSGPolicy, fsg_batch

REPLY = json.dumps({"choices": [{"message": {"role": "assistant", "content": "The answer is 472."}}]}).encode()
BODY = {"model": "m", "messages": [{"role": "user", "content": "1+1"}]}
HANG = 5.0  # a request that takes this long hung: the deadline is 1 s (3 s with retries)


class Server:
    """A raw TCP server answering each connection by ``mode``: ``status`` trickles the status
    line and then headers without end, one byte per 0.2 s; ``body`` sends the headers (a body
    of 1 MB announced) and then trickles the body; ``unsized`` the same with no length (the
    body ends when the connection does); ``silent`` reads the request and never answers;
    ``hangup`` reads it and closes the connection; ``normal`` answers at once. ``requests``:
    each request's first line."""

    def __init__(self, mode: str):
        self.mode, self.requests, self.stop = mode, [], threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/v1"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket):
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                head += chunk
            self.requests.append(head.split(b"\r\n")[0].decode())
            try:
                if self.mode == "normal":
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                                 + str(len(REPLY)).encode() + b"\r\n\r\n" + REPLY)
                elif self.mode in ("body", "unsized"):
                    length = b"Content-Length: 1000000\r\n" if self.mode == "body" else b""
                    conn.sendall(b"HTTP/1.1 200 OK\r\n" + length + b"\r\n{")
                    self._trickle(conn, b" ")
                elif self.mode == "hangup":
                    return
                elif self.mode == "status":
                    self._trickle(conn, b"HTTP/1.1 200 OK\r\n", then=b"X-Pad: 1\r\n")
                self.stop.wait()  # silent, or the client has gone
            except OSError:
                pass  # the client shut the connection down: what the deadline does

    def _trickle(self, conn: socket.socket, first: bytes, then: bytes | None = None):
        data = first
        while not self.stop.is_set():
            for i in range(len(data)):
                conn.sendall(data[i:i + 1])
                if self.stop.wait(0.2):
                    return
            data = then or first

    def close(self):
        self.stop.set()
        self.listener.close()


@pytest.fixture
def server():
    made = []

    def make(mode):
        made.append(Server(mode))
        return made[-1]

    yield make
    for s in made:
        s.close()


def _post(url, **kwargs):
    args = {"api_key": None, "timeout_s": 1.0, "retries": 0, "retry_wait_s": 0.0, "who": "test", **kwargs}
    return post_chat(url + "/chat/completions", BODY, **args)


@pytest.mark.parametrize("mode", ["status", "body", "unsized", "silent"])
def test_a_stalling_server_times_out_at_the_deadline(server, mode):
    stalling = server(mode)
    start = time.monotonic()
    with pytest.raises(EndpointError, match=r"test: POST http://127\.0\.0\.1:\d+/v1/chat/completions timed out "
                                            r"after 1 s \(1 attempt\(s\)\)"):
        _post(stalling.url)
    assert time.monotonic() - start < HANG
    assert stalling.requests == ["POST /v1/chat/completions HTTP/1.1"]


def test_each_retry_gets_its_own_deadline(server):
    stalling = server("status")
    start = time.monotonic()
    with pytest.raises(EndpointError, match=r"timed out after 1 s \(2 attempt\(s\)\)"):
        _post(stalling.url, retries=1, retry_wait_s=0.01)
    assert time.monotonic() - start < 2 * HANG and len(stalling.requests) == 2


def test_a_connection_cut_before_the_reply_is_retried_and_then_the_callers_error(server):
    hangup = server("hangup")  # http.client's RemoteDisconnected used to escape as itself
    with pytest.raises(EndpointError, match=r"test: POST .* failed: Remote end closed connection without response"):
        _post(hangup.url, retries=1, retry_wait_s=0.01)
    assert len(hangup.requests) == 2


def test_a_normal_server_answers(server):
    assert _post(server("normal").url) == "The answer is 472."


def test_a_tls_server_that_never_answers_times_out(server):
    silent = server("silent")  # accepts the TCP connection, never sends its TLS hello
    with pytest.raises(EndpointError, match=r"POST https://127\.0\.0\.1:\d+/v1/chat/completions timed out after 1 s"):
        _post(silent.url.replace("http:", "https:"))


def test_the_proxy_of_the_environment_is_used_as_urllib_does(server, monkeypatch):
    proxy = server("normal")
    for name in ("no_proxy", "NO_PROXY", "HTTP_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", proxy.url.removesuffix("/v1"))
    assert _post("http://judge.invalid/v1") == "The answer is 472."
    assert proxy.requests == ["POST http://judge.invalid/v1/chat/completions HTTP/1.1"]


def test_the_advisor_raises_its_error_on_a_trickling_server(server):
    adv = OpenAIChatAdvisor(base_url=server("body").url, model="m", timeout_s=1, retries=0)
    start = time.monotonic()
    with pytest.raises(AdvisorError, match=r"advisor openai_chat: POST .* timed out after 1 s \(1 attempt\(s\)\)"):
        adv.answer("1+1", None)
    assert time.monotonic() - start < HANG


def test_the_fsg_teacher_judge_fails_open_on_a_trickling_server(server):
    log = []
    method = FSGVerifier(teacher="openai_chat", teacher_params={"base_url": server("status").url, "model": "m",
                                                                "timeout_s": 1, "retries": 0})
    method.setup(SimpleNamespace(policy=FSGPolicy(build_char_tokenizer(ALPHABET)), recipe=None, log=log.append))
    batch = fsg_batch(method.tokenizer, PENS, [RIGHT, WRONG_F2], [0, 0])
    metrics = method.annotate(batch, 0)
    # The group's t = 0: R is the verifier's alone (test_fsg: 4.3 and 1.325), the group counted as failed.
    torch.testing.assert_close(batch.rewards, torch.tensor([4.3, 1.325]))
    assert metrics["fsg/teacher"] == 0.0 and metrics["fsg/teacher_failed"] == 1.0
    assert metrics["fsg/teacher_s"] < HANG
    assert len(log) == 1 and "failed on a group (its t = 0; fsg/teacher_failed is the share of groups that " \
                              "failed): FSGJudgeError: FSG judge openai_chat: POST" in log[0]
    assert log[0].endswith("timed out after 1 s (1 attempt(s))")
