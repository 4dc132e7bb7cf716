"""The effective memory limit (kvpool.native.limits), with the platform faked.

Each test builds directory trees that look like cgroup v1 and v2 file
systems (nested levels), a /proc/self/cgroup, a mountinfo, a meminfo and a
/proc/self/status, and points :class:`~kvpool.native.limits.Platform` at them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from fake_cgroups import CAP_IPC_LOCK, NO_CAPS, V1_UNLIMITED, FakeHost, level

from kvpool import errors
from kvpool.native import limits

GiB, MiB, KiB = 1 << 30, 1 << 20, 1 << 10


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path)


# -- cgroup v1 --------------------------------------------------------------


def test_v1_nested_the_tightest_level_wins(host: FakeHost) -> None:
    point = host.v1(cgroup="/outer/inner")
    level(point, memory__limit_in_bytes=V1_UNLIMITED, memory__usage_in_bytes=5 * GiB)
    outer = level(point / "outer", memory__limit_in_bytes=GiB, memory__usage_in_bytes=900 * MiB)
    level(point / "outer/inner", memory__limit_in_bytes=2 * GiB, memory__usage_in_bytes=100 * MiB)
    room = limits.headroom(platform=host.platform())
    binding = room.binding
    assert binding is not None
    # The parent's 1 GiB binds although the child allows 2 GiB: its usage
    # counts the child's too, so 124 MiB are left.
    assert binding.name == "memory cgroup /outer (v1)"
    assert binding.kind == "memory-cgroup"
    assert binding.available == 124 * MiB
    assert binding.source == str(outer / "memory.limit_in_bytes")
    assert [lim.name for lim in room.limits] == [
        "memory cgroup /outer (v1)",
        "memory cgroup /outer/inner (v1)",
        "host's available RAM",
    ]
    assert room.fits(124 * MiB)
    assert not room.fits(124 * MiB + 1)


def test_v1_refusal_names_the_limit_its_file_and_the_fix(host: FakeHost) -> None:
    point = host.v1(cgroup="/job")
    job = level(point / "job", memory__limit_in_bytes=GiB, memory__usage_in_bytes=256 * MiB)
    room = limits.headroom(platform=host.platform())
    with pytest.raises(errors.MemoryLimitError) as info:
        room.check(2 * GiB, "a 2 GiB pool")
    assert isinstance(info.value, MemoryError)
    assert not isinstance(info.value, errors.MemlockLimitError)
    text = str(info.value)
    assert "a 2 GiB pool needs 2 GiB" in text
    assert "memory cgroup /job (v1) is 1 GiB with 256 MiB in use: 768 MiB left" in text
    assert str(job / "memory.limit_in_bytes") in text
    assert f"echo <bytes> > {job}/memory.limit_in_bytes" in text
    assert "smaller pool" in text


def test_v1_unlimited_everywhere_is_no_cgroup_limit(host: FakeHost) -> None:
    point = host.v1(cgroup="/a")
    level(point, memory__limit_in_bytes=V1_UNLIMITED, memory__usage_in_bytes=GiB)
    level(point / "a", memory__limit_in_bytes=V1_UNLIMITED, memory__usage_in_bytes=GiB)
    platform = host.platform()
    assert limits.cgroup_memory(platform) is None
    room = limits.headroom(platform=platform)
    assert [lim.name for lim in room.limits] == ["host's available RAM"]


def test_v1_inactive_page_cache_is_not_counted_as_use(host: FakeHost) -> None:
    point = host.v1(cgroup="/c")
    level(
        point / "c",
        memory__limit_in_bytes=GiB,
        memory__usage_in_bytes=GiB,  # full, but mostly reclaimable cache
        memory__stat=f"cache 800\ninactive_file 1\ntotal_inactive_file {700 * MiB}\n",
    )
    binding = limits.cgroup_memory(host.platform())
    assert binding is not None
    assert binding.used == GiB - 700 * MiB  # the hierarchical total_ figure
    assert binding.available == 700 * MiB


def test_v1_mount_of_a_subtree_without_a_cgroup_namespace(host: FakeHost) -> None:
    # Docker without a cgroup namespace: /proc/self/cgroup names /docker/abc
    # and the mount shows exactly that cgroup at its top.
    point = host.v1(cgroup="/docker/abc", mount_root="/docker/abc")
    level(point, memory__limit_in_bytes=512 * MiB, memory__usage_in_bytes=12 * MiB)
    binding = limits.cgroup_memory(host.platform())
    assert binding is not None
    assert binding.name == "memory cgroup /docker/abc (v1)"
    assert binding.source == str(point / "memory.limit_in_bytes")
    assert binding.available == 500 * MiB


def test_mount_point_with_escaped_space(host: FakeHost) -> None:
    point = host.root / "odd dir" / "memory"
    level(point / "j", memory__limit_in_bytes=GiB, memory__usage_in_bytes=0)
    escaped = str(point).replace(" ", "\\040")
    host.mounts.append(f"35 31 0:32 / {escaped} rw - cgroup cgroup rw,memory")
    host.memberships.append("4:memory:/j")
    binding = limits.cgroup_memory(host.platform())
    assert binding is not None
    assert binding.source == str(point / "j" / "memory.limit_in_bytes")


# -- cgroup v2 --------------------------------------------------------------


def test_v2_nested_with_max_and_working_set(host: FakeHost) -> None:
    point = host.v2(cgroup="/system.slice/job.scope")
    level(point)  # the v2 root has no memory.max
    level(point / "system.slice", memory__max="max", memory__current=3 * GiB)
    scope = level(
        point / "system.slice/job.scope",
        memory__max=GiB,
        memory__current=600 * MiB,
        memory__stat=f"anon {500 * MiB}\nfile {100 * MiB}\ninactive_file {88 * MiB}\n",
    )
    binding = limits.cgroup_memory(host.platform())
    assert binding is not None
    assert binding.name == "memory cgroup /system.slice/job.scope (v2)"
    assert binding.used == 512 * MiB
    assert binding.available == 512 * MiB
    assert binding.source == str(scope / "memory.max")
    assert f"echo <bytes> > {scope}/memory.max" in binding.fix


def test_v2_parent_limit_binds_a_child_without_one(host: FakeHost) -> None:
    point = host.v2(cgroup="/pod/ctr")
    level(point / "pod", memory__max=2 * GiB, memory__current=1900 * MiB)
    level(point / "pod/ctr", memory__max="max", memory__current=10 * MiB)
    room = limits.headroom(platform=host.platform())
    assert room.binding is not None
    assert room.binding.name == "memory cgroup /pod (v2)"
    assert room.available == 148 * MiB


def test_v1_and_v2_together_tightest_of_all(host: FakeHost) -> None:
    v1 = host.v1(cgroup="/x")
    level(v1 / "x", memory__limit_in_bytes=4 * GiB, memory__usage_in_bytes=0)
    v2 = host.v2(cgroup="/y")
    level(v2 / "y", memory__max=3 * GiB, memory__current=0)
    host.meminfo = "MemTotal: 16777216 kB\nMemAvailable: 2097152 kB\n"  # 2 GiB
    room = limits.headroom(platform=host.platform())
    assert [lim.available for lim in room.limits] == [2 * GiB, 3 * GiB, 4 * GiB]
    assert room.binding is not None
    assert room.binding.name == "host's available RAM"
    with pytest.raises(errors.MemoryLimitError, match=r"RAM.*MemAvailable"):
        room.check(3 * GiB, "a pool")


# -- host, memlock ----------------------------------------------------------


def test_host_memory_alone(host: FakeHost) -> None:
    room = limits.headroom(platform=host.platform())
    (only,) = room.limits
    assert only.limit == 16 * GiB
    assert only.kind == "host"
    assert only.available == 8 * GiB
    assert "MemAvailable" in only.source
    assert limits.host_ram(host.platform()) == 16 * GiB


def test_memlock_counts_what_is_locked_already(host: FakeHost) -> None:
    host.memlock = 64 * KiB
    host.status = NO_CAPS + "VmLck:\t      16 kB\n"
    platform = host.platform()
    assert all(
        lim.source != "RLIMIT_MEMLOCK (ulimit -l)"
        for lim in limits.headroom(platform=platform).limits
    )
    room = limits.headroom(memory=False, locking=True, platform=platform)
    (lock,) = room.limits
    assert (lock.limit, lock.used, lock.available) == (64 * KiB, 16 * KiB, 48 * KiB)
    assert lock.kind == "memlock"
    with pytest.raises(errors.MemlockLimitError) as info:
        room.check(64 * KiB, "locking 64 KiB")
    assert isinstance(info.value, errors.FeatureUnavailableError)  # what libpinmem raised
    assert isinstance(info.value, MemoryError)
    text = str(info.value)
    assert "memlock limit is 64 KiB with 16 KiB in use: 48 KiB left" in text
    assert "RLIMIT_MEMLOCK" in text and "ulimit -l" in text and "pin='none'" in text


def test_memlock_does_not_bind_with_cap_ipc_lock_or_unlimited(host: FakeHost) -> None:
    host.memlock = 64 * KiB
    host.status = CAP_IPC_LOCK
    assert limits.headroom(memory=False, locking=True, platform=host.platform()).limits == ()
    host.status = NO_CAPS
    host.memlock = None
    assert limits.headroom(memory=False, locking=True, platform=host.platform()).limits == ()


# -- hugetlb ----------------------------------------------------------------


def test_hugetlb_is_not_charged_to_the_memory_cgroup(host: FakeHost) -> None:
    mem = host.v1(cgroup="/j")
    level(mem / "j", memory__limit_in_bytes=64 * MiB, memory__usage_in_bytes=60 * MiB)
    host.meminfo = "MemTotal: 1048576 kB\nMemAvailable: 1024 kB\n"
    platform = host.platform()
    assert not limits.headroom(platform=platform).fits(GiB)
    # Neither the v1 memory cgroup nor MemAvailable counts hugetlb pages.
    assert limits.headroom(hugetlb=True, platform=platform).limits == ()


def test_hugetlb_cgroup_limits_hugetlb_pages(host: FakeHost) -> None:
    hug = host.v1("hugetlb", cgroup="/j")
    level(
        hug / "j",
        hugetlb__2MB__limit_in_bytes=32 * MiB,
        hugetlb__2MB__usage_in_bytes=8 * MiB,
    )
    room = limits.headroom(hugetlb=True, platform=host.platform())
    assert room.binding is not None
    assert room.binding.name == "hugetlb cgroup /j (v1, 2 MiB pages)"
    assert room.binding.kind == "hugetlb-cgroup"
    assert room.available == 24 * MiB
    with pytest.raises(errors.MemoryLimitError, match="hugepages='never'"):
        room.check(32 * MiB, "a hugetlb pool")


def test_v2_memory_hugetlb_accounting_charges_hugetlb(host: FakeHost) -> None:
    point = host.v2(cgroup="/j", options="rw,memory_hugetlb_accounting")
    level(point / "j", memory__max=GiB, memory__current=GiB - 8 * MiB)
    room = limits.headroom(hugetlb=True, platform=host.platform())
    assert room.binding is not None
    assert room.binding.name == "memory cgroup /j (v2)"
    host2 = FakeHost(host.root / "other")
    point2 = host2.v2(cgroup="/j")
    level(point2 / "j", memory__max=GiB, memory__current=GiB - 8 * MiB)
    assert limits.headroom(hugetlb=True, platform=host2.platform()).limits == ()


# -- what cannot be read is left out ------------------------------------------


def test_missing_and_garbled_files_are_left_out(host: FakeHost) -> None:
    point = host.v1(cgroup="/g/h")
    level(point / "g", memory__limit_in_bytes="garbage", memory__usage_in_bytes=1)
    level(point / "g/h")  # no files at all
    host.meminfo = "nothing useful\n"
    host.mounts.append("not a mountinfo line")
    host.memberships.append("nonsense")
    platform = host.platform()
    assert limits.headroom(locking=True, platform=platform).limits == ()
    gone = dataclasses.replace(platform, proc_cgroup=host.root / "absent", meminfo=host.root / "x")
    assert limits.headroom(platform=gone).limits == ()
    assert limits.headroom(platform=gone).fits(1 << 60)
    limits.headroom(platform=gone).check(1 << 60, "anything")  # nothing to refuse it


def test_the_real_machine_reads_without_error() -> None:
    room = limits.headroom(locking=True)
    assert all(lim.available <= lim.limit for lim in room.limits)
    assert any(lim.name == "host's available RAM" for lim in room.limits)
