"""``kvpool install-sglang``: one pinned list, shipped with kvpool, and a stand-in where needed.

Without network or SGLang: the list (in the package, the one the compat
environment uses too), what the command would run (``--dry-run``), its
refusal without torch, and the stand-in step for real in a virtual
environment (placed when the module is missing, not when it is
installed).  The recipe itself runs for real in
tests/packaging/test_sglang_recipe.py.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvpool.cli.sglang import MODULES, REQUIREMENTS, TORCHVISION
from kvpool.integrations.install import Recipe, install, requirements

ROOT = Path(__file__).resolve().parents[2]


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


def test_the_list_is_shipped_beside_the_backend_pinned_and_complete() -> None:
    assert REQUIREMENTS == ROOT / "kvpool" / "integrations" / "sglang" / "requirements-sgl0523.txt"
    lines = requirements(REQUIREMENTS)
    assert lines[0] == "sglang==0.5.23"
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][\w.]*", line) for line in lines), lines
    names = {line.split("==")[0].lower().replace("_", "-") for line in lines}
    # What the example lacked over a bare venv (the issue), and never torch or torchvision.
    assert {"orjson", "requests", "urllib3", "idna", "certifi", "packaging", "pillow"} <= names
    assert not names & {"torch", "torchvision"}
    assert "kvpool.integrations.sglang" in MODULES


def test_the_compat_environment_uses_the_same_list() -> None:
    spec = importlib.util.spec_from_file_location(
        "make_venv", ROOT / "tests" / "compat" / "make_venv.py"
    )
    make_venv = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(make_venv)  # type: ignore[union-attr]
    assert REQUIREMENTS in make_venv.ALL_REQUIREMENTS
    assert make_venv.site_files(REQUIREMENTS) == TORCHVISION.files()
    assert [p.name for p in TORCHVISION.files()] == [
        "kvpool_torchvision_stub.pth",
        "kvpool_torchvision_stub.py",
    ]
    assert not (ROOT / "tests" / "compat" / REQUIREMENTS.name).exists()  # one list, not two


def test_dry_run_shows_pip_no_deps_into_this_python() -> None:
    done = kvpool_cli("install-sglang", "--dry-run")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("install-sglang: SGLang 0.5.23 and "), lines[0]
    assert f"into {sys.prefix} ({sys.executable})" in lines[0], lines[0]
    pip = lines[1].split()
    assert pip[:5] == [sys.executable, "-m", "pip", "install", "--no-deps"], pip
    assert pip[pip.index("-r") + 1] == str(REQUIREMENTS)
    assert "-c" in pip  # the constraint that holds torch to the installed one
    # The constraints file is temporary: what it holds is said, so the command can be rerun.
    assert lines[2].startswith("  (constraints.txt is a temporary file holding: torch=="), lines
    assert lines[3] == "then, where torchvision is missing, a stand-in for it is placed", lines
    assert lines[4].endswith(f"<import {len(MODULES)} modules: {', '.join(MODULES)}>")


def test_without_torch_it_says_how_to_get_the_cpu_build(tmp_path: Path) -> None:
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    done = kvpool_cli("install-sglang", python=str(venv / "bin" / "python"))
    assert done.returncode == 2, done.stdout + done.stderr
    said = done.stdout
    assert "install-sglang: torch is not installed in" in said
    assert "--index-url https://download.pytorch.org/whl/cpu" in said


# Run in a venv over this interpreter's packages: the recipe machinery with a
# list already satisfied here and a stand-in for a module no one has.
STAND_IN = """
import sys
from pathlib import Path
from kvpool.integrations.install import Recipe, StandIn, install
listed, folder, module = sys.argv[1:]
recipe = Recipe(command="install-test", title="cffi", requirements=Path(listed),
                modules=(module,), stand_in=StandIn(module, Path(folder), "A note."))
sys.exit(install(recipe))
"""


def stand_in_run(tmp_path: Path, module: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    venv = tmp_path / "venv"
    made = [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)]
    subprocess.run(made, check=True)
    folder = tmp_path / "stand-in"
    folder.mkdir()
    (folder / "stand_in_for_test.pth").write_text("import stand_in_for_test\n")
    (folder / "stand_in_for_test.py").write_text(
        f"import sys, types\nsys.modules.setdefault({module!r}, types.ModuleType({module!r}))\n"
    )
    listed = tmp_path / "requirements.txt"
    listed.write_text(f"cffi=={importlib.metadata.version('cffi')}\n")
    python = venv / "bin" / "python"
    done = subprocess.run(
        [str(python), "-c", STAND_IN, str(listed), str(folder), module],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return done, Path(site)


def test_the_stand_in_is_placed_where_its_module_is_missing(tmp_path: Path) -> None:
    done, site = stand_in_run(tmp_path, "kvpool_no_such_module")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "kvpool_no_such_module is not installed: placed a stand-in in" in done.stdout
    assert "A note." in done.stdout
    assert (site / "stand_in_for_test.pth").is_file() and (site / "stand_in_for_test.py").is_file()
    assert "imported 1 cffi modules" in done.stdout  # the check's child loaded it


def test_the_stand_in_is_not_placed_where_its_module_is_installed(tmp_path: Path) -> None:
    done, site = stand_in_run(tmp_path, "pytest")  # a distribution installed here
    assert done.returncode == 0, done.stdout + done.stderr
    assert "placed a stand-in" not in done.stdout
    assert not (site / "stand_in_for_test.pth").exists()


def test_a_recipe_and_install_refuse_what_they_cannot_use(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"requirements='list\.txt'.*pathlib\.Path"):
        Recipe("install-x", "X 1", "list.txt", ("x",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"modules=\(\).*one or more module names"):
        Recipe("install-x", "X 1", tmp_path / "list.txt", ())
    with pytest.raises(TypeError, match=re.escape("give a kvpool.integrations.install.Recipe")):
        install(REQUIREMENTS)  # type: ignore[arg-type]
    missing = Recipe("install-x", "X 1", tmp_path / "list.txt", ("x",))
    with pytest.raises(FileNotFoundError, match=r"install-x: the pinned list .* is missing"):
        install(missing)
