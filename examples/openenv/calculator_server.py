"""The calculator environment (reasonrl.envs.calculator) written with OpenEnv's own API and served
by it: ``python calculator_server.py PORT`` (an interpreter with ``openenv``; ``make openenv-env``).

A turn that ends in a call ``[expr]`` is answered ``=value`` (``=`` when the expression is not
integer arithmetic); any other turn ends the episode, rewarded 1 when its last ``####N`` is the
answer reset was given. It imports nothing of reasonrl."""

import ast
import re
import sys

import uvicorn
from openenv.core.env_server import Action, Environment, Observation, State, create_app


class CalcAction(Action):
    message: str


class CalcObservation(Observation):
    reply: str = ""


class CalcState(State):
    answer: str | None = None
    calls: int = 0


def value(text: str):
    def ev(node):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
            a, b = ev(node.left), ev(node.right)
            return a + b if isinstance(node.op, ast.Add) else a - b if isinstance(node.op, ast.Sub) else a * b
        raise ValueError(node)

    try:
        return ev(ast.parse(text, mode="eval").body) if len(text) <= 40 else None
    except (SyntaxError, ValueError):
        return None


class CalcEnv(Environment[CalcAction, CalcObservation, CalcState]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = CalcState()

    def reset(self, seed=None, episode_id=None, answer=None, **kwargs) -> CalcObservation:
        self._state = CalcState(episode_id=episode_id, answer=answer)
        return CalcObservation(reply="", done=False)

    def step(self, action: CalcAction, timeout_s=None, **kwargs) -> CalcObservation:
        self._state.step_count += 1
        text = action.message
        start = text.rfind("[")
        if text.endswith("]") and start >= 0 and self._state.calls < 8:
            self._state.calls += 1
            result = value(text[start + 1:-1])
            return CalcObservation(reply="=" if result is None else f"={result}", reward=0.0, done=False)
        found = re.findall(r"####(-?\d+)", text)
        right = bool(found) and found[-1] == self._state.answer
        return CalcObservation(reply="", reward=1.0 if right else 0.0, done=True)

    @property
    def state(self) -> CalcState:
        return self._state


app = create_app(CalcEnv, CalcAction, CalcObservation, state_cls=CalcState, max_concurrent_envs=256)

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
