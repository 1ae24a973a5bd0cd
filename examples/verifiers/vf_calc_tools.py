"""A verifiers (v1) tool environment: ``(a+b)*c`` problems the model may hand to a ``calc`` tool
served over MCP by verifiers' own ``Toolset`` (a tool server per rollout, in a subprocess);
rewarded 1 when the final reply's last ``####N`` is the value. Written with verifiers' own API;
it imports nothing of reasonrl. Run as a module, it serves the toolset (verifiers starts it so).

The tool evaluates only digits, ``+ - * ( )`` and spaces: a model's argument is never ``eval``-ed."""

import random
import re

import verifiers.v1 as vf

ANSWER = re.compile(r"####(-?\d+)")
TOKEN = re.compile(r"\s*(\d+|[-+*()])")


def evaluate(expression: str) -> int:
    """The value of an integer expression over + - * and parentheses (a small recursive descent)."""
    tokens, at = [], 0
    while at < len(expression):
        found = TOKEN.match(expression, at)
        if found is None:
            if expression[at:].strip():
                raise ValueError(f"unexpected {expression[at:]!r}")
            break
        tokens.append(found.group(1))
        at = found.end()

    def expr(i):
        value, i = term(i)
        while i < len(tokens) and tokens[i] in "+-":
            right, j = term(i + 1)
            value, i = (value + right if tokens[i] == "+" else value - right), j
        return value, i

    def term(i):
        value, i = atom(i)
        while i < len(tokens) and tokens[i] == "*":
            right, i = atom(i + 1)
            value *= right
        return value, i

    def atom(i):
        if i >= len(tokens):
            raise ValueError("the expression ends early")
        if tokens[i] == "(":
            value, i = expr(i + 1)
            if i >= len(tokens) or tokens[i] != ")":
                raise ValueError("a parenthesis is not closed")
            return value, i + 1
        if tokens[i] == "-":
            value, i = atom(i + 1)
            return -value, i
        if not tokens[i].isdigit():
            raise ValueError(f"unexpected {tokens[i]!r}")
        return int(tokens[i]), i + 1

    value, end = expr(0)
    if end != len(tokens):
        raise ValueError(f"unexpected {tokens[end]!r}")
    return value


class CalcToolsetConfig(vf.ToolsetConfig):
    pass


class CalcToolset(vf.Toolset[CalcToolsetConfig]):
    TOOL_PREFIX = None  # the tool is called "calc", unqualified

    @vf.tool
    async def calc(self, expression: str) -> str:
        """Evaluate an integer arithmetic expression (digits, + - * and parentheses)."""
        try:
            return str(evaluate(expression))
        except ValueError as e:
            return f"error: {e}"


class CalcData(vf.TaskData):
    answer: str


class CalcTaskConfig(vf.TaskConfig):
    tools: CalcToolsetConfig = CalcToolsetConfig()


class CalcTask(vf.Task[CalcData, vf.State, CalcTaskConfig]):
    @classmethod
    def toolsets(cls, config: CalcTaskConfig) -> list[vf.Toolset]:
        return [CalcToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        found = ANSWER.findall(trace.last_reply or "")
        return float(bool(found) and found[-1] == self.data.answer)


class CalcTasksetConfig(vf.TasksetConfig):
    task: CalcTaskConfig = CalcTaskConfig()
    count: int = 64
    seed: int = 0


class CalcTaskset(vf.Taskset[CalcTask, CalcTasksetConfig]):
    def load(self):
        rng = random.Random(self.config.seed)
        problems = [(rng.randint(0, 20), rng.randint(0, 20), rng.randint(1, 9)) for _ in range(self.config.count)]
        return [CalcTask(CalcData(prompt=f"What is ({a}+{b})*{c}? Use the calc tool, then answer as ####N.",
                                  answer=str((a + b) * c)), self.config.task) for a, b, c in problems]


__all__ = ["CalcTaskset"]

if __name__ == "__main__":
    CalcToolset.run()
