"""One typed path for every value a recipe sets: section fields and component parameters.

A value is checked against its declared type, and against the bounds declared beside it::

    epsilon: Annotated[float, Range(ge=0)] = 0.2          # in a function's signature
    num_generations: Annotated[int, Range(ge=2, why="a group needs a baseline")] = 8

Recipe sections (dataclasses in ``reasonrl.sections``) and registered components (reward
functions, advantages, policy losses, optimisers, methods...) go through the same
:func:`coerce`, so a bad number fails when the recipe loads, with the key, the bound and
the value, never as a traceback after the run folder exists.

A parameter typed only ``str`` whose component refuses values up front, with a guard among its
first statements (``if scale not in GRPO_SCALES: raise ValueError(...)``, before anything returns
or rebinds the name), has those choices checked at load as a ``Literal`` would be
(:func:`guarded_choices`): the component would raise on any other value at its first call.

Reward functions come in three calling conventions (:func:`reward_style`), each checked at load
against the function's signature (:func:`check_reward_signature`).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import math
import textwrap
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Annotated, Callable, Iterable, Literal, Union

from reasonrl import registry
from reasonrl.registry import UnknownNameError, closest_match_hint

__all__ = ["ConfigError", "Range", "Component", "build_section", "PIPELINE_ARGS", "registered", "coerce",
           "component_hints", "check_component_params", "check_plugin_params", "inject", "guarded_choices",
           "reward_style", "reward_call", "check_reward_signature", "TRL_ARGS"]


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
    choices = guarded_choices(fn)
    for p, v in out.items():
        if p in choices and not _among(v, choices[p]):
            allowed = [str(c) for c in choices[p]]
            raise ConfigError(f"{where}: '{key}.{p}' must be one of {', '.join(allowed)}; got {v!r}."
                              f"{closest_match_hint(str(v), allowed)}")
    check = getattr(fn, "check_params", None)
    if check is not None:
        try:
            check(**out)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: {key}: {exc}") from None
    return out


def _among(value: Any, choices: tuple) -> bool:
    try:
        return value in choices
    except TypeError:  # an unhashable value against a frozenset
        return False


def guarded_choices(fn: Callable) -> dict[str, tuple]:
    """The values each parameter of ``fn`` (of ``__init__`` for a class) is limited to by a guard
    the component runs before anything else can happen::

        if scale not in GRPO_SCALES:          # or ("group", "batch", "none"), or `... or scale not in X`
            raise ValueError(...)

    A guard counts when it is a top-level ``if`` of the body whose test is ``NAME not in CHOICES``
    (alone, or one operand of an ``or``) and whose body raises, and no earlier statement can return
    or yield, or rebind ``NAME``; ``CHOICES`` is a literal tuple, list or set of constants or a
    module-level tuple or frozenset of them. Then any other value raises at the component's first
    call, so the recipe loader refuses it instead. Empty when the source cannot be read."""
    target = fn.__init__ if inspect.isclass(fn) else fn
    try:
        return _guarded_choices(inspect.unwrap(target))
    except TypeError:  # not hashable (a callable instance): no guards read
        return {}


@functools.lru_cache(maxsize=None)
def _guarded_choices(fn: Callable) -> dict[str, tuple]:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        names = set(inspect.signature(fn).parameters)
    except (OSError, TypeError, ValueError, SyntaxError):
        return {}
    node = tree.body[0] if tree.body else None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return {}
    found: dict[str, tuple] = {}
    rebound: set[str] = set()
    for stmt in node.body:
        if isinstance(stmt, ast.If) and any(isinstance(s, ast.Raise) for s in stmt.body):
            tests = stmt.test.values if isinstance(stmt.test, ast.BoolOp) and isinstance(stmt.test.op, ast.Or) \
                else [stmt.test]
            for test in tests:
                guard = _not_in(test, getattr(fn, "__globals__", {}))
                if guard and guard[0] in names and guard[0] not in rebound and guard[0] not in found:
                    found[guard[0]] = guard[1]
        inner = list(ast.walk(stmt))
        if any(isinstance(n, (ast.Return, ast.Yield, ast.YieldFrom)) for n in inner):
            break
        rebound |= {n.id for n in inner if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
    return found


def _not_in(test: ast.expr, module: dict[str, Any]) -> tuple[str, tuple] | None:
    """(name, choices) of a ``name not in CHOICES`` test, or None."""
    if not (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and len(test.ops) == 1
            and isinstance(test.ops[0], ast.NotIn)):
        return None
    right = test.comparators[0]
    if isinstance(right, (ast.Tuple, ast.List, ast.Set)):
        if not all(isinstance(e, ast.Constant) for e in right.elts):
            return None
        values = tuple(e.value for e in right.elts)
    elif isinstance(right, ast.Name) and isinstance(module.get(right.id), (tuple, frozenset)):
        values = tuple(module[right.id])  # immutable: what the guard compares with at every call
        if not all(isinstance(v, (str, int, float, bool, type(None))) for v in values):
            return None
    else:
        return None
    return (test.left.id, values) if values else None


# --- reward functions' calling conventions ------------------------------------------------

TRL_ARGS = ("prompts", "completions", "completion_ids")
"""What a TRL-style reward is called with beside its dataset columns (TRL ``GRPOTrainer``)."""

REWARD_CALLS = {
    "completion": "fn(completion: str, problem: Problem, *, num_tokens: int, truncated: bool, **params) -> float",
    "group": "fn(completions: list[str], problem: Problem, *, num_tokens: list[int], truncated: list[bool], "
             "**params) -> list[float]",
    "batched": "fn(*, prompts: list[str], completions: list[str], completion_ids: list[list[int]], "
               "answer: list[str], solution: list[str], <each problem.meta key>: list, **params) "
               "-> list[float | None]  (TRL's reward-function signature; declared names only, unless it takes **kwargs)",
}


def reward_style(fn: Callable) -> str:
    """How the scorer calls reward ``fn``: ``"group"`` (marked ``@group_reward``), ``"batched"``
    (TRL's convention, told by a parameter named ``completions`` and none named ``problem`` or
    ``completion``: keyword lists for one prompt's group), else ``"completion"`` (one call per
    completion). ``REWARD_CALLS`` spells each out."""
    if getattr(fn, "group_reward", False):
        return "group"
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return "completion"
    if "completions" in params and "problem" not in params and "completion" not in params:
        return "batched"
    return "completion"


def reward_call(fn: Callable) -> str:
    """The signature the scorer calls ``fn`` with, and ``fn``'s own: for messages."""
    try:
        own = f"{getattr(fn, '__name__', type(fn).__name__)}{inspect.signature(fn)}"
    except (TypeError, ValueError):
        own = repr(fn)
    return f"reasonrl calls it as {REWARD_CALLS[reward_style(fn)]}; its signature is {own}"


def check_reward_signature(fn: Callable, params: dict[str, Any], where: str, key: str) -> None:
    """A ConfigError when reward ``fn`` cannot be called the way the scorer will call it (a keyword
    it does not take, a third positional parameter): every call would fail, whatever the recipe
    sets. TRL-style rewards are checked at their first call, which knows the dataset's columns."""
    style = reward_style(fn)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    pars = sig.parameters
    if style == "completion" and "completions" in pars and "problem" in pars:
        raise ConfigError(f"{where}: {key}: reward takes 'completions' and 'problem': a reward scoring a prompt's "
                          f"group at once must be marked @group_reward (reasonrl.rewards.scorer.group_reward), and a "
                          f"TRL-style reward takes no 'problem' ({reward_call(fn)})")
    if style == "batched":
        return
    # A parameter of its own the recipe leaves unset is the recipe's business (the call's error says
    # which); what no recipe can fix is a call the signature cannot take.
    first = list(pars)[:2]  # the completion(s) and the problem, passed by position
    unset = {n: None for n, p in pars.items() if p.default is p.empty and n not in PIPELINE_ARGS["rewards"]
             and n not in params and n not in first and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    rows: Any = [] if style == "group" else ""
    try:
        sig.bind(rows, None, num_tokens=rows, truncated=rows, **params, **unset)
    except TypeError as exc:
        raise ConfigError(f"{where}: {key}: reward cannot be called this way ({exc}); {reward_call(fn)}. Give it the "
                          "parameters it is called with (and **kwargs for those it ignores), or TRL's signature "
                          "fn(completions, **kwargs)") from None


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
        if section == "rewards" and reward_style(fn) == "batched":
            pipeline |= BATCHED_REWARD_ARGS
        params = check_component_params(fn, params, where, key, pipeline, strict_kwargs=section == "rewards")
        if section == "rewards":
            check_reward_signature(fn, params, where, key)
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


# A TRL-style reward's arguments that no recipe sets: TRL's, and the columns every problem has.
BATCHED_REWARD_ARGS = {*TRL_ARGS, "answer", "solution", "num_tokens", "truncated"}


def registered(reg: registry.Registry, name: str, where: str, key: str) -> Any:
    """The component ``name`` of ``reg``, or a ConfigError naming the recipe key."""
    try:
        return reg.get(name)
    except UnknownNameError as exc:
        raise ConfigError(f"{where}: {key}: {exc}") from None


