"""``non_iid``: a prompt sampler that gives one federated client mostly its own kind of problem.

Client ``client`` of ``num_clients`` has home values of a problem attribute (``key``): the
values listed in ``groups[client]``; a value in no group is home to client
``crc32(str(value)) % num_clients`` (stable across processes, unlike ``hash``). Each round
draws ``pool`` × count candidates from the task's seeded stream and keeps, in stream order,
the first round(``dominant`` · count) home problems and the first count − that many away ones
(topping up from the other side when one runs short). It keeps no state: a pure function of
the step, so a client resumes exactly.

Attributes: any ``Problem.meta`` key (``form`` for the embedded arithmetic task: the split the
recipes use), or ``solution_steps``: the number of lines of the worked solution before its
``####`` line (GSM8K's split: e.g. ``groups: [[1, 2], [3], [4, 5, 6, 7, 8]]`` gives clients
short, medium and long problems).
"""

from __future__ import annotations

import zlib
from typing import Annotated, Any

from reasonrl.params import Range
from reasonrl.registry import PROMPT_SAMPLERS
from reasonrl.rollout.samplers import PromptSampler
from reasonrl.problem import Problem

__all__ = ["NonIIDSplit", "solution_steps"]


def solution_steps(problem: Problem) -> int:
    """Lines of the worked solution before its final ``####`` line (at least 1)."""
    body = (problem.solution or "").split("####")[0]
    return max(1, sum(1 for line in body.splitlines() if line.strip()))


@PROMPT_SAMPLERS.register("non_iid")
class NonIIDSplit(PromptSampler):
    def __init__(self, task: Any, seed: int = 0,
                 client: Annotated[int, Range(ge=0, why="this client's index")] = 0,
                 num_clients: Annotated[int, Range(ge=1)] = 1,
                 key: str = "form",
                 groups: list[list[Any]] | None = None,
                 dominant: Annotated[float, Range(ge=0, le=1, why="share of home problems per step")] = 0.8,
                 pool: Annotated[int, Range(ge=1, why="candidates drawn per problem kept")] = 8) -> None:
        super().__init__(task, seed)
        if client >= num_clients:
            raise ValueError(f"sampler.client must be in 0..{num_clients - 1} (num_clients {num_clients}), got {client}")
        if groups is not None and len(groups) != num_clients:
            raise ValueError(f"sampler.groups must have one list per client ({num_clients}), got {len(groups)}")
        self.client, self.num_clients, self.key = client, num_clients, key
        self.groups = [list(g) for g in groups] if groups is not None else None
        self.dominant, self.pool = dominant, pool

    def value(self, problem: Problem) -> Any:
        if self.key == "solution_steps":
            return solution_steps(problem)
        if self.key not in problem.meta:
            raise ValueError(f"sampler 'non_iid': key '{self.key}' is not in the task's Problem.meta "
                             f"({', '.join(problem.meta) or 'empty'}) and is not 'solution_steps'")
        return problem.meta[self.key]

    def home(self, problem: Problem) -> int:
        """The client whose home this problem is."""
        value = self.value(problem)
        for c, group in enumerate(self.groups or []):
            if value in group:
                return c
        return zlib.crc32(str(value).encode()) % self.num_clients

    def problems(self, step: int, count: int, round: int = 0) -> list[Problem]:
        candidates = super().problems(step, count * self.pool, round)
        mine = [i for i, p in enumerate(candidates) if self.home(p) == self.client]
        mine_set = set(mine)
        away = [i for i in range(len(candidates)) if i not in mine_set]
        n_home = min(round_half_up(self.dominant * count), len(mine))
        n_away = min(count - n_home, len(away))
        n_home = min(count - n_away, len(mine))  # top up from home when away runs short
        return [candidates[i] for i in sorted(mine[:n_home] + away[:n_away])]


def round_half_up(x: float) -> int:
    return int(x + 0.5)
