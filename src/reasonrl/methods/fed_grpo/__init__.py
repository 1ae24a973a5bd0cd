"""Fed-GRPO on Flower (``docs/methods/fed_grpo.md``; INFERRED from the abstract of Fed-GRPO,
github.com/HKU-HealthAI/Fed-GRPO).

Importing this package registers what a recipe names (the ``fed_grpo`` method and the
``non_iid`` prompt sampler); it does not import Flower, an optional extra (``reasonrl[fed]``):
``reasonrl.methods.fed_grpo.strategy`` and ``reasonrl.methods.fed_grpo.apps`` do, when a federation runs.

- ``sampler``: the non-IID prompt sampler (each client sees mostly its own problem forms);
- ``method``: the client's extras on the method hooks (calibration weights ω, the round's
  signal S_c, n_c and mean reward);
- ``codec``: an update as one sparse payload (error-compensated update, per-block budgets, top-k);
- ``client``: one client's round (E local GRPO steps with the library's Trainer);
- ``strategy``: the Flower strategy (signal-weighted aggregation, R̄ broadcast, the round's upload
  slots split across clients, sparse decode);
- ``apps``: Flower's ServerApp/ClientApp, the simulation and the real-process entry points.
"""

from reasonrl.methods.fed_grpo import method  # noqa: F401  (registers the "fed_grpo" method)
from reasonrl.methods.fed_grpo import sampler  # noqa: F401  (registers the "non_iid" prompt sampler)
