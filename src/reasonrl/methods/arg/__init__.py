"""ARG (Adaptive Reference Guidance).

One research method in one package: importing it registers its components. See ``docs/methods/arg.md``."""

from reasonrl.methods.arg import method  # noqa: F401  (registration)
