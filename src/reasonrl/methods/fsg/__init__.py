"""FSG-RL: function graphs as tagged Python, sandboxed checks, answer-gated span credit.

One research method in one package: importing it registers its components. See ``docs/methods/fsg_rl.md``."""

from reasonrl.methods.fsg import advantage  # noqa: F401  (registration)
from reasonrl.methods.fsg import execute  # noqa: F401  (registration)
from reasonrl.methods.fsg import gsm8k_task  # noqa: F401  (registration)
from reasonrl.methods.fsg import judge  # noqa: F401  (registration)
from reasonrl.methods.fsg import method  # noqa: F401  (registration)
from reasonrl.methods.fsg import parse  # noqa: F401  (registration)
from reasonrl.methods.fsg import task  # noqa: F401  (registration)
