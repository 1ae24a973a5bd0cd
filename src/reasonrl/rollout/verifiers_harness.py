"""The harness the verifiers worker gives every agent (``rollout.verifiers_worker``): the agent's
chat loop runs in the worker's own event loop and asks the model through verifiers' interception
endpoint, which relays each call to reasonrl's endpoint with the rollout's trace id as
``X-Session-ID``. No program is started and nothing is installed (verifiers' own harnesses are
uv scripts that fetch their dependencies: no network here). Tool calls are executed by verifiers
(its MCP tool servers) between the calls this harness makes.

Imported by name (``verifiers_harness``) from the worker's folder; it imports nothing of
reasonrl. One Harness subclass in ``__all__``, as verifiers finds plugins."""

from __future__ import annotations

import verifiers.v1 as vf
from openai import AsyncOpenAI
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.runtimes import ProgramResult


class ReasonrlHarnessConfig(vf.HarnessConfig):
    pass


class ReasonrlHarness(vf.Harness[ReasonrlHarnessConfig]):
    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True  # a later turn (Env.interaction) relaunches on the conversation so far
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **_):
        system, prompt = self.resolve_prompt(data)
        messages = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        elif prompt:
            messages += [message_to_wire(m) for m in prompt]
        async with AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0) as client:
            await client.chat.completions.create(model=ctx.model, messages=messages)
        return ProgramResult(exit_code=0, stdout="", stderr="")


__all__ = ["ReasonrlHarness"]
