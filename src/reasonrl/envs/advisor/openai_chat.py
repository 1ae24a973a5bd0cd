"""An advisor behind any HTTP endpoint that speaks the OpenAI chat-completions API.

``POST {base_url}/chat/completions`` with ``{"model", "messages", "temperature", "max_tokens"}``;
the answer is ``choices[0].message.content``. The standard library only (``urllib``), a
timeout per request, the API key read from the environment variable the recipe names
(``api_key_env``; none for a local server that wants none). Works with OpenAI, vLLM's and
llama.cpp's servers, LiteLLM, Ollama's ``/v1``, and so on.

The HTTP exchange itself (:func:`post_chat`), the key lookup (:func:`read_api_key`) and the
endpoint check (:func:`check_endpoint`) are shared with every other client of such an endpoint
(FSG-RL's teacher judge, ``rewards.fsg_judge``).
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.request
from typing import Annotated

from reasonrl.envs.advisor.advisors import ADVISORS, Advisor, AdvisorError
from reasonrl.params import Range

__all__ = ["OpenAIChatAdvisor", "check_endpoint", "post_chat", "read_api_key"]

DEFAULT_SYSTEM = "You are an expert advisor. Answer the question with the final result only, no explanation."


def check_endpoint(base_url: str | None, model: str | None, who: str, key: str) -> None:
    """ValueError unless ``base_url`` (an http(s) API root) and ``model`` are given; ``who``
    names the component, ``key`` the recipe mapping that holds them (``env.advisor_params``)."""
    missing = [k for k, v in (("base_url", base_url), ("model", model)) if not v]
    if missing:
        raise ValueError(f"{who} needs {key}.{missing[0]} (base_url: the API root, "
                         f"e.g. http://localhost:8000/v1; model: the model name to send)")
    if base_url is not None and not base_url.startswith(("http://", "https://")):
        raise ValueError(f"{key}.base_url must start with http:// or https://, got {base_url!r}")


def read_api_key(api_key_env: str | None, who: str, key: str, error: type[Exception] = AdvisorError) -> str | None:
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
              who: str, error: type[Exception] = AdvisorError) -> str:
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


@ADVISORS.register("openai_chat")
class OpenAIChatAdvisor(Advisor):
    """``base_url``: the API root (``https://api.openai.com/v1``, ``http://localhost:8000/v1``);
    ``model``: the model name sent; ``api_key_env``: the environment variable holding the key
    (sent as ``Authorization: Bearer``; None: no key); ``system``: the system message (None:
    none); ``template``: the user message, ``{query}`` the student's query; ``timeout_s`` per
    request; ``retries``: further attempts after a timeout, a connection error, HTTP 429 or
    5xx, ``retry_wait_s`` × 2^attempt apart. Any other failure, or the last, raises
    ``AdvisorError``."""

    def __init__(self, base_url: str, model: str, api_key_env: str | None = None, system: str | None = DEFAULT_SYSTEM,
                 template: str = "{query}", temperature: Annotated[float, Range(ge=0)] = 0.0,
                 max_tokens: Annotated[int, Range(ge=1)] = 64, timeout_s: Annotated[float, Range(gt=0)] = 30.0,
                 retries: Annotated[int, Range(ge=0)] = 2, retry_wait_s: Annotated[float, Range(ge=0)] = 1.0) -> None:
        self.validate(base_url=base_url, model=model, template=template)
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.system, self.template = model, system, template
        self.temperature, self.max_tokens, self.timeout_s = temperature, max_tokens, timeout_s
        self.retries, self.retry_wait_s = retries, retry_wait_s
        self.api_key = read_api_key(api_key_env, "advisor openai_chat", "env.advisor_params")

    @staticmethod
    def validate(base_url: str | None = None, model: str | None = None, template: str = "{query}", **_) -> None:
        check_endpoint(base_url, model, "advisor openai_chat", "env.advisor_params")
        if "{query}" not in template:
            raise ValueError(f"env.advisor_params.template must contain {{query}}, got {template!r}")

    def request_body(self, query: str) -> dict:
        messages = [{"role": "system", "content": self.system}] if self.system else []
        messages.append({"role": "user", "content": self.template.format(query=query)})
        return {"model": self.model, "messages": messages, "temperature": self.temperature,
                "max_tokens": self.max_tokens}

    def answer(self, query: str, problem) -> str:
        return post_chat(self.url, self.request_body(query), api_key=self.api_key, timeout_s=self.timeout_s,
                         retries=self.retries, retry_wait_s=self.retry_wait_s, who="advisor openai_chat")
