"""Limits checked before populating: allocate_host / HostBuffer.commit with the platform faked.

The cgroup files, meminfo and memlock limit are fake (tests/fake_cgroups.py);
the mappings are real, so "refused" means nothing was mapped and "fits"
means the memory was made resident.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
from fake_cgroups import NO_CAPS, FakeHost, level

from kvpool import errors
from kvpool.native import limits
from kvpool.native.buffer import allocate_host, live_mappings
from kvpool.native.machine import capabilities

GiB, MiB = 1 << 30, 1 << 20


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path)


def v1_job(host: FakeHost, limit: int, usage: int) -> Path:
    point = host.v1(cgroup="/job")
    return level(point / "job", memory__limit_in_bytes=limit, memory__usage_in_bytes=usage)


@pytest.mark.parametrize("pin", ["none", "auto"])
def test_populate_past_the_cgroup_limit_is_refused_and_nothing_is_mapped(
    host: FakeHost, monkeypatch: pytest.MonkeyPatch, pin: str
) -> None:
    job = v1_job(host, 64 * MiB, 32 * MiB)
    host.install(monkeypatch)
    before = live_mappings()
    with pytest.raises(errors.MemoryLimitError) as info:
        allocate_host(64 * MiB, pin=pin)
    assert live_mappings() == before
    text = str(info.value)
    assert "memory cgroup /job (v1) is 64 MiB with 32 MiB in use: 32 MiB left" in text
    assert str(job / "memory.limit_in_bytes") in text
    assert "raise the cgroup's limit" in text


def test_a_mapping_that_fits_is_made(host: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    v1_job(host, 256 * MiB, 32 * MiB)
    host.install(monkeypatch)
    with allocate_host(64 * MiB, pin="none") as buf:
        assert buf.committed_bytes == buf.mapped_size
    # The reserve is part of the room asked for: 64 MiB + page tables + 16 MiB.
    v1_job(host, 64 * MiB + 16 * MiB + 128 * 1024 - 1, 0)
    host.install(monkeypatch)
    with pytest.raises(errors.MemoryLimitError):
        allocate_host(64 * MiB, pin="none")


def test_reserving_is_not_checked_but_each_commit_is(
    host: FakeHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = v1_job(host, 64 * MiB, 40 * MiB)  # 24 MiB left
    host.install(monkeypatch)
    with allocate_host(64 * MiB, pin="none", populate=False) as buf:
        assert buf.committed_bytes == 0
        buf.commit(0, 4 * MiB)  # 4 MiB + tables + 16 MiB fit in 24
        with pytest.raises(errors.MemoryLimitError, match=r"committing 8 MiB at offset 4194304"):
            buf.commit(4 * MiB, 8 * MiB)
        assert buf.committed_bytes == 4 * MiB  # the refused range was not touched
        (job / "memory.usage_in_bytes").write_text(str(0))
        buf.commit(4 * MiB, 8 * MiB)  # room again: the same range commits
        assert buf.committed_bytes == 12 * MiB


def test_host_ram_is_checked_too(host: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    host.meminfo = "MemTotal: 16777216 kB\nMemAvailable: 32768 kB\n"  # 32 MiB available
    host.install(monkeypatch)
    with pytest.raises(errors.MemoryLimitError, match=r"host's available RAM is 16 GiB"):
        allocate_host(64 * MiB, pin="none")


def test_explicit_mlock_is_checked_against_memlock_auto_falls_back(
    host: FakeHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    host.memlock = 1 * MiB
    host.status = NO_CAPS
    host.install(monkeypatch)
    before = live_mappings()
    with pytest.raises(errors.MemlockLimitError, match="memlock limit is 1 MiB") as info:
        allocate_host(8 * MiB, pin="mlock")
    assert isinstance(info.value, errors.FeatureUnavailableError)
    assert live_mappings() == before
    # pin="auto" takes no risk with the memlock limit (unpinned when refused): not refused.
    with allocate_host(8 * MiB, pin="auto") as buf:
        assert buf.committed_bytes == buf.mapped_size


@pytest.mark.hugepages
def test_hugetlb_pages_are_not_charged_to_a_v1_memory_cgroup(
    hugepages: int, host: FakeHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    v1_job(host, 8 * MiB, 0)  # less than the pool below
    host.install(monkeypatch)
    with allocate_host(16 * MiB, pin="none", hugepages="required") as buf:
        assert buf.kind == "hugetlb"
    with pytest.raises(errors.MemoryLimitError):
        allocate_host(16 * MiB, pin="none", hugepages="never")


@pytest.mark.hugepages
def test_hugetlb_cgroup_refuses_required_and_auto_falls_back(
    hugepages: int,
    host: FakeHost,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    hug = host.v1("hugetlb", cgroup="/job")
    level(hug / "job", hugetlb__2MB__limit_in_bytes=8 * MiB, hugetlb__2MB__usage_in_bytes=0)
    host.install(monkeypatch)
    with pytest.raises(errors.MemoryLimitError, match=r"hugetlb cgroup /job \(v1, 2 MiB pages\)"):
        allocate_host(16 * MiB, pin="none", hugepages="required")
    with caplog.at_level(logging.WARNING, logger="kvpool.native.buffer"):
        buf = allocate_host(16 * MiB, pin="none", hugepages="auto")
    with buf:
        assert buf.kind == "anonymous"
        assert buf.hugepages != "hugetlb-2MiB"
    assert any("uses 4 KiB pages instead" in r.getMessage() for r in caplog.records)
    with allocate_host(4 * MiB, pin="none", hugepages="auto") as small:
        assert small.kind == "hugetlb"  # within the hugetlb limit


def test_info_reports_the_memory_cgroup(host: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    job = v1_job(host, GiB, 256 * MiB)
    host.install(monkeypatch)
    caps = capabilities()
    assert caps.memory_cgroup is not None
    assert caps.to_dict()["memory_cgroup"]["limit"] == GiB
    line = f"memory cgroup        1 GiB limit, 256 MiB in use, 768 MiB left ({job}"
    assert line in caps.report()
    none = dataclasses.replace(caps, memory_cgroup=None)
    assert "memory cgroup        no memory cgroup limit" in none.report()
    assert limits.cgroup_memory() == caps.memory_cgroup
