"""RollVerify: stale prefixes of partial rollouts checked at the weight switch.

One research method in one package: importing it registers its components. See ``docs/methods/rollverify.md``."""
from reasonrl.methods.rollverify import prefix_check  # noqa: F401  (registration)
