"""RL-ARC: calibration-aware RL with reasoning and answer confidence.

One research method in one package: importing it registers its components. See ``docs/methods/rl_arc.md``."""

from reasonrl.methods.rl_arc import method  # noqa: F401  (registration)
