"""The documentation site builds with ``mkdocs build --strict`` (mkdocs.yml): a broken link between
pages, a missing ``#anchor`` or a link to a file outside ``docs/`` fails ``make test`` and CI.

mkdocs and mkdocs-material are the ``docs`` extra, which ``make test`` installs; without them the
test skips, or fails under CI, where their absence is a broken set-up.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_docs_site_builds_strict(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        why = "mkdocs or mkdocs-material not installed (pip install -e '.[docs]')"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why}; `make test` installs the docs extra, so CI must have it")
        pytest.skip(why)
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                          "-f", str(ROOT / "mkdocs.yml"), "-d", str(site)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, (out.stdout + out.stderr)[-5000:]
    assert (site / "index.html").is_file() and (site / "methods" / "index.html").is_file()
    # The HTML reports the pages link to are copied as they are, beside the pages.
    reports = sorted((ROOT / "docs" / "reports").glob("*.html"))
    assert reports and all((site / "reports" / r.name).is_file() for r in reports)
