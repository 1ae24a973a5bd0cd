"""OpenEnv environments (``env: {name: openenv, url: ...}``): our multi-turn episode loop
(``reasonrl.rollout.episodes``) drives an environment served by OpenEnv over its WebSocket
session protocol, one session per episode.

OpenEnv (PyPI ``openenv``) serves a Gymnasium-style ``reset()`` / ``step(action)`` /
``state`` behind HTTP and WebSocket. Only the WebSocket route ``/ws`` keeps an environment
across steps (its HTTP ``/reset`` and ``/step`` build a new environment per request), so each
episode opens one WebSocket session::

    -> {"type": "reset", "data": {"seed": s, **reset_args, "prompt": ..., "answer": ...}}
    <- {"type": "observation", "data": {"observation": {...}, "reward": r, "done": d}}
    -> {"type": "step", "data": {<action_field>: the model's turn}}
    <- {"type": "observation", ...}            (or {"type": "error", "data": {"message", "code"}})
    -> {"type": "close"}

The model's turn (its decoded text, stop string included) is the action's ``action_field``; the
observation's ``observation_field`` is what the model reads next (its tokens are appended,
attended and never trained on, as every environment's), ``reward`` a per-turn reward and
``done`` ends the episode. With ``send_problem``, reset also carries the problem's ``prompt``
and ``answer`` (an environment whose reset accepts them may score the episode itself).

The protocol is spoken here with the ``websockets`` client (a dependency of uvicorn[standard],
which reasonrl already has), so the openenv package (gradio and MCP with it, which downgrade
what reasonrl pins) need not be installed beside reasonrl: the server runs wherever it likes.

A session that cannot be opened, an error message, or a reply later than ``timeout_s`` ends that
episode (its last turn's reward 0) and counts in ``episode/openenv_errors``; it never stops the
run. The ids trained on are the sampled ids, as in every episode: only the observation's text
is tokenised.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Annotated, Any

from websockets.exceptions import WebSocketException
from websockets.sync.client import connect

from reasonrl.envs.base import Environment, Step
from reasonrl.params import Range
from reasonrl.registry import ENVIRONMENTS

__all__ = ["OpenEnvEnvironment", "OpenEnvError", "ws_url"]


class OpenEnvError(RuntimeError):
    """The OpenEnv server answered with an error, or not in time."""


def ws_url(url: str) -> str:
    """The session endpoint of an OpenEnv server: ``http(s)://host:port`` -> ``ws(s)://host:port/ws``."""
    if url.startswith(("ws://", "wss://")):
        return url if url.rstrip("/").endswith("/ws") else url.rstrip("/") + "/ws"
    if url.startswith(("http://", "https://")):
        return "ws" + url[len("http"):].rstrip("/") + "/ws"
    raise ValueError(f"env.url must start with http://, https://, ws:// or wss://, got {url!r}")


@ENVIRONMENTS.register("openenv")
@dataclass
class OpenEnvEnvironment(Environment):
    """One episode against the OpenEnv server at ``url`` (module docstring).

    ``action_field`` / ``observation_field``: the action's field the turn goes in, the
    observation's field the model reads. ``stop``: the strings that end a turn as an action
    (e.g. a tool call's closing tag). ``reset_args``: more keyword arguments of reset.
    ``timeout_s``: the longest wait for one reply."""

    url: str = ""
    action_field: str = "message"
    observation_field: str = "reply"
    stop: list[str] = field(default_factory=list)
    reset_args: dict[str, Any] = field(default_factory=dict)
    send_problem: bool = True
    timeout_s: Annotated[float, Range(gt=0)] = 60.0

    info_keys = ("openenv_errors",)

    def __post_init__(self) -> None:
        self.endpoint = ws_url(self.url)
        self.socket = None

    @classmethod
    def stops(cls, params: dict[str, Any]) -> tuple[str, ...]:
        return tuple(params.get("stop") or ())

    def _ask(self, message: dict) -> dict:
        self.socket.send(json.dumps(message))
        reply = json.loads(self.socket.recv(timeout=self.timeout_s))
        if reply.get("type") == "error":
            data = reply.get("data") or {}
            raise OpenEnvError(f"{data.get('code', 'ERROR')}: {data.get('message', reply)}")
        if reply.get("type") != "observation":
            raise OpenEnvError(f"expected an observation, got {str(reply)[:200]}")
        return reply["data"]

    def _observation(self, data: dict) -> str:
        value = (data.get("observation") or {}).get(self.observation_field, "")
        return value if isinstance(value, str) else json.dumps(value)

    def reset(self, problem, seed: int) -> str:
        self.failed = False
        args = {"seed": seed, **self.reset_args}
        if self.send_problem:
            args.update(prompt=problem.prompt, answer=problem.answer)
        try:
            # websockets wants its client used as a context manager: entered here, left in close()
            self._session = connect(self.endpoint, open_timeout=self.timeout_s, close_timeout=1.0)
            self.socket = self._session.__enter__()
            return self._observation(self._ask({"type": "reset", "data": args}))
        except (OSError, TimeoutError, WebSocketException, OpenEnvError, ValueError) as exc:
            self._fail(exc)
            return ""

    def step(self, action: str) -> Step:
        if self.failed:
            return Step(done=True, info={"openenv_errors": 1.0})
        try:
            data = self._ask({"type": "step", "data": {self.action_field: action}})
        except (OSError, TimeoutError, WebSocketException, OpenEnvError, ValueError) as exc:
            self._fail(exc)
            return Step(done=True, info={"openenv_errors": 1.0})
        reward = data.get("reward")
        return Step(observation=self._observation(data), reward=float(reward) if isinstance(reward, (int, float)) else 0.0,
                    done=bool(data.get("done")))

    def _fail(self, exc: BaseException) -> None:
        self.failed, self.error = True, f"{type(exc).__name__}: {exc}"
        self.close()

    def close(self) -> None:
        if self.socket is not None:
            try:
                self.socket.send(json.dumps({"type": "close"}))
            except (OSError, WebSocketException):
                pass
            self._session.__exit__(None, None, None)
            self.socket = self._session = None
