"""AURAL-RL's concise-reasoning reward and its mixed-quality group filter.

AURAL (arXiv 2610.01560, https://arxiv.org/abs/2610.01560, Wang et al.; the equations as quoted in a paper note)
trains latent reasoning for speech LLMs with a reward that pays for a right answer, and pays
more for a right answer reached in fewer reasoning steps::

    ℓ(L) = (L − 1)/(L_max − 1)
    R    = q·[1 + λ·(1 − ℓ(L))] − α·1_EOL − β·1_end

L the number of reasoning steps, q the answer quality (0 when wrong: brevity never pays for a
wrong answer, which removes the early-stop shortcut), 1_EOL = 1[the reasoning never ended],
1_end = 1[no answer]. The paper's coefficients 0.5, 0.10, 0.02 are read as λ, α, β in that
order (INFERRED mapping); L_max = 64 in its RL stage.

On the embedded arithmetic task (``3+4=7;7*5=35;####35``): a reasoning step is a non-empty
``;``-separated segment before the end-of-reasoning marker ``####``; q = exact match of the
``####`` answer (``rewards.basic.exact_answer``). ℓ is clipped to [0, 1] (INFERRED: the paper
always emits L ≥ 1 latent state and caps L at L_max, so the formula never leaves it there;
here a direct answer has L = 0 and a run-on trace may exceed L_max).

The paper keeps only the groups of mixed quality (some answers right, some wrong): the
``mixed_quality`` selector. DAPO's dynamic sampling (``rollout.dynamic_sampling``,
``algos.selection.zero_variance_groups``) cannot stand in for it here, because the length
bonus makes the rewards of an all-right group differ; the selector applies the same
zero-variance test to q itself. It also logs reasoning length per difficulty bucket.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

import torch

from reasonrl.algos.selection import zero_variance_groups
from reasonrl.params import Range
from reasonrl.dataflow import declares, meta_reward
from reasonrl.registry import REWARDS, SELECTORS
from reasonrl.problem import Problem

__all__ = ["normalised_length", "aural_reward", "reasoning_steps", "mixed_quality", "length_by_difficulty"]

END_OF_REASONING = "####"
STEP_SEPARATOR = ";"
_NUMBER = r"\s*-?[\d,]*\.?\d+"  # as rewards.basic.ANSWER_RE reads an answer


def normalised_length(length: float, l_max: float) -> float:
    """ℓ(L) = (L − 1)/(L_max − 1), clipped to [0, 1] (AURAL, arXiv 2610.01560)."""
    if l_max <= 1:
        raise ValueError(f"l_max must be > 1, got {l_max}")
    return min(1.0, max(0.0, (length - 1.0) / (l_max - 1.0)))


def reasoning_steps(completion: str, marker: str = END_OF_REASONING, separator: str = STEP_SEPARATOR) -> int:
    """The number of non-empty ``separator``-separated segments before ``marker`` (all of the
    text when there is no marker): ``3+4=7;7*5=35;####35`` has 2."""
    head = completion.split(marker, 1)[0]
    return sum(1 for segment in head.split(separator) if segment.strip())


@REWARDS.register("aural")
def aural_reward(completion: str, problem: Problem, *, num_tokens: int,
                 lam: Annotated[float, Range(ge=0, why="λ, the concision bonus")] = 0.5,
                 alpha: Annotated[float, Range(ge=0, why="α, the no-end-of-reasoning penalty")] = 0.10,
                 beta: Annotated[float, Range(ge=0, why="β, the no-answer penalty")] = 0.02,
                 l_max: Annotated[float, Range(gt=1, why="ℓ(L) divides by L_max − 1")] = 64,
                 unit: Literal["steps", "tokens"] = "steps",
                 marker: str = END_OF_REASONING, separator: str = STEP_SEPARATOR,
                 quality: str = "exact_answer", **_) -> float:
    """AURAL's reward R = q·[1 + λ(1 − ℓ(L))] − α·1_EOL − β·1_end (arXiv 2610.01560).

    q = the registered per-completion reward ``quality``'s score (default ``exact_answer``:
    1 right, 0 wrong; ``reasoning_gym`` on that task's tagged answers), called with its own
    defaults; L = the reasoning steps before ``marker``
    (``unit: steps``) or the completion's token count (``unit: tokens``: the whole completion,
    whose answer adds a few tokens to every trace alike); 1_EOL = 1[``marker`` absent];
    1_end = 1[no number after the marker] (the task's answer convention, as ``extract_answer``)."""
    if quality == "aural" or quality not in REWARDS:
        raise ValueError(f"aural: quality '{quality}' is not a registered reward other than aural; registered: {sorted(REWARDS)}")
    q = float(REWARDS.get(quality)(completion, problem, num_tokens=num_tokens))
    length = reasoning_steps(completion, marker, separator) if unit == "steps" else float(num_tokens)
    no_eol = marker not in completion
    no_answer = re.search(re.escape(marker) + _NUMBER, completion) is None
    return q * (1.0 + lam * (1.0 - normalised_length(length, l_max))) - alpha * no_eol - beta * no_answer


def _bucket(problem: Problem | None, answer: str, by: str) -> str:
    if by == "form":
        form = getattr(problem, "meta", {}).get("form") if problem is not None else None
        if form is not None:
            return str(form)
    digits = sum(ch.isdigit() for ch in str(answer))  # the answer's size: operand size, for arithmetic
    return f"{digits}digit"


def length_by_difficulty(completions: list[str], buckets: list[str], marker: str = END_OF_REASONING,
                         separator: str = STEP_SEPARATOR) -> dict[str, float]:
    """Mean reasoning steps and reasoning characters (the text before ``marker``) per
    difficulty bucket: ``steps/<bucket>`` and ``chars/<bucket>``. Harder questions should get
    longer reasoning; a concision reward that flattens this has taught the model to skip
    steps rather than to spend them where they are needed."""
    sums: dict[str, list[float]] = {}
    for text, bucket in zip(completions, buckets):
        entry = sums.setdefault(bucket, [0.0, 0.0, 0])
        entry[0] += reasoning_steps(text, marker, separator)
        entry[1] += len(text.split(marker, 1)[0])
        entry[2] += 1
    out = {}
    for bucket, (steps, chars, count) in sorted(sums.items()):
        out[f"steps/{bucket}"] = steps / count
        out[f"chars/{bucket}"] = chars / count
    return out


@SELECTORS.register("mixed_quality")
@declares(by_params=lambda params: ((), (meta_reward(params.get("quality", "exact_answer")),)))
def mixed_quality(batch, *, quality: str = "exact_answer",
                  threshold: float = 0.5,
                  difficulty: Literal["form", "answer_digits"] = "form",
                  marker: str = END_OF_REASONING, separator: str = STEP_SEPARATOR):
    """Keep only the groups whose answers are of mixed quality: some with q > ``threshold``,
    some not (AURAL keeps "only groups with mixed quality", arXiv 2610.01560). q is the
    recipe reward ``quality``'s unweighted score (``batch.meta["reward/<quality>"]``; give it
    weight 0 to only gate with it). The test is ``zero_variance_groups`` on 1[q > threshold].

    Metrics: ``kept_fraction`` (rows kept) and the reasoning length per difficulty bucket over
    every sampled row (``length_by_difficulty``; buckets by the problem's ``form`` meta, else
    by the answer's digit count; ``difficulty: answer_digits`` always by digits), its steps read
    with the ``aural`` reward's ``marker`` and ``separator`` (give both the same values)."""
    key = f"reward/{quality}"
    if key not in batch.meta:
        raise ValueError(f"mixed_quality: the batch has no scores of the quality reward '{quality}' "
                         f"(batch.meta['{key}']); add it to the recipe's rewards (weight 0 to only gate with it)")
    if len(batch) == 0:
        return batch, {}
    good = torch.tensor([float(v) > threshold for v in batch.meta[key]], dtype=torch.float32)
    keep = ~zero_variance_groups(good, batch.group_ids.cpu())
    problems = batch.meta.get("problem", [None] * len(batch))
    buckets = [_bucket(p if difficulty == "form" else None, a, difficulty)
               for p, a in zip(problems, batch.meta["answer"])]
    metrics = {"kept_fraction": float(keep.float().mean()),
               **length_by_difficulty(batch.meta["completion"], buckets, marker, separator)}
    return batch.select(torch.nonzero(keep).squeeze(-1)), metrics
