"""Minimal-witness subset sums: a set-valued task with several right answers.

A problem lists distinct small numbers (ascending) and a target; a proposal chooses some
of them. The verifier is monotone, s(S) = [Σ_{i∈S} v_i ≥ target], and a MINIMAL WITNESS
is a sufficient set whose every element is necessary (dropping any one falls below the
target). Problems are kept only when they have several minimal witnesses (3–8 by
default), so a policy can be judged on how many distinct ones it finds (MWRL,
``reasonrl.methods.mwrl.advantage``)::

    prompt      1,3,4,6,8>9;          (values, then ">" and the target)
    proposal    1+8                   (the chosen values, "+"-separated, any order)
    witnesses   1+8 3+6 3+8 4+6 4+8 6+8   (the exact oracle, ``minimal_witnesses``)
    not minimal 1+3+6 (3+6 suffices), 1+3+4+6 ...

Sets are frozensets of item INDICES (positions in the prompt); values are distinct, so a
value names its item.

Warm-up design (what the embedded model imitates before RL). With probability
``favourite_fraction`` the solution is the greedy-largest-first set (add the largest
items until the target is met): always a minimal witness (the last item added is the
smallest, and the sum before it fell short), and always the SAME one for a problem: one
favourite kind. Otherwise it is a padded random prefix: shuffle the items, take them
until the target is met, then one more (when one is left). That set is sufficient, never
minimal (the extra item is unnecessary) and varies between samples. So the warm model
is fluent and mostly sufficient, but neither reliably minimal nor diverse among its
minimal answers: RL has room to improve both, and a reward that pays only for
minimality can settle on the favourite, while MWRL's credit pays for new witnesses.

Targets exceed the largest item, so every witness combines at least two items.

Train/eval split: every problem goes to a split by a stable hash of its prompt.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

from reasonrl.registry import REWARDS, TASKS
from reasonrl.problem import Problem
from reasonrl.tasks.base import in_eval_split

ALPHABET = "0123456789,+>;"
PROPOSAL_RE = re.compile(r"^\d+(?:\+\d+)*$")


# -- the verifier and its oracle ------------------------------------------------

def is_sufficient(values: Sequence[int], target: int, chosen: frozenset) -> bool:
    """s(S) = [Σ_{i∈S} v_i ≥ target]."""
    return sum(values[i] for i in chosen) >= target


def is_minimal(values: Sequence[int], target: int, chosen: frozenset) -> bool:
    """Sufficient, and every element necessary: s(S \\ {i}) = 0 for each i ∈ S."""
    return is_sufficient(values, target, chosen) and all(
        not is_sufficient(values, target, chosen - {i}) for i in chosen)


def minimal_witnesses(values: Sequence[int], target: int) -> list[frozenset]:
    """All minimal witnesses, exactly, for positive ``values`` (the oracle).

    Depth-first over the items in decreasing value, adding items while the sum is below
    the target. A branch stops at the first item that reaches the target: that item is
    the set's smallest, and the sum without it was below the target, so the set is
    minimal (removing a larger item removes more). Conversely every minimal witness,
    listed in decreasing value, is such a path. Branches that cannot reach the target
    even with every remaining item are cut. Sorted by (size, indices).
    """
    if any(v <= 0 for v in values):
        raise ValueError(f"values must be positive, got {list(values)}")
    order = sorted(range(len(values)), key=lambda i: -values[i])
    suffix = [0] * (len(order) + 1)
    for pos in range(len(order) - 1, -1, -1):
        suffix[pos] = suffix[pos + 1] + values[order[pos]]
    found: list[frozenset] = []

    def extend(start: int, chosen: list[int], total: int) -> None:
        for pos in range(start, len(order)):
            if total + suffix[pos] < target:
                return  # nothing from here on can reach the target
            item = order[pos]
            if total + values[item] >= target:
                found.append(frozenset(chosen + [item]))
            else:
                extend(pos + 1, chosen + [item], total + values[item])

    if target <= 0:
        return [frozenset()]
    extend(0, [], 0)
    return sorted(found, key=lambda s: (len(s), sorted(s)))


# -- text <-> sets ----------------------------------------------------------------

def render_prompt(values: Sequence[int], target: int) -> str:
    return ",".join(map(str, values)) + f">{target};"


def render_proposal(values: Sequence[int], chosen: frozenset) -> str:
    """The chosen values in prompt order, e.g. ``3+8``."""
    return "+".join(str(values[i]) for i in sorted(chosen))


def parse_proposal(text: str, values: Sequence[int]) -> frozenset | None:
    """The set of item indices a completion names, or None when it is malformed: not
    ``n+n+…``, a value that is not an item, or an item named twice."""
    if not isinstance(text, str):
        return None
    text = text.strip()
    if not PROPOSAL_RE.match(text):
        return None
    where = {v: i for i, v in enumerate(values)}
    picked = [where.get(int(tok)) for tok in text.split("+")]
    if None in picked or len(set(picked)) != len(picked):
        return None
    return frozenset(picked)


def _instance(problem: Problem) -> tuple[list[int], int]:
    try:
        return list(problem.meta["values"]), int(problem.meta["target"])
    except (KeyError, TypeError, ValueError):
        raise ValueError("expected a minimal_witness problem (meta with 'values' and 'target'), "
                         f"got meta keys {sorted(problem.meta)} for prompt {problem.prompt!r}") from None


def verdict(completion: str, problem: Problem) -> tuple[frozenset | None, bool]:
    """(parsed set or None, sufficient?) for one completion; malformed is insufficient."""
    values, target = _instance(problem)
    chosen = parse_proposal(completion, values)
    return chosen, chosen is not None and is_sufficient(values, target, chosen)


@REWARDS.register("witness_sufficient")
def witness_sufficient(completion: str, problem: Problem, **_) -> float:
    """1.0 when the completion names a set of items whose sum reaches the target."""
    return float(verdict(completion, problem)[1])


@REWARDS.register("witness_minimal")
def witness_minimal(completion: str, problem: Problem, **_) -> float:
    """1.0 when the named set is sufficient and minimal (the set-valued GRPO reward)."""
    values, target = _instance(problem)
    chosen = parse_proposal(completion, values)
    return float(chosen is not None and is_minimal(values, target, chosen))


# -- the task ---------------------------------------------------------------------------

@TASKS.register("minimal_witness")
@dataclass
class MinimalWitnessTask:
    """Subset-sum minimal witnesses (see module docstring)."""

    min_items: int = 5
    max_items: int = 6
    max_value: int = 9
    """Items are distinct integers in 1..max_value (one character each at the default)."""
    min_witnesses: int = 3
    max_witnesses: int = 8
    """Only problems whose number of minimal witnesses lies in [min_witnesses, max_witnesses]."""
    eval_fraction: float = 0.1
    favourite_fraction: float = 0.5
    """Share of warm-up solutions that are the greedy-largest-first witness (the rest are
    random-order prefixes: sufficient, often non-minimal)."""
    name: str = "minimal_witness"
    alphabet = ALPHABET  # class attribute: the characters of every prompt and solution

    def __post_init__(self) -> None:
        if not 1 <= self.min_items <= self.max_items:
            raise ValueError(f"task.min_items/max_items must satisfy 1 <= min_items <= max_items, "
                             f"got {self.min_items}, {self.max_items}")
        if self.max_value < self.max_items:
            raise ValueError(f"task.max_value must be >= max_items (items are distinct), got {self.max_value}")
        if self.max_value > 30:
            raise ValueError(f"task.max_value must be <= 30 (the exact space is enumerated), got {self.max_value}")
        if not 1 <= self.min_witnesses <= self.max_witnesses:
            raise ValueError(f"task.min_witnesses/max_witnesses must satisfy 1 <= min <= max, "
                             f"got {self.min_witnesses}, {self.max_witnesses}")
        if not 0.0 < self.eval_fraction < 1.0:
            raise ValueError(f"task.eval_fraction must be in (0, 1), got {self.eval_fraction}")
        if not 0.0 <= self.favourite_fraction <= 1.0:
            raise ValueError(f"task.favourite_fraction must be in [0, 1], got {self.favourite_fraction}")
        self._train: list[tuple[tuple[int, ...], int]] = []
        self._eval: list[tuple[tuple[int, ...], int]] = []
        for n in range(self.min_items, self.max_items + 1):
            for values in combinations(range(1, self.max_value + 1), n):
                # A target above the largest item: every witness combines at least two items.
                for target in range(max(values) + 1, sum(values) + 1):
                    if self.min_witnesses <= len(minimal_witnesses(values, target)) <= self.max_witnesses:
                        key = (values, target)
                        split = self._eval if in_eval_split(render_prompt(*key), self.eval_fraction) else self._train
                        split.append(key)
        if not self._train or not self._eval:
            raise ValueError("task 'minimal_witness' produced an empty split; widen the item or witness ranges")
        random.Random(1234).shuffle(self._eval)

    def problem(self, values: Sequence[int], target: int, solution: str = "") -> Problem:
        witnesses = minimal_witnesses(values, target)
        return Problem(
            prompt=render_prompt(values, target),
            answer=";".join(render_proposal(values, w) for w in witnesses),
            solution=solution,
            meta={"values": list(values), "target": target, "num_witnesses": len(witnesses)},
        )

    def train_problems(self, step: int, count: int, seed: int) -> list[Problem]:
        rng = random.Random(f"{seed}:{step}")
        return [self.problem(*rng.choice(self._train)) for _ in range(count)]

    def eval_problems(self, count: int) -> list[Problem]:
        if count > len(self._eval):
            raise ValueError(f"asked for {count} eval problems; the held-out split has {len(self._eval)}")
        return [self.problem(*key) for key in self._eval[:count]]

    def warmup_problems(self, step: int, count: int, seed: int) -> list[Problem]:
        """Training problems whose ``solution`` is the favourite witness or a random
        sufficient prefix (see module docstring)."""
        rng = random.Random(f"warmup:{seed}:{step}")
        out = []
        for _ in range(count):
            values, target = rng.choice(self._train)
            favourite = rng.random() < self.favourite_fraction
            if favourite:
                order = sorted(range(len(values)), key=lambda i: -values[i])
            else:
                order = list(range(len(values)))
                rng.shuffle(order)
            chosen: list[int] = []
            for i in order:
                if sum(values[j] for j in chosen) >= target:
                    break
                chosen.append(i)
            if not favourite and len(chosen) < len(order):
                chosen.append(order[len(chosen)])  # one item past sufficiency: never minimal
            out.append(self.problem(values, target, render_proposal(values, frozenset(chosen))))
        return out

    def extract_answer(self, completion: str, problem: Problem) -> str | None:
        """The proposal in canonical form (items in prompt order), for majority voting; None if malformed."""
        values, _ = _instance(problem)
        chosen = parse_proposal(completion, values)
        return render_proposal(values, chosen) if chosen is not None else None

    def group_metrics(self, problem: Problem, completions: list[str]) -> dict[str, float]:
        """Quality of n samples for one problem: ``witness_recall`` (share of the problem's
        minimal witnesses among the distinct minimal proposals), ``distinct_minimal``,
        ``minimal_rate``, ``sufficient_rate`` and ``parse_rate``."""
        values, target = _instance(problem)
        witnesses = set(minimal_witnesses(values, target))
        parsed = [parse_proposal(c, values) for c in completions]
        sufficient = [s is not None and is_sufficient(values, target, s) for s in parsed]
        minimal = [s is not None and s in witnesses for s in parsed]
        found = {s for s, ok in zip(parsed, minimal) if ok}
        n = max(len(completions), 1)
        return {
            "witness_recall": len(found) / len(witnesses) if witnesses else 0.0,
            "distinct_minimal": float(len(found)),
            "minimal_rate": sum(minimal) / n,
            "sufficient_rate": sum(sufficient) / n,
            "parse_rate": sum(s is not None for s in parsed) / n,
        }
