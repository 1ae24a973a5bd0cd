"""A client of any HTTP endpoint that speaks the OpenAI chat-completions API: the request with
retries (:func:`post_chat`), the API key from the environment (:func:`read_api_key`) and the
check of a recipe's endpoint settings (:func:`check_endpoint`).

The standard library only (``urllib``, ``http.client``). Each attempt of a request ends within
its ``timeout_s`` however slowly the server trickles its reply: a watchdog shuts the socket down
at the deadline. Works with OpenAI, vLLM's and llama.cpp's servers, LiteLLM, Ollama's ``/v1``,
and so on. Used by every component that asks a
remote model (the advisor of ``methods.advisor``, FSG-RL's teacher judge), each passing the
error type its callers catch.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request

__all__ = ["EndpointError", "check_endpoint", "post_chat", "read_api_key"]


class EndpointError(RuntimeError):
    """A chat-completions request failed (an HTTP error, a timeout, a malformed reply)."""


def check_endpoint(base_url: str | None, model: str | None, who: str, key: str) -> None:
    """ValueError unless ``base_url`` (an http(s) API root) and ``model`` are given; ``who``
    names the component, ``key`` the recipe mapping that holds them (``env.advisor_params``)."""
    missing = [k for k, v in (("base_url", base_url), ("model", model)) if not v]
    if missing:
        raise ValueError(f"{who} needs {key}.{missing[0]} (base_url: the API root, "
                         f"e.g. http://localhost:8000/v1; model: the model name to send)")
    if base_url is not None and not base_url.startswith(("http://", "https://")):
        raise ValueError(f"{key}.base_url must start with http:// or https://, got {base_url!r}")


def read_api_key(api_key_env: str | None, who: str, key: str, error: type[Exception] = EndpointError) -> str | None:
    """The key in the environment variable ``api_key_env`` (None: no key wanted); ``error``
    naming ``{key}.api_key_env`` when that variable is not set."""
    if not api_key_env:
        return None
    value = os.environ.get(api_key_env)
    if not value:
        raise error(f"{who}: the environment variable {api_key_env} ({key}.api_key_env) is not set; export the "
                    f"API key there, or set api_key_env: null for a server that needs none")
    return value


class _Deadline:
    """The watchdog of one attempt: ``seconds`` after it starts it shuts down every socket its
    connections opened, so a blocked connect, send or read (TLS handshake, proxy tunnel, status
    line, headers, body) returns at once. A socket timeout bounds each read alone, and a server
    that trickles a byte a second never trips it. ``shutdown`` acts on the connection, not on
    the descriptor, so the watched duplicate still reaches it after TLS wraps (and detaches)
    the original."""

    def __init__(self, seconds: float) -> None:
        self.expired, self._socks, self._lock = False, [], threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def _connect(self, *args, **kwargs) -> socket.socket:
        sock = socket.create_connection(*args, **kwargs)
        with self._lock:
            if self.expired:
                sock.close()
                raise TimeoutError("the deadline passed while connecting")
            self._socks.append(sock.dup())
        return sock

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._socks:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # the peer closed it already

    def close(self) -> None:
        self._timer.cancel()
        with self._lock:
            for sock in self._socks:
                sock.close()
            self._socks.clear()

    def open(self, request: urllib.request.Request, timeout_s: float):
        """``urlopen(request)``, with urllib's proxies from the environment, redirects and TLS,
        every connection it makes watched."""
        def watched(cls):
            def connection(host, **kwargs):
                conn = cls(host, **kwargs)
                conn._create_connection = self._connect  # http.client's hook for opening its socket
                return conn
            return connection

        class HTTP(urllib.request.HTTPHandler):
            def http_open(self, req):
                return self.do_open(watched(http.client.HTTPConnection), req)

        class HTTPS(urllib.request.HTTPSHandler):
            def https_open(self, req):
                return self.do_open(watched(http.client.HTTPSConnection), req, context=self._context)

        return urllib.request.build_opener(HTTP, HTTPS).open(request, timeout=timeout_s)


def _detail(exc: urllib.error.HTTPError) -> str:
    """': ' and the start of an error reply's body ('' for none, or none read before the deadline)."""
    try:
        text = exc.read()[:300].decode(errors="replace").strip()
    except (OSError, http.client.HTTPException):
        text = ""
    return f": {text}" if text else ""


def post_chat(url: str, body: dict, *, api_key: str | None, timeout_s: float, retries: int, retry_wait_s: float,
              who: str, error: type[Exception] = EndpointError) -> str:
    """POST the chat-completions ``body`` to ``url`` and return ``choices[0].message.content``
    ('' when it is null: a refusal or a tool call). Each attempt, from connecting to the last
    byte of the reply, ends within ``timeout_s`` (a deadline, not a bound per read; name
    resolution aside, which is the system resolver's). ``retries``: further attempts after a
    timeout, a connection error (a connection cut mid-reply too), HTTP 429 or 5xx,
    ``retry_wait_s`` × 2^attempt apart, so a call ends within (retries + 1)·timeout_s +
    (2^retries − 1)·retry_wait_s. Any other failure, or the last, raises ``error`` with a
    message that starts ``{who}: POST {url}``. Proxies come from the environment
    (``http_proxy``, ``https_proxy``, ``no_proxy``) as urllib reads them."""
    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    where = f"{who}: POST {url}"
    for attempt in range(retries + 1):
        last, deadline = attempt == retries, _Deadline(timeout_s)
        try:
            request = urllib.request.Request(url, data=data, headers=headers, method="POST")
            with deadline.open(request, timeout_s) as response:
                raw = response.read()
            if deadline.expired:  # the watchdog's shutdown reads as the end of a body sent without a length
                raise TimeoutError
            break
        except urllib.error.HTTPError as exc:
            if last or not (exc.code == 429 or exc.code >= 500):
                raise error(f"{where} returned HTTP {exc.code} {exc.reason}{_detail(exc)}") from None
        except (OSError, http.client.HTTPException) as exc:  # URLError, a timeout, a connection cut
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            # Past the deadline, the shutdown surfaces as whatever the blocked call saw (EOF, a reset).
            if last and (deadline.expired or isinstance(reason, TimeoutError)):
                raise error(f"{where} timed out after {timeout_s:g} s ({retries + 1} attempt(s))") from exc
            if last:
                raise error(f"{where} failed: {reason}") from exc
        finally:
            deadline.close()
        time.sleep(retry_wait_s * 2 ** attempt)
    try:
        content = json.loads(raw)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        excerpt = raw[:300].decode(errors="replace")
        raise error(f"{where}: the reply has no choices[0].message.content: {excerpt}") from None
    if content is None:
        return ""  # e.g. a reply that is only a refusal or a tool call
    if not isinstance(content, str):
        raise error(f"{where}: choices[0].message.content is {type(content).__name__}, not text")
    return content
