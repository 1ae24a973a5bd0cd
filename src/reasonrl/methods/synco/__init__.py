"""SynCo: a Synthesizer co-trained with the Reasoner.

One research method in one package: importing it registers its components. See ``docs/methods/synco.md``."""

from reasonrl.methods.synco import method  # noqa: F401  (registration)
from reasonrl.methods.synco import task  # noqa: F401  (registration)
