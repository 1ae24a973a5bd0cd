"""CARing: the coverage reward, the ``multilabel`` and ``next_visit`` tasks, semantic IDs.

One research method in one package: importing it registers its components. See ``docs/methods/caring.md`` and ``docs/methods/coverage_reward.md``."""

from reasonrl.methods.caring import next_visit  # noqa: F401  (registration)
from reasonrl.methods.caring import reward  # noqa: F401  (registration)
from reasonrl.methods.caring import task  # noqa: F401  (registration)
