"""SRD (Self-Retrospection Distillation).

One research method in one package: importing it registers its components. See ``docs/methods/srd.md``."""

from reasonrl.methods.srd import method  # noqa: F401  (registration)
