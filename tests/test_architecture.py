"""The house's rules, checked rather than hoped for (DESIGN §3, ``docs/adding_a_method.md``):

- no import cycle among ``reasonrl``'s modules, function-local imports included;
- the import-linter contracts of ``pyproject.toml`` hold (layers from the entry points down to the
  base types; the core never imports ``reasonrl.methods``; methods are independent of each other);
- ``reasonrl.components`` finds every method package, and every module that registers a
  component is imported with it.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "reasonrl"


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def import_graph() -> dict[str, set[str]]:
    """Module → the package's modules it imports, from every import statement anywhere in it
    (inside functions and ``if TYPE_CHECKING:`` blocks too). ``from pkg import name`` is an import
    of ``pkg.name`` when that is a module, else of ``pkg``; a module's implicit import of its
    parent packages is not an edge."""
    files = {module_name(f): f for f in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        base = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                parts = base.split(".")
                root = ".".join(parts[: len(parts) - node.level + 1] + [node.module or ""]).strip(".") if node.level \
                    else node.module or ""
                targets = [f"{root}.{a.name}" if f"{root}.{a.name}" in files else root for a in node.names]
            else:
                continue
            for target in targets:
                while target not in files and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in files and target != mod:
                    graph[mod].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e2"}, "e2": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_graph_counts_function_local_imports():
    graph = import_graph()
    # reasonrl.policy.factory imports reasonrl.policy.tiny at its top, reasonrl.rewards.math imports
    # math_verify inside a function (external, not an edge); the CLI imports most of its commands
    # inside functions: those must be edges, or a cycle could hide there.
    assert "reasonrl.quickstart" in graph["reasonrl.cli"]
    assert "reasonrl.methods.surge.fuse" in graph["reasonrl.cli"]


def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles (move the shared piece down; never hide an import in a function):\n" + "\n".join(
        " -> ".join(c) for c in found)


def test_import_linter_contracts_hold():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    if lint is None:
        pytest.fail("lint-imports (PyPI import-linter, in the dev extra) is not installed: `make test` installs it")
    out = subprocess.run([lint, "--config", str(SRC.parent / "pyproject.toml")], cwd=SRC.parent,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert out.stdout.count(" KEPT") >= 3, out.stdout


def test_every_method_is_a_package_and_is_found():
    """``reasonrl.components`` imports every package under ``reasonrl/methods/``; a plain module there
    would never be imported (its registrations would be missing), so none may exist."""
    methods = PACKAGE / "methods"
    stray = sorted(p.name for p in methods.glob("*.py") if p.name != "__init__.py")
    assert not stray, f"a research method is a package, methods/<name>/: move {stray} into one"
    packages = sorted(f"reasonrl.methods.{p.name}" for p in methods.iterdir() if (p / "__init__.py").is_file())
    code = "import reasonrl.components as c; print(' '.join(c.METHOD_PACKAGES))"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300).stdout.split()
    assert len(packages) >= 27 and found == packages


def test_every_registering_module_is_imported_by_the_components():
    """A module that registers a component (``@X.register(...)``) must be imported when
    ``reasonrl.components`` is, or its names would resolve in one process and not another."""
    code = ("import sys, reasonrl.components; "
            "print('\\n'.join(m for m in sys.modules if m.startswith('reasonrl')))")
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                timeout=300).stdout.split())
    registering = {module_name(f) for f in PACKAGE.rglob("*.py") if ".register(" in f.read_text(encoding="utf-8")
                   and f.name != "registry.py"}
    assert registering, "no registering module found"
    assert registering <= loaded, f"registering modules not imported by reasonrl.components: {sorted(registering - loaded)}"
