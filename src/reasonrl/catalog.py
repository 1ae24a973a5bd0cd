"""The catalog of every registered component, built from the registries alone.

For each stage (a registry: ``advantages``, ``losses``, ``rewards``, ...) and each name in it:
its kind (function or class), the parameters a recipe may set (from the signature of the
function, the class's ``__init__`` or the dataclass's fields, less the arguments the framework
passes itself, e.g. a reward's ``completion`` and ``problem``: ``reasonrl.params.PIPELINE_ARGS``),
with their types, bounds and defaults, the first sentence of its docstring, and where it is
defined (the core, a method package of ``reasonrl.methods``, or another installed package).

Rendered as plain text for the terminal (``reasonrl list [STAGE]``, ``reasonrl describe NAME``)
and as Markdown tables (``reasonrl list --markdown``, which writes ``docs/components.md``), so
the documentation's tables and the command line say the same thing as the code.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import json
import re
import shutil
import sys
import textwrap
import types
import typing
from dataclasses import dataclass
from typing import Any, Annotated, Literal, Union

from reasonrl.params import PIPELINE_ARGS, Range, component_hints, guarded_choices
from reasonrl.registry import Registry, UnknownNameError, registries

__all__ = ["Param", "Entry", "Stage", "stages", "stage", "entries", "find", "list_text", "describe_text",
           "markdown", "GENERATE_DOCS"]

GENERATE_DOCS = "reasonrl list --markdown > docs/components.md"
"""The command that writes ``docs/components.md`` (``tests/test_catalog.py`` checks the file is its output)."""


class _Required:
    """The default of a parameter that has none: the recipe must set it."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()


@dataclass(frozen=True)
class Param:
    """One parameter a recipe may set: its name, type (as text), bounds (``≥ 0, ≤ 1``) and default."""

    name: str
    type: str
    default: Any
    bounds: str = ""
    why: str = ""

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


@dataclass(frozen=True)
class Stage:
    """One registry as the catalog shows it: its name, how a recipe names one of its components
    (``recipe``, with NAME and ``...`` for the parameters), and the arguments reasonrl passes itself."""

    name: str
    registry: Registry
    recipe: str = ""
    section: str = ""
    framework_args: frozenset[str] = frozenset()

    @property
    def kind(self) -> str:
        return self.registry.kind


@dataclass(frozen=True)
class Entry:
    """One registered component."""

    stage: Stage
    name: str
    obj: Any
    kind: str  # "function" or "class"
    params: tuple[Param, ...]
    framework_args: tuple[str, ...]  # what reasonrl passes (the data), in signature order
    summary: str  # the docstring's first sentence, markup removed
    doc: str  # the whole docstring (the module's for a class without its own), cleaned
    module: str
    origin: str  # "core", "method <package>" or "plugin <top-level package>"
    recipe: str  # how a recipe names it, every parameter at its default
    page: str  # its documentation page (docs/methods/<page>.md) as its docstrings name it, or ""


# --- stages -----------------------------------------------------------------------------------

# How a recipe names each core stage's components (NAME, then ``...`` for the parameters), the recipe
# section (an alias of the stage on the command line), and the arguments reasonrl passes itself
# (``reasonrl.params.PIPELINE_ARGS`` for the stages the recipe loader checks, written out for the others).
_STAGES: dict[str, tuple[str, str, frozenset[str]]] = {
    "tasks": ("task: {name: NAME, ...}", "task", frozenset(PIPELINE_ARGS["task"])),
    "samplers": ("sampler: {name: NAME, ...}", "sampler", frozenset(PIPELINE_ARGS["sampler"])),
    "rollout_sources": ("rollout: {source: NAME}", "rollout.source", frozenset({"ctx"})),
    "envs": ("env: {name: NAME, ...}", "env", frozenset(PIPELINE_ARGS["env"])),
    "prefix_checks": ("rollout: {prefix_check: {name: NAME, ...}}", "rollout.prefix_check",
                      frozenset(PIPELINE_ARGS["rollout.prefix_check"])),
    "rewards": ("rewards: [{name: NAME, weight: 1.0, ...}]", "rewards", frozenset(PIPELINE_ARGS["rewards"])),
    "token_rewards": ("token_reward: {name: NAME, ...}", "token_reward", frozenset(PIPELINE_ARGS["token_reward"])),
    "selectors": ("selection: [{name: NAME, ...}]", "selection", frozenset(PIPELINE_ARGS["selection"])),
    "advantages": ("advantage: {name: NAME, ...}", "advantage", frozenset(PIPELINE_ARGS["advantage"])),
    "corrections": ("off_policy: {name: NAME, ...}", "off_policy", frozenset(PIPELINE_ARGS["off_policy"])),
    "losses": ("loss: {policy: NAME, epsilon: ..., epsilon_high: ..., dual_clip: ..., params: {...}}", "loss",
               frozenset(PIPELINE_ARGS["loss"])),
    "kl_estimators": ("loss: {kl: {estimator: NAME, coef: ...}}", "loss.kl", frozenset({"logprobs", "ref_logprobs"})),
    "optimisers": ("optim: {name: NAME, params: {...}}", "optim", frozenset(PIPELINE_ARGS["optim"])),
    "schedules": ("optim: {schedule: NAME}", "optim.schedule", frozenset({"step", "total"})),
    "methods": ("methods: [{name: NAME, ...}]", "methods", frozenset(PIPELINE_ARGS["methods"])),
    # The reward-hacking diagnostics' citation checkers: fn(text) -> [(citation, valid)].
    "citation_validators": ("", "", frozenset({"text"})),
}
_LOSS_TOP_LEVEL = ("epsilon", "epsilon_high", "dual_clip")  # set on loss: itself; the rest go in loss.params


def stages() -> list[Stage]:
    """Every stage: the core's in the order of the data flow, then any other registry (a method
    package's own plugins) by name."""
    order = list(_STAGES)
    found = [Stage(reg.stage, reg, *_STAGES.get(reg.stage, ("", "", frozenset()))) for reg in registries()]
    return sorted(found, key=lambda s: (order.index(s.name) if s.name in order else len(order), s.name))


def stage(name: str) -> Stage:
    """The stage called ``name`` (or by its recipe section, ``advantage`` for ``advantages``);
    ``UnknownNameError`` listing the stages otherwise."""
    every = stages()
    for s in every:
        if name in (s.name, s.section):
            return s
    known = [s.name for s in every]
    by_word = {**{s.section: s.name for s in every if s.section}, **{n: n for n in known}}
    close = difflib.get_close_matches(name, list(by_word), n=1, cutoff=0.5)
    hint = f" Did you mean '{by_word[close[0]]}'?" if close else ""
    raise UnknownNameError(f"unknown stage '{name}'; stages: {', '.join(known)}.{hint}")


# --- entries ----------------------------------------------------------------------------------

def entries(of: Stage | str | None = None, core_only: bool = False) -> list[Entry]:
    """The components of one stage (a Stage or its name), or of every stage, sorted by stage then
    name; ``core_only``: only those reasonrl itself defines (no other package's, no test's)."""
    chosen = [of] if isinstance(of, Stage) else [stage(of)] if of is not None else stages()
    out = []
    for s in chosen:
        for name, obj in s.registry.items():
            if core_only and not (getattr(obj, "__module__", "") or "").startswith("reasonrl."):
                continue
            out.append(_entry(s, name, obj))
    return out


def find(name: str, in_stage: str | None = None) -> list[Entry]:
    """Every component registered as ``name`` (one name may be in several stages: ``grpo_dropout``
    is an advantage and a selector); ``UnknownNameError`` with the closest names otherwise."""
    chosen = [stage(in_stage)] if in_stage is not None else stages()
    found = [_entry(s, name, s.registry.get(name)) for s in chosen if name in s.registry]
    if found:
        return found
    known = sorted({n for s in chosen for n in s.registry.names()})
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    where = f" in stage {chosen[0].name}" if in_stage is not None else ""
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    raise UnknownNameError(f"no component named '{name}'{where}.{hint} (reasonrl list shows them all)")


def _entry(s: Stage, name: str, obj: Any) -> Entry:
    skip = set(s.framework_args) | set(getattr(obj, "consumes", ()))  # the batch keys a component reads arrive by name
    params, framework = _params(obj, skip)
    section = getattr(obj, "section", None) if inspect.isclass(obj) else None
    if section and len(params) == 1 and _section_fields(obj, params[0].name):
        params = _section_fields(obj, params[0].name)  # a method configured by a recipe section of its own
    module = getattr(obj, "__module__", "") or ""
    doc = _own_doc(obj)
    return Entry(stage=s, name=name, obj=obj, kind="class" if inspect.isclass(obj) else "function",
                 params=tuple(params), framework_args=tuple(framework), summary=first_sentence(plain(doc)),
                 doc=doc, module=module, origin=_origin(module), recipe=_recipe_line(s, name, params, section),
                 page=_page(obj, doc, module))


def _params(obj: Any, skip: set[str]) -> tuple[list[Param], list[str]]:
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # a builtin without a signature: nothing to show
        return [], []
    hints = component_hints(obj)
    choices = guarded_choices(obj)  # a str parameter the component limits by a guard reads as its choices
    factories = {f.name: f.default_factory for f in dataclasses.fields(obj)} \
        if inspect.isclass(obj) and dataclasses.is_dataclass(obj) else {}
    params, framework = [], []
    for p in signature.parameters.values():
        if p.name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.name in skip:
            framework.append(p.name)
            continue
        factory = factories.get(p.name, dataclasses.MISSING)
        if factory is not dataclasses.MISSING:
            default = factory()
        elif p.default is inspect.Parameter.empty:
            default = REQUIRED
        else:
            default = p.default
        hint = hints.get(p.name, p.annotation)
        text, ranges = _type_text(hint) if hint is not inspect.Parameter.empty else ("", [])
        if p.name in choices:
            text = " | ".join(str(c) for c in choices[p.name])
        params.append(Param(p.name, text, default, _bounds(ranges), "; ".join(r.why for r in ranges if r.why)))
    return params, framework


def _section_fields(obj: Any, param: str) -> list[Param]:
    """The fields of the dataclass a section-configured method takes (``residual_teacher``'s
    ``teacher:``), as its parameters; empty when that parameter is not a dataclass."""
    config = component_hints(obj).get(param)
    if not (inspect.isclass(config) and dataclasses.is_dataclass(config)):
        return []
    return _params(config, set())[0]


def _own_doc(obj: Any) -> str:
    """The component's own docstring; for a class without one (a method's class, documented by
    its module by the house's convention), its module's. Never a base class's."""
    doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else getattr(obj, "__doc__", None)
    if inspect.isclass(obj) and doc and dataclasses.is_dataclass(obj) and doc.startswith(f"{obj.__name__}("):
        doc = None  # the signature dataclasses writes in place of a missing docstring
    if not doc and inspect.isclass(obj):
        doc = getattr(sys.modules.get(obj.__module__), "__doc__", None)
    return inspect.cleandoc(doc) if doc else ""


_PAGE = re.compile(r"docs/methods/[a-z0-9_]+\.md")


def _page(obj: Any, doc: str, module: str) -> str:
    """The page ``docs/methods/<page>.md`` that documents a component: the first one named by its
    docstring, its module's, or (for a method) its package's; "" when none names one."""
    package = ".".join(module.split(".")[:3]) if module.startswith("reasonrl.methods.") else None
    texts = [doc, getattr(sys.modules.get(module), "__doc__", None), getattr(sys.modules.get(package or ""), "__doc__", None)]
    for text in texts:
        found = _PAGE.search(text or "")
        if found:
            return found.group(0)
    return ""


def _origin(module: str) -> str:
    if module.startswith("reasonrl.methods."):
        return f"method {module.split('.')[2]}"
    if module.startswith("reasonrl."):
        return "core"
    return f"plugin {module.split('.')[0] or '?'}"


# --- types, bounds and values as text ------------------------------------------------------------

def _type_text(tp: Any) -> tuple[str, list[Range]]:
    """``tp`` as a reader writes it (``float``, ``int | None``, ``mask | truncate``), and the
    ``Range`` bounds found in it, at any depth."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Annotated:
        text, ranges = _type_text(args[0])
        return text, ranges + [m for m in tp.__metadata__ if isinstance(m, Range)]
    if origin in (Union, types.UnionType):
        parts = [_type_text(a) for a in args]
        return " | ".join(t for t, _ in parts), [r for _, rs in parts for r in rs]
    if origin is Literal:
        return " | ".join(str(a) for a in args), []
    if origin in (list, tuple, dict, set):
        parts = [("...", []) if a is Ellipsis else _type_text(a) for a in args]
        inner = f"[{', '.join(t for t, _ in parts)}]" if parts else ""
        return f"{origin.__name__}{inner}", [r for _, rs in parts for r in rs]
    if tp is type(None):
        return "None", []
    if isinstance(tp, type):
        return tp.__name__, []
    if isinstance(tp, str):  # an annotation that could not be resolved
        return tp.strip("'\""), []
    return str(tp).replace("typing.", ""), []


def _bounds(ranges: list[Range]) -> str:
    words = (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"))
    return ", ".join(f"{sign} {_number(getattr(r, key))}" for r in ranges for key, sign in words
                     if getattr(r, key) is not None)


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


_PLAIN_STRING = re.compile(r"^[A-Za-z_][\w.\-/+]*$")
_YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "none", "~", "y", "n"}


def value_text(value: Any, limit: int | None = None) -> str:
    """``value`` as a recipe writes it (YAML flow style: ``null``, ``true``, ``[0.9, 0.999]``,
    a plain word unquoted, other strings in double quotes); cut to ``limit`` characters with "…"."""
    text = _yaml(value)
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def _yaml(value: Any) -> str:
    if value is REQUIRED:
        return "REQUIRED"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return value if _PLAIN_STRING.match(value) and value.lower() not in _YAML_WORDS else json.dumps(value)
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return "[" + ", ".join(_yaml(v) for v in items) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_yaml(k)}: {_yaml(v)}" for k, v in value.items()) + "}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return "{...}"  # a nested section at its own defaults
    if callable(value):  # a function or class: its name, never a repr with a memory address
        return getattr(value, "__qualname__", None) or type(value).__name__
    return re.sub(r" at 0x[0-9a-f]+", "", repr(value))


def _recipe_line(s: Stage, name: str, params: list[Param], section: str | None) -> str:
    """The recipe entry that names this component with every parameter at its default."""
    pairs = [f"{p.name}: {value_text(p.default)}" for p in params]
    if section:
        return f"{section}: {{{', '.join(pairs)}}}"
    if not s.recipe:
        return ""
    if s.name == "losses":
        top = [f"{p.name}: {value_text(p.default)}" for p in params if p.name in _LOSS_TOP_LEVEL]
        rest = [f"{p.name}: {value_text(p.default)}" for p in params if p.name not in _LOSS_TOP_LEVEL]
        return "loss: {" + ", ".join([f"policy: {name}", *top, *([f"params: {{{', '.join(rest)}}}"] if rest else [])]) + "}"
    if s.name == "optimisers":
        return f"optim: {{name: {name}" + (f", params: {{{', '.join(pairs)}}}" if pairs else "") + "}"
    line = s.recipe.replace("NAME", name)
    return line.replace(", ...", "".join(f", {p}" for p in pairs)).replace(", coef: ...", "")


# --- docstrings ---------------------------------------------------------------------------------

_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")
_ABBREVIATIONS = ("e.g", "i.e", "cf", "vs", "al", "etc", "Eq", "eq", "resp", "approx", "Fig", "Sec", "p", "pp")


def plain(doc: str) -> str:
    """A docstring without its reStructuredText markup (``code`` and :role:`x` become code and x)."""
    return _LITERAL.sub(r"\1", _ROLE.sub(r"\1", doc)).replace("::\n", ":\n").removesuffix("::")


def _markdown_code(doc: str) -> str:
    """A docstring's markup in Markdown: ``code`` and :role:`x` become `code` and `x`."""
    return _LITERAL.sub(r"`\1`", _ROLE.sub(r"`\1`", doc)).replace("::\n", ":\n").removesuffix("::")


def first_sentence(doc: str) -> str:
    """The first sentence of ``doc``'s first paragraph, on one line (a sentence ends at a full stop
    followed by a space, not one of an abbreviation such as "e.g.")."""
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    for match in re.finditer(r"\.\s", paragraph):
        before = paragraph[: match.start()]
        if not before.endswith(_ABBREVIATIONS) and not before.endswith("."):
            return before + "."
    return paragraph


# --- terminal text ------------------------------------------------------------------------------

def _plural(kind: str) -> str:
    return kind + ("es" if kind.endswith(("s", "x")) else "s")


def _width() -> int:
    return max(60, min(shutil.get_terminal_size((100, 24)).columns, 160))


def params_text(params: tuple[Param, ...] | list[Param], limit: int | None = 40) -> str:
    """``name: default`` for each parameter, ``·``-separated; ``(no parameters)`` when none."""
    return " · ".join(f"{p.name}: {value_text(p.default, limit)}" for p in params) or "(no parameters)"


def list_text(of: str | None = None) -> str:
    """``reasonrl list [STAGE]``: each stage's components with their summary, parameters and
    defaults, and where they are defined."""
    chosen = [stage(of)] if of is not None else stages()
    width, blocks = _width(), []
    for s in chosen:
        found = entries(s)
        head = f"{s.name} ({len(found)} {s.kind if len(found) == 1 else _plural(s.kind)})"
        lines = [head + (f"  recipe: {s.recipe}" if s.recipe else "")]
        pad = min(max((len(e.name) for e in found), default=0), 24) + 4
        for e in found:
            wrap = textwrap.TextWrapper(width=width, initial_indent=f"  {e.name:<{pad - 2}}", subsequent_indent=" " * pad)
            lines.extend(wrap.wrap(e.summary or "(no docstring)") or [f"  {e.name}"])
            lines.extend(textwrap.wrap(f"{params_text(e.params)}  [{e.origin}]", width=width,
                                       initial_indent=" " * pad, subsequent_indent=" " * (pad + 2)))
        blocks.append("\n".join(lines))
    tail = "\n\nreasonrl describe NAME: a component's whole docstring and its parameters' types and bounds."
    return "\n\n".join(blocks) + tail


def describe_text(name: str, in_stage: str | None = None) -> str:
    """``reasonrl describe NAME``: for each stage that registers ``name``, its kind and origin,
    a recipe entry with every default, the whole docstring and a table of its parameters."""
    width, blocks = _width(), []
    for e in find(name, in_stage):
        where = f"{e.kind} {e.module}.{getattr(e.obj, '__qualname__', e.name)}"
        lines = [f"{e.name}: {e.stage.kind} (stage {e.stage.name}), {where} [{e.origin}]"]
        if e.recipe:
            lines.append(f"recipe: {e.recipe}")
        if e.framework_args:
            lines.append(f"passed by reasonrl: {', '.join(e.framework_args)}")
        if e.page:
            lines.append(f"documentation: {e.page}")
        lines.append("")
        for paragraph in plain(e.doc).split("\n\n") if e.doc else ["(no docstring)"]:
            lines.extend(_wrap_paragraph(paragraph, width))
            lines.append("")
        lines.append(_param_table(e.params) if e.params else "parameters: none")
        blocks.append("\n".join(lines).rstrip())
    return f"\n\n{'-' * min(width, 80)}\n\n".join(blocks)


def _wrap_paragraph(paragraph: str, width: int) -> list[str]:
    # Lists, formulas and code keep their lines; running text is re-wrapped to the terminal.
    rows = paragraph.splitlines()
    if any(r.startswith((" ", "-", "*", "•")) for r in rows[1:]) or any(r.lstrip().startswith(("- ", "* ")) for r in rows):
        return rows
    return textwrap.wrap(" ".join(r.strip() for r in rows), width=width) or [""]


def _param_table(params: tuple[Param, ...]) -> str:
    rows = [("parameter", "type", "default", "bounds")]
    rows += [(p.name, p.type or "-", value_text(p.default), (p.bounds + (f" ({p.why})" if p.why else "")) or "-")
             for p in params]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3] for r in rows).rstrip()


# --- Markdown -----------------------------------------------------------------------------------

def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_params(params: tuple[Param, ...]) -> str:
    return ", ".join(f"`{p.name}`: `{value_text(p.default, 40)}`" for p in params) or "none"


_NAMED_ELSEWHERE = "named by a parameter of another component (see its docs)"


def markdown() -> str:
    """``docs/components.md``: an index of the stages, then one table per stage of the components
    reasonrl ships (name, parameters with defaults, first sentence, where defined)."""
    chosen = [(s, entries(s, core_only=True)) for s in stages()]
    chosen = [(s, found) for s, found in chosen if found]
    out = [
        "# Components",
        "",
        f"<!-- Generated from the registries by `{GENERATE_DOCS}`; do not edit by hand:",
        "     tests/test_catalog.py fails when this file and the code disagree. -->",
        "",
        "Every component a recipe can name, by stage, with the parameters a recipe may set and their",
        "defaults. Arguments reasonrl passes itself (a reward's `completion` and `problem`, an",
        "advantage's `token_rewards`) are not parameters. `reasonrl list [STAGE]` prints these tables",
        "in the terminal, and `reasonrl describe NAME` one component's whole docstring with its",
        "parameters' types and bounds. Section keys (`rollout.num_generations`, `train.steps`, ...)",
        "are in [recipes.md](recipes.md); your own components in",
        "[recipes.md, Your own code](recipes.md#your-own-code).",
        "",
        "| stage | in a recipe | components |",
        "|---|---|---|",
    ]
    out += [f"| [{s.name}](#{s.name}) | {_cell(f'`{s.recipe}`') if s.recipe else _NAMED_ELSEWHERE} | "
            f"{len(found)} |" for s, found in chosen]
    for s, found in chosen:
        out += ["", f"## {s.name}", ""]
        intro = f"{_plural(s.kind)[0].upper()}{_plural(s.kind)[1:]}; " + (f"in a recipe: `{s.recipe}`" if s.recipe else _NAMED_ELSEWHERE)
        if s.framework_args:
            intro += f". Passed by reasonrl, not set by a recipe: {', '.join(f'`{a}`' for a in sorted(s.framework_args))}"
        out += [intro + ".", "", "| name | parameters (default) | what it is | defined in |", "|---|---|---|---|"]
        for e in found:
            origin = f"method `{e.origin.split()[1]}`" if e.origin.startswith("method ") else f"core (`{e.module}`)"
            if e.page:  # components.md sits in docs/, beside methods/
                origin += f", [docs]({e.page.removeprefix('docs/')})"
            summary = first_sentence(_markdown_code(e.doc))
            out.append(f"| `{e.name}` | {_cell(_md_params(e.params))} | {_cell(summary) or '-'} | {origin} |")
    return "\n".join(out) + "\n"
