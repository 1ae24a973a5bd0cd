"""The harness the verifiers worker gives every agent (``rollout.verifiers_worker``): the agent's
chat loop runs in the worker's own event loop and asks the model through verifiers' interception
endpoint, which relays each call to reasonrl's endpoint with the rollout's trace id as
``X-Session-ID``. No program is started and nothing is installed (verifiers' own harnesses are
uv scripts that fetch their dependencies: no network here).

Tools: a task's tool servers (verifiers ``Toolset``s, MCP over HTTP, ``mcp_urls``) are listed
and offered to the model as OpenAI tools; each tool call in a reply is run on its server and
answered with a ``tool`` message, and the model is asked again, until a reply calls no tool,
``max_tool_rounds`` rounds have run, or verifiers stops the rollout (a ``@vf.stop``, its turn
limit). This is the loop of verifiers' own chat program, in process.

Imported by name (``verifiers_harness``) from the worker's folder; it imports nothing of
reasonrl. One Harness subclass in ``__all__``, as verifiers finds plugins."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack

import verifiers.v1 as vf
from openai import APIStatusError, AsyncOpenAI
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.harnesses.utils.mcp import call_mcp, connect_mcp
from verifiers.v1.runtimes import ProgramResult

# The interception answers a call after the rollout ended with 400 "rollout stopped" (a stop
# condition fired) or 409 "rollout concluded": the end of the episode, not an error of ours.
ENDED = ("rollout stopped", "rollout concluded")


class ReasonrlHarnessConfig(vf.HarnessConfig):
    max_tool_rounds: int = 8
    """Replies with tool calls answered before the loop ends (the trace keeps what ran)."""


class ReasonrlHarness(vf.Harness[ReasonrlHarnessConfig]):
    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_MCP = True
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
        async with AsyncExitStack() as stack:
            tools, dispatch, servers = [], {}, {}
            if mcp_urls:
                config = {"mcpServers": {name: {"url": url, "timeout": self.config.tool_timeout}
                                         for name, url in mcp_urls.items()}}
                tools, dispatch, servers = await connect_mcp(config, stack)
            client = await stack.enter_async_context(AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0))
            for answered in range(self.config.max_tool_rounds + 1):
                try:
                    reply = await client.chat.completions.create(model=ctx.model, messages=messages,
                                                                 **({"tools": tools} if tools else {}))
                except APIStatusError as e:
                    if e.status_code in (400, 409) and any(m in str(e) for m in ENDED):
                        break
                    raise
                message = reply.choices[0].message
                messages.append(message.model_dump(exclude_none=True))
                if not message.tool_calls or answered == self.config.max_tool_rounds:
                    break
                for call in message.tool_calls:
                    messages.append({"role": "tool", "tool_call_id": call.id, "name": call.function.name,
                                     "content": await _run_tool(servers, dispatch, call)})
        return ProgramResult(exit_code=0, stdout="", stderr="")


async def _run_tool(servers, dispatch, call) -> str:
    """A tool call's result text; a call the tools cannot take is answered with an error text,
    as verifiers' chat program answers it, so the model sees why."""
    name = call.function.name
    try:
        arguments = json.loads(call.function.arguments or "{}")
    except json.JSONDecodeError as e:
        return f"error: invalid JSON in tool arguments ({e}); resend the call with valid JSON"
    if not isinstance(arguments, dict):
        return f"error: tool arguments must be a JSON object, got {type(arguments).__name__}"
    if name not in dispatch:
        return f"error: unknown tool {name!r}"
    content = await call_mcp(servers, dispatch, name, arguments)
    return content if isinstance(content, str) else json.dumps(content)


__all__ = ["ReasonrlHarness"]
