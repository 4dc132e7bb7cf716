"""``make docs-check`` (what ``make test`` and CI run) fails on any warning of the site build.

Each test builds a small site of its own through the real target
(``DOCS_CONFIG=``): a page with a broken link must fail the check, with the
warning shown; the same site without it must pass.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def docs_check(site: Path, page: str) -> subprocess.CompletedProcess[str]:
    """Run ``make docs-check`` on a one-page site whose page reads ``page``."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    (site / "docs").mkdir()
    (site / "docs" / "index.md").write_text(f"# A page\n\n{page}\n")
    config = site / "mkdocs.yml"
    config.write_text("site_name: check\ndocs_dir: docs\ntheme:\n  name: mkdocs\n")
    # Not the variables of a make that runs this test (make test PYTHON=...).
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    return subprocess.run(
        # This interpreter (it has mkdocs), not the clone's .venv the Makefile would make.
        [
            "make",
            "--no-print-directory",
            "docs-check",
            f"DOCS_CONFIG={config}",
            f"PYTHON={sys.executable}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_a_broken_link_fails_the_check(tmp_path: Path) -> None:
    done = docs_check(tmp_path, "See [the guide](missing.md).")
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "WARNING" in out and "missing.md" in out, out  # the reason is shown


def test_a_clean_site_passes_quietly(tmp_path: Path) -> None:
    done = docs_check(tmp_path, "Nothing links anywhere.")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "docs-check: the site builds (strict, no warning)"
