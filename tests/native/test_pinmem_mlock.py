"""mlock pinning: locked for real, refused (faked and real), never over-reported."""

from __future__ import annotations

import subprocess

import pytest

from kvpool import errors, native
from kvpool.native.buffer import allocate_host

MIB = 1 << 20


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_every_mlock_mode_locks_everything(mode: int, smaps, options) -> None:
    native.option_set("mlock_mode", mode)
    native.option_set("min_thread_bytes", 4 * MIB)
    try:
        buf = allocate_host(16 * MIB, pin="mlock", threads=2)
    except errors.FeatureUnavailableError as exc:
        pytest.skip(f"mlock is not allowed here: {exc}")
    with buf:
        fields = smaps.fields(buf.address, buf.mapped_size)
        assert buf.pinned == "mlock"
        assert fields["Locked"] == buf.mapped_size
        assert fields["Rss"] == buf.mapped_size


def test_refused_mlock_auto_reports_none(smaps, faults) -> None:
    faults.set("mlock_eperm")
    with allocate_host(8 * MIB) as buf:
        assert buf.pinned == "none"
        fields = smaps.fields(buf.address, buf.mapped_size)
        assert fields.get("Locked", 0) == 0
        assert fields["Rss"] == buf.mapped_size


def test_refused_mlock_explicit_raises_with_the_limit(faults) -> None:
    faults.set("mlock_eperm")
    with pytest.raises(errors.FeatureUnavailableError) as info:
        allocate_host(8 * MIB, pin="mlock")
    message = str(info.value)
    assert "memlock limit" in message
    assert "ulimit -l" in message
    assert info.value.errno == 1  # EPERM


CHILD = """
import os, resource
from kvpool import errors
from kvpool.native.buffer import allocate_host
resource.setrlimit(resource.RLIMIT_MEMLOCK, (64 * 1024, 64 * 1024))
if os.geteuid() == 0:
    try:
        os.setgid(65534)
        os.setuid(65534)  # drops CAP_IPC_LOCK with the rest
    except PermissionError:
        pass
status = open("/proc/self/status").read()
cap_eff = int(status.split("CapEff:")[1].split()[0], 16)
if cap_eff >> 14 & 1:
    print("skip: cannot drop CAP_IPC_LOCK")
    raise SystemExit(0)
b = allocate_host(8 << 20)
print("auto", b.pinned)
try:
    allocate_host(8 << 20, pin="mlock")
    print("explicit ok")
except errors.FeatureUnavailableError as exc:
    # Refused before libpinmem tries (kvpool.native.limits), still a FeatureUnavailableError.
    text = str(exc)
    named = "memlock limit is 64 KiB" in text and "ulimit -l" in text
    print("explicit refused", type(exc).__name__, named)
"""


def test_real_memlock_limit_in_a_child(python, child_env, tmp_path) -> None:
    """A real refusal: a child with a 64 KiB memlock limit and no CAP_IPC_LOCK."""
    out = subprocess.run(
        [python, "-c", CHILD], env=child_env, capture_output=True, text=True, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    if out.stdout.startswith("skip:"):
        pytest.skip(out.stdout.strip())
    assert out.stdout.split("\n")[:2] == ["auto none", "explicit refused MemlockLimitError True"]
