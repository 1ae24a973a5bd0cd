"""The one data flow: the stages of a training step in their order, and the batch keys each
stage declares writing and reading, checked when a recipe loads.

:data:`STAGES` is the order the Trainer runs (``Trainer.train_step`` walks it), the order this
module checks declarations in, and the order the docs describe (``reasonrl.hooks``). Stages
talk through ``batch.aux`` (per-row tensors), ``batch.meta`` (per-row values) and the rewards
themselves; every key one stage writes and another reads is declared by its writer and its
readers — a function with :func:`declares`, a method with ``Method.declared_keys`` — under one
of three kinds of name:

- a plain name: a ``batch.aux`` key (``"values"``, ``"env_channel"``);
- ``"meta:<key>"``: a ``batch.meta`` key written by a stage (``meta_reward(name)``: a recipe
  reward's unweighted scores, ``meta:reward/<name>``);
- :data:`REWARDS`: the stage changes ``batch.rewards`` after scoring (a method adding its reward
  term). Only the stages after it see the change; what each reader sees is in :data:`STAGES`.

A key read before any earlier stage wrote it is a recipe error naming the reader, the key and
the registered components that could write it; an ``aux`` key a method writes that nothing reads
is an error too (the method's work would be thrown away, always a misconfiguration). A reader
that works without a key (and uses it when present) declares it in ``optional``.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from reasonrl.hooks import method_specs
from reasonrl.params import ConfigError
from reasonrl.registry import ADVANTAGES, ENVIRONMENTS, METHODS, POLICY_LOSSES, SELECTORS, TOKEN_REWARDS

__all__ = ["STAGES", "STAGE_NAMES", "REWARDS", "ENV_CHANNEL", "meta_reward", "declares", "declared_stages",
           "check_data_flow"]

REWARDS = "batch.rewards"
"""Declared in ``produces`` by a stage that changes the scored rewards (``annotate`` only)."""

ENV_CHANNEL = "env_channel"
"""``batch.aux`` key the rollout writes for an environment with observation channels: per token,
0 for the model's tokens, k + 1 for the environment's channel k (``Environment.channels``)."""


def meta_reward(name: str) -> str:
    """The declared name of recipe reward ``name``'s unweighted scores, ``batch.meta["reward/<name>"]``."""
    return f"meta:reward/{name}"


STAGES: tuple[tuple[str, str], ...] = (
    ("rollout", "the rollout source: the prompt sampler picks prompts, G completions each are sampled and scored "
                "(batch.rewards, the weighted sum; meta:reward/<name>, each reward's own score; env_channel for "
                "channelled episodes); dynamic sampling drops flat groups here. The prompt sampler observes, and the "
                "reward/* metrics report, these scored rewards"),
    ("select", "the recipe's selectors, in order (GRPODropout, mixed_quality): they see the scored rewards"),
    ("extend_batch", "methods add or replace rows, each scored like the rollout's (ARG's guided continuations, "
                     "SynCo's synthetic tasks)"),
    ("token_reward", "a token-level reward writes dense rewards for the rows that will be trained on"),
    ("annotate", "methods write their aux keys and may add a reward term to batch.rewards (declared REWARDS); "
                 "a step with no rows left ends before this stage"),
    ("behaviour", "behaviour and proximal log-probs, off-policy weights"),
    ("advantage", "the advantage estimator: it reads batch.rewards as the methods left them"),
    ("update", "the policy's optimiser steps: the policy loss and the methods' loss terms (skipped while a "
               "method holds the policy)"),
    ("after_update", "methods learn from the same batch (a critic, a teacher) and report their metrics"),
)
STAGE_NAMES: tuple[str, ...] = tuple(name for name, _ in STAGES)


def declares(produces: Iterable[str] = (), consumes: Iterable[str] = (), optional: Iterable[str] = (),
             by_params: Callable[[dict], tuple[Iterable[str], Iterable[str]]] | None = None) -> Callable:
    """Decorator: the keys a registered function writes and reads (``optional``: reads when present).
    ``by_params(params) -> (produces, consumes)`` adds the keys that depend on the recipe's
    parameters of the function (a selector gating on the scores of the reward it is told to read)."""
    def mark(fn: Callable) -> Callable:
        fn.produces, fn.consumes, fn.optional = tuple(produces), tuple(consumes), tuple(optional)
        fn.keys_by_params = by_params
        return fn

    return mark


def _fn_keys(fn: Any, params: dict | None = None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    produces, consumes = tuple(getattr(fn, "produces", ())), tuple(getattr(fn, "consumes", ()))
    by_params = getattr(fn, "keys_by_params", None)
    if by_params is not None and params is not None:
        more_produces, more_consumes = by_params(dict(params))
        produces, consumes = produces + tuple(more_produces), consumes + tuple(more_consumes)
    return produces, consumes


def declared_stages(r: Any) -> list[tuple[str, str, tuple[str, ...], tuple[str, ...]]]:
    """``(stage, who, produces, consumes)`` for every component of recipe ``r``, in :data:`STAGES` order."""
    rollout: tuple[str, ...] = tuple(meta_reward(rw.name) for rw in r.rewards)
    if r.env is not None and getattr(ENVIRONMENTS.get(r.env.name), "channels", ()):
        rollout += (ENV_CHANNEL,)
    methods = [(name, cls.declared_keys(config)) for name, cls, config in method_specs(r)]
    by_stage: dict[str, list[tuple[str, tuple[str, ...], tuple[str, ...]]]] = {s: [] for s in STAGE_NAMES}
    by_stage["rollout"].append((f"the rollout ({r.rollout.source})", rollout, ()))
    by_stage["select"] = [(f"selector '{s.name}'", *_fn_keys(SELECTORS.get(s.name), s.params)) for s in r.selection]
    if r.token_reward is not None:
        by_stage["token_reward"].append((f"token_reward '{r.token_reward.name}'",
                                         *_fn_keys(TOKEN_REWARDS.get(r.token_reward.name), r.token_reward.params)))
    by_stage["advantage"].append((f"advantage '{r.advantage.name}'", *_fn_keys(ADVANTAGES.get(r.advantage.name), r.advantage.params)))
    by_stage["update"].append((f"loss.policy '{r.loss.policy}'", *_fn_keys(POLICY_LOSSES.get(r.loss.policy))))
    suffix = {"extend_batch": " (its extend_batch)", "update": " (its loss term)", "after_update": " (after the update)"}
    hook = {"update": "loss_term"}
    for stage in ("extend_batch", "annotate", "update", "after_update"):
        for name, keys in methods:
            if hook.get(stage, stage) in keys:
                by_stage[stage].append((f"method '{name}'{suffix.get(stage, '')}", *keys[hook.get(stage, stage)][:2]))
    return [(stage, who, produces, consumes) for stage in STAGE_NAMES for who, produces, consumes in by_stage[stage]]


def _writers(key: str) -> list[str]:
    """Registered components that declare writing ``key``, for the error message."""
    out = []
    for kind, reg in (("selector", SELECTORS), ("token_reward", TOKEN_REWARDS), ("advantage", ADVANTAGES)):
        out += [f"{kind} '{n}'" for n in reg.names() if key in _fn_keys(reg.get(n))[0]]
    for n in METHODS.names():
        cls = METHODS.get(n)
        writes = getattr(cls, "writes", ())
        if key in writes:
            section = getattr(cls, "section", None)
            out.append(f"method '{n}'" + (f" (a `{section}:` section in the recipe)" if section else ""))
    if key.startswith("meta:reward/"):
        out.append(f"the rollout, with '{key[len('meta:reward/'):]}' among the recipe's rewards")
    if key == ENV_CHANNEL:
        out.append("the rollout, with an env that has observation channels")
    return out


def _describe(keys: list[str]) -> str:
    aux = [k for k in keys if not k.startswith("meta:") and k != REWARDS]
    meta = [k[len("meta:"):] for k in keys if k.startswith("meta:")]
    parts = ([f"batch.aux[{', '.join(repr(k) for k in aux)}]"] if aux else []) + \
            ([f"batch.meta[{', '.join(repr(k) for k in meta)}]"] if meta else [])
    return " and ".join(parts)


def check_data_flow(r: Any, where: str) -> None:
    written: dict[str, str] = {}
    read: set[str] = set()
    for _stage, who, produces, consumes in declared_stages(r):
        missing = [k for k in consumes if k not in written]
        if missing:
            writers = sorted({w for k in missing for w in _writers(k)})
            hint = f"; written by {', '.join(writers)}" if writers else ""
            raise ConfigError(f"{where}: {who} reads {_describe(missing)}, which no earlier stage of the recipe "
                              f"writes{hint}")
        read.update(consumes)
        for k in produces:
            written.setdefault(k, who)
    unread = sorted(k for k, who in written.items()
                    if who.startswith("method") and k not in read and k != REWARDS and not k.startswith("meta:"))
    if unread:
        who = written[unread[0]]
        raise ConfigError(f"{where}: {who} writes {_describe(unread)}, which no stage of the recipe reads: its work "
                          "would be thrown away (is a stage that uses it missing?)")
