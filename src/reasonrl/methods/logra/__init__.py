"""LoGRA: low-rank gradient sketches with predicted-KL step control, as the ``logra`` optimiser.

One research method in one package: importing it registers its components. See ``docs/methods/logra.md``."""

from reasonrl.methods.logra import optimizer  # noqa: F401  (registration)
