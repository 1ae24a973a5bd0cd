"""COPC's ablations on the staleness test bed (``benchmarks/staleness.py``, whose command line,
run folders and summary this reuses): the arms that took COPC's collapse apart
(``docs/methods/copc.md``, "Why the first form collapsed").

    .venv/bin/python benchmarks/copc_ablations.py OUT --steps 100 --ks 0 2 --arms copc --set train.threads=1
    .venv/bin/python benchmarks/copc_ablations.py OUT --steps 100 --ks 2 --seeds 1 --set train.threads=1 \\
        --arms copc_spec copc_whiten_off copc_mask_only copc_traces_only copc_no_weight

Arms (every one with the critic of ``recipes/ppo.yaml``; ``copc`` is the staleness script's own arm):

- ``copc``: COPC as shipped, whitening inside the trace weight (``whiten_at: residual``);
- ``copc_spec``: the first form, whitening c_t·B_t (``whiten_at: advantage``);
- ``copc_whiten_off``: no whitening at all, Â_t = c_t·B_t (V-trace's policy term);
- ``copc_mask_only``: the token mask with plain GAE (``gae`` + ``ratio_mask``, no traces);
- ``copc_traces_only``: the first form's traces without the mask (``off_policy: none``);
- ``copc_no_weight``: traces in the sum only, Â_t = whiten(B)_t (no weight on the current token).

At k = 0 every arm but ``copc_whiten_off`` is plain PPO with GAE, so only ``copc`` runs there.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import staleness  # noqa: E402  (the test bed beside this file)

COPC = staleness.ARMS["copc"]
ADV = COPC["advantage"]
staleness.ARMS.update({
    "copc_spec": {**COPC, "advantage": {**ADV, "whiten_at": "advantage"}},
    "copc_whiten_off": {**COPC, "advantage": {**ADV, "whiten": False}},
    "copc_mask_only": {**staleness.ARMS["ppo"], "off_policy": COPC["off_policy"]},
    "copc_traces_only": {**COPC, "advantage": {**ADV, "whiten_at": "advantage"}, "off_policy": {"name": "none"}},
    "copc_no_weight": {**COPC, "advantage": {**ADV, "weight": False}},
})

if __name__ == "__main__":
    raise SystemExit(staleness.main())
