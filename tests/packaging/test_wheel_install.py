"""`make wheel`: a manylinux wheel and an sdist, installed in a fresh venv and used elsewhere.

The wheel is built once per session by the real Makefile target (sdist,
then the wheel from the sdist, then ``auditwheel repair``/``show``), then
installed with ``--no-deps`` into a new virtual environment that sees
this interpreter's packages (so the local CPU torch is used, never a
download), and imported from a directory outside the source tree.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import kvpool

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 600

pytestmark = pytest.mark.slow

# What a user of the installed wheel does first, run from another directory.
USE = r"""
import sys, torch, kvpool
from kvpool import MemoryFormat
print(kvpool.__file__)
pool = kvpool.MixedMemoryAllocator(1 << 20)
obj = pool.allocate(torch.Size([2, 4, 16, 8]), torch.float16, MemoryFormat.KV_2LTD)
obj.tensor.fill_(1.5)
assert obj.tensor.sum().item() == 1.5 * obj.tensor.numel()
stats = pool.stats()
assert stats.active_objects == 1, stats
obj.ref_count_down()
assert pool.stats().active_objects == 0
pool.close()
print("used", kvpool.__version__)
"""


def _run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=TIMEOUT, check=False, **kwargs
    )


def _clean_env() -> dict[str, str]:
    """This environment without anything that would point Python at the source tree."""
    skip = ("PYTHONPATH", "PYTHONHOME", "MAKEFLAGS", "MAKELEVEL", "MFLAGS")
    env = {k: v for k, v in os.environ.items() if k not in skip}
    env["PYTHONNOUSERSITE"] = "1"
    return env


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    out = tmp_path_factory.mktemp("dist")
    done = _run(
        ["make", "-s", "wheel", f"DIST={out}", f"PYTHON={sys.executable}"],
        cwd=ROOT,
        env=_clean_env(),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def _one(dist: Path, pattern: str) -> Path:
    found = sorted(dist.glob(pattern))
    assert len(found) == 1, f"{pattern}: {found}"
    return found[0]


def test_wheel_is_manylinux_and_carries_the_library_and_license(dist: Path) -> None:
    wheel = _one(dist, "kvpool-*.whl")
    # py3-none-manylinux_<glibc>_<arch>: any Python 3 (cffi ABI mode), tagged by auditwheel.
    assert re.fullmatch(
        rf"kvpool-{re.escape(kvpool.__version__)}-py3-none-manylinux_2_\d+_\w+\.whl", wheel.name
    ), wheel.name
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        info = f"kvpool-{kvpool.__version__}.dist-info"
        shipped = {"kvpool/native/libpinmem.so", "kvpool/native/_pinmem_ffi.py", "kvpool/py.typed"}
        assert shipped <= names
        # The KVPOOL_LMCACHE=1 start-up hook, at the root of site-packages.
        assert {"kvpool-lmcache.pth", "kvpool_lmcache_hook.py"} <= names
        assert f"{info}/licenses/LICENSE" in names
        assert "Apache License" in zf.read(f"{info}/licenses/LICENSE").decode()
        metadata = zf.read(f"{info}/METADATA").decode()
        assert "License-Expression: Apache-2.0" in metadata
        assert not any(n.startswith("kvpool.libs/") for n in names), "auditwheel grafted libraries"
    shown = _run([sys.executable, "-m", "auditwheel", "show", str(wheel)])
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    assert "is consistent with the following platform tag" in text
    assert "external shared libraries are required" not in text


def test_sdist_carries_the_sources_the_wheel_is_built_from(dist: Path) -> None:
    sdist = _one(dist, "kvpool-*.tar.gz")
    with tarfile.open(sdist) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    for needed in ("LICENSE", "build.py", "setup.py", "pyproject.toml", "libpinmem/pinmem.h"):
        assert needed in names, needed
    assert any(n.startswith("libpinmem/") and n.endswith(".c") for n in names)
    assert "kvpool/native/libpinmem.so" not in names  # built at install time, not shipped


def test_wheel_installs_in_a_fresh_venv_and_works_from_another_directory(
    dist: Path, tmp_path: Path
) -> None:
    wheel = _one(dist, "kvpool-*.whl")
    venv = tmp_path / "venv"
    made = _run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)])
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    env = _clean_env()
    # --no-deps: cffi, numpy and torch come from this interpreter's packages,
    # so no torch (let alone a CUDA build) is ever downloaded.
    installed = _run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        env=env,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    used = _run([str(python), "-c", USE], cwd=elsewhere, env=env)
    assert used.returncode == 0, used.stdout + used.stderr
    where, last = used.stdout.splitlines()[0], used.stdout.splitlines()[-1]
    assert Path(where).resolve().is_relative_to(venv.resolve()), where  # not the source tree
    assert last == f"used {kvpool.__version__}"
    kvpool_script = str(venv / "bin" / "kvpool")
    for cmd in ([kvpool_script, "--version"], [str(python), "-m", "kvpool", "--version"]):
        shown = _run(cmd, cwd=elsewhere, env=env)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.strip() == f"kvpool {kvpool.__version__}"
    info = _run([kvpool_script, "info"], cwd=elsewhere, env=env)
    assert info.returncode == 0, info.stderr
    assert "hugepages" in info.stdout.lower()
    # The installed .pth arms the LMCache hook only when asked, importing nothing of kvpool.
    probe = (
        "import sys; print(any(type(f).__name__ == '_InstallOnFirstImport' for f in sys.meta_path),"
        " 'kvpool' in sys.modules)"
    )
    for value, armed in (("1", "True False"), ("", "False False")):
        hooked = _run(
            [str(python), "-c", probe], cwd=elsewhere, env={**env, "KVPOOL_LMCACHE": value}
        )
        assert hooked.returncode == 0, hooked.stderr
        assert hooked.stdout.strip() == armed
