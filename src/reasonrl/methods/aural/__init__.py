"""AURAL-RL: the concise-reasoning reward and the ``mixed_quality`` group filter.

One research method in one package: importing it registers its components. See ``docs/methods/aural.md``."""

from reasonrl.methods.aural import reward  # noqa: F401  (registration)
