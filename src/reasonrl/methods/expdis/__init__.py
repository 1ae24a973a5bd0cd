"""ExpDis (Exploration–Distillation): novelty-seeking explorers, a filter, SFT rounds.

One research method in one package: importing it registers its components. See ``docs/methods/expdis.md``."""

from reasonrl.methods.expdis import advantage  # noqa: F401  (registration)
from reasonrl.methods.expdis import method  # noqa: F401  (registration)
