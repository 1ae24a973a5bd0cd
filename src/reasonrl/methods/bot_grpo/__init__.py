"""BoT-GRPO (bag-of-tokens advantage) and its ``arithmetic_steps`` process reward.

One research method in one package: importing it registers its components. See ``docs/methods/bot_grpo.md``."""

from reasonrl.methods.bot_grpo import advantage  # noqa: F401  (registration)
from reasonrl.methods.bot_grpo import token_reward  # noqa: F401  (registration)
