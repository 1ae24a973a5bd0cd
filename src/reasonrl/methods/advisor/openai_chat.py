"""An advisor behind any HTTP endpoint that speaks the OpenAI chat-completions API.

``POST {base_url}/chat/completions`` with ``{"model", "messages", "temperature", "max_tokens"}``;
the answer is ``choices[0].message.content``. The standard library only (``urllib``), a
deadline of ``timeout_s`` per attempt (however slowly the server trickles its reply), the API
key read from the environment variable the recipe names (``api_key_env``; none for a local
server that wants none). Works with OpenAI, vLLM's and llama.cpp's servers, LiteLLM, Ollama's
``/v1``, and so on.

The HTTP exchange, the key lookup and the endpoint check are the core's
(``reasonrl.isolation.openai_chat``), shared with every other client of such an endpoint.
"""

from __future__ import annotations

from typing import Annotated

from reasonrl.methods.advisor.advisors import ADVISORS, Advisor, AdvisorError
from reasonrl.params import Range
from reasonrl.isolation.openai_chat import check_endpoint, post_chat, read_api_key

__all__ = ["OpenAIChatAdvisor"]

DEFAULT_SYSTEM = "You are an expert advisor. Answer the question with the final result only, no explanation."


@ADVISORS.register("openai_chat")
class OpenAIChatAdvisor(Advisor):
    """``base_url``: the API root (``https://api.openai.com/v1``, ``http://localhost:8000/v1``);
    ``model``: the model name sent; ``api_key_env``: the environment variable holding the key
    (sent as ``Authorization: Bearer``; None: no key); ``system``: the system message (None:
    none); ``template``: the user message, ``{query}`` the student's query; ``timeout_s``: the
    deadline of each attempt as a whole (not of each read); ``retries``: further attempts after
    a timeout, a connection error, HTTP 429 or 5xx, ``retry_wait_s`` × 2^attempt apart. Any
    other failure, or the last, raises ``AdvisorError``."""

    def __init__(self, base_url: str, model: str, api_key_env: str | None = None, system: str | None = DEFAULT_SYSTEM,
                 template: str = "{query}", temperature: Annotated[float, Range(ge=0)] = 0.0,
                 max_tokens: Annotated[int, Range(ge=1)] = 64, timeout_s: Annotated[float, Range(gt=0)] = 30.0,
                 retries: Annotated[int, Range(ge=0)] = 2, retry_wait_s: Annotated[float, Range(ge=0)] = 1.0) -> None:
        self.validate(base_url=base_url, model=model, template=template)
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.system, self.template = model, system, template
        self.temperature, self.max_tokens, self.timeout_s = temperature, max_tokens, timeout_s
        self.retries, self.retry_wait_s = retries, retry_wait_s
        self.api_key = read_api_key(api_key_env, "advisor openai_chat", "env.advisor_params", AdvisorError)

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
                         retries=self.retries, retry_wait_s=self.retry_wait_s, who="advisor openai_chat",
                         error=AdvisorError)
