"""A second model beside the policy (a teacher, a reference, a judge, a synthesiser, a critic's
trunk): built from a ``model:`` section on the student's device (:func:`build_teacher_policy`),
and checked to read the student's token ids (:func:`check_shared_vocabulary`). Used by the
distillation methods, the critic and several research methods.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from reasonrl.params import build_section
from reasonrl.policy.factory import build_policy
from reasonrl.policy.hf import HFPolicy
from reasonrl.sections import ModelConfig

__all__ = ["build_teacher_policy", "check_shared_vocabulary"]


def check_shared_vocabulary(student_tokenizer, teacher_tokenizer, role: str = "teacher") -> None:
    """The teacher (or a critic: ``role``) reads the student's token ids, so both must mean the
    same strings by them."""
    s, t = student_tokenizer.get_vocab(), teacher_tokenizer.get_vocab()
    if s == t:
        return
    differ = sorted({tok for tok in s.keys() | t.keys() if s.get(tok) != t.get(tok)}, key=str)[:5]
    raise ValueError(
        f"{role} and student must share one tokenizer vocabulary (the {role} reads the student's token ids): "
        f"the student has {len(s)} tokens, the {role} {len(t)}; they differ on e.g. "
        + ", ".join(f"{tok!r} (student id {s.get(tok)}, {role} id {t.get(tok)})" for tok in differ)
        + f". Choose a {role}.model of the student's model family.")


def build_teacher_policy(cfg: Any, student: HFPolicy, log: Callable[[str], None] | None = None,
                         trainable: bool = False, role: str = "teacher", same_vocab: bool = True,
                         key: str = "model") -> HFPolicy:
    """A second model (a teacher, a reference, a judge, a synthesiser) from a ``model:`` section
    (a ``ModelConfig``, or its mapping, named ``methods[<role>].<key>`` in errors) on the
    student's device, with the run's RNG untouched. ``same_vocab``: checked to read the
    student's token ids (a model that reads and writes its own text, a judge, skips it). Its
    LoRA, if any, is the caller's to apply."""
    if isinstance(cfg, dict):
        cfg = build_section(ModelConfig, cfg, "recipe", f"methods[{role}].{key}")
    # Building an uncached tiny model reseeds and draws from the global RNG; isolate it so a
    # run does not depend on what was cached.
    with torch.random.fork_rng(devices=[]):
        policy = build_policy(dataclasses.replace(cfg, lora=None), log=log, trainable=trainable)
    if same_vocab:
        check_shared_vocabulary(student.tokenizer, policy.tokenizer, role)
    policy.model.to(student.device)
    policy.device = student.device
    if not trainable:
        policy.model.eval()
    return policy
