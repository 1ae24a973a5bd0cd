"""The ``advisor`` environment (a student asks an advisor under a call budget) and the
``arithmetic_advisor`` task whose warm-up shows the query protocol.

A query is text in braces at the end of a turn, ``{(12+47)*8}``; the environment forwards it to
the advisor and appends the answer as an observation of channel ``advisor``, ``=472``; the
student goes on (``{(12+47)*8}=472;####472``). Any other turn ends the episode. The spec's
``<ask>…</ask>`` in two characters the embedded model's tokenizer holds, as the calculator's
``[…]``.

Per episode at most ``budget`` calls reach the advisor; a further query is refused (never
sent) and ends the episode (``over_budget: end``) or is answered with an empty ``=`` and the
student goes on (``refuse``), and costs ``over_budget_penalty`` (1 by default: with a 0/1
correctness reward an over-budget episode earns no more than a wrong one, the spec's hard
fail). Each answered call is a per-turn reward of −(``cost`` + ``token_cost`` · query
characters), so with the ``exact_answer`` reward an episode earns

    R = 1[correct] − cost · n_calls − token_cost · Σ |query|        (stages 1 and 3 of the spec)

(|query| counts characters: tokens of the character tokenizer; ``token_cost`` = λ_tok / L).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Annotated, Literal

from reasonrl.methods.advisor.advisors import check_advisor, get_advisor
from reasonrl.envs.base import Environment, Step
from reasonrl.params import Range
from reasonrl.policy.char_tokenizer import ARITHMETIC_CHARS
from reasonrl.registry import ENVIRONMENTS, TASKS
from reasonrl.rewards.basic import extract_answer
from reasonrl.tasks.arithmetic import ArithmeticTask, render
from reasonrl.problem import Problem

__all__ = ["AdvisorEnv", "ArithmeticAdvisorTask", "ASK_OPEN", "ASK_CLOSE", "advice_value"]

ASK_OPEN, ASK_CLOSE = "{", "}"
ANSWER_MARK = "="  # an observation is "=" + the advice ("=" alone: no answer, or a refused call)
_NUMBER = re.compile(r"-?\d[\d,]*")


def advice_value(reply: str) -> str:
    """The number an advisor's reply gives: its ``####N`` answer, else its last integer, else ''."""
    found = extract_answer(reply)
    if found is not None:
        return found
    numbers = _NUMBER.findall(reply)
    return numbers[-1].replace(",", "") if numbers else ""


@ENVIRONMENTS.register("advisor")
@dataclass
class AdvisorEnv(Environment):
    """Answers a turn that ends in a query ``{…}`` with the advisor's answer ``=…``, at most
    ``budget`` times an episode; any other turn ends the episode.

    ``advisor`` (``ADVISORS``: ``tiny``, ``openai_chat``, ``oracle_arithmetic``, or
    ``file.py:Class``) built once per process with ``advisor_params``; ``budget``: calls per
    episode (B); ``cost``: the reward −cost per call (λ_c); ``token_cost``: −token_cost per
    query character (λ_tok / L); ``over_budget``: a query past the budget ends the episode
    (``end``) or is answered ``=`` (``refuse``), either way unsent, counted in
    ``over_budget`` and charged ``over_budget_penalty``; ``advice``: ``value`` appends the number
    the advisor's reply gives (fits the embedded model's alphabet), ``text`` its whole reply;
    both cut at ``max_advice_chars``; a query is cut at ``max_query_chars`` before it is sent."""

    advisor: str = "tiny"
    advisor_params: dict = field(default_factory=dict)
    budget: Annotated[int, Range(ge=1, why="a budget of 0 allows no call: drop the env for the never-call "
                                          "baseline")] = 1
    cost: Annotated[float, Range(ge=0)] = 0.1
    token_cost: Annotated[float, Range(ge=0)] = 0.0
    over_budget: Literal["end", "refuse"] = "end"
    over_budget_penalty: Annotated[float, Range(ge=0)] = 1.0
    advice: Literal["value", "text"] = "value"
    max_query_chars: Annotated[int, Range(ge=1)] = 64
    max_advice_chars: Annotated[int, Range(ge=1)] = 32

    stop = (ASK_CLOSE,)
    channels = ("advisor",)
    info_keys = ("calls", "over_budget", "query_tokens", "advice_tokens")

    @staticmethod
    def check_params(advisor: str = "tiny", advisor_params: dict | None = None, **_) -> None:
        check_advisor(advisor, advisor_params or {})

    def reset(self, problem, seed: int) -> str:
        self.problem, self.calls, self.refused = problem, 0, 0
        return ""

    def step(self, action: str) -> Step:
        start = action.rfind(ASK_OPEN)
        if not action.endswith(ASK_CLOSE) or start < 0:
            return Step(done=True)
        if self.calls >= self.budget:  # refused: never sent, never answered
            self.refused += 1
            penalty = -self.over_budget_penalty if self.over_budget_penalty else 0.0
            info = {"over_budget": 1.0}
            if self.over_budget == "end":
                return Step(reward=penalty, done=True, info=info)
            return Step(observation=ANSWER_MARK, reward=penalty, info=info, channel="advisor")
        query = action[start + 1:-1][: self.max_query_chars]
        reply = get_advisor(self.advisor, self.advisor_params).answer(query, self.problem)
        self.calls += 1
        assert self.calls <= self.budget, "the advisor was called past the episode's budget"
        advice = (advice_value(reply) if self.advice == "value" else reply.strip())[: self.max_advice_chars]
        charge = self.cost + self.token_cost * len(query)
        return Step(observation=ANSWER_MARK + advice, reward=-charge if charge else 0.0, channel="advisor",
                    info={"calls": 1.0, "query_tokens": float(len(query)), "advice_tokens": float(len(advice))})

    def state_dict(self):
        return {"calls": self.calls, "refused": self.refused}

    def load_state_dict(self, state):
        self.calls, self.refused = state["calls"], state["refused"]


@TASKS.register("arithmetic_advisor")
@dataclass
class ArithmeticAdvisorTask(ArithmeticTask):
    """The arithmetic task with the advisor's query syntax in its alphabet and warm-up: a share
    ``ask_fraction`` of the worked solutions ask the advisor the whole problem instead,
    ``{(12+47)*8}=472;####472`` (the ``=472`` being what a right advisor answers; the same on
    every kind of problem, so when to ask is left to the reward). Problems carry their
    expression in ``meta["expr"]`` (what a problem-level router sends)."""

    ask_fraction: float = 0.3
    name: str = "arithmetic_advisor"
    alphabet = ARITHMETIC_CHARS + ASK_OPEN + ASK_CLOSE

    def __post_init__(self) -> None:
        if not 0.0 <= self.ask_fraction <= 1.0:
            raise ValueError(f"task.ask_fraction must be in [0, 1], got {self.ask_fraction}")
        super().__post_init__()

    def _problem(self, key: tuple[str, int, int, int], careless: bool = False) -> Problem:
        problem = super()._problem(key, careless)
        problem.meta["expr"] = render(*key)
        return problem

    def warmup_problems(self, step: int, count: int, seed: int) -> list[Problem]:
        rng = random.Random(f"advisor:{seed}:{step}")
        out = []
        for p in super().warmup_problems(step, count, seed):
            if rng.random() < self.ask_fraction:
                p = Problem(p.prompt, p.answer, f"{ASK_OPEN}{p.meta['expr']}{ASK_CLOSE}{ANSWER_MARK}{p.answer};"
                            f"####{p.answer}", p.meta)
            out.append(p)
        return out
