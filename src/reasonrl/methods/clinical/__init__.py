"""The clinical soft verifier: concept F1, the entropy-normalised judge, the consistency penalty.

One research method in one package: importing it registers its components. See ``docs/methods/clinical_verifier.md``."""

from reasonrl.methods.clinical import method  # noqa: F401  (registration)
from reasonrl.methods.clinical import reward  # noqa: F401  (registration)
from reasonrl.methods.clinical import task  # noqa: F401  (registration)
