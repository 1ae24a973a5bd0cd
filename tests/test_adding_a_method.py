"""``docs/adding_a_method.md`` works as written: its example method, built from the page's own code
blocks into a throw-away folder, registers itself on import, loads from its recipe, passes the
page's tests, keeps the house rules, and touches only the files the page says it touches.

Run in a child process, so the example's registered names never leak into the other tests.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "adding_a_method.md"


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", GUIDE.read_text(encoding="utf-8"), flags=re.S)


def test_guide_has_the_example_and_its_diff_stat():
    py, yaml = blocks("python"), blocks("yaml")
    assert len(py) == 3 and len(yaml) == 1, "the guide's example: advantage.py, __init__.py, the tests; one recipe"
    assert '@ADVANTAGES.register("clipped_grpo")' in py[0]
    assert "import advantage" in py[1]
    assert "def test_" in py[2]
    listed = sorted(line.split("|")[0].strip() for line in GUIDE.read_text().splitlines() if line.rstrip().endswith("| ..."))
    assert listed == ["docs/methods/clipped_grpo.md", "recipes/clipped_grpo.yaml",
                      "src/reasonrl/methods/clipped_grpo/__init__.py", "src/reasonrl/methods/clipped_grpo/advantage.py",
                      "tests/test_clipped_grpo.py"]


def test_guide_example_runs(tmp_path):
    py, yaml = blocks("python"), blocks("yaml")
    package = tmp_path / "methods" / "clipped_grpo"
    package.mkdir(parents=True)
    (package / "advantage.py").write_text(py[0])
    (package / "__init__.py").write_text(py[1])
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "clipped_grpo.yaml").write_text(yaml[0])
    (tmp_path / "test_clipped_grpo.py").write_text(py[2])
    # The example lives in a folder of its own; extending reasonrl.methods' search path makes it
    # importable as reasonrl.methods.clipped_grpo, exactly as it would be inside src/.
    driver = textwrap.dedent(f"""
        import importlib.util, sys
        import reasonrl.methods
        reasonrl.methods.__path__.append({str(tmp_path / "methods")!r})
        import reasonrl.components
        from reasonrl.registry import ADVANTAGES
        assert "clipped_grpo" in ADVANTAGES, "the package does not register itself"
        spec = importlib.util.spec_from_file_location("guide_tests", {str(tmp_path / "test_clipped_grpo.py")!r})
        tests = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(tests)
        ran = [name for name in dir(tests) if name.startswith("test_")]
        for name in ran:
            getattr(tests, name)()
        print("ran", len(ran))
    """)
    out = subprocess.run([sys.executable, "-c", driver], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "ran 3"


def test_guide_example_keeps_the_house_rules():
    """The example imports only the core: no ``reasonrl.methods.<other>`` and nothing above."""
    source = "\n".join(blocks("python")[:2])
    imported = set(re.findall(r"^from (reasonrl[\w.]*) import", source, flags=re.M))
    assert imported, "no import found in the example"
    allowed = ("reasonrl.algos", "reasonrl.params", "reasonrl.registry", "reasonrl.methods.clipped_grpo")
    assert all(m.startswith(allowed) for m in imported), imported
