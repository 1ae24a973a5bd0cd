"""Prompt sources with their answers; each registered in ``TASKS``."""

from reasonrl.tasks.base import Problem, Task  # noqa: F401
from reasonrl.tasks import arithmetic  # noqa: F401  (registers "arithmetic")
