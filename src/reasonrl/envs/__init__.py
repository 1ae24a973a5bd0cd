"""Multi-turn environments, registered in ``ENVIRONMENTS`` (``env:`` in a recipe)."""

from reasonrl.envs.base import Environment, Step  # noqa: F401
from reasonrl.envs import calculator  # noqa: F401  (registers "calculator" and the "arithmetic_tools" task)
from reasonrl.envs import evidence  # noqa: F401  (registers "evidence", the "evidence_seek" task, "evidence_tool_use")
from reasonrl.envs import advisor  # noqa: F401  (registers "advisor", its ADVISORS, and the "arithmetic_advisor" task)
