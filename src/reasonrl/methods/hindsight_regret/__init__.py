"""macro2mind's hindsight-regret curriculum: the sampler, the regret method, the ``forecast`` task and rewards.

One research method in one package: importing it registers its components. See ``docs/methods/hindsight_regret.md``."""

from reasonrl.methods.hindsight_regret import method  # noqa: F401  (registration)
from reasonrl.methods.hindsight_regret import reward  # noqa: F401  (registration)
from reasonrl.methods.hindsight_regret import sampler  # noqa: F401  (registration)
from reasonrl.methods.hindsight_regret import task  # noqa: F401  (registration)
