"""``make demo`` and ``make docs`` leave kvpool's install as they found it, hook included.

They used to run ``pip install -e .``: a regular install (``pip install .``,
as getting-started says) became an editable one, which has no
``kvpool-lmcache.pth``, so ``KVPOOL_LMCACHE=1`` stopped working.  Here a
virtual environment (over this interpreter's packages, so nothing is
downloaded) gets kvpool installed regularly or editable; ``make demo`` and
the install step of ``make docs`` (``docs-deps``; ``make docs`` then only
runs ``mkdocs build``, see test_make_targets) run for real with that
environment's Python; then the install is of the same kind, in the same
place, and the start-up hook still works where it did.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 600

pytestmark = pytest.mark.slow

# Run by the venv's Python outside the clone: how kvpool is installed, and
# whether KVPOOL_LMCACHE=1 put the hook's finder on sys.meta_path.
PROBE = r"""
import importlib.metadata as md, json, sys
dist = md.distribution("kvpool")
url = json.loads(dist.read_text("direct_url.json") or "{}")
# The .pth files Python runs at start-up: those at the root of site-packages.
pth = sorted(str(f) for f in dist.files or () if str(f).endswith(".pth") and "/" not in str(f))
import kvpool
print(json.dumps({
    "editable": bool(url.get("dir_info", {}).get("editable")),
    "files": pth,
    "kvpool": kvpool.__file__,
    "hook": any(type(f).__name__ == "_InstallOnFirstImport" for f in sys.meta_path),
}))
"""


def env() -> dict[str, str]:
    skip = ("PYTHONPATH", "KVPOOL_LMCACHE", "MAKEFLAGS", "MAKELEVEL", "MFLAGS", "VIRTUAL_ENV")
    return {k: v for k, v in os.environ.items() if k not in skip}


def run(cmd: list[str], cwd: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=TIMEOUT, cwd=cwd, env={**env(), **extra}
    )
    assert done.returncode == 0, f"{cmd}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def probe(python: Path, cwd: Path) -> dict[str, object]:
    return json.loads(run([str(python), "-c", PROBE], cwd, KVPOOL_LMCACHE="1").stdout)


@pytest.mark.parametrize("mode", ["regular", "editable"])
def test_make_demo_and_docs_keep_the_install_and_its_hook(tmp_path: Path, mode: str) -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], tmp_path)
    python = venv / "bin" / "python"
    install = ["-e", str(ROOT)] if mode == "editable" else [str(ROOT)]
    run([str(python), "-m", "pip", "install", "-q", "--no-deps", *install], tmp_path)
    before = probe(python, tmp_path)
    assert before["editable"] is (mode == "editable"), before
    if mode == "regular":
        assert before["files"] == ["kvpool-lmcache.pth"] and before["hook"] is True, before
        assert str(venv) in str(before["kvpool"]), before

    demo = run(["make", "-s", "demo", f"PYTHON={python}"], ROOT)
    assert "verified: all 64 chunks" in demo.stdout, demo.stdout
    run(["make", "-s", "docs-deps", f"PYTHON={python}"], ROOT)

    assert probe(python, tmp_path) == before
