"""Prompt sources with their answers; each registered in ``TASKS``."""

from reasonrl.tasks.base import Problem, Task  # noqa: F401
from reasonrl.tasks import arithmetic  # noqa: F401  (registers "arithmetic")
from reasonrl.tasks import gsm8k  # noqa: F401  (registers "gsm8k")
from reasonrl.tasks import dataset  # noqa: F401  (registers "dataset")
# reasoning-gym itself is imported only when the task is built, so this never fails.
from reasonrl.tasks import reasoning_gym  # noqa: F401  (registers "reasoning_gym" and its reward)
from reasonrl.tasks import multilabel  # noqa: F401  (registers "multilabel")
from reasonrl.tasks import witness  # noqa: F401  (registers "minimal_witness" and its rewards)
from reasonrl.tasks import function_graph  # noqa: F401  (registers "function_graph", FSG-RL's task)
from reasonrl.tasks import gsm8k_graph  # noqa: F401  (registers "gsm8k_graph", FSG-RL's graphs from GSM8K)
from reasonrl.tasks import arithmetic_proposals  # noqa: F401  (registers "arithmetic_proposals", SynCo's Synthesizer task)
from reasonrl.tasks import grounding  # noqa: F401  (registers "grounding", SAVER's dense/sparse-view task)
from reasonrl.tasks import clinical_qa  # noqa: F401  (registers "clinical_qa", the clinical soft verifier's task)
from reasonrl.tasks import forecast  # noqa: F401  (registers "forecast", the hindsight-regret curriculum's task)
from reasonrl.tasks import next_visit  # noqa: F401  (registers "next_visit", CARing's semantic-ID multi-label task)
