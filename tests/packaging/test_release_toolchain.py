"""build.py's compiler choice: KVPOOL_CC (the release's zig, glibc 2.17) and rebuilds on a change.

The release build compiles libpinmem with zig's clang aimed at glibc 2.17
(what ``make wheel`` does through ``KVPOOL_CC``); here libpinmem's own C
test program runs against that build, and against nothing else, so the
library the wheel ships passes the same checks as the developer build
(``make check``).  The developer build keeps the system ``cc``.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from glibc_needs import glibc_versions, needed_libraries

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 600
#: The Makefile's WHEEL_CC for this machine, WHEEL_GLIBC = 2.17.
ZIG_CC = f"{sys.executable} -m ziglang cc -target {platform.machine()}-linux-gnu.2.17 -g0"
#: The Makefile's CFLAGS_TEST.
CFLAGS_TEST = ["-O2", "-Wall", "-Wextra", "-Werror", "-std=gnu11", "-pthread"]


def _build(out: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run build.py into out/ (library and cffi module) and out/build/ (objects)."""
    full = {k: v for k, v in os.environ.items() if k not in ("KVPOOL_CC", "CC", "CFLAGS")}
    full.update(env)
    cmd = [sys.executable, str(ROOT / "build.py"), "--out", str(out)]
    return subprocess.run(
        [*cmd, "--build-dir", str(out / "build"), *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        env=full,
    )


def documented_libraries() -> set[str]:
    """The libraries docs/contributing.md says libpinmem needs (its paragraph on the wheel)."""
    text = (ROOT / "docs" / "contributing.md").read_text()
    paragraph = text.split("libpinmem needs only", 1)[1].split("no CUDA", 1)[0]
    return set(re.findall(r"`((?:lib|ld-)[\w.-]+\.so[\w.]*)`", paragraph))


def _compiled(done: subprocess.CompletedProcess[str]) -> int:
    """How many sources build.py compiled (it echoes each command)."""
    return sum(" -c " in line for line in done.stdout.splitlines())


@pytest.mark.slow
def test_c_tests_pass_on_the_glibc_2_17_build(tmp_path: Path) -> None:
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (cc) for the test program")
    # CC names no compiler: KVPOOL_CC must be the one used.
    done = _build(tmp_path, "--testing", KVPOOL_CC=ZIG_CC, CC="/nonexistent/cc")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ziglang cc" in done.stdout and "/nonexistent/cc" not in done.stdout
    testing = tmp_path / "build" / "testing"
    for library in (tmp_path / "libpinmem.so", testing / "libpinmem.so"):
        needs = glibc_versions(library.read_bytes())
        assert needs and max(needs) <= (2, 17), (library, sorted(needs))
    # docs/contributing.md names every library the release build and the
    # developer build (this machine's cc) need, and no other.
    documented = documented_libraries()
    release = needed_libraries((tmp_path / "libpinmem.so").read_bytes())
    developer = needed_libraries((ROOT / "kvpool" / "native" / "libpinmem.so").read_bytes())
    assert release | developer <= documented, sorted((release | developer) - documented)
    loaders = {name for name in documented if name.startswith("ld-linux")}
    assert documented - loaders <= release, sorted(documented - loaders - release)
    # The test program and the fake CUDA runtime, as the Makefile builds them
    # (the system cc: only the library is the release's).
    program = tmp_path / "test_pinmem"
    fake_cudart = tmp_path / "libfakecudart.so"
    tests = ROOT / "libpinmem" / "tests"
    link = [f"-L{testing}", "-lpinmem", f"-Wl,-rpath,{testing}", "-ldl"]
    test_sources = sorted(str(path) for path in tests.glob("test_*.c"))  # the Makefile's list
    for out, flags, sources in (
        (fake_cudart, ["-fPIC", "-shared"], [str(tests / "fake_cudart.c")]),
        (program, ["-DPINMEM_TESTING"], test_sources),
    ):
        cmd = [cc, *CFLAGS_TEST, *flags, "-o", str(out), *sources]
        cmd += link if out == program else []
        made = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, check=False)
        assert made.returncode == 0, made.stderr
    ran = subprocess.run(
        [str(program), str(fake_cudart), str(tmp_path / "libpinmem.so")],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.splitlines()[-1].endswith(" checks, 0 failed"), ran.stdout


def test_a_change_of_compiler_flags_rebuilds_everything_and_nothing_else_does(
    tmp_path: Path,
) -> None:
    sources = len(list((ROOT / "libpinmem").glob("*.c")))
    first = _build(tmp_path)
    assert first.returncode == 0, first.stderr
    assert _compiled(first) == sources
    again = _build(tmp_path)
    assert again.returncode == 0, again.stderr
    assert _compiled(again) == 0  # nothing changed: nothing compiled
    # Timestamps alone would keep every object built with the old flags.
    changed = _build(tmp_path, CFLAGS="-DKVPOOL_TOOLCHAIN_TEST=1")
    assert changed.returncode == 0, changed.stderr
    assert _compiled(changed) == sources
    assert "-DKVPOOL_TOOLCHAIN_TEST=1" in (tmp_path / "build" / "commands.txt").read_text()
    # A build that fails keeps no record, so the next one starts over.
    failed = _build(tmp_path, KVPOOL_CC="cc -DKVPOOL_TOOLCHAIN_TEST=2 -include /nonexistent.h")
    assert failed.returncode != 0
    assert not (tmp_path / "build" / "commands.txt").exists()
    back = _build(tmp_path, CFLAGS="-DKVPOOL_TOOLCHAIN_TEST=1")
    assert back.returncode == 0, back.stderr
    assert _compiled(back) == sources
