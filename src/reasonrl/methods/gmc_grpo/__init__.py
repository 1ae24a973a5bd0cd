"""TIC-GRPO and GMC-GRPO: trajectory-ratio clipping and group-mass capping policy losses.

One research method in one package: importing it registers its components. See ``docs/methods/gmc_grpo.md``."""

from reasonrl.methods.gmc_grpo import loss  # noqa: F401  (registration)
