"""The RA/CoRA teacher on the method hooks (paper: "Residual Advantage (RA) and CoRA", not located; see
``reasonrl.policy.teacher`` for what it computes and ``docs/methods/residual_advantage.md``).

Enabled by the recipe's ``teacher:`` section. ``annotate`` writes the teacher's and the
student's token probabilities and the state value for the ``residual`` advantage; with
``teacher.update`` (CoRA), ``after_update`` trains the teacher's adapter on the verifier
advantage that the ``residual`` advantage left in ``batch.aux``.
"""

from __future__ import annotations

from typing import Any

from reasonrl.methods.residual.advantage import AUX_KEYS, VERIFIER_KEY
from reasonrl.batch import RolloutBatch
from reasonrl.sections import TeacherConfig
from reasonrl.hooks import Method, MethodContext
from reasonrl.registry import METHODS


@METHODS.register("residual_teacher")
class ResidualTeacher(Method):
    section = "teacher"
    writes = AUX_KEYS

    def __init__(self, config: TeacherConfig) -> None:
        self.cfg = config
        self.teacher = None

    @classmethod
    def declared_keys(cls, config: TeacherConfig) -> dict:
        return {"annotate": (AUX_KEYS, ()), "after_update": ((), (VERIFIER_KEY,) if config.update else ())}

    def setup(self, ctx: MethodContext) -> None:
        from reasonrl.methods.residual.teacher import Teacher

        self.student = ctx.policy
        self.temperature = ctx.recipe.rollout.temperature
        self.share_prompt = ctx.recipe.train.share_prompt
        self.teacher = Teacher(self.cfg, ctx.policy, log=ctx.log)

    def annotate(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        return self.teacher.annotate(batch, self.student, self.temperature)

    def after_update(self, batch: RolloutBatch, step: int) -> dict[str, float]:
        if not self.cfg.update:
            return {}
        return self.teacher.update(batch, self.temperature, self.share_prompt)

    def state_dict(self) -> dict[str, Any]:
        return self.teacher.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.teacher.load_state_dict(state)
