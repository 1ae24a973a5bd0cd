"""SLM–LLM advisor collaboration under a call budget (paper: "Learning to Ask: Information Acquisition for
SLM-LLM Collaboration, under a budget", https://arxiv.org/abs/2610.01236): the
``Advisor`` interface and its registry (``advisors``, ``openai_chat``), the ``advisor``
environment and the ``arithmetic_advisor`` task (``env``). See ``docs/methods/advisor.md``."""

from reasonrl.methods.advisor.advisors import (  # noqa: F401
    ADVISORS, Advisor, AdvisorError, OracleArithmeticAdvisor, TinyAdvisor, check_advisor, get_advisor)
from reasonrl.methods.advisor.openai_chat import OpenAIChatAdvisor  # noqa: F401
from reasonrl.methods.advisor.env import (  # noqa: F401
    ASK_CLOSE, ASK_OPEN, AdvisorEnv, ArithmeticAdvisorTask, advice_value)
from reasonrl.methods.advisor import method  # noqa: F401  (registers "advice_gain", stage 2's information gain)
