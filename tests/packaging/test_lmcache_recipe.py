"""The LMCache recipe of docs/guide/lmcache.md, run verbatim in a fresh virtual environment.

A newcomer's path: a fresh clone that was never built (a copy of this
checkout's files, without its build outputs), a virtual environment that
sees nothing of this machine's packages, torch (this interpreter's version,
the CPU build: never a CUDA download), kvpool installed from the clone as
getting-started says (``pip install .``, which puts ``kvpool-lmcache.pth``
in site-packages and leaves the clone unbuilt), then every line of the
guide's "Installing LMCache" block, as written, at the clone's root in a
shell where that environment is active - where ``python -m`` finds the
clone's unbuilt ``kvpool/`` first.  Afterwards the plugin example and
``KVPOOL_LMCACHE=1`` must have used *that* environment's kvpool (the
example prints where its kvpool comes from, and the start-up hook only
exists there).

Then ``tests/compat/make_venv.py``, run by that environment's Python, must
build the compat environment over it: its Python imports the venv's kvpool
(not the base interpreter's, which here is another checkout's editable
install), runs the venv's ``KVPOOL_LMCACHE`` hook, and imports the clone's
kvpool when started in the clone, as the compat suite is.

Downloads come from pip's cache after the first run (the compat
environment of ``make compat`` fetches the same wheels).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from newcomer import CPU_TORCH

import kvpool
from kvpool.integrations.lmcache.requirements import MODULES

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 600
GUIDE = ROOT / "docs" / "guide" / "lmcache.md"

pytestmark = pytest.mark.slow


def recipe() -> list[str]:
    """The command lines of the guide's "Installing LMCache" block, comments removed."""
    section = GUIDE.read_text().split("## Installing LMCache\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "docs/guide/lmcache.md has no sh block under 'Installing LMCache'"
    lines = [line.split("  #", 1)[0].strip() for line in block.group(1).splitlines()]
    return [line for line in lines if line]


def clean_env(venv: Path | None = None) -> dict[str, str]:
    """This environment without what would point Python elsewhere; ``venv`` active if given."""
    skip = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "KVPOOL_LMCACHE", "MAKEFLAGS", "MAKELEVEL")
    env = {k: v for k, v in os.environ.items() if k not in skip}
    env["PYTHONNOUSERSITE"] = "1"
    env["LMCACHE_TRACK_USAGE"] = "false"
    if venv is not None:
        env["VIRTUAL_ENV"] = str(venv)
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def sh(command: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=TIMEOUT, env=env, cwd=cwd
    )
    assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def test_the_recipe_works_in_a_fresh_venv_and_uses_its_kvpool(
    fresh_clone: Path, newcomer_venv: Path, tmp_path: Path
) -> None:
    clone, venv = fresh_clone, newcomer_venv
    python = venv / "bin" / "python"
    base = clean_env()
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(sh(f'{python} -c "{purelib}"', base, tmp_path).stdout.strip())
    assert (site / "kvpool-lmcache.pth").is_file()

    active = clean_env(venv)
    lines = recipe()
    assert lines[0] == "python -m kvpool install-lmcache", lines
    outputs = [sh(line, active, clone).stdout for line in lines]

    assert "install-lmcache: done: LMCache 0.5.6 is ready in" in outputs[0], outputs[0]
    assert f"imported {len(MODULES)} LMCache modules" in outputs[0], outputs[0]
    versions = "import importlib.metadata as m; print(m.version('lmcache'), m.version('torch'))"
    version = sh(f'{python} -c "{versions}"', base, tmp_path)
    assert version.stdout.split() == ["0.5.6", CPU_TORCH], version.stdout
    ours = f"kvpool {kvpool.__version__} from {site / 'kvpool'}\n"
    for line, out in zip(lines[1:], outputs[1:], strict=True):
        assert ours in out, f"{line}: not the venv's kvpool\n{out}"
        assert out.strip().splitlines()[-1] == "lmcache remote plugin round trip ok", out
    assert "memory objects: lmcache.v1.memory_management.TensorMemoryObj" in outputs[1]
    assert lines[2].startswith("KVPOOL_LMCACHE=1 ")
    assert "memory objects: kvpool.pool.handle.TensorMemoryObj" in outputs[2], outputs[2]

    # The compat environment, made by the venv's Python, is over the venv.
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("lmcache==0.5.6\n")
    made = sh(
        f"{python} {ROOT / 'tests' / 'compat' / 'make_venv.py'} --cache {tmp_path / 'cache'} "
        f"--requirements {requirements}",
        base,
        tmp_path,
    )
    compat = made.stdout.strip().splitlines()[-1]
    assert compat.startswith(str(tmp_path / "cache")), made.stdout
    where = sh(f"{compat} -c 'import kvpool; print(kvpool.__file__)'", base, tmp_path)
    assert where.stdout.strip() == str(site / "kvpool" / "__init__.py"), where.stdout
    served = "import lmcache.v1.memory_management as mm; print(hasattr(mm, '__kvpool_served__'))"
    hook = sh(f'KVPOOL_LMCACHE=1 {compat} -c "{served}"', base, tmp_path)
    assert hook.stdout.strip() == "True", hook.stdout
    clone = sh(f"{compat} -c 'import kvpool; print(kvpool.__file__)'", base, ROOT)
    assert clone.stdout.strip() == str(ROOT / "kvpool" / "__init__.py"), clone.stdout
