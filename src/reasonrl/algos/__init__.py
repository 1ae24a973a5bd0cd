"""Pure tensor math for RL post-training: advantages, policy losses, KL, selection.

Importing this package registers the estimators and losses in
``reasonrl.registry`` (``ADVANTAGES``, ``POLICY_LOSSES``, ``KL_ESTIMATORS``).
"""

from reasonrl.algos import advantages, kl, losses, masked, overlong, selection  # noqa: F401  (registration)
