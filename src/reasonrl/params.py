"""One typed path for every value a recipe sets: section fields and component parameters.

A value is checked against its declared type, and against the bounds declared beside it::

    epsilon: Annotated[float, Range(ge=0)] = 0.2          # in a function's signature
    num_generations: Annotated[int, Range(ge=2, why="a group needs a baseline")] = 8

Recipe sections (dataclasses in ``reasonrl.sections``) and registered components (reward
functions, advantages, policy losses, optimisers, methods...) go through the same
:func:`coerce`, so a bad number fails when the recipe loads, with the key, the bound and
the value, never as a traceback after the run folder exists.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Annotated, Callable, Iterable, Literal, Union

from reasonrl import registry
from reasonrl.registry import UnknownNameError, closest_match_hint

__all__ = ["ConfigError", "Range", "Component", "build_section", "PIPELINE_ARGS", "registered", "coerce",
           "component_hints", "check_component_params", "check_plugin_params", "inject"]


class ConfigError(ValueError):
    """A recipe problem (a value that does not fit its declared type or bounds, an unknown key
    or name); the message names the key and what was expected. The CLI exits 2 on it."""


@dataclass(frozen=True)
class Range:
    """Bounds of a number: ``ge``/``gt``/``le``/``lt``; ``why`` is appended to the error."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    why: str = ""

    def check(self, value: Any, key: str, where: str) -> None:
        if value is None:
            return
        if isinstance(value, float) and math.isnan(value):
            raise ConfigError(f"{where}: {key} must be a number, got nan")
        for bound, ok, word in ((self.ge, lambda b: value >= b, ">="), (self.gt, lambda b: value > b, ">"),
                                (self.le, lambda b: value <= b, "<="), (self.lt, lambda b: value < b, "<")):
            if bound is not None and not ok(bound):
                why = f" ({self.why})" if self.why else ""
                raise ConfigError(f"{where}: {key} must be {word} {_fmt(bound)}, got {value!r}{why}")


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def coerce(tp: Any, value: Any, where: str, key: str) -> Any:
    """``value`` as type ``tp`` (dataclass sections recursively), or a ConfigError naming ``key``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Annotated:
        out = coerce(args[0], value, where, key)
        for extra in tp.__metadata__:
            if isinstance(extra, Range):
                extra.check(out, key, where)
        return out
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(arg, value, where, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[-1] if errors else f"{where}: '{key}' has an invalid value {value!r}")
    if origin is Literal:
        if value not in args:
            allowed = [str(a) for a in args]
            raise ConfigError(f"{where}: '{key}' must be one of {', '.join(allowed)}; got {value!r}."
                             f"{closest_match_hint(str(value), allowed)}")
        return value
    if origin in (list, tuple) and not isinstance(value, (list, tuple)):
        what = "a list" if origin is list else f"a list of {len(args)} values"
        raise ConfigError(f"{where}: '{key}' must be {what}, got {value!r}")
    if origin is list:
        return [coerce(args[0], v, where, f"{key}[{i}]") for i, v in enumerate(value)] if args else list(value)
    if origin is tuple:
        if args and args[-1] is not Ellipsis and len(value) != len(args):
            raise ConfigError(f"{where}: '{key}' must be a list of {len(args)} values, got {value!r}")
        kinds = [args[0]] * len(value) if args and args[-1] is Ellipsis else list(args)
        return tuple(coerce(a, v, where, key) for a, v in zip(kinds, value)) if args else tuple(value)
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: '{key}' must be a mapping, got {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return build_section(tp, value, where, key)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: '{key}' must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: '{key}' must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):
            # PyYAML reads `3e-4` (no dot) as a string; accept what any reader would call a number.
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: '{key}' must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: '{key}' must be a string, got {value!r}")
        return value
    # Anything else (Any, a class, a protocol, an unresolvable hint) is the component's business.
    return value


def component_hints(fn: Callable) -> dict[str, Any]:
    """The type hints of ``fn``'s parameters (of ``__init__`` for a class), with their
    ``Annotated`` bounds; empty when a hint cannot be resolved (a name imported only for type
    checking): such a component's parameters pass unchecked, as before hints were read."""
    target = fn.__init__ if inspect.isclass(fn) else fn
    try:
        return typing.get_type_hints(target, include_extras=True)
    except Exception:  # noqa: BLE001
        return {}


def own_parameters(fn: Callable, pipeline: Iterable[str]) -> tuple[list[str], bool]:
    """The parameter names a recipe may set (``fn``'s keyword parameters less the ``pipeline``
    arguments the stage supplies itself), and whether ``fn`` takes ``**kwargs``."""
    target = fn.__init__ if inspect.isclass(fn) else fn
    params = inspect.signature(target).parameters
    skip = set(pipeline) | {"self"}
    own = [n for n, p in params.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and n not in skip]
    return own, any(p.kind is p.VAR_KEYWORD for p in params.values())


def check_component_params(fn: Callable, params: dict[str, Any], where: str, key: str,
                           pipeline: Iterable[str], strict_kwargs: bool = False) -> dict[str, Any]:
    """Check a component's recipe ``params`` against its signature: unknown names fail with the
    closest match; values are coerced to their hints and checked against their bounds; then
    the component's own ``check_params(**params)``, if it has one, may reject values. Returns
    the coerced parameters. A component taking ``**kwargs`` accepts any name unless
    ``strict_kwargs`` (reward functions swallow the pipeline's extras with ``**_``)."""
    own, takes_any = own_parameters(fn, pipeline)
    if not takes_any or strict_kwargs:
        for p in params:
            if p not in own:
                raise ConfigError(f"{where}: unknown parameter '{key}.{p}'; allowed: {', '.join(own) or '(none)'}."
                                 f"{closest_match_hint(p, own)}")
    hints = component_hints(fn)
    out = {p: coerce(hints[p], v, where, f"{key}.{p}") if p in hints else v for p, v in params.items()}
    check = getattr(fn, "check_params", None)
    if check is not None:
        try:
            check(**out)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: {key}: {exc}") from None
    return out


def inject(fn: Callable, args: tuple, pipeline: dict[str, Any], params: dict[str, Any]) -> Any:
    """Call ``fn(*args, **params)`` plus those ``pipeline`` values (batch, step, total_steps...)
    that its signature declares by name."""
    sig = inspect.signature(fn).parameters
    return fn(*args, **{k: v for k, v in pipeline.items() if k in sig}, **params)


def check_plugin_params(registry, name: str, params: dict[str, Any], what: str, name_key: str,
                        params_key: str) -> dict[str, Any]:
    """The check, when the recipe loads, of a plugin that a section names with its own parameter
    dict (an env's ``advisor`` + ``advisor_params``, a verifier's ``teacher`` + ``teacher_params``):
    the name must be in ``registry`` (or be ``file.py:Class``), then ``params`` go through
    ``check_component_params`` against the class's signature and its own ``validate(**params)``,
    if any. Errors are ValueErrors naming ``name_key`` / ``params_key``. Returns the coerced params."""
    try:
        cls = registry.get(name)
    except KeyError as exc:
        raise ValueError(f"{name_key}: {exc}") from None
    try:
        params = check_component_params(cls, dict(params), f"{what} '{name}'", params_key, ())
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    validate = getattr(cls, "validate", None)
    if validate is not None:
        validate(**params)
    return params


# --- recipe sections -------------------------------------------------------------

@dataclass
class Component:
    """A registry name plus that component's own parameters (``{name: grpo, scale: group}``)."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)


# The registry each component section's names are looked up in.
_COMPONENT_REGISTRIES = {
    "task": registry.TASKS,
    "rewards": registry.REWARDS,
    "token_reward": registry.TOKEN_REWARDS,
    "selection": registry.SELECTORS,
    "advantage": registry.ADVANTAGES,
    "eval.task": registry.TASKS,
    "sampler": registry.PROMPT_SAMPLERS,
    "methods": registry.METHODS,
    "off_policy": registry.OFF_POLICY,
    "rollout.prefix_check": registry.PREFIX_CHECKS,
    "env": registry.ENVIRONMENTS,
}


def build_section(cls: type, raw: Any, where: str, key: str) -> Any:
    """A recipe section (a dataclass, or a ``Component``) from its raw mapping; every field goes
    through :func:`reasonrl.params.coerce`, so types and bounds are checked in one place."""
    if issubclass(cls, Component):
        return _build_component(cls, raw, where, key)
    prefix = f"{key}." if key else ""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: '{key or 'recipe'}' must be a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls, include_extras=True)
    known = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for name, value in raw.items():
        if name not in known:
            raise ConfigError(f"{where}: unknown key '{prefix}{name}'; allowed: {', '.join(known)}."
                              f"{closest_match_hint(str(name), known)}")
        kwargs[name] = coerce(hints[name], value, where, f"{prefix}{name}")
    return cls(**kwargs)


def _build_component(cls: type, raw: Any, where: str, key: str) -> Component:
    if isinstance(raw, str):
        raw = {"name": raw}
    if not isinstance(raw, dict) or "name" not in raw:
        raise ConfigError(f"{where}: '{key}' must be a mapping with a 'name', got {raw!r}")
    raw = dict(raw)
    name = raw.pop("name")
    extra = {}
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        if f.name not in ("name", "params") and f.name in raw:
            extra[f.name] = coerce(hints[f.name], raw.pop(f.name), where, f"{key}.{f.name}")
    params = dict(raw.pop("params", {}) or {}, **raw)
    section = key.split("[")[0]
    reg = _COMPONENT_REGISTRIES.get(section)
    if reg is not None:
        fn = registered(reg, name, where, f"{key}.name")
        # The batch.aux keys a component declares reading (``dataflow.declares``) reach it by name from
        # the pipeline (the ``gae`` advantage's ``values``), so a recipe never sets them.
        pipeline = PIPELINE_ARGS[section] | set(getattr(fn, "consumes", ()))
        params = check_component_params(fn, params, where, key, pipeline, strict_kwargs=section == "rewards")
    return cls(name=name, params=params, **extra)


# Arguments supplied by the pipeline itself, never by the recipe.
PIPELINE_ARGS = {
    "advantage": {"token_rewards", "response_mask", "group_ids", "batch", "step", "total_steps"},
    "rewards": {"completion", "completions", "problem", "num_tokens", "truncated"},
    "token_reward": {"completion", "problem"},
    "selection": {"batch", "step", "total_steps"},
    "task": {"name"},
    "eval.task": {"name"},
    "sampler": {"task", "seed", "total_steps", "group_size"},
    "methods": set(),
    "env": set(),
    "off_policy": {"proximal_logprobs", "behaviour_logprobs", "response_mask"},
    "rollout.prefix_check": {"current_logprobs", "behaviour_logprobs", "current_probs", "behaviour_probs",
                             "prefix_tokens", "prefix_mask", "generator"},
    "loss": {"logprobs", "old_logprobs", "advantages", "response_mask", "group_ids"},
    "optim": {"parameters", "lr", "betas", "weight_decay"},
}


def registered(reg: registry.Registry, name: str, where: str, key: str) -> Any:
    """The component ``name`` of ``reg``, or a ConfigError naming the recipe key."""
    try:
        return reg.get(name)
    except UnknownNameError as exc:
        raise ConfigError(f"{where}: {key}: {exc}") from None


