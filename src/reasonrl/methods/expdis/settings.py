"""The ExpDis loop's settings (``methods[novelty_memory].expdis`` in a recipe), read by the loop
(``loop``) and checked when the recipe loads by the ``novelty_memory`` method (``method``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional

from reasonrl.params import Range, build_section

__all__ = ["METHOD", "ExpDisSettings", "settings_from"]

METHOD = "novelty_memory"


@dataclass
class ExpDisSettings:
    """The loop's settings: ``methods[novelty_memory].expdis`` in the recipe (``--set expdis.X=...``
    on the command line). S, the explorer's steps, is the recipe's ``train.steps``; β is
    ``advantage.beta``."""

    rounds: Annotated[int, Range(ge=1)] = 3
    """R: explore → filter → distil rounds."""
    explorers: Annotated[int, Range(ge=1, le=99)] = 4
    """K: explorers per round, trained one after another from the round's student."""
    tau_n: Annotated[float, Range(ge=0, le=1)] = 0.1
    """τ_N: a sample is distilled only if its novelty at sampling time is at least this."""
    tau_dup: Annotated[float, Range(gt=0, le=1)] = 0.9
    """τ_dup: a sample whose n-gram Jaccard with one already kept for its prompt is ≥ this is dropped."""
    max_tokens: Optional[Annotated[int, Range(ge=1)]] = None
    """Length check of the filter: at most this many response tokens (null: any; truncated samples always go)."""
    sft_epochs: Annotated[int, Range(ge=1)] = 2
    sft_lr: Optional[Annotated[float, Range(gt=0)]] = None
    """Learning rate of the distillation (null: ``optim.lr``); the rest of ``optim:`` applies."""
    sft_batch_size: Annotated[int, Range(ge=1)] = 32
    """Examples per SFT optimiser step."""
    sft_micro_batch_size: Optional[Annotated[int, Range(ge=1)]] = None
    """Examples per forward/backward (null: ``train.micro_batch_size``); does not change the maths."""
    student_steps: Annotated[int, Range(ge=0)] = 0
    """Steps of plain GRPO (the ``base`` advantage, no bonus) on the student after its SFT; 0: none."""
    student_phase: Literal["every_round", "last_round"] = "every_round"
    """When the plain-GRPO steps run: after every round's SFT, or only after the last one."""
    explorer_eval: bool = False
    """Evaluate each explorer before and after its run (``eval:``); off by default to save time."""


def settings_from(raw: Any) -> ExpDisSettings:
    return build_section(ExpDisSettings, raw or {}, f"methods[{METHOD}]", "expdis")
