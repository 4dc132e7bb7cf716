"""What the Makefile's user-facing targets would run (``make -n``), without running them."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[2]


def dry_run(target: str, *args: str) -> str:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    # Not the variables of a make that runs this test (make test PIP=...).
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    done = subprocess.run(
        ["make", "-n", target, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def requirements_installed(out: str) -> list[str]:
    """The requirements the pip install lines of ``out`` name (quotes removed)."""
    words = []
    for line in out.splitlines():
        if " -m pip install " in line:
            words += [w.strip('"') for w in line.split(" -m pip install ", 1)[1].split()]
    return [w for w in words if not w.startswith("-")]


def test_demo_and_docs_install_what_they_need_but_not_kvpool() -> None:
    # They ran `pip install -e .`, which turned a regular install into an
    # editable one and dropped its KVPOOL_LMCACHE hook.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = [d for d in project["dependencies"] if not d.startswith("torch")]
    demo = dry_run("demo", "PYTHON=/opt/venv/bin/python")
    assert requirements_installed(demo) == ["torch==2.13.0", *runtime], demo
    assert "not kvpool" in demo and "/opt/venv/bin/python" in demo
    assert "/opt/venv/bin/python -m kvpool demo" in demo
    docs = dry_run("docs", "PYTHON=/opt/venv/bin/python")
    assert requirements_installed(docs) == project["optional-dependencies"]["docs"], docs


def test_lint_runs_ruff_check_and_format() -> None:
    out = dry_run("lint")
    assert "ruff check ." in out and "ruff format --check ." in out


def test_ci_lints_before_testing() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    assert script.index("make lint") < script.index("make test")


def test_wheel_compiles_with_zig_for_glibc_2_17_and_lib_with_the_system_cc() -> None:
    for target, arch in (("wheel", platform.machine()), ("wheel-aarch64", "aarch64")):
        out = dry_run(target, "PYTHON=python3")
        assert '"ziglang==' in out  # wheel-tools installs the pinned toolchain
        build = next(line for line in out.splitlines() if " -m build " in line)
        # By absolute path: the build runs in an unpacked sdist elsewhere.
        zig = rf'KVPOOL_CC="/\S+ -m ziglang cc -target {arch}-linux-gnu\.2\.17 -g0"'
        assert re.search(zig, build), build
        assert f"--plat-name=linux_{arch}" in out
        assert "auditwheel show" in out
    lib = dry_run("lib")
    assert "build.py" in lib and "ziglang" not in lib and "KVPOOL_CC" not in lib


def test_gpu_wheels_downloads_cffi_and_pycparser_for_the_gpu_python() -> None:
    out = dry_run("gpu-wheels", "GPU_PY=3.12")
    assert "download" in out and "--python-version 3.12" in out and "--only-binary=:all:" in out
    assert '"cffi>=1.15" pycparser' in out and "-d .whl" in out


def test_gpu_check_runs_every_step_and_logs_each(tmp_path: Path) -> None:
    # Small sizes, so that on a GPU machine too this takes seconds; without a
    # GPU the two benchmarks say so (status 2) and the script exits 1.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    env.update(OUT=str(tmp_path), GPU_CHECK_PINNED_SIZE="64M", GPU_CHECK_H2D_SIZE="16M")
    env.update(GPU_CHECK_POOL_SIZE=str(1 << 30), GPU_CHECK_POOL_CHUNK="256M")
    env.update(PYTHON=sys.executable, GPU_CHECK_WHEELS=str(tmp_path / "no-wheels"))
    done = subprocess.run(
        [str(ROOT / ".ci" / "gpu-check")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    logs = {p.name for p in tmp_path.iterdir()}
    steps = ("build", "gpu-tests", "big-pool", "h2d", "pinned")
    assert logs == {"machine.log", *(f"{step}.log" for step in steps)}
    for step in steps:
        assert f"== {step}: " in done.stdout
    assert "status 0" in done.stdout.split("== gpu-tests")[1].split("==")[0]
    assert "status 0" in done.stdout.split("== big-pool")[1].split("==")[0]
    # The limits of the steps and the 20 s of the machine's report fit in 6 minutes.
    script = (ROOT / ".ci" / "gpu-check").read_text()
    limits = [int(n) for n in re.findall(r"^step [\w-]+ (\d+) ", script, re.M)]
    assert len(limits) == len(steps) and sum(limits) + 20 <= 360
    if torch.cuda.is_available():
        assert done.returncode == 0, done.stdout
        assert "cuda-register / cudaHostAlloc" in (tmp_path / "pinned.log").read_text()
    else:
        assert done.returncode == 1
        assert "no CUDA device" in (tmp_path / "h2d.log").read_text()
        assert "no CUDA device" in (tmp_path / "pinned.log").read_text()


def pip_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if " -m pip " in line]


def pip_pythons(out: str) -> set[str]:
    """The interpreters whose pip the commands of ``out`` run."""
    return set(re.findall(r"(\S+) -m pip ", out))


def test_make_runs_in_the_project_venv_unless_python_is_given(tmp_path: Path) -> None:
    # A venv that does not exist yet is made first, over python3's packages.
    venv = tmp_path / "venv"
    for target in ("demo", "test", "lint", "docs", "wheel"):
        out = dry_run(target, f"VENV={venv}")
        assert out.index(f"python3 -m venv --system-site-packages {venv}") < out.index(" -m pip ")
        assert pip_pythons(out) == {f"{venv}/bin/python"}, out
    # By default the venv is .venv; no pip ever runs on the system's python3.
    for target in ("demo", "test", "lint", "docs"):
        assert pip_pythons(dry_run(target)) == {".venv/bin/python"}, target
    given = dry_run("demo", "PYTHON=/opt/venv/bin/python")
    assert " -m venv " not in given


def test_ci_leaves_the_interpreter_to_make_unless_python_is_set() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    calls = re.findall(r"^make (lint|test)\b(.*)$", script, re.M)
    assert [c[0] for c in calls] == ["lint", "test"]
    assert all(rest.strip() == '${PYTHON:+PYTHON="$PYTHON"}' for _, rest in calls), calls


def test_torch_is_installed_only_where_there_is_none_from_the_index_given() -> None:
    cpu = "https://download.pytorch.org/whl/cpu"
    for target in ("demo", "deps"):
        out = dry_run(target, "PYTHON=/opt/venv/bin/python", f"TORCH_INDEX={cpu}")
        line = next(line for line in pip_lines(out) if '"torch==2.13.0"' in line)
        assert line.startswith("/opt/venv/bin/python -c 'import torch' 2>/dev/null || "), line
        assert line.split(" -m pip install ")[1].split() == [
            "-q", '"torch==2.13.0"', "--index-url", cpu
        ], line  # fmt: skip
        plain = dry_run(target, "PYTHON=/opt/venv/bin/python")
        assert "--index-url" not in plain
    # What the Makefile says of it: PyPI's build is CUDA's; the CPU one is TORCH_INDEX's.
    comments = " ".join(
        line.lstrip("# ").strip()
        for line in (ROOT / "Makefile").read_text().splitlines()
        if line.startswith("#")
    )
    assert re.search(r"From PyPI that is, on x86-64 Linux, the CUDA build", comments), comments
    assert f"make demo TORCH_INDEX={cpu}" in comments


# Run by the venv's python: is its base interpreter's site-packages on sys.path?
SEES_BASE = """
import sys, sysconfig
base = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_prefix})
print(base["purelib"] in sys.path)
"""


@pytest.mark.slow
def test_the_venv_is_made_once_over_the_base_packages_and_a_failed_one_is_removed(
    tmp_path: Path,
) -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    venv = tmp_path / "venv"
    python = venv / "bin" / "python"

    def make(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["make", "--no-print-directory", *args, str(python)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )

    first = make(f"VENV={venv}", f"BASE_PYTHON={sys.executable}")
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"creating the virtual environment {venv}" in first.stdout
    assert "include-system-site-packages = true" in (venv / "pyvenv.cfg").read_text()
    # The base's packages are visible (a torch there is used, not installed again).
    sees = subprocess.run([str(python), "-c", SEES_BASE], capture_output=True, text=True)
    assert sees.stdout.strip() == "True", sees.stdout + sees.stderr
    again = make(f"VENV={venv}", f"BASE_PYTHON={sys.executable}")
    assert again.returncode == 0 and "creating" not in again.stdout, again.stdout

    broken = tmp_path / "broken"
    failed = subprocess.run(
        ["make", "--no-print-directory", f"VENV={broken}", "BASE_PYTHON=/nonexistent/python3",
         str(broken / "bin" / "python")],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert failed.returncode != 0
    assert "apt install python3-venv" in failed.stderr and "PYTHON=" in failed.stderr
    assert not broken.exists()
