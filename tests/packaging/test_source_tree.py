"""At the root of a never-built clone: ``python -m kvpool`` says what hides what, installers run.

From a clone's root, ``python -m kvpool`` and ``python -c`` import the
clone's ``kvpool/`` folder before the installed package.  Unbuilt, that
folder has no native layer: a command that needs it must say that the
tree hides the installed kvpool and what to do, and the installers (which
need none) must work there, their pip and import check included.  The
installed kvpool here is this interpreter's (this checkout, built).
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import kvpool

ROOT = Path(__file__).resolve().parents[2]
INSTALLED = Path(kvpool.__file__).resolve().parent


def env() -> dict[str, str]:
    skip = ("PYTHONPATH", "KVPOOL_LMCACHE", "VIRTUAL_ENV")
    return {k: v for k, v in os.environ.items() if k not in skip}


def kvpool_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvpool", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=env(),
    )


def test_a_command_that_needs_the_native_layer_says_the_tree_hides_the_install(
    fresh_clone: Path,
) -> None:
    for command in (["info"], ["demo"]):
        done = kvpool_cli(*command, cwd=fresh_clone)
        assert done.returncode == 2, done.stdout + done.stderr
        said = " ".join(done.stderr.split())
        tree = fresh_clone / "kvpool"
        assert f"the kvpool folder here ({tree}) is a source tree that is not built" in said
        assert f"instead of the kvpool installed at {INSTALLED}" in said, said
        assert "from another directory" in said and "build this tree with `make`" in said
        assert "Traceback" not in done.stderr


def test_the_installers_and_version_run_from_the_tree(fresh_clone: Path) -> None:
    version = kvpool_cli("--version", cwd=fresh_clone)
    assert version.returncode == 0 and version.stdout.startswith("kvpool "), version.stderr
    for command, listed in (
        ("install-lmcache", "lmcache/requirements-lmc056.txt"),
        ("install-sglang", "sglang/requirements-sgl0523.txt"),
    ):
        done = kvpool_cli(command, "--dry-run", cwd=fresh_clone)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"-r {fresh_clone / 'kvpool' / 'integrations' / listed}" in done.stdout


def test_a_built_tree_runs_as_it_is() -> None:
    done = kvpool_cli("info", cwd=ROOT)  # make test builds this checkout first
    assert done.returncode == 0, done.stdout + done.stderr
    assert "source tree" not in done.stderr


# Run from the clone's root, as `python -m kvpool install-...` is: the clone's
# installer, with a list already satisfied here and a module that needs the
# native layer, which only the installed kvpool has.
INSTALL = """
import sys
from pathlib import Path
from kvpool.integrations.install import Recipe, install
recipe = Recipe(command="install-test", title="cffi", requirements=Path(sys.argv[1]),
                modules=("kvpool.native.loader",))
sys.exit(install(recipe))
"""


def test_the_installers_pip_and_check_do_not_depend_on_the_current_directory(
    fresh_clone: Path, tmp_path: Path
) -> None:
    # A venv that sees this interpreter's packages (its pip, torch and kvpool
    # among them), so pip has nothing to fetch.
    venv = tmp_path / "venv"
    made = subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    listed = tmp_path / "requirements.txt"
    listed.write_text(f"cffi=={importlib.metadata.version('cffi')}\n")
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", INSTALL, str(listed)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=fresh_clone,
        env=env(),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "imported 1 cffi modules" in done.stdout
    assert f"install-test: done: cffi is ready in {venv}" in done.stdout
