"""Reward functions and verifiers, registered in ``REWARDS``.

A reward function is called once per completion::

    fn(completion: str, problem: Problem, *, num_tokens: int, truncated: bool, **params) -> float

(a group reward, marked ``@group_reward``, gets a prompt's G completions at once). A function
with TRL's batched signature, told by a parameter named ``completions`` and none named
``problem``, is called once per prompt group with keyword lists, as TRL's ``GRPOTrainer`` calls
it::

    fn(prompts=[...], completions=[...], answer=[...], solution=[...], <problem.meta keys>=[...],
       **params) -> list[float | None]      # None: not applicable, scored 0

(``completion_ids`` too where the caller has the token ids; a function without ``**kwargs``
gets only the names it declares). The recipe loader refuses a function the scorer cannot call
(``reasonrl.params.check_reward_signature``); its metrics are named by its function's name
(``reward/fn`` for ``path/to/file.py:fn``).
The scorer (``reasonrl.rewards.scorer``) calls it in a worker process forked from
the training process, under a timeout, so a reward function may:

- be any callable: a lambda, a closure, a function defined in your script's
  ``__main__`` or in a ``path/to/file.py`` (the worker inherits the object; nothing
  is pickled but the rows and the returned floats);
- return ``None`` (no opinion: 0, not a failure);
- raise, return something other than a real number finite in float32 (NaN, inf, 1e300,
  a ``str`` such as ``"1.0"``, a ``bool``, a tensor: never coerced), run past
  ``rewards[i].timeout_s`` (default ``rollout.reward_timeout_s``, 30 s), or kill its
  process (segfault, ``os._exit``, MemoryError): that sample (or group) scores 0, the failure is counted in
  ``reward_failures/<name>`` and warned about once per function and kind; a hung or
  dead worker is killed with its process group (so a sandbox it started goes too)
  and replaced, and the other rows carry on. A function that fails on more than
  ``rollout.reward_max_failure_share`` (0.5) of a step's completions ``rollout.reward_failure_patience``
  (3) steps in a row stops the run (exit 2) with its last error and the signature it is called with;
- be slow: ``rewards[i].workers: N`` scores its calls in N processes in parallel
  (``workers: 0``, the default, shares one worker among all such rewards);
- start subprocesses, threads, or its own ``TimeoutRunner`` (``math_verify`` does:
  each worker starts its own, never the parent's), and use torch on one thread.

What it cannot do: keep state across calls in the training process (a cache or
counter it updates lives in its worker, and is lost when that worker is
replaced), or use CUDA (a forked process cannot). The time a call takes includes
its lazy imports and verifier start-up on a fresh worker's first call.
"""

from reasonrl.rewards import basic  # noqa: F401  (registers the built-in rewards)
from reasonrl.rewards import math  # noqa: F401  (registers "math_verify"; math-verify itself is imported lazily)
from reasonrl.rewards import reasoning_gym  # noqa: F401  (registers "reasoning_gym"; the package itself is imported lazily)
from reasonrl.rewards import python_tests  # noqa: F401  (registers "python_tests"; runs model code in isolation.sandbox)
from reasonrl.rewards import proxy  # noqa: F401  (registers "proxy_length_keyword", the reward-hacking demo)
from reasonrl.rewards import learned  # noqa: F401  (registers "reward_model" and "llm_judge"; the model or endpoint is reached only when called)
