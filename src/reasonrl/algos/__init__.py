"""Pure tensor math for RL post-training: advantages, policy losses, KL, selection.

Importing this package registers the estimators and losses in
``reasonrl.registry`` (``ADVANTAGES``, ``POLICY_LOSSES``, ``KL_ESTIMATORS``).
"""

from reasonrl.algos import advantages, kl, losses, masked, overlong, selection  # noqa: F401  (registration)
from reasonrl.algos import offpolicy  # noqa: F401  (registers OFF_POLICY corrections: tis, mis, decoupled_ppo, ...)
from reasonrl.algos import critic  # noqa: F401  (registers the "gae" advantage)
