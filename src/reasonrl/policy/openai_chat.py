"""A client of any HTTP endpoint that speaks the OpenAI chat-completions API: the request with
retries (:func:`post_chat`), the API key from the environment (:func:`read_api_key`) and the
check of a recipe's endpoint settings (:func:`check_endpoint`).

The standard library only (``urllib``), a timeout per request. Works with OpenAI, vLLM's and
llama.cpp's servers, LiteLLM, Ollama's ``/v1``, and so on. Used by every component that asks a
remote model (the advisor of ``methods.advisor``, FSG-RL's teacher judge), each passing the
error type its callers catch.
"""

from __future__ import annotations

import json
import os
import socket
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


def post_chat(url: str, body: dict, *, api_key: str | None, timeout_s: float, retries: int, retry_wait_s: float,
              who: str, error: type[Exception] = EndpointError) -> str:
    """POST the chat-completions ``body`` to ``url`` and return ``choices[0].message.content``
    ('' when it is null: a refusal or a tool call). ``retries``: further attempts after a
    timeout, a connection error, HTTP 429 or 5xx, ``retry_wait_s`` × 2^attempt apart; any other
    failure, or the last, raises ``error`` with a message that starts ``{who}: POST {url}``."""
    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    where = f"{who}: POST {url}"
    for attempt in range(retries + 1):
        last = attempt == retries
        try:
            request = urllib.request.Request(url, data=data, headers=headers, method="POST")
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                raw = response.read()
            break
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode(errors="replace").strip()
            if last or not (exc.code == 429 or exc.code >= 500):
                raise error(f"{where} returned HTTP {exc.code} {exc.reason}"
                            f"{': ' + detail if detail else ''}") from None
        except (TimeoutError, socket.timeout) as exc:
            if last:
                raise error(f"{where} timed out after {timeout_s:g} s ({retries + 1} attempt(s))") from exc
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, (TimeoutError, socket.timeout)):
                if last:
                    raise error(f"{where} timed out after {timeout_s:g} s ({retries + 1} attempt(s))") from exc
            elif last:
                raise error(f"{where} failed: {exc.reason}") from exc
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
