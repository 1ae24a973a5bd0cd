"""Prompt sources with their answers; each registered in ``TASKS``."""

from reasonrl.problem import Problem  # noqa: F401

from reasonrl.tasks.base import Task  # noqa: F401
from reasonrl.tasks import arithmetic  # noqa: F401  (registers "arithmetic")
from reasonrl.tasks import gsm8k  # noqa: F401  (registers "gsm8k")
from reasonrl.tasks import dataset  # noqa: F401  (registers "dataset")
# reasoning-gym itself is imported only when the task is built, so this never fails.
from reasonrl.tasks import reasoning_gym  # noqa: F401  (registers "reasoning_gym" and its reward)
