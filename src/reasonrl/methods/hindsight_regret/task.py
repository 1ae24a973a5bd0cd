"""An embedded forecasting task with a structured decomposition and hindsight information
(macro2mind's analogue of prediction-market transitions; https://arxiv.org/abs/2610.07062, formulas INFERRED;
``docs/methods/hindsight_regret.md``).

An event has a topic t (a digit), a prior price p0 (30..69) and ``groups`` participant groups,
each a distinct id digit g with a signed signal s (±1..±5). The outcome p1 follows a hidden rule:
**group g moves the price iff g + t is odd** (the relevant, "hindsight-identified" groups), so
p1 = p0 + Σ_{relevant} s_g (+ a shock on a share ``shock_fraction`` of the events, which no
reading of the groups explains), clipped to 0..99. The prompt and a completion::

    prompt:     2#47;3+5;6-2;1+4;8-3;          t=2, p0=47, groups 3,6,1,8 with their signals
    completion: 3+5=52;1+4=56;#56               relevant groups → their update and the running
                                                price (interpretations) → '#' aggregate p̂

The completion is the decomposition groups → interpretations → aggregate: for each group it
judges relevant (in prompt order) the group id, its belief update and the price after it, then
``#`` and the forecast p̂ (0..99). ``rewards.forecast`` parses and scores it.

**Hindsight.** Which groups mattered is knowable only with p1. Training problems carry in
``meta["hindsight_prompt"]`` the same input with the identified groups appended, ``(31);``;
``methods.hindsight_regret`` samples the current policy on it to measure the regret. Eval
problems carry no hindsight (neither that key nor ``meta["relevant"]``).

**Training pool.** ``train_problems`` draws from a fixed pool of ``pool_size`` events (drawn
once with a fixed seed), so prompts recur and a curriculum can learn per-prompt statistics, as
over the paper's finite set of market transitions; eval events are held out by a hash of the
prompt and never in the pool.

**Warm-up** (``model: {backend: tiny, tiny: {task: forecast}}``): fresh events (not the pool)
with the rule's solution, except that on *hard* topics (t ≥ 5) a share ``careless_fraction``
of the solutions counts every group (the naive "every voice counts" forecaster, a systematic
mistake supervised learning copies and only the reward removes); easy topics are always
careful. A share ``hindsight_share`` of the warm-up prompts are hindsight prompts, always
solved with the identified groups, so the model can use hindsight when asked.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Annotated, Any

from reasonrl.params import Range
from reasonrl.registry import TASKS
from reasonrl.problem import Problem
from reasonrl.tasks.base import in_eval_split

__all__ = ["ForecastTask", "Event", "Decomposition", "parse_event", "parse_forecast", "relevant", "render_prompt", "render_solution"]

HARD_TOPICS = frozenset(range(5, 10))
UNPARSED_ERROR = 50  # the |p̂ − p1| an unparsable forecast counts as in eval metrics (half the price range)
# t#p0; then g±s; per group; then, on a hindsight prompt, (ids);
EVENT_RE = re.compile(r"(\d)#(\d{1,2});((?:\d[+-]\d;)+)(?:\((\d*)\);)?")


@dataclass(frozen=True)
class Event:
    topic: int
    p0: int
    groups: tuple[tuple[int, int], ...]  # (id, signed signal), in prompt order
    shock: int = 0

    @property
    def relevant(self) -> tuple[tuple[int, int], ...]:
        return tuple((g, s) for g, s in self.groups if relevant(g, self.topic))

    @property
    def p1(self) -> int:
        return min(99, max(0, self.p0 + sum(s for _, s in self.relevant) + self.shock))


def relevant(group: int, topic: int) -> bool:
    """The hidden rule: a group moves the price iff its id and the topic have different parity."""
    return (group + topic) % 2 == 1


def render_prompt(event: Event, hindsight: bool = False) -> str:
    text = f"{event.topic}#{event.p0};" + "".join(f"{g}{s:+d};" for g, s in event.groups)
    return text + ("(" + "".join(str(g) for g, _ in event.relevant) + ");" if hindsight else "")


def render_solution(p0: int, chosen: tuple[tuple[int, int], ...]) -> str:
    """``g±s=price;`` per chosen group (the running price, clipped to 0..99), then ``#p̂``."""
    price, parts = p0, []
    for g, s in chosen:
        price = min(99, max(0, price + s))
        parts.append(f"{g}{s:+d}={price};")
    return "".join(parts) + f"#{price}"


def parse_event(prompt: str) -> tuple[int, int, list[int]]:
    """(topic, p0, group ids in order) of a forecast prompt (plain or hindsight); ValueError
    naming the prompt when it is not one."""
    m = EVENT_RE.fullmatch(prompt.strip())
    if m is None:
        raise ValueError(f"not a forecast prompt ('t#p0;g±s;...;'): {prompt!r}")
    groups = [int(part[0]) for part in m.group(3).split(";") if part]
    return int(m.group(1)), int(m.group(2)), groups


STEP_RE = re.compile(r"(\d)([+-]\d)=(\d{1,2});")
DECOMPOSITION_RE = re.compile(r"((?:\d[+-]\d=\d{1,2};)*)#(\d{1,2})")


@dataclass(frozen=True)
class Decomposition:
    steps: tuple[tuple[int, int, int], ...]  # (group id, update, running price) per relevant group
    forecast: int  # the aggregate p̂


def parse_forecast(completion: str, prompt: str) -> Decomposition | None:
    """The decomposition of ``completion`` for the forecast ``prompt``, or None when it does not
    parse (wrong shape, a group not in the prompt, a repeated group, groups out of prompt order).
    A ``prompt`` that is not a forecast prompt raises ValueError."""
    _, _, groups = parse_event(prompt)
    m = DECOMPOSITION_RE.fullmatch(completion.strip())
    if m is None:
        return None
    steps = tuple((int(g), int(d), int(p)) for g, d, p in STEP_RE.findall(m.group(1)))
    order = [groups.index(g) if g in groups else -1 for g, _, _ in steps]
    if any(i < 0 for i in order) or any(b <= a for a, b in zip(order, order[1:])):
        return None
    return Decomposition(steps, int(m.group(2)))


@TASKS.register("forecast")
@dataclass
class ForecastTask:
    """Forecast a price move from participant groups; see the module docstring."""

    groups: Annotated[int, Range(ge=1, le=4, why="prompt and completion must fit the tiny model's 64 positions")] = 4
    pool_size: Annotated[int, Range(ge=1)] = 128
    shock_fraction: Annotated[float, Range(ge=0, le=1)] = 0.2
    careless_fraction: Annotated[float, Range(ge=0, le=1)] = 0.7
    hindsight_share: Annotated[float, Range(ge=0, le=1)] = 0.25
    eval_fraction: Annotated[float, Range(gt=0, lt=1)] = 0.1
    name: str = "forecast"

    alphabet = "0123456789+-*()=;#"  # the embedded tokenizer's default characters suffice

    def __post_init__(self) -> None:
        rng, seen, self._pool = random.Random("forecast-pool"), set(), []
        while len(self._pool) < self.pool_size:
            event = self._event(rng, held_out=False)
            if render_prompt(event) not in seen:
                seen.add(render_prompt(event))
                self._pool.append(event)

    def _event(self, rng: random.Random, held_out: bool) -> Event:
        """An event of the requested split (drawn until the prompt's hash puts it there)."""
        while True:
            ids = rng.sample(range(10), self.groups)
            groups = tuple((g, rng.choice((-1, 1)) * rng.randint(1, 5)) for g in ids)
            shock = rng.choice((-1, 1)) * rng.randint(6, 9) if rng.random() < self.shock_fraction else 0
            event = Event(rng.randrange(10), rng.randint(30, 69), groups, shock)
            if in_eval_split(render_prompt(event), self.eval_fraction) == held_out:
                return event

    def problem(self, event: Event, hindsight: bool = True) -> Problem:
        """The plain problem of ``event``; with ``hindsight`` its meta carries the hindsight
        prompt and the identified groups (training only)."""
        # "form" (public: the topic is in the prompt) splits eval accuracy into hard and easy topics.
        meta: dict[str, Any] = {"topic": event.topic, "p0": event.p0,
                                "form": "hard" if event.topic in HARD_TOPICS else "easy"}
        if hindsight:
            meta.update(hindsight_prompt=render_prompt(event, hindsight=True),
                        relevant="".join(str(g) for g, _ in event.relevant), shock=event.shock)
        return Problem(prompt=render_prompt(event), answer=str(event.p1),
                       solution=render_solution(event.p0, event.relevant), meta=meta)

    def train_problems(self, step: int, count: int, seed: int) -> list[Problem]:
        rng = random.Random(f"forecast:{seed}:{step}")
        return [self.problem(rng.choice(self._pool)) for _ in range(count)]

    def eval_problems(self, count: int) -> list[Problem]:
        rng = random.Random("forecast-eval")
        return [self.problem(self._event(rng, held_out=True), hindsight=False) for _ in range(count)]

    def warmup_problems(self, step: int, count: int, seed: int) -> list[Problem]:
        """Fresh events; careless solutions on hard topics, hindsight prompts; see the module
        docstring."""
        rng = random.Random(f"forecast-warmup:{seed}:{step}")
        out = []
        for _ in range(count):
            event = self._event(rng, held_out=False)
            if rng.random() < self.hindsight_share:
                out.append(Problem(render_prompt(event, hindsight=True), str(event.p1),
                                   render_solution(event.p0, event.relevant)))
                continue
            careless = event.topic in HARD_TOPICS and rng.random() < self.careless_fraction
            out.append(Problem(render_prompt(event), str(event.p1),
                               render_solution(event.p0, event.groups if careless else event.relevant)))
        return out

    def extract_answer(self, completion: str, problem: Problem) -> str | None:
        """The forecast p̂ as text (for majority voting and format-failure counts), or None."""
        parsed = parse_forecast(completion, problem.prompt)
        return None if parsed is None else str(parsed.forecast)

    def group_metrics(self, problem: Problem, completions: list[str]) -> dict[str, float]:
        """Means over one problem's samples: ``exact`` (p̂ = p1), ``abs_error`` (|p̂ − p1|, an
        unparsable sample counting as ``UNPARSED_ERROR``) and ``format`` (it parses)."""
        if not completions:
            raise ValueError("group_metrics needs at least one completion")
        p1 = int(problem.answer)
        parsed = [parse_forecast(c, problem.prompt) for c in completions]
        errors = [UNPARSED_ERROR if p is None else abs(p.forecast - p1) for p in parsed]
        return {"exact": sum(e == 0 for e in errors) / len(errors), "abs_error": sum(errors) / len(errors),
                "format": sum(p is not None for p in parsed) / len(parsed)}
