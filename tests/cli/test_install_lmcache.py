"""``kvpool install-lmcache``: the one LMCache recipe, and the advice that points to it.

Without network or LMCache: what it would run (``--dry-run``), the pinned
list it ships, its refusal without torch (a fresh virtual environment that
has nothing but pip), and the install advice of ``LMCacheBridgeError``,
the plugin example and the lmcache_remote benchmark.  The recipe itself
runs for real in tests/packaging/test_lmcache_recipe.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import kvpool.integrations.lmcache as kv_lmcache
from kvpool.integrations.install import requirements
from kvpool.integrations.lmcache.requirements import REQUIREMENTS

ROOT = Path(__file__).resolve().parents[2]
RECIPE = "python -m kvpool install-lmcache"


def kvpool_cli(*args: str, python: str = sys.executable) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KVPOOL_LMCACHE")}
    return subprocess.run(
        [python, "-m", "kvpool", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
    )


def test_the_list_is_shipped_pinned_and_complete() -> None:
    assert REQUIREMENTS.parent == Path(kv_lmcache.__file__).parent  # package data
    lines = requirements(REQUIREMENTS)
    assert lines[0] == "lmcache==0.5.6"
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][\w.]*", line) for line in lines), lines
    names = {line.split("==")[0].lower().replace("_", "-") for line in lines}
    # What a clean venv lacked with lmcache alone (the issue), and never torch.
    assert {"cachetools", "requests", "py-cpuinfo", "packaging", "attrs", "idna"} <= names
    assert "cryptography" in names and "torch" not in names


def test_dry_run_shows_pip_no_deps_into_this_python() -> None:
    done = kvpool_cli("install-lmcache", "--dry-run")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert f"into {sys.prefix} ({sys.executable})" in lines[0], lines[0]
    assert "each with --no-deps; torch" in lines[0] and "stays" in lines[0]
    pip = lines[1].split()
    assert pip[:5] == [sys.executable, "-m", "pip", "install", "--no-deps"], pip
    assert pip[pip.index("-r") + 1] == str(ROOT / "kvpool" / "integrations" / "lmcache" /
                                           "requirements-lmc056.txt")  # fmt: skip
    assert "-c" in pip  # the constraint that holds torch to the installed one


def test_without_torch_it_says_to_install_torch_first(tmp_path: Path) -> None:
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    done = kvpool_cli("install-lmcache", python=str(venv / "bin" / "python"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "torch is not installed in" in done.stdout and "pip install torch==2.13.0" in done.stdout


# A child in which LMCache cannot be found, installed or not (a None in
# sys.modules stops both the import and importlib.util.find_spec).
NO_LMCACHE = """
import runpy, sys
sys.modules["lmcache"] = None
sys.argv = {argv!r}
if sys.argv[0].endswith(".py"):
    runpy.run_path(sys.argv[0], run_name="__main__")
from kvpool.cli import main
sys.exit(main(sys.argv[1:]))
"""


def without_lmcache(argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KVPOOL_LMCACHE"}
    return subprocess.run(
        [sys.executable, "-c", NO_LMCACHE.format(argv=argv)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
    )


def test_every_install_advice_is_the_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    assert kv_lmcache.INSTALL_COMMAND == RECIPE
    monkeypatch.setattr(kv_lmcache, "lmcache_version", lambda: None)
    with pytest.raises(kv_lmcache.LMCacheBridgeError, match=re.escape(RECIPE)):
        kv_lmcache.install()
    monkeypatch.setattr(kv_lmcache, "lmcache_version", lambda: "0.4.1")
    with pytest.raises(kv_lmcache.LMCacheBridgeError, match=re.escape(RECIPE)):
        kv_lmcache.install()
    example = without_lmcache([str(ROOT / "examples" / "lmcache_remote_plugin.py")])
    assert example.returncode == 2 and RECIPE in example.stderr, example.stderr
    bench = without_lmcache(["kvpool", "bench", "--only", "lmcache_remote"])
    assert bench.returncode == 2 and RECIPE in bench.stderr, bench.stderr
