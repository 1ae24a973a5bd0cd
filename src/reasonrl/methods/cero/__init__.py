"""CERO (Cross-Epoch Adaptive Rollout Optimization) and the ``pool`` baseline sampler.

One research method in one package: importing it registers its components. See ``docs/methods/cero.md``."""

from reasonrl.methods.cero import sampler  # noqa: F401  (registration)
