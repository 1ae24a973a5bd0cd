"""Declared ``batch.aux`` keys: who writes what, who reads what, checked when a recipe loads.

Stages talk through ``batch.aux`` (per-row tensors a method or an estimator adds). A
component declares the keys it writes and reads — a function with :func:`declares`, a method
with ``Method.declared_keys`` — and :func:`check_data_flow` walks the recipe's stages in the
order the Trainer runs them::

    selection → token_reward → methods.annotate → advantage → loss → methods.loss_term
    → methods.after_update

A key read before any earlier stage wrote it is a recipe error naming the reader, the key and
the registered components that could write it; a key a method writes that nothing reads is an
error too (the method's work would be thrown away, which is always a misconfiguration).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from reasonrl.params import ConfigError

__all__ = ["declares", "check_data_flow"]


def declares(produces: Iterable[str] = (), consumes: Iterable[str] = ()) -> Callable:
    """Decorator: the ``batch.aux`` keys a registered function writes and reads."""
    def mark(fn: Callable) -> Callable:
        fn.produces, fn.consumes = tuple(produces), tuple(consumes)
        return fn

    return mark


def _fn_keys(fn: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return tuple(getattr(fn, "produces", ())), tuple(getattr(fn, "consumes", ()))


def _stages(r: Any) -> list[tuple[str, tuple[str, ...], tuple[str, ...]]]:
    from reasonrl.methods.base import method_specs
    from reasonrl.registry import ADVANTAGES, POLICY_LOSSES, SELECTORS, TOKEN_REWARDS

    stages = [(f"selector '{s.name}'", *_fn_keys(SELECTORS.get(s.name))) for s in r.selection]
    if r.token_reward is not None:
        stages.append((f"token_reward '{r.token_reward.name}'", *_fn_keys(TOKEN_REWARDS.get(r.token_reward.name))))
    methods = [(name, cls.declared_keys(config)) for name, cls, config in method_specs(r)]
    stages += [(f"method '{name}'", *keys.get("annotate", ((), ()))) for name, keys in methods]
    stages.append((f"advantage '{r.advantage.name}'", *_fn_keys(ADVANTAGES.get(r.advantage.name))))
    stages.append((f"loss.policy '{r.loss.policy}'", *_fn_keys(POLICY_LOSSES.get(r.loss.policy))))
    stages += [(f"method '{name}' (its loss term)", *keys["loss_term"]) for name, keys in methods if "loss_term" in keys]
    stages += [(f"method '{name}' (after the update)", *keys.get("after_update", ((), ()))) for name, keys in methods]
    return stages


def _writers(key: str) -> list[str]:
    """Registered components that declare writing ``key``, for the error message."""
    from reasonrl.registry import ADVANTAGES, METHODS, SELECTORS, TOKEN_REWARDS

    out = []
    for kind, reg in (("selector", SELECTORS), ("token_reward", TOKEN_REWARDS), ("advantage", ADVANTAGES)):
        out += [f"{kind} '{n}'" for n in reg.names() if key in _fn_keys(reg.get(n))[0]]
    for n in METHODS.names():
        cls = METHODS.get(n)
        writes = getattr(cls, "writes", ())
        if key in writes:
            section = getattr(cls, "section", None)
            out.append(f"method '{n}'" + (f" (a `{section}:` section in the recipe)" if section else ""))
    return out


def check_data_flow(r: Any, where: str) -> None:
    written: dict[str, str] = {}
    read: set[str] = set()
    for who, produces, consumes in _stages(r):
        missing = [k for k in consumes if k not in written]
        if missing:
            writers = sorted({w for k in missing for w in _writers(k)})
            hint = f"; written by {', '.join(writers)}" if writers else ""
            raise ConfigError(f"{where}: {who} reads batch.aux[{', '.join(repr(k) for k in missing)}], which no "
                              f"earlier stage of the recipe writes{hint}")
        read.update(consumes)
        for k in produces:
            written.setdefault(k, who)
    unread = sorted(k for k, who in written.items() if who.startswith("method") and k not in read)
    if unread:
        who = written[unread[0]]
        raise ConfigError(f"{where}: {who} writes batch.aux[{', '.join(repr(k) for k in unread)}], which no stage of "
                          "the recipe reads: its work would be thrown away (is a stage that uses it missing?)")
