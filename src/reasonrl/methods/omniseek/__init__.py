"""OmniSeek-style evidence seeking: the ``evidence`` environment and the ``necessity_reward`` method.

One research method in one package: importing it registers its components. See ``docs/methods/evidence_seeking.md``."""

from reasonrl.methods.omniseek import env  # noqa: F401  (registration)
from reasonrl.methods.omniseek import method  # noqa: F401  (registration)
