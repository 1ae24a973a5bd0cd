"""SURGE's choices made without the test set: the validation split, the anchor, the donor, the cell.

SURGE (paper not located; formalised from its abstract, docs/methods/surge.md) fuses an anchor
and a donor checkpoint **of one RL run**, the donor being a checkpoint that answers shorter. Every
choice the experiment makes — which checkpoint is the anchor, which is the donor, which (ρ, γ)
cell of the sweep is "SURGE" — is made on a **validation** split of held-out problems that is
disjoint from the **test** split on which the chosen models are finally reported. Choosing on the
test split and reporting the same numbers would overstate the winner (the best of 6 noisy cells).

- :func:`split_eval_problems`: test = the task's first ``test_size`` held-out problems (exactly
  those training's ``eval`` and ``reasonrl eval --size`` score), validation = the next
  ``val_size``; both come from the task's held-out split, so neither overlaps training.
- :func:`choose_anchor`: the checkpoint with the highest validation greedy accuracy (the later on ties).
- :func:`choose_donor`: among the run's other checkpoints whose mean validation answer length is
  below the anchor's, the shortest (ties: higher validation accuracy, then the later one).
- :func:`choose_cell`: the fused model with the highest validation greedy accuracy (ties: higher
  validation avg@n, then the first in sweep order).

Each ``Scored`` carries a model's validation numbers; the functions are pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from reasonrl.problem import Problem

__all__ = ["Scored", "split_eval_problems", "choose_anchor", "choose_donor", "choose_cell"]


@dataclass(frozen=True)
class Scored:
    """A candidate model and its numbers on the validation split."""

    name: str
    greedy: float
    """Greedy accuracy."""
    length: float
    """Mean sampled completion length in tokens."""
    avg: float = 0.0
    """avg@n (sampled accuracy)."""
    step: int = 0
    """The training step of a checkpoint (0 for other models)."""


def split_eval_problems(task: Any, test_size: int, val_size: int) -> tuple[list[Problem], list[Problem]]:
    """(validation, test): test = ``task.eval_problems(test_size)``, validation = the next
    ``val_size`` held-out problems. A ValueError when the held-out split is too small or when a
    prompt would be in both (a task whose ``eval_problems`` is not a prefix-stable list)."""
    if test_size < 1 or val_size < 1:
        raise ValueError(f"need test_size >= 1 and val_size >= 1, got {test_size} and {val_size}")
    try:
        both = task.eval_problems(test_size + val_size)
    except ValueError as exc:
        raise ValueError(f"validation split: {exc} (test {test_size} + validation {val_size}); "
                         "lower --val-size") from None
    test = task.eval_problems(test_size)
    if [p.prompt for p in both[:test_size]] != [p.prompt for p in test]:
        raise ValueError("the task's held-out problems are not in a fixed order (eval_problems(n) is not a prefix "
                         "of eval_problems(n + m)); a validation split disjoint from the test split cannot be formed")
    validation = both[test_size:]
    shared = {p.prompt for p in test} & {p.prompt for p in validation}
    if shared:
        raise ValueError(f"{len(shared)} prompts are in both the test and the validation split "
                         f"(e.g. {next(iter(shared))!r}): the task repeats held-out problems")
    return validation, test


def choose_anchor(candidates: Sequence[Scored]) -> Scored:
    """The candidate with the highest validation greedy accuracy; the later step on ties."""
    if not candidates:
        raise ValueError("no candidate checkpoints for the anchor")
    return max(candidates, key=lambda c: (c.greedy, c.step))


def choose_donor(candidates: Sequence[Scored], anchor: Scored) -> Scored:
    """The shortest-answering candidate other than the anchor that answers shorter than it
    (validation mean length); ties: higher validation accuracy, then the later step. A
    ValueError naming the lengths when no checkpoint answers shorter than the anchor."""
    shorter = [c for c in candidates if c.name != anchor.name and c.length < anchor.length]
    if not shorter:
        lengths = ", ".join(f"{c.name} {c.length:.2f}" for c in candidates)
        raise ValueError(f"no checkpoint of the run answers shorter than the anchor {anchor.name} "
                         f"({anchor.length:.2f} tokens on validation): {lengths}; keep more checkpoints "
                         "(train.keep_checkpoints) or train the run with a length penalty")
    return min(shorter, key=lambda c: (c.length, -c.greedy, -c.step))


def choose_cell(cells: Sequence[Scored]) -> Scored:
    """The fused model with the highest validation greedy accuracy; ties: higher validation
    avg@n, then the first in the given (sweep) order."""
    if not cells:
        raise ValueError("no fused models to choose from")
    best = cells[0]
    for c in cells[1:]:
        if (c.greedy, c.avg) > (best.greedy, best.avg):
            best = c
    return best
