"""RLCPR: verifier-free RL with probability rewards, and the ``uncertainty`` prompt sampler.

One research method in one package: importing it registers its components. See ``docs/methods/rlcpr.md``."""

from reasonrl.methods.rlcpr import method  # noqa: F401  (registration)
from reasonrl.methods.rlcpr import sampler  # noqa: F401  (registration)
