"""The one list of packages that register components: importing this module makes every
built-in name of a recipe resolvable.

An entry point of the house (with ``cli``, ``api`` and ``config``): it may import anything, and
nothing in the core or in a method imports it. Each package registers its components when it is
imported (``@ADVANTAGES.register("grpo")`` ...). A process that did not start from an entry
point (a spawned sampler, a Ray actor, a Flower app) gets the same names: a registry that
misses a name loads this module through the ``reasonrl.components`` entry-point group
(``pyproject.toml``), where other installed packages may list their own components too.

To add a research method: write ``methods/<name>/`` (``docs/adding_a_method.md``); it is found
there. The core's packages are listed by name below.
"""

from __future__ import annotations

import importlib
import pkgutil

# The core: the GRPO family and the generic stages.
import reasonrl.algos  # noqa: F401  (advantages, policy losses, KL estimators, off-policy corrections, gae)
import reasonrl.envs  # noqa: F401  (environments: calculator)
import reasonrl.evaluate.diagnostics  # noqa: F401  (the reward-hacking diagnostics' citation checkers)
import reasonrl.rewards  # noqa: F401  (reward functions and verifiers)
import reasonrl.rollout.async_source  # noqa: F401  (the async rollout source)
import reasonrl.rollout.partial  # noqa: F401  (the keep / discard prefix checks)
import reasonrl.rollout.samplers  # noqa: F401  (prompt samplers)
import reasonrl.rollout.sources  # noqa: F401  (rollout sources: sync)
import reasonrl.tasks  # noqa: F401  (tasks)
import reasonrl.train.critic  # noqa: F401  (PPO's critic, a method)
import reasonrl.train.opd  # noqa: F401  (on-policy distillation, a method)
import reasonrl.train.optim  # noqa: F401  (optimisers and LR schedules)

# Research methods, one package each: every package under ``reasonrl/methods/`` is imported, so a new
# method is its package, a recipe, a test file and a docs page, and nothing here changes.
import reasonrl.methods


def _method_packages() -> list[str]:
    return sorted(info.name for info in pkgutil.iter_modules(reasonrl.methods.__path__, "reasonrl.methods.")
                  if info.ispkg)


METHOD_PACKAGES = tuple(_method_packages())
"""The research-method packages found (and imported) when this module loaded."""
for _name in METHOD_PACKAGES:
    importlib.import_module(_name)
