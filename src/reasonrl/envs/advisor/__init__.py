"""SLM–LLM advisor collaboration under a call budget (``specs/methods-b.md`` §11): the
``Advisor`` interface and its registry (``advisors``, ``openai_chat``), the ``advisor``
environment and the ``arithmetic_advisor`` task (``env``). See ``docs/methods/advisor.md``."""

from reasonrl.envs.advisor.advisors import (  # noqa: F401
    ADVISORS, Advisor, AdvisorError, OracleArithmeticAdvisor, TinyAdvisor, check_advisor, get_advisor)
from reasonrl.envs.advisor.openai_chat import OpenAIChatAdvisor  # noqa: F401
from reasonrl.envs.advisor.env import (  # noqa: F401
    ASK_CLOSE, ASK_OPEN, AdvisorEnv, ArithmeticAdvisorTask, advice_value)
