"""Pools under memory limits: MemoryLimitError, never OOM-killed; lazy pools stop growing.

Two halves.  With the platform faked (tests/fake_cgroups.py), the lazy
pool's growth is stopped by a limit in-process.  For real, as root, each
case runs a child Python inside a fresh 1 GiB memory cgroup (v1 or v2,
tests/memory_cgroup.py): ``MixedMemoryAllocator(2 GiB)`` and
``HostMemoryAllocator(2 GiB)`` must raise MemoryLimitError (the child exits
normally with the message, it is not killed by a signal), a lazy pool
growing to 2 GiB must stop with a warning and stay usable, and a pool that
fits must work.  The children use 4 KiB pages (``KVPOOL_HUGEPAGES=never``):
hugetlb pages are not charged to a memory cgroup.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fake_cgroups import FakeHost, level
from memory_cgroup import NOT_JOINED, MemoryCgroup, memory_cgroup
from pool_helpers import MIB, count_mappings

import kvpool
from kvpool import MemoryFormat

GIB = 1 << 30
LIVENESS = 120.0  # bound on every wait; no test asserts how long anything took
CHILD_TIMEOUT = 300.0
REFUSED = 3


# -- the platform faked -----------------------------------------------------


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeHost:
    monkeypatch.setenv("KVPOOL_HUGEPAGES", "never")  # the memory cgroup charges 4 KiB pages
    return FakeHost(tmp_path)


@pytest.mark.parametrize(
    ("keep_free", "stopped_by"),
    [(None, "would leave less than keep_free="), (0, "committing 8 MiB at offset 8388608")],
    ids=["keep_free-default", "commit-check"],
)
def test_lazy_growth_stops_at_the_limit_and_the_pool_stays_usable(
    host: FakeHost,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    keep_free: int | None,
    stopped_by: str,
) -> None:
    job = level(
        host.v1(cgroup="/job") / "job", memory__limit_in_bytes=GIB, memory__usage_in_bytes=0
    )
    host.install(monkeypatch)
    before = count_mappings()
    pool = kvpool.LazyMemoryAllocator(
        8 * MIB, 64 * MIB, step_size=8 * MIB, start=False, keep_free=keep_free
    )
    try:
        # The cgroup fills up (another process, say) before the pool grows.
        (job / "memory.usage_in_bytes").write_text(str(GIB - 20 * MIB))
        with caplog.at_level(logging.WARNING, logger="kvpool"):
            pool.start_growth()
            assert pool.wait_ready(LIVENESS) is False
        assert not pool.growing  # finished, not timed out
        assert pool.stopped_by is not None
        assert stopped_by in pool.stopped_by
        assert "memory cgroup /job (v1)" in pool.stopped_by
        assert str(job / "memory.limit_in_bytes") in pool.stopped_by
        assert pool.committed_bytes == 8 * MIB
        assert pool.usable_bytes == 8 * MIB
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert any(
            "stopped growing" in r.getMessage() and "memory cgroup /job (v1)" in r.getMessage()
            for r in warnings
        )
        # Usable at the size it reached: 8 MiB can be handed out, not more.
        obj = pool.allocate(torch.Size([4 * MIB]), torch.uint8, MemoryFormat.KV_2LTD)
        assert obj is not None
        obj.tensor.fill_(7)
        assert int(obj.tensor[-1]) == 7
        assert pool.allocate(torch.Size([8 * MIB]), torch.uint8, MemoryFormat.KV_2LTD) is None
        obj.ref_count_down()
    finally:
        pool.close()
    assert count_mappings() == before


def test_lazy_first_part_that_does_not_fit_raises(
    host: FakeHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    level(
        host.v1(cgroup="/job") / "job",
        memory__limit_in_bytes=GIB,
        memory__usage_in_bytes=GIB - 64 * MIB,
    )
    host.install(monkeypatch)
    before = count_mappings()
    with pytest.raises(kvpool.MemoryLimitError, match=r"memory cgroup /job \(v1\)"):
        kvpool.LazyMemoryAllocator(128 * MIB, 256 * MIB)
    assert count_mappings() == before


def test_pool_constructors_raise_before_populating(
    host: FakeHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    host.meminfo = "MemTotal: 16777216 kB\nMemAvailable: 65536 kB\n"  # 64 MiB available
    host.install(monkeypatch)
    before = count_mappings()
    for make in (kvpool.MixedMemoryAllocator, kvpool.HostMemoryAllocator):
        with pytest.raises(kvpool.MemoryLimitError, match="available RAM"):
            make(128 * MIB)
    assert count_mappings() == before
    with kvpool.MixedMemoryAllocator(16 * MIB) as pool:
        assert pool.allocate(torch.Size([MIB]), torch.uint8, MemoryFormat.KV_2LTD) is not None


# -- for real, in a memory cgroup ---------------------------------------------

CHILD_REFUSED = """
import json, sys
import kvpool
try:
    pool = kvpool.{cls}(2 << 30)
except kvpool.MemoryLimitError as exc:
    print(json.dumps({{"refused": type(exc).__name__, "message": str(exc)}}))
    sys.exit(3)
print(json.dumps({{"refused": None}}))
pool.close()
"""

CHILD_LAZY = """
import json, logging, torch
import kvpool
from kvpool import MemoryFormat
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
pool = kvpool.LazyMemoryAllocator(256 << 20, 2 << 30, **{kwargs})
ready = pool.wait_ready({liveness})
obj = pool.allocate(torch.Size([128 << 20]), torch.uint8, MemoryFormat.KV_2LTD)
obj.tensor.fill_(5)
readback = int(obj.tensor[0]) + int(obj.tensor[-1])
too_big = pool.allocate(torch.Size([pool.usable_bytes + 4096]), torch.uint8, MemoryFormat.KV_2LTD)
print(json.dumps({{
    "ready": ready,
    "growing": pool.growing,
    "stopped_by": pool.stopped_by,
    "committed": pool.committed_bytes,
    "usable": pool.usable_bytes,
    "readback": readback,
    "too_big": too_big is not None,
}}))
obj.ref_count_down()
pool.close()
"""

CHILD_FITS = """
import json, torch
import kvpool
from kvpool import MemoryFormat
sums = []
for cls in (kvpool.MixedMemoryAllocator, kvpool.HostMemoryAllocator):
    with cls(256 << 20) as pool:
        obj = pool.allocate(torch.Size([64 << 20]), torch.uint8, MemoryFormat.KV_2LTD)
        obj.tensor.fill_(3)
        sums.append(int(obj.tensor.sum()))
        obj.ref_count_down()
print(json.dumps({"sums": sums}))
"""


@pytest.fixture(scope="module")
def limited() -> Iterator[MemoryCgroup]:
    """A 1 GiB memory cgroup for this module's children (removed at the end)."""
    with memory_cgroup(GIB) as cgroup:
        yield cgroup


@pytest.fixture
def cgroup_env(child_env: dict[str, str]) -> dict[str, str]:
    return dict(child_env, KVPOOL_HUGEPAGES="never")


def run_child(
    cgroup: MemoryCgroup, script: str, env: dict[str, str], cwd: Path
) -> tuple[int, dict[str, Any]]:
    out = cgroup.run(script, env=env, timeout=CHILD_TIMEOUT, cwd=cwd)
    assert out.returncode != NOT_JOINED, out.stderr
    # A negative status is a signal: the OOM killer (SIGKILL) is what this prevents.
    assert out.returncode >= 0, f"child killed by signal {-out.returncode}: {out.stderr[-2000:]}"
    lines = out.stdout.strip().splitlines()
    assert lines, out.stderr[-2000:]
    return out.returncode, {**json.loads(lines[-1]), "stderr": out.stderr}


@pytest.mark.parametrize("cls", ["MixedMemoryAllocator", "HostMemoryAllocator"])
def test_a_pool_larger_than_the_cgroup_is_refused_not_killed(
    limited: MemoryCgroup, cgroup_env: dict[str, str], tmp_path: Path, cls: str
) -> None:
    code, result = run_child(limited, CHILD_REFUSED.format(cls=cls), cgroup_env, tmp_path)
    assert code == REFUSED, result
    assert result["refused"] == "MemoryLimitError"
    message = result["message"]
    name = limited.path.name
    assert "memory cgroup /" in message and name in message
    assert str(limited.limit_file) in message
    assert "is 1 GiB with" in message
    assert "raise the cgroup's limit" in message and "smaller pool" in message


@pytest.mark.parametrize(
    ("kwargs", "grows"),
    [
        ({}, False),  # LMCache's call; the default keep_free (up to 2 GiB) stops it at once
        ({"step_size": 128 * MIB, "keep_free": 0}, True),  # grows up to the commit check
    ],
    ids=["defaults", "keep_free=0"],
)
def test_a_lazy_pool_stops_growing_at_the_cgroup_limit_and_stays_usable(
    limited: MemoryCgroup,
    cgroup_env: dict[str, str],
    tmp_path: Path,
    kwargs: dict[str, int],
    grows: bool,
) -> None:
    script = CHILD_LAZY.format(liveness=LIVENESS, kwargs=kwargs)
    code, result = run_child(limited, script, cgroup_env, tmp_path)
    assert code == 0, result["stderr"][-2000:]
    assert result["ready"] is False
    assert result["growing"] is False  # stopped, not timed out
    assert str(limited.limit_file) in result["stopped_by"]
    assert 256 * MIB <= result["committed"] < GIB
    assert (result["committed"] > 256 * MIB) is grows
    assert result["usable"] == result["committed"]
    assert result["readback"] == 10
    assert result["too_big"] is False
    warning = [line for line in result["stderr"].splitlines() if "stopped growing" in line]
    assert warning and warning[0].startswith("WARNING kvpool")
    assert str(limited.limit_file) in warning[0]


def test_a_pool_that_fits_in_the_cgroup_works(
    limited: MemoryCgroup, cgroup_env: dict[str, str], tmp_path: Path
) -> None:
    code, result = run_child(limited, CHILD_FITS, cgroup_env, tmp_path)
    assert code == 0, result["stderr"][-2000:]
    assert result["sums"] == [3 * 64 * MIB, 3 * 64 * MIB]
