"""Named registries for every pluggable stage of the data flow.

A recipe names components by string (``advantage: {name: grpo}``); the
registry turns the name into the function or class and reports the closest
known name when a user mistypes one.

Every registry also resolves the user's own code, in ``Registry.get``:

- ``"path/to/file.py:symbol"``: the file (relative to the working directory, or
  absolute; ``~`` expanded) is imported once per process under a stable module
  name derived from its absolute path (``sys.modules`` holds it, so pickling by
  reference works in this process and in forked children);
- ``"package.module:symbol"``: an importable module;
- a Python object passed in place of a name (``recipe_from_dict({"rewards":
  [{"name": score}]})``) is registered under a generated ``module:qualname``
  name (``register_passed_object``).

``symbol`` may be dotted (``Class.method``). The resolved object is cached
under the name as written. Problems raise ``UserCodeError`` (an
``UnknownNameError``), whose message names the file or module, the symbol and
what is wrong.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import inspect
import os
import re
import sys
import traceback
import types
import weakref
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError):
    """An unknown registry name; the message lists the known names."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0])


class UserCodeError(UnknownNameError):
    """A name that points at user code (``file.py:symbol``, ``module:symbol``) that cannot be
    used: the file or module cannot be imported, the symbol is missing or of the wrong kind."""


def closest_match_hint(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    return f" Did you mean '{close[0]}'?" if close else ""


# --- the built-in components ---------------------------------------------------------

COMPONENTS_GROUP = "reasonrl.components"
"""The entry-point group whose modules register components (``pyproject.toml`` lists
``reasonrl.components``, the house's one list; an installed package may add its own)."""
_components_loaded = False


def load_components() -> None:
    """Import every module of the ``reasonrl.components`` entry-point group, once per process.

    An entry point of the house imports ``reasonrl.components`` itself; this is for a process
    that began elsewhere (a spawned sampler, a Ray actor, a Flower app, a user's script that
    imports a core module), so a registry lookup there finds the same names. The core learns
    what is installed from the package metadata, never by naming a method."""
    global _components_loaded
    if _components_loaded:
        return
    _components_loaded = True  # first: a module being loaded may itself look a name up
    try:
        for entry in entry_points(group=COMPONENTS_GROUP):
            entry.load()
    except BaseException:
        # Not loaded: the next lookup tries again (and fails the same way) rather than answering
        # from registries that hold only the modules imported before the failure.
        _components_loaded = False
        raise


# --- user code ------------------------------------------------------------------------

_PASSED: Dict[str, Any] = {}  # objects passed in place of a name, by generated name
_FILE_MODULES: Dict[str, str] = {}  # module name -> absolute path of the file it was imported from
_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def is_code_ref(name: Any) -> bool:
    """Whether ``name`` points at user code (``file.py:symbol`` or ``module:symbol``)."""
    return isinstance(name, str) and ":" in name


def _split_ref(ref: str) -> tuple[str, str]:
    target, _, symbol = ref.rpartition(":")
    return target.strip(), symbol.strip()


def _is_file(target: str) -> bool:
    return (target.endswith(".py") or "/" in target or os.sep in target or target.startswith(("~", "."))
            or os.path.isfile(target))


def _absolute(target: str) -> Path:
    return Path(os.path.abspath(os.path.expanduser(target)))


def canonical_name(name: Any) -> Any:
    """``name`` with the file of a ``file.py:symbol`` reference made absolute, so a saved
    recipe resolves from any directory; any other value unchanged."""
    if not is_code_ref(name):
        return name
    target, symbol = _split_ref(name)
    if not target.endswith(".py") or not _DOTTED.match(symbol):
        return name
    return f"{_absolute(target)}:{symbol}"


def canonical_plugin(ref: str) -> str:
    """A plugin file made absolute; a module name unchanged."""
    return str(_absolute(ref)) if _is_file(ref) else ref


def import_plugin(ref: str) -> types.ModuleType:
    """Import a plugin (a ``.py`` file or a module) so the components it registers can be named."""
    if ":" in ref:
        raise UserCodeError(f"plugin '{ref}': a plugin is a .py file or a module name (it registers its "
                            "components itself); to name one function, use 'file.py:function' where a name goes")
    return _import_file(ref, f"plugin '{ref}'") if _is_file(ref) else _import_module(ref, f"plugin '{ref}'")


def resolve_code_ref(ref: str, kind: str = "component") -> Any:
    """The object ``"file.py:symbol"`` or ``"package.module:symbol"`` points at (uncached;
    ``Registry.get`` caches). Raises ``UserCodeError`` naming what is wrong."""
    what = f"{kind} '{ref}'"
    target, symbol = _split_ref(ref)
    if not target or not symbol:
        raise UserCodeError(f"{what}: write 'path/to/file.py:NAME' or 'package.module:NAME'")
    if target == "__main__":
        return _from_main(symbol, what)
    if not _DOTTED.match(symbol):
        raise UserCodeError(
            f"{what} names a Python object that was passed to reasonrl directly (a local function, a "
            "lambda or a callable instance has no importable name), and this process has not been given it. "
            "Pass the same object again (e.g. reasonrl.train(recipe, run_dir, resume=True) with the object in "
            "the recipe), or move it to the top level of a file and name it 'path/to/file.py:NAME'")
    if _is_file(target):
        module = _import_file(target, what)
        where = f"file {_FILE_MODULES.get(module.__name__, target)}"
    else:
        module = _import_module(target, what)
        where = f"module '{target}'"
    return _lookup(module, symbol, where, what)


def register_passed_object(obj: Any, taken: Dict[str, Any] | None = None) -> str:
    """Register a callable given in place of a registry name; returns its generated name.

    The name is ``module:qualname`` (``/abs/file.py:qualname`` for a function of a file
    imported by name), so an importable function resolves again in another process. A
    function of a script or notebook gives ``__main__:name``, a local function or lambda
    ``module:outer.<locals>.name``: only a process that is given the object again can use
    those. ``taken`` (name -> object) keeps the names of one recipe distinct (``#2``, ...)."""
    name = passed_object_name(obj)
    if taken is not None:
        base, n = name, 1
        while name in taken and taken[name] is not obj:
            n += 1
            name = f"{base}#{n}"
        taken[name] = obj
    _PASSED[name] = obj
    return name


def only_in_this_process(name: str) -> bool:
    """Whether the generated name of a passed object resolves only in the process it was passed
    to (a script's ``__main__`` function, a local function or lambda, a callable instance)."""
    return name in _PASSED and (name.startswith("__main__:") or "<" in name)


def passed_object_name(obj: Any) -> str:
    if inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj):
        module = getattr(obj, "__module__", None) or "<unknown module>"
        qual = getattr(obj, "__qualname__", None) or obj.__name__
    else:  # a bound method, a functools.partial, an instance with __call__
        module = type(obj).__module__
        qual = f"<{type(obj).__qualname__} object>"
    return f"{_FILE_MODULES.get(module, module)}:{qual}"


def _file_module_name(path: Path) -> str:
    stem = re.sub(r"\W", "_", path.stem)
    return f"_reasonrl_user_{stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:10]}"


def _import_file(target: str, what: str) -> types.ModuleType:
    path = _absolute(target)
    if not path.exists():
        raise UserCodeError(f"{what}: file not found: {path}")
    if path.suffix != ".py" or not path.is_file():
        raise UserCodeError(f"{what}: {path} is not a .py file")
    name = _file_module_name(path)
    module = sys.modules.get(name)
    if module is not None:
        return module
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before executing it: dataclasses and pickling look it up there
    _FILE_MODULES[name] = str(path)
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        del sys.modules[name]
        del _FILE_MODULES[name]
        raise UserCodeError(f"{what}: {_import_failure(exc, str(path), str(path))}") from None
    return module


def _import_module(target: str, what: str) -> types.ModuleType:
    if not _DOTTED.match(target):
        raise UserCodeError(f"{what}: '{target}' is neither a .py file nor a module name")
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        if exc.name and (target == exc.name or target.startswith(exc.name + ".")):
            raise UserCodeError(
                f"{what}: module '{target}' is not importable ({exc}; is it installed or on PYTHONPATH?). "
                f"For a file, write 'path/to/{target.rsplit('.', 1)[-1]}.py:NAME'") from None
        raise UserCodeError(f"{what}: importing module '{target}' raised ModuleNotFoundError: {exc}") from None
    except (Exception, SystemExit) as exc:
        raise UserCodeError(f"{what}: {_import_failure(exc, f'module {target}')}") from None


def _import_failure(exc: BaseException, label: str, path: str | None = None) -> str:
    """What went wrong importing ``label`` (a file ``path`` or a module): the syntax error's
    file:line, or the exception's type and message with the line that raised it."""
    if isinstance(exc, SyntaxError):
        return f"syntax error in {exc.filename or label}:{exc.lineno}: {exc.msg}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<frozen")]
    mine = [f for f in frames if f.filename == path] if path else []
    if mine:
        at = f" (line {mine[-1].lineno})"
    elif frames:
        at = f" (at {frames[-1].filename}:{frames[-1].lineno})"
    else:
        at = ""
    return f"importing {label} raised {type(exc).__name__}: {exc}{at}"


def _lookup(module: types.ModuleType, symbol: str, where: str, what: str) -> Any:
    obj: Any = module
    parts = symbol.split(".")
    for i, part in enumerate(parts):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            if i == 0:
                candidates = _public_callables(module)
                listing = f"its public callables: {', '.join(candidates) or '(none)'}"
            else:
                candidates = sorted(n for n in dir(obj) if not n.startswith("_"))
                listing = f"'{'.'.join(parts[:i])}' has: {', '.join(candidates) or '(nothing public)'}"
            raise UserCodeError(f"{what}: {where} has no '{'.'.join(parts[:i + 1])}'; {listing}."
                                f"{closest_match_hint(part, candidates)}") from None
    return obj


def _public_callables(module: types.ModuleType) -> list[str]:
    public = {n: v for n, v in vars(module).items()
              if not n.startswith("_") and callable(v) and not inspect.ismodule(v)}
    own = [n for n, v in public.items() if getattr(v, "__module__", None) == module.__name__]
    return sorted(own or public)


def _from_main(symbol: str, what: str) -> Any:
    # A run started from a script or notebook saved "__main__:name". That resolves only in a
    # script that defines it again, never in the reasonrl command (whose own __main__ it is not).
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    obj: Any = None
    if main is not None and not (getattr(spec, "name", None) or "").startswith("reasonrl"):
        obj = main
        for part in symbol.split("."):
            obj = getattr(obj, part, None)
    if obj is None or getattr(obj, "__module__", None) != "__main__":
        raise UserCodeError(
            f"{what} was passed to reasonrl as a Python object defined in a script or notebook (module "
            f"__main__), so it cannot be imported here. Resume such a run through the Python API, from a "
            f"script that defines the same function: reasonrl.train(recipe, run_dir, resume=True) with the "
            f"function in the recipe (or reasonrl.train(None, run_dir, resume=True) with it defined at the "
            f"script's top level). To use the command line, put it in a file and name it "
            f"'path/to/file.py:{symbol}'")
    return obj


def _describe(obj: Any) -> str:
    if inspect.isfunction(obj):
        return "a function"
    if inspect.ismodule(obj):
        return f"a module ({obj.__name__})"
    text, kind = repr(obj), type(obj).__name__
    return f"{'an' if kind[0] in 'aeiouAEIOU' else 'a'} {kind} ({text[:60] + '...' if len(text) > 60 else text})"


# Every registry created, in order: the core's below, then any a package declares. Weak references:
# a registry made for a moment (a test's) leaves the catalog when it is gone.
_REGISTRIES: list[weakref.ref] = []


def registries() -> list["Registry"]:
    """Every registry, with the built-in components loaded first: the core's stages, and the
    registries a method package declares for its own plugins (an advisor, an FSG judge), so a
    catalog of them (``reasonrl list``) needs no list of its own."""
    load_components()
    return [reg for reg in (ref() for ref in _REGISTRIES) if reg is not None]


class Registry:
    """A mapping from name to component, with duplicate and typo checks.

    ``expects``: ``"callable"`` (functions, or classes) or ``"class"`` (the registry's
    users instantiate what they get, e.g. tasks); checked for user code. ``stage``: the
    registry's name in the catalog (``reasonrl list advantages``); by default the plural of
    ``kind`` in snake case ("FSG judge" -> ``fsg_judges``).

    Listing (``names``, ``items``, iteration, ``in``) loads the built-in components
    first (``load_components``), so it is complete in any process, whatever it imported."""

    def __init__(self, kind: str, expects: str = "callable", stage: str | None = None) -> None:
        if expects not in ("callable", "class"):
            raise ValueError(f"expects must be 'callable' or 'class', got {expects!r}")
        self.kind = kind
        self.expects = expects
        self.stage = stage or re.sub(r"\W+", "_", kind.lower()).strip("_") + "s"
        self._items: Dict[str, Any] = {}
        self._code: Dict[str, Any] = {}  # user code resolved from "file.py:symbol" / "module:symbol"
        _REGISTRIES.append(weakref.ref(self))

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            existing = self._items.get(name)
            if existing is not None and existing is not obj:
                raise ValueError(f"{self.kind} '{name}' is already registered to {existing!r}")
            self._items[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> Any:
        """The component registered as ``name``, or the user code it points at (see the module
        docstring); ``UnknownNameError`` (``UserCodeError`` for user code) otherwise."""
        if isinstance(name, str) and name in _PASSED:  # the latest object passed under this name wins
            return self._usable(name, _PASSED[name])
        try:
            return self._items[name]
        except KeyError:
            pass
        if name in self._code:
            return self._code[name]
        if is_code_ref(name):
            obj = self._usable(name, resolve_code_ref(name, self.kind))
            self._code[name] = obj
            return obj
        if not _components_loaded:
            load_components()
            return self.get(name)
        known = sorted(self._items)
        raise UnknownNameError(
            f"unknown {self.kind} '{name}'; known: {', '.join(known)}.{closest_match_hint(str(name), known)}"
            " Your own code: 'path/to/file.py:function' or 'package.module:function'."
        ) from None

    def _usable(self, name: str, obj: Any) -> Any:
        if self.expects == "class" and not inspect.isclass(obj):
            raise UserCodeError(f"{self.kind} '{name}' is {_describe(obj)}, but a {self.kind} must be a class")
        if not callable(obj):
            raise UserCodeError(f"{self.kind} '{name}' is {_describe(obj)}, not callable; "
                                f"a {self.kind} must be a function or a class")
        return obj

    def names(self) -> list[str]:
        """Every registered name, sorted (all built-in components loaded first)."""
        load_components()
        return sorted(self._items)

    def items(self) -> list[tuple[str, Any]]:
        """Every registered ``(name, component)``, sorted by name (all built-in components loaded first)."""
        load_components()
        return sorted(self._items.items())

    def __contains__(self, name: object) -> bool:
        load_components()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __repr__(self) -> str:
        return f"<Registry {self.stage} ({self.kind})>"


# ``stage``: the name in the catalog (``reasonrl list STAGE``, docs/components.md).
ADVANTAGES = Registry("advantage estimator", stage="advantages")
POLICY_LOSSES = Registry("policy loss", stage="losses")
KL_ESTIMATORS = Registry("KL estimator", stage="kl_estimators")
REWARDS = Registry("reward function", stage="rewards")
TOKEN_REWARDS = Registry("token reward function", stage="token_rewards")
SELECTORS = Registry("selector", stage="selectors")
TASKS = Registry("task", expects="class", stage="tasks")
OPTIMIZERS = Registry("optimizer", stage="optimisers")
SCHEDULES = Registry("LR schedule", stage="schedules")
PROMPT_SAMPLERS = Registry("prompt sampler", expects="class", stage="samplers")
METHODS = Registry("method", expects="class", stage="methods")
OFF_POLICY = Registry("off-policy correction", stage="corrections")
PREFIX_CHECKS = Registry("prefix check", stage="prefix_checks")
ROLLOUT_SOURCES = Registry("rollout source", expects="class", stage="rollout_sources")
ENVIRONMENTS = Registry("environment", expects="class", stage="envs")
