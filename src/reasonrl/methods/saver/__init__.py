"""SAVER: paired dense and sparse views with a reliability-gated reference reward.

One research method in one package: importing it registers its components. See ``docs/methods/saver.md``."""

from reasonrl.methods.saver import method  # noqa: F401  (registration)
from reasonrl.methods.saver import reward  # noqa: F401  (registration)
from reasonrl.methods.saver import task  # noqa: F401  (registration)
