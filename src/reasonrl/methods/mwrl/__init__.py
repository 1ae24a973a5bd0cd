"""MWRL (Minimal-Witness RL): the lattice-coverage advantage and the ``minimal_witness`` task.

One research method in one package: importing it registers its components. See ``docs/methods/mwrl.md``."""

from reasonrl.methods.mwrl import advantage  # noqa: F401  (registration)
from reasonrl.methods.mwrl import task  # noqa: F401  (registration)
