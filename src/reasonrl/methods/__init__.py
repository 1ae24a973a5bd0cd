"""Components that own models or state, called through the method hooks (``methods.base``)."""

from reasonrl.methods import residual_teacher  # noqa: F401  (registers "residual_teacher")
from reasonrl.methods import critic  # noqa: F401  (registers "critic", PPO's value model)
from reasonrl.methods import necessity  # noqa: F401  (registers "necessity_reward", OmniSeek's r_avn)
from reasonrl.methods import fsg  # noqa: F401  (registers "fsg_verifier", FSG-RL's verifier and span map)
from reasonrl.methods import advice_gain  # noqa: F401  (registers "advice_gain", the advisor's stage-2 information gain)
from reasonrl.methods import opd  # noqa: F401  (registers "opd", on-policy distillation)
from reasonrl.methods import ts_opd  # noqa: F401  (registers "ts_opd", transfer-stratified OPD)
from reasonrl.methods import srd  # noqa: F401  (registers "srd", self-retrospection distillation)
from reasonrl.methods import arg  # noqa: F401  (registers "arg", adaptive reference guidance)
from reasonrl.methods import synco  # noqa: F401  (registers "synco", a Synthesizer co-trained with the Reasoner)
from reasonrl.methods import novelty  # noqa: F401  (registers "novelty_memory", the ExpDis explorers' memory)
from reasonrl.methods import drift  # noqa: F401  (registers "drift", the reference perplexity of the reasoning)
from reasonrl.methods import rl_arc  # noqa: F401  (registers "rl_arc", calibration-aware reward from reasoning/answer confidence)
from reasonrl.methods import saver  # noqa: F401  (registers "saver", the paired views' gated reference reward)
from reasonrl.methods import rlcpr  # noqa: F401  (registers "rlcpr", the verifier-free probability reward)
from reasonrl.methods import clinical_judge  # noqa: F401  (registers "clinical_judge", the entropy-normalised judge)
from reasonrl.methods.base import Method, MethodContext, build_methods  # noqa: F401
