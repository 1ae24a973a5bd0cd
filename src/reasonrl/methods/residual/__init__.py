"""Residual Advantage (RA) and CoRA: the teacher–student residual credit.

One research method in one package: importing it registers its components. See ``docs/methods/residual_advantage.md``."""

from reasonrl.methods.residual import advantage  # noqa: F401  (registration)
from reasonrl.methods.residual import method  # noqa: F401  (registration)
