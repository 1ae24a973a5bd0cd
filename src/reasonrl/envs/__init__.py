"""Multi-turn environments, registered in ``ENVIRONMENTS`` (``env:`` in a recipe)."""

from reasonrl.envs.base import Environment, Step  # noqa: F401
from reasonrl.envs import calculator  # noqa: F401  (registers "calculator" and the "arithmetic_tools" task)
from reasonrl.envs import verifiers  # noqa: F401  (registers the "verifiers" task: environments written with verifiers)
from reasonrl.envs import openenv  # noqa: F401  (registers "openenv": environments served by OpenEnv)
