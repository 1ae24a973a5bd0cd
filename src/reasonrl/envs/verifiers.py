"""Environments written with verifiers (``task: {name: verifiers, env: <id>}``): their tasks,
their rollout protocol and their rubric, trained on the exact token ids the policy sampled.

The environment runs in a worker process of its own (``reasonrl.rollout.verifiers_worker``,
under ``$REASONRL_VERIFIERS_PYTHON``: ``make verifiers-env``), with its event loop, its tools
and its rubric. Its agents ask the model through an OpenAI-compatible endpoint over the policy
(``reasonrl.policy.openai_server``) that this process serves on 127.0.0.1 while a step
samples; the endpoint keeps every conversation's ids and log-probs under the rollout's trace id
(verifiers' ``X-Session-ID``), and each rollout becomes one row of the batch:

- prompt: the ids of the first request (the chat template's rendering of the task's prompt);
- completion: the sampled ids of each turn (trained), and between turns the template's turn
  boundary and the environment's messages as ids (attended, never trained: ``loss_mask`` 0);
- reward: the rubric's weighted reward (``reward/env``), plus the recipe's ``rewards`` on the
  text of the model's turns, if it names any.

A rollout whose agent asked the model more than once outside one conversation (a client that
edited the history) trains on its longest conversation; ``verifiers/extra_conversations``
counts the others. A rollout that failed (an error in the environment) trains as reward 0 and
is counted in ``verifiers/errors``.

The model sees what verifiers sends (system prompt, chat template), so the policy's tokenizer
needs a chat template; the embedded model's is a plain one (the messages' texts in order).
The rollout runs under the ``sync`` source or the ``async`` one (``rollout.partial: false``: an
episode keeps its weights), over the learner's policy or a vLLM engine (``rollout.engine:
vllm``: the endpoint then serves the engine's samples and log-probs). The evaluator runs the
same rollouts greedily on the held-out tasks and scores them with the rubric (``eval.size``:
``eval/accuracy`` is the share whose reward is 1, ``eval/env_reward`` the mean).
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Annotated, Any

import torch

from reasonrl.params import Range
from reasonrl.policy.sampling import Samples, left_pad, right_pad
from reasonrl.problem import Problem
from reasonrl.registry import TASKS
from reasonrl.policy.openai_server import PolicyServer
from reasonrl.isolation.worker_process import WorkerError, WorkerProcess
from reasonrl.tasks.base import in_eval_split

__all__ = ["VerifiersTask", "VerifiersRollout", "VerifiersError", "verifiers_python", "VERIFIERS_PYTHON_ENV"]

VERIFIERS_PYTHON_ENV = "REASONRL_VERIFIERS_PYTHON"
VERIFIERS_INSTALL = (f"`make verifiers-env` and export {VERIFIERS_PYTHON_ENV}=$PWD/.venv-verifiers/bin/python, then "
                     "install the environment's package there (docs/environments.md)")
WORKER = Path(__file__).resolve().parents[1] / "rollout" / "verifiers_worker.py"
MODEL_NAME = "reasonrl-policy"


class VerifiersError(WorkerError):
    """The verifiers worker failed, died or did not answer in time."""


class VerifiersProcess(WorkerProcess):
    who = "the verifiers worker"
    timeout_key = "task.timeout_s"
    error = VerifiersError


def verifiers_python() -> str | None:
    """The interpreter that runs environments: ``$REASONRL_VERIFIERS_PYTHON``, else this one when
    it has verifiers, else None."""
    explicit = os.environ.get(VERIFIERS_PYTHON_ENV)
    if explicit:
        return explicit
    return sys.executable if find_spec("verifiers") is not None else None


# One worker per environment and process: the task lists the environment's tasks with it, the
# rollout runs them (the two are built apart, from the same recipe).
_WORKERS: dict[str, tuple[VerifiersProcess, list[dict]]] = {}


def _worker(env: str, config: dict, timeout_s: float, pythonpath: list[str]) -> tuple[VerifiersProcess, list[dict]]:
    key = json.dumps([env, config, timeout_s, pythonpath], sort_keys=True)
    if key in _WORKERS and _WORKERS[key][0].alive():
        return _WORKERS[key]
    python = verifiers_python()
    if python is None:
        raise ValueError(f"a verifiers environment needs verifiers, which this Python ({sys.executable}) cannot "
                         f"import: {VERIFIERS_INSTALL}")
    log = Path(tempfile.mkdtemp(prefix="reasonrl-verifiers-")) / "worker.log"
    # The worker's import path is its own interpreter's plus task.pythonpath, never this process's
    # PYTHONPATH: that may hold this environment's site-packages (Flower's Ray backend exports
    # sys.path there), whose packages would stand for the worker's own (seen: OpenEnv's server
    # importing .venv's mcp).
    proc = VerifiersProcess(log, timeout_s, [python, str(WORKER)], {"PYTHONPATH": os.pathsep.join(pythonpath)})
    try:
        tasks = proc.call("start", env=env, config=config)["tasks"]
    except VerifiersError as exc:
        proc.kill()
        raise ValueError(f"verifiers environment '{env}' did not load: {str(exc).splitlines()[0]}\n{exc}") from None
    if not tasks:
        proc.close()
        raise ValueError(f"verifiers environment '{env}' has no tasks")
    _WORKERS[key] = (proc, tasks)
    return _WORKERS[key]


@TASKS.register("verifiers")
@dataclass
class VerifiersTask:
    """A verifiers environment's tasks as problems (each problem is one task of the
    environment, by index); its rollouts run in the worker (:class:`VerifiersRollout`).

    ``env``: the taskset or env id (an importable module in the worker's interpreter).
    ``config``: the env config's other fields (``{"taskset": {...}}`` parameters, a role's
    settings). ``pythonpath``: folders added to the worker's import path (an environment that
    is not installed; the worker does not inherit this process's ``PYTHONPATH``).
    ``eval_fraction``: the share of tasks held out (by a hash of the prompt).
    ``timeout_s``: the longest one call of the worker may take (a whole step's rollouts).
    ``max_concurrent``: episodes run at once."""

    env: str
    config: dict[str, Any] = field(default_factory=dict)
    pythonpath: list[str] = field(default_factory=list)
    eval_fraction: Annotated[float, Range(ge=0, lt=1)] = 0.1
    timeout_s: Annotated[float, Range(gt=0)] = 600.0
    max_concurrent: Annotated[int, Range(ge=1)] = 64
    name: str = "verifiers"

    def __post_init__(self) -> None:
        if not isinstance(self.env, str) or not self.env:
            raise ValueError("task.env must name a verifiers taskset or env (an importable module)")
        self.worker, tasks = _worker(self.env, self.config, self.timeout_s, [str(Path(p).resolve()) for p in self.pythonpath])
        self.problems = [Problem(t["prompt"] or f"task {k}", "", meta={"verifiers_task": k}) for k, t in enumerate(tasks)]
        held = [in_eval_split(p.prompt, self.eval_fraction) for p in self.problems]
        self.train = [p for p, h in zip(self.problems, held) if not h] or self.problems
        self.held_out = [p for p, h in zip(self.problems, held) if h]

    def train_problems(self, step: int, count: int, seed: int) -> list[Problem]:
        rng = random.Random(f"verifiers:{seed}:{step}")
        return [self.train[rng.randrange(len(self.train))] for _ in range(count)]

    def eval_problems(self, count: int) -> list[Problem]:
        return self.held_out[:count]

    def rollout_sampler(self, policy, recipe) -> VerifiersRollout:
        return VerifiersRollout(self, policy, recipe)


class VerifiersRollout:
    """The sampler ``collect`` calls for a verifiers task (``episodic``: it gets the problems):
    serves the policy, has the worker run ``G`` rollouts of each problem's task, and builds the
    batch's rows from the endpoint's conversations. ``metrics()``: the means since the last call."""

    episodic = True

    def __init__(self, task: VerifiersTask, policy, recipe) -> None:
        self.task, self.policy, self.tokenizer = task, policy, policy.tokenizer
        self.server: PolicyServer | None = None
        self._sums: dict[str, float] = defaultdict(float)
        self._episodes = 0

    def sample(self, prompts, num_generations, max_new_tokens, temperature=1.0, generator=None, stop=None,
               problems=None, **_) -> Samples:
        if problems is None or len(problems) != len(prompts):
            raise ValueError("a verifiers rollout needs the problems of its prompts (problems=[...])")
        if self.server is None:
            self.server = PolicyServer(self.policy, MODEL_NAME, max_batch=4096, batch_window_s=0.05,
                                       request_timeout_s=self.task.timeout_s)
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator)) if generator is not None else 0
        self.server.generator.manual_seed(seed)  # the draws follow the run's stream (given the batches)
        try:
            reply = self.task.worker.call("rollout", tasks=[p.meta["verifiers_task"] for p in problems],
                                          n=num_generations, temperature=float(temperature), max_tokens=int(max_new_tokens),
                                          max_concurrent=self.task.max_concurrent, base_url=self.server.base_url,
                                          model=MODEL_NAME)
            if self.server.error is not None:
                raise RuntimeError(f"the policy failed while serving the environment: {self.server.error!r}") from self.server.error
            return self._assemble(reply["rollouts"])
        finally:
            self.server.forget()

    def _assemble(self, rollouts: list[dict]) -> Samples:
        tok, pad = self.tokenizer, self.tokenizer.pad_token_id
        prompts, blocks, rewards, truncated = [], [], [], []
        for r in rollouts:
            convs = self.server.session(r["trace"])
            self._sums["verifiers/errors"] += float(bool(r["errors"]) or not convs)
            self._sums["verifiers/extra_conversations"] += max(0, len(convs) - 1)
            self._sums["verifiers/turns"] += r["turns"]
            for name, value in {**r["rewards"], **r["metrics"]}.items():
                if value is not None:
                    self._sums[f"verifiers/{name}"] += value
            if not convs:  # the environment failed before the model spoke: an empty row, reward 0
                prompts.append(torch.tensor([pad]))
                blocks.append(([], [], []))
                rewards.append(0.0)
                truncated.append(True)
                continue
            conv = max(convs, key=lambda c: len(c.context))
            prompts.append(torch.tensor(conv.prompt_ids))
            blocks.append(conv.block())
            rewards.append(r["reward"] if r["reward"] is not None and not r["errors"] else 0.0)
            truncated.append(conv.finish_reason == "length")
        self._episodes += len(rollouts)
        prompt_ids, prompt_mask = left_pad(prompts, pad)
        ids, mask = right_pad([torch.tensor(b[0], dtype=torch.long) for b in blocks], pad)
        logps = right_pad([torch.tensor(b[1], dtype=torch.float) for b in blocks])[0]
        loss = right_pad([torch.tensor(b[2], dtype=torch.long) for b in blocks])[0]
        texts = [tok.decode(torch.tensor(b[0], dtype=torch.long)[torch.tensor(b[2], dtype=torch.bool)], skip_special_tokens=True)
                 if b[0] else "" for b in blocks]
        return Samples(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=ids, completion_mask=mask,
                       sample_logprobs=logps * loss, truncated=torch.tensor(truncated), texts=texts, loss_mask=loss,
                       env_rewards=torch.tensor(rewards))

    def metrics(self) -> dict[str, float]:
        sums, episodes = self._sums, self._episodes
        self._sums, self._episodes = defaultdict(float), 0
        return {k: v / episodes for k, v in sums.items()} if episodes else {}

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
