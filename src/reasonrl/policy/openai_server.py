"""An OpenAI-compatible endpoint over the policy (``/v1/chat/completions``, ``/v1/completions``)
that keeps the exact token ids of everything it samples.

Environments written for other trainers (verifiers, and any agent loop that speaks the OpenAI
API) ask a model through a client; this server answers them with our sampler (``HFPolicy``, or
the vLLM engine's ``VLLMSampler``: whatever has ``sample_ids`` and ``tokenizer``) and records,
per **conversation**, the ids the trainer will train on::

    [prompt ids][turn 1: sampled ids][boundary + environment ids][turn 2: sampled ids] …
                 loss 1 (log-probs)    loss 0                       loss 1

**Nothing is re-tokenised that the model sampled.** A request that continues a conversation (its
messages repeat an assistant reply this server gave, or its prompt text starts with an earlier
prompt and its completion) is served from the conversation's ids plus the ids of what is new:
for chat, the chat template's text after the last reply (the template's turn boundary, e.g.
ChatML's ``<|im_end|>\\n``, and the new messages), found by rendering the conversation with a
sentinel in place of the reply; for completions, the prompt text after the earlier one. Where a
template closes a reply with the EOS the model already sampled, that EOS is not added twice.
Peers that re-tokenise the returned text train on other ids than were sampled (TRL #5224,
verl #6501: 783 of 10,726 conversations).

A request that continues nothing starts a conversation. Each choice of a response names its
conversation (``conversation_id``, also in the response ``id``: ``chatcmpl-<conversation>-<turn>``)
so the caller finds the ids of a finished rollout; vLLM's ``prompt_token_ids`` and
``token_ids`` extensions are in every response too.

**Batching.** Requests are queued and sampled together: the batcher takes what arrives within
``batch_window_s`` of the first request (at most ``max_batch`` rows), groups it by temperature
and stop strings, sorts each group by its token ids (so the same set of requests is sampled in
the same order whatever order they came in), and makes one ``sample_ids`` call per group with the
server's random generator. Samples still depend on which requests share a batch (they arrive
when the client sends them), so a run with an endpoint repeats its samples only as far as its
requests arrive in the same batches.

**Errors** are OpenAI-style JSON: an unknown model (404, ``model_not_found``), a prompt plus
``max_tokens`` beyond the model's context (400, ``context_length_exceeded``), a malformed body
(400), a request not served within ``request_timeout_s`` (504), a failed sampler
(500; ``error`` keeps it for the trainer to raise). The server binds 127.0.0.1 by default and
checks no API key: it is the rollout side's, not a public service.
"""

from __future__ import annotations

import json
import queue
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

from reasonrl.policy.sampling import cut_at_stop, left_pad

__all__ = ["Conversation", "PolicyServer", "RequestError", "model_context", "parse_tool_calls", "stream_events"]

MAX_BODY_BYTES = 16 * 2**20
SENTINEL = "\u27e6reasonrl:reply\u27e7"  # stands for a reply when the chat template is rendered
TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


class _Server(ThreadingHTTPServer):
    # A step opens one connection per rollout at once; socketserver's backlog of 5 refused the
    # rest (seen: 8 of 32 verifiers rollouts failed with an empty provider error; none with this backlog).
    request_queue_size = 1024


class RequestError(Exception):
    """A request this server refuses: HTTP ``status``, OpenAI error ``code``."""

    def __init__(self, status: int, message: str, code: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.code, self.kind = status, code, kind


@dataclass
class Conversation:
    """The token ids of one conversation: the first prompt's ids, then segments of sampled ids
    (``loss`` 1, with their log-probs) and of template or environment ids (``loss`` 0)."""

    id: int
    prompt_ids: list[int]
    segments: list[tuple[list[int], list[float], int]] = field(default_factory=list)
    turns: int = 0
    finish_reason: str | None = None
    session: str | None = None  # the client's X-Session-ID (verifiers sends its trace id)
    keys: list[str] = field(default_factory=list, repr=False)  # where it waits to be continued

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + [t for ids, _, _ in self.segments for t in ids]

    def block(self) -> tuple[list[int], list[float], list[int]]:
        """The completion block (everything after the first prompt): ids, log-probs (0 on
        loss-0 tokens) and the loss mask."""
        ids = [t for s, _, _ in self.segments for t in s]
        logps = [lp for s, lps, loss in self.segments for lp in (lps if loss else [0.0] * len(s))]
        mask = [loss for s, _, loss in self.segments for _ in s]
        return ids, logps, mask


@dataclass
class _Job:
    context: list[int]
    n: int
    max_tokens: int
    temperature: float
    stop: tuple[str, ...]
    done: threading.Event = field(default_factory=threading.Event)
    result: list[tuple[list[int], list[float], str, str, str | None]] | None = None  # ids, logps, text, finish, stop
    error: BaseException | None = None


def _content(message: dict) -> str:
    """A message's text: a string content, or the text parts of a list content."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type", "text") == "text")
    raise RequestError(400, f"a message's content must be a string or a list of parts, got {type(content).__name__}",
                       "invalid_content")


def _calls_key(message: dict) -> list | None:
    calls = message.get("tool_calls") or None
    if calls is None:
        return None
    try:
        return [(c["function"]["name"], c["function"]["arguments"]) for c in calls]
    except (KeyError, TypeError) as e:
        raise RequestError(400, f"a tool call must have function.name and function.arguments: {e!r}", "invalid_tool_calls") from e


def _message_key(messages: list[dict]) -> str:
    """What identifies a conversation so far: roles, texts and tool calls (not ids, names or
    fields a client library adds)."""
    return json.dumps([(m.get("role"), _content(m), _calls_key(m)) for m in messages], ensure_ascii=False)


def parse_tool_calls(text: str) -> tuple[str, list[dict]]:
    """Hermes-style calls in a reply, ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
    (the form Qwen's, Hermes' and SmolLM's tool templates teach): the text around them and the
    calls as OpenAI ``tool_calls`` (without ids). A block that is not such JSON stays text."""
    calls, kept, at = [], [], 0
    for m in TOOL_CALL_RE.finditer(text):
        try:
            call = json.loads(m.group(1))
            name, args = call["name"], call.get("arguments", {})
            if not isinstance(name, str):
                raise TypeError(name)
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
        kept.append(text[at:m.start()])
        at = m.end()
        calls.append({"type": "function", "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}})
    kept.append(text[at:])
    return "".join(kept).strip() if calls else text, calls


class PolicyServer:
    """An OpenAI-compatible server over ``sampler`` on ``host:port`` (0: a free port), in threads
    of this process. ``with PolicyServer(...) as server: ... server.base_url``.

    ``model``: the one model name it serves. ``max_context``: prompt + max_tokens bound (None: the
    sampler's ``max_context``, else its model's ``max_position_embeddings``). ``generator``: the
    random stream of its draws."""

    def __init__(self, sampler, model: str = "reasonrl-policy", host: str = "127.0.0.1", port: int = 0,
                 max_batch: int = 64, batch_window_s: float = 0.05, request_timeout_s: float = 600.0,
                 max_context: int | None = None, default_max_tokens: int = 256,
                 generator: torch.Generator | None = None) -> None:
        if max_batch < 1 or batch_window_s < 0 or request_timeout_s <= 0:
            raise ValueError("max_batch must be >= 1, batch_window_s >= 0 and request_timeout_s > 0")
        self.sampler, self.tokenizer, self.model = sampler, sampler.tokenizer, model
        self.max_batch, self.window, self.timeout = max_batch, batch_window_s, request_timeout_s
        self.max_context = max_context if max_context is not None else model_context(sampler)
        self.default_max_tokens = default_max_tokens
        self.generator = generator if generator is not None else torch.Generator().manual_seed(0)
        self.error: BaseException | None = None
        self.requests = 0
        self._conversations: dict[int, Conversation] = {}
        self._open: dict[str, list[int]] = {}  # continuation key -> conversations that ended there
        self._sessions: dict[str, list[int]] = {}
        self._lock = threading.Lock()
        # One thread at a time in the tokenizer: a fast tokenizer used from two threads at once can
        # raise "Already borrowed" (its padding settings are shared state).
        self._tok = threading.RLock()
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._httpd = _Server((host, port), _handler(self))
        self._httpd.daemon_threads = True
        self._threads = [threading.Thread(target=self._httpd.serve_forever, name="openai-server", daemon=True),
                         threading.Thread(target=self._batch_loop, name="openai-batcher", daemon=True)]
        for t in self._threads:
            t.start()

    # -- lifetime ---------------------------------------------------------
    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._jobs.put(None)
        for t in self._threads:
            t.join(timeout=10)

    def __enter__(self) -> PolicyServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- what the trainer reads -------------------------------------------
    def conversation(self, conversation_id: int) -> Conversation:
        with self._lock:
            if conversation_id not in self._conversations:
                raise KeyError(f"no conversation {conversation_id} on this server")
            return self._conversations[conversation_id]

    def session(self, session_id: str) -> list[Conversation]:
        """The conversations of requests that carried ``X-Session-ID: session_id``, oldest first."""
        with self._lock:
            return [self._conversations[c] for c in self._sessions.get(session_id, [])]

    def forget(self) -> None:
        """Drop every conversation (between training steps: their ids are in the batch now)."""
        with self._lock:
            self._conversations.clear()
            self._open.clear()
            self._sessions.clear()

    # -- requests -----------------------------------------------------------
    def handle(self, path: str, body: dict, session: str | None = None) -> dict:
        if body.get("model") != self.model:
            raise RequestError(404, f"the model {body.get('model')!r} does not exist; this server serves {self.model!r}",
                               "model_not_found")
        n = _int(body, "n", 1, 1, 64)
        max_tokens = _int(body, "max_completion_tokens", None, 1, None)
        if max_tokens is None:
            max_tokens = _int(body, "max_tokens", self.default_max_tokens, 1, None)
        temperature = body.get("temperature", 1.0)
        if not isinstance(temperature, (int, float)) or not 0 <= temperature <= 10:
            raise RequestError(400, f"temperature must be a number in [0, 10], got {temperature!r}", "invalid_temperature")
        stop = body.get("stop") or ()
        stop = (stop,) if isinstance(stop, str) else tuple(stop)
        if not all(isinstance(s, str) and s for s in stop):
            raise RequestError(400, "stop must be a string or a list of non-empty strings", "invalid_stop")
        chat = path.endswith("/chat/completions")
        parent, context = self._chat_context(body) if chat else self._text_context(body)
        if len(context) + max_tokens > self.max_context:
            raise RequestError(400, f"this model's context is {self.max_context} tokens; the prompt has {len(context)} "
                               f"and max_tokens asks for {max_tokens} more", "context_length_exceeded")
        job = _Job(context, n, max_tokens, float(temperature), stop)
        self._jobs.put(job)
        if not job.done.wait(self.timeout):
            raise RequestError(504, f"not served within {self.timeout:g} s (request_timeout_s)", "timeout", "server_error")
        if job.error is not None:
            raise RequestError(500, f"the sampler failed: {job.error!r}", "sampler_error", "server_error")
        return self._respond(body, chat, parent, context, job, session)

    def _chat_context(self, body: dict) -> tuple[Conversation | None, list[int]]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise RequestError(400, "messages must be a non-empty list of {role, content} objects", "invalid_messages")
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise RequestError(400, "the policy's tokenizer has no chat template; use /v1/completions", "no_chat_template")
        kwargs = {"tools": body["tools"]} if body.get("tools") else {}
        for j in range(len(messages) - 1, -1, -1):
            if messages[j].get("role") != "assistant":
                continue
            parent = self._continue(_message_key(messages[: j + 1]))
            if parent is None:
                continue
            # The template's text after the reply: its turn boundary, the new messages and the
            # generation prompt, with a sentinel standing for the reply (whatever the template does
            # to earlier turns, the ids before the reply are the conversation's own).
            stand_in = [*messages[:j], {"role": "assistant", "content": SENTINEL}, *messages[j + 1:]]
            text = self._render(stand_in, kwargs)
            if text.count(SENTINEL) != 1:
                raise RequestError(400, "the chat template dropped or repeated the last reply; this conversation cannot "
                                   "be continued token-exactly", "template_unsupported")
            after = text.split(SENTINEL, 1)[1]
            last = parent.segments[-1][0] if parent.segments else []
            eos_text = self._decode([self.tokenizer.eos_token_id]) if self.tokenizer.eos_token_id is not None else ""
            if last and last[-1] == self.tokenizer.eos_token_id and eos_text and after.startswith(eos_text):
                after = after[len(eos_text):]  # the model sampled the template's end of turn
            return parent, parent.context + self._ids(after)
        return None, self._ids(self._render(messages, kwargs))

    def _text_context(self, body: dict) -> tuple[Conversation | None, list[int]]:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return None, list(prompt)  # token ids as given
        if not isinstance(prompt, str) or not prompt:
            raise RequestError(400, "prompt must be a non-empty string (or a list of token ids; one prompt per request)",
                               "invalid_prompt")
        with self._lock:
            keys = [k for k in self._open if self._open[k] and prompt.startswith(k)]
        for key in sorted(keys, key=len, reverse=True):
            parent = self._continue(key)
            if parent is not None:
                return parent, parent.context + self._ids(prompt[len(key):])
        with self._tok:
            ids, mask = self.sampler.encode_prompts([prompt])  # as a task's prompt: its special tokens, its chat wrapping
        return None, ids[0][mask[0].bool()].tolist()

    def _continue(self, key: str) -> Conversation | None:
        with self._lock:
            waiting = self._open.get(key)
            if not waiting:
                return None
            conv = self._conversations[waiting[0]]
            for k in conv.keys:  # continued once: no longer waiting under any of its keys
                self._open[k].remove(conv.id)
            conv.keys = []
            return conv

    def _wait(self, conv: Conversation, key: str) -> None:
        self._open.setdefault(key, []).append(conv.id)
        conv.keys.append(key)

    def _render(self, messages: list[dict], kwargs: dict) -> str:
        try:
            with self._tok:
                return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
        except Exception as e:  # a template that rejects these messages (roles, tools)
            raise RequestError(400, f"the chat template could not render these messages: {e}", "template_error") from e

    def _decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        with self._tok:
            return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def _ids(self, text: str) -> list[int]:
        if not text:
            return []
        with self._tok:
            return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _respond(self, body: dict, chat: bool, parent: Conversation | None, context: list[int], job: _Job,
                 session: str | None) -> dict:
        choices, first = [], None
        base = list(parent.segments) if parent is not None else []  # before this turn: forks start here
        turns = parent.turns if parent is not None else 0
        new_ids = context[len(parent.context):] if parent is not None else []
        for index, (ids, logps, text, finish, stop_reason) in enumerate(job.result):
            with self._lock:
                if parent is not None and index == 0:
                    conv = parent  # the first choice continues the conversation, the others fork it
                else:
                    conv = Conversation(len(self._conversations), parent.prompt_ids if parent is not None else list(context),
                                        list(base), turns, session=session)
                    self._conversations[conv.id] = conv
                    if session is not None:
                        self._sessions.setdefault(session, []).append(conv.id)
                if new_ids:
                    conv.segments.append((new_ids, [], 0))
                conv.segments.append((ids, logps, 1))
                conv.turns += 1
                conv.finish_reason = finish
                if chat:
                    content, calls = parse_tool_calls(text) if body.get("tools") else (text, [])
                    for k, call in enumerate(calls):
                        call["id"] = f"call_{conv.id}_{conv.turns}_{k}"
                    reply = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
                    self._wait(conv, _message_key([*body["messages"], reply]))
                elif isinstance(body["prompt"], str) or isinstance(body["prompt"][0], str):
                    # The text returned stops before the stop string, which was sampled: a client that
                    # writes it back (an action's closing tag) continues as well as one that does not.
                    key = (body["prompt"] if isinstance(body["prompt"], str) else body["prompt"][0]) + text
                    self._wait(conv, key)
                    if stop_reason:
                        self._wait(conv, key + stop_reason)
                first = conv if first is None else first
            choice: dict[str, Any] = {"index": index, "finish_reason": finish, "stop_reason": stop_reason,
                                      "conversation_id": conv.id, "token_ids": ids}
            tokens = [self._decode([t]) for t in ids]
            if chat:
                choice["message"] = reply
                if calls and finish == "stop":
                    choice["finish_reason"] = "tool_calls"
                if body.get("logprobs"):
                    choice["logprobs"] = {"content": [{"token": s, "logprob": lp, "bytes": list(s.encode()), "top_logprobs": []}
                                                      for s, lp in zip(tokens, logps)]}
            else:
                choice["text"] = text
                if body.get("logprobs") is not None:
                    choice["logprobs"] = {"tokens": tokens, "token_logprobs": logps, "top_logprobs": None,
                                          "text_offset": None}
            choices.append(choice)
        completion_tokens = sum(len(c["token_ids"]) for c in choices)
        return {"id": f"{'chatcmpl' if chat else 'cmpl'}-{first.id}-{first.turns}",
                "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                "model": self.model, "choices": choices, "prompt_token_ids": context,
                "usage": {"prompt_tokens": len(context), "completion_tokens": completion_tokens,
                          "total_tokens": len(context) + completion_tokens}}

    # -- the batcher ----------------------------------------------------------
    def _batch_loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            jobs, rows = [job], job.n
            deadline = time.monotonic() + self.window
            while rows < self.max_batch:
                try:
                    nxt = self._jobs.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if nxt is None:
                    self._jobs.put(None)
                    break
                jobs.append(nxt)
                rows += nxt.n
            groups: dict[tuple, list[_Job]] = {}
            for j in jobs:
                groups.setdefault((j.temperature, j.stop), []).append(j)
            for (temperature, stop), group in groups.items():
                group.sort(key=lambda j: (j.context, j.max_tokens, j.n))
                try:
                    self._sample(group, temperature, list(stop))
                except BaseException as e:  # every waiting request answers 500; the trainer raises it
                    self.error = e
                    for j in group:
                        j.error = e
                for j in group:
                    j.done.set()

    def _sample(self, group: list[_Job], temperature: float, stop: list[str]) -> None:
        contexts = [torch.tensor(j.context, dtype=torch.long) for j in group for _ in range(j.n)]
        limits = [j.max_tokens for j in group for _ in range(j.n)]
        ids, mask = left_pad(contexts, self.tokenizer.pad_token_id)
        out = self.sampler.sample_ids(ids, mask, max(limits), temperature, self.generator, stop or None)
        self.requests += len(group)
        eos = self.tokenizer.eos_token_id
        results = []
        for r, limit in enumerate(limits):
            take = min(int(out.completion_mask[r].sum()), limit)
            row = out.completion_ids[r, :take].tolist()
            text = self._decode(row, skip_special_tokens=True)
            cut = cut_at_stop(text, stop) if stop else text
            # vLLM's stop_reason: the stop string that ended the reply (None: EOS or the length)
            matched = min((s for s in stop if s in text), key=text.find) if cut != text else None
            ended = (row and row[-1] == eos) or cut != text
            results.append((row, out.sample_logprobs[r, :take].tolist(), cut, "stop" if ended else "length", matched))
        at = 0
        for j in group:
            j.result, at = results[at: at + j.n], at + j.n


def stream_events(payload: dict, include_usage: bool) -> list[dict]:
    """A whole response as the chunks of a stream (``stream: true``): each choice's text (and
    tool calls) in one delta, then its finish reason, then the usage when asked for. Sampling is
    batched, so nothing is gained by sending tokens as they come."""
    chat = payload["object"] == "chat.completion"
    head = {"id": payload["id"], "object": "chat.completion.chunk" if chat else "text_completion",
            "created": payload["created"], "model": payload["model"]}
    events = []
    for c in payload["choices"]:
        extra = {k: c[k] for k in ("conversation_id", "token_ids", "logprobs") if k in c}
        if chat:
            delta = {k: v for k, v in c["message"].items() if k != "tool_calls"}
            if c["message"].get("tool_calls"):
                delta["tool_calls"] = [{"index": k, **call} for k, call in enumerate(c["message"]["tool_calls"])]
            first = {"index": c["index"], "delta": delta, "finish_reason": None, **extra}
            last = {"index": c["index"], "delta": {}, "finish_reason": c["finish_reason"]}
        else:
            first = {"index": c["index"], "text": c["text"], "finish_reason": None, **extra}
            last = {"index": c["index"], "text": "", "finish_reason": c["finish_reason"]}
        events += [{**head, "choices": [first]}, {**head, "choices": [last]}]
    if include_usage:
        events.append({**head, "choices": [], "usage": payload["usage"]})
    return events


def model_context(sampler) -> int:
    """The sampler's context length: its own ``max_context`` (an engine's ``max_model_len``), else
    its model's ``max_position_embeddings``, else unbounded."""
    if getattr(sampler, "max_context", None):
        return int(sampler.max_context)
    model = getattr(sampler, "model", None)
    return int(getattr(getattr(model, "config", None), "max_position_embeddings", None) or 2**31)


def _int(body: dict, key: str, default, low: int, high: int | None):
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise RequestError(400, f"{key} must be an integer {bound}, got {value!r}", f"invalid_{key}")
    return value


def _handler(server: PolicyServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = server.timeout  # a client that stops sending mid-request frees its thread

        def log_message(self, *args) -> None:  # no line per request on stderr
            pass

        def _send(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, events: list[dict]) -> None:
            """Server-sent events, then the connection closes (no length to announce)."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            for event in events:
                self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

        def _error(self, e: RequestError) -> None:
            self._send(e.status, {"error": {"message": str(e), "type": e.kind, "code": e.code, "param": None}})

        def do_GET(self) -> None:
            path = self.path.split("?")[0].rstrip("/")
            if path in ("/health", "/v1/health"):
                self._send(200, {"status": "ok"})
            elif path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": server.model, "object": "model", "owned_by": "reasonrl"}]})
            else:
                self._error(RequestError(404, f"no route GET {path}", "not_found"))

        def do_POST(self) -> None:
            path = self.path.split("?")[0].rstrip("/")
            try:
                if path not in ("/v1/chat/completions", "/v1/completions"):
                    raise RequestError(404, f"no route POST {path}; this server has /v1/chat/completions and /v1/completions",
                                       "not_found")
                size = int(self.headers.get("Content-Length") or 0)
                if size > MAX_BODY_BYTES:
                    raise RequestError(413, f"a request body of {size} bytes is over {MAX_BODY_BYTES}", "too_large")
                try:
                    body = json.loads(self.rfile.read(size) or b"null")
                except (json.JSONDecodeError, UnicodeDecodeError) as e:
                    raise RequestError(400, f"the body is not JSON: {e}", "invalid_json") from e
                if not isinstance(body, dict):
                    raise RequestError(400, "the body must be a JSON object", "invalid_json")
                payload = server.handle(path, body, self.headers.get("X-Session-ID"))
                if body.get("stream"):
                    self._stream(stream_events(payload, bool((body.get("stream_options") or {}).get("include_usage"))))
                else:
                    self._send(200, payload)
            except RequestError as e:
                self._error(e)
            except Exception as e:  # a bug or a tokenizer that refuses the text: an answer, never a dropped connection
                self._error(RequestError(500, f"{type(e).__name__}: {e}", "internal_error", "server_error"))

    return Handler
