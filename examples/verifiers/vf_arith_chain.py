"""A multi-turn verifiers (v1) env in the embedded model's alphabet: the model answers a sum
``a+b;``, the env (playing the user) sends a second one, the model answers again; the reward is
the share of the two answered right. Short problems: the embedded model reads 64 tokens.
Written with verifiers' own API (``Env.run`` with an interaction); it imports nothing of reasonrl."""

import random

import verifiers.v1 as vf
from vf_arith import ANSWER


def sums(count: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pairs = [(rng.randint(0, 20), rng.randint(0, 20)) for _ in range(count)]
    return [(f"{a}+{b};", str(a + b)) for a, b in pairs]


class ChainData(vf.TaskData):
    answers: list[str]
    second: str


class ChainTask(vf.Task[ChainData]):
    @vf.reward(weight=1.0)
    async def share_right(self, trace: vf.Trace) -> float:
        replies = [m.content or "" for m in trace.assistant_messages]
        right = [bool(ANSWER.findall(r)) and ANSWER.findall(r)[-1] == a for r, a in zip(replies, self.data.answers)]
        return sum(right) / len(self.data.answers)


class ChainTaskset(vf.Taskset[ChainTask, vf.TasksetConfig]):
    def load(self):
        pairs = sums(64, 1)
        return [ChainTask(ChainData(prompt=p, second=q, answers=[a, b]), self.config.task)
                for (p, a), (q, b) in zip(pairs[::2], pairs[1::2])]


class ChainEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class ChainEnv(vf.Env[ChainEnvConfig]):
    async def run(self, task, agents):
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            if not segment.terminated:
                await interaction.turn(task.data.second)


__all__ = ["ChainTaskset", "ChainEnv"]
