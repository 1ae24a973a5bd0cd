"""Pure tensor math for RL post-training: advantages, policy losses, KL, selection.

Importing this package registers the estimators and losses in
``reasonrl.registry`` (``ADVANTAGES``, ``POLICY_LOSSES``, ``KL_ESTIMATORS``).
"""

from reasonrl.algos import advantages, kl, losses, masked, overlong, selection  # noqa: F401  (registration)
from reasonrl.algos import residual  # noqa: F401  (registration: Residual Advantage)
from reasonrl.algos import bag_of_tokens  # noqa: F401  (registers "bot_grpo")
from reasonrl.algos import dropout  # noqa: F401  (registration: GRPODropout selector + advantage)
from reasonrl.algos import witness  # noqa: F401  (registers the "mwrl" advantage)
from reasonrl.algos import offpolicy  # noqa: F401  (registers OFF_POLICY corrections: tis, mis, decoupled_ppo, ...)
from reasonrl.algos import critic  # noqa: F401  (registers the "gae" advantage)
from reasonrl.algos import copc  # noqa: F401  (registers the "copc" advantage)
from reasonrl.algos import trajectory  # noqa: F401  (registers "tic_grpo" and "gmc_grpo" policy losses)
from reasonrl.algos import fsg  # noqa: F401  (registers the "fsg_span" advantage)
from reasonrl.algos import novelty  # noqa: F401  (registers the "novelty" advantage, ExpDis's explorer bonus)
