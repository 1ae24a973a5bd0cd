"""A single-turn verifiers (v1) taskset in the embedded model's alphabet: ``(a+b)*c;``, rewarded 1
when the reply's last ``####N`` is the value. Written with verifiers' own API; runs in the
verifiers worker's interpreter (it imports nothing of reasonrl)."""

import random
import re

import verifiers.v1 as vf

ANSWER = re.compile(r"####(-?\d+)")


def arithmetic(count: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        a, b, c = rng.randint(0, 20), rng.randint(0, 20), rng.randint(1, 9)
        out.append((f"({a}+{b})*{c};", str((a + b) * c)))
    return out


class ArithData(vf.TaskData):
    answer: str


class ArithTask(vf.Task[ArithData]):
    @vf.stop
    async def one_turn(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        found = ANSWER.findall(trace.last_reply or "")
        return float(bool(found) and found[-1] == self.data.answer)

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply or ""))


class ArithTasksetConfig(vf.TasksetConfig):
    count: int = 64
    seed: int = 0


class ArithTaskset(vf.Taskset[ArithTask, ArithTasksetConfig]):
    def load(self):
        return [ArithTask(ArithData(prompt=p, answer=a), self.config.task) for p, a in arithmetic(self.config.count, self.config.seed)]


__all__ = ["ArithTaskset"]
