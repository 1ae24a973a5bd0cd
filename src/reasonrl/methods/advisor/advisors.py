"""Advisors: what answers the student's queries in the ``advisor`` environment.

An advisor is a class registered in ``ADVISORS`` (or ``path/to/file.py:Class``), built once
per process and configuration (``get_advisor``) with the recipe's ``env.advisor_params``::

    class Advisor:
        def answer(self, query: str, problem) -> str: ...

``query`` is what the student wrote between the query marks; ``problem`` is the episode's
``Problem``. An advisor that stands for a black box (the spec's LLM behind an API) must read
only ``query``: the student decides what is sent, and pays for it. ``problem`` is there for
stand-ins and logging. A failure raises ``AdvisorError`` with a message that says what failed.

Built in:

- ``tiny`` (:class:`TinyAdvisor`): a stronger local model built offline by the project's own
  tiny-model machinery (``load_tiny_policy``, cached like any ``model.tiny`` spec; by default
  warmed up on correct solutions, no careless bracket mistake, with operands up to 99), or a
  local model folder; it answers with its greedy completion of ``template`` (``{query};``).
- ``oracle_arithmetic`` (:class:`OracleArithmeticAdvisor`): the exact value of an arithmetic
  query (the calculator's evaluator), '' for anything else. A stand-in for tests and upper
  bounds, not a model.
- ``openai_chat`` (``reasonrl.methods.advisor.openai_chat``): any HTTP endpoint that speaks the
  OpenAI chat-completions API.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Annotated, Any

from reasonrl.params import Range, check_plugin_params
from reasonrl.registry import Registry

__all__ = ["ADVISORS", "Advisor", "AdvisorError", "OracleArithmeticAdvisor", "TinyAdvisor", "check_advisor",
           "get_advisor"]

ADVISORS = Registry("advisor", expects="class")


class AdvisorError(RuntimeError):
    """An advisor could not answer (an HTTP error, a timeout, a malformed reply)."""


class Advisor:
    """The advisor protocol (a base class with nothing to inherit but the name)."""

    def answer(self, query: str, problem) -> str:
        raise NotImplementedError

    def answer_batch(self, queries: list[str], problems: list) -> list[str]:
        """``answer`` for many queries at once (a benchmark's routing baselines); an advisor
        that can batch overrides it."""
        return [self.answer(q, p) for q, p in zip(queries, problems)]


_CACHE: dict[str, Advisor] = {}
_CACHE_LOCK = threading.Lock()


def check_advisor(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """The advisor class ``name``'s check of ``params`` (unknown names, types and bounds from its
    signature, then its own ``validate(**params)``, if any), when the recipe loads: a ValueError
    naming the ``env.advisor_params`` key. Returns the coerced params."""
    return check_plugin_params(ADVISORS, name, params, "advisor", "env.advisor", "env.advisor_params")


def get_advisor(name: str, params: dict[str, Any]) -> Advisor:
    """The advisor ``name`` built with ``params``: one instance per process and configuration
    (an environment is built per episode; a model behind it must be loaded once)."""
    key = json.dumps([name, params], sort_keys=True, default=str)
    with _CACHE_LOCK:
        advisor = _CACHE.get(key)
        if advisor is None:
            advisor = _CACHE[key] = ADVISORS.get(name)(**params)
        return advisor


@ADVISORS.register("oracle_arithmetic")
class OracleArithmeticAdvisor(Advisor):
    """The exact integer value of an arithmetic query (``+ - *``, brackets; the calculator's
    ``evaluate_expression``), '' for anything else: an always-right advisor on the embedded
    task, for tests and as an upper bound. Not a model; it ignores ``problem``."""

    def answer(self, query: str, problem) -> str:
        from reasonrl.envs.calculator import evaluate_expression

        value = evaluate_expression(query.strip())
        return "" if value is None else str(value)


@ADVISORS.register("tiny")
class TinyAdvisor(Advisor):
    """A local model that answers a query with its greedy completion of ``template``.

    ``tiny``: a ``model.tiny`` spec (``TinySpec`` fields) over ``DEFAULT_SPEC``, built and
    warmed up offline on first use and cached on disk like any tiny model (never downloaded).
    The default is stronger than the student on the embedded task: it imitates correct worked
    solutions (``careless_fraction: 0``), with operands up to 99, for twice the warm-up steps.
    ``path``: a local model folder instead (e.g. a trained run's ``final_model``).
    ``max_new_tokens``: the completion's budget (also capped by the model's positions).
    Its answers are cached per query (greedy decoding is deterministic)."""

    DEFAULT_SPEC = {"max_operand": 99, "careless_fraction": 0.0, "warmup_steps": 1200}
    MAX_CACHED = 100_000

    def __init__(self, tiny: dict | None = None, path: str | None = None, template: str = "{query};",
                 max_new_tokens: Annotated[int, Range(ge=1)] = 32) -> None:
        self.validate(tiny=tiny, path=path, template=template)
        self.template, self.max_new_tokens = template, max_new_tokens
        if path is not None:
            from reasonrl.policy.loading import load_hf_policy

            self.policy = load_hf_policy(Path(path).expanduser())
        else:
            from reasonrl.policy.tiny import TinySpec, load_tiny_policy

            self.policy = load_tiny_policy(TinySpec(**{**self.DEFAULT_SPEC, **(tiny or {})}))
        self.policy.model.requires_grad_(False)
        self.policy.model.eval()
        self.max_positions = getattr(self.policy.model.config, "max_position_embeddings", 10**6)
        self._answers: dict[str, str] = {}
        self._lock = threading.Lock()

    @staticmethod
    def validate(tiny: dict | None = None, path: str | None = None, template: str = "{query};", **_) -> None:
        import dataclasses

        from reasonrl.sections import TinyConfig

        if tiny is not None and path is not None:
            raise ValueError("env.advisor_params: give either tiny (a spec to build) or path (a local model "
                             "folder), not both")
        known = [f.name for f in dataclasses.fields(TinyConfig)]
        bad = [k for k in (tiny or {}) if k not in known]
        if bad:
            raise ValueError(f"env.advisor_params.tiny: unknown key '{bad[0]}'; allowed: {', '.join(known)}")
        if path is not None and not Path(path).expanduser().is_dir():
            raise ValueError(f"env.advisor_params.path: no such local model folder: {path} (advisors are "
                             "never downloaded)")
        if "{query}" not in template:
            raise ValueError(f"env.advisor_params.template must contain {{query}}, got {template!r}")

    def answer(self, query: str, problem) -> str:
        with self._lock:
            if query in self._answers:
                return self._answers[query]
            prompt = self.template.format(query=query)
            length = len(self.policy.tokenizer(prompt)["input_ids"])
            budget = max(1, min(self.max_new_tokens, self.max_positions - length))
            text = self.policy.sample([prompt], 1, budget, 0.0).texts[0]
            if len(self._answers) < self.MAX_CACHED:
                self._answers[query] = text
            return text

    def answer_batch(self, queries: list[str], problems: list, batch_size: int = 256) -> list[str]:
        """Greedy completions of many queries in left-padded batches (not cached: a batch may
        round differently from one query alone, and the environment's answers stay the latter)."""
        out: list[str] = []
        with self._lock:
            for i in range(0, len(queries), batch_size):
                prompts = [self.template.format(query=q) for q in queries[i:i + batch_size]]
                length = max(len(self.policy.tokenizer(p)["input_ids"]) for p in prompts)
                budget = max(1, min(self.max_new_tokens, self.max_positions - length))
                out += self.policy.sample(prompts, 1, budget, 0.0).texts
        return out
