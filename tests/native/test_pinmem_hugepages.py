"""2 MiB hugetlb pages: for real when the pool can be reserved, and the short-pool message."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvpool import errors, native
from kvpool.native.buffer import allocate_host
from kvpool.native.machine import read_hugepage_info

MIB = 1 << 20


def pool_or_skip() -> tuple[int, int]:
    try:
        return native.hugepages_2m()
    except errors.NativeError as exc:
        pytest.skip(f"no 2 MiB hugepage pool: {exc}")


@pytest.mark.hugepages
def test_required_gets_hugetlb_pages_rounded_up(hugepages: int, smaps) -> None:
    size = 5 * MIB + 1
    with allocate_host(size, pin="none", hugepages="required") as buf:
        assert buf.kind == "hugetlb"
        assert buf.hugepages == "hugetlb-2MiB"
        assert buf.size == size
        assert buf.mapped_size == 6 * MIB
        assert buf.address % (2 * MIB) == 0
        fields = smaps.fields(buf.address, buf.mapped_size)
        assert fields["KernelPageSize"] == 2 * MIB
        assert fields["Rss"] == 6 * MIB or fields.get("Private_Hugetlb", 0) == 6 * MIB
        view = buf.memoryview()
        view[size - 1] = 0x5A
        assert view[size - 1] == 0x5A
        del view


@pytest.mark.hugepages
def test_populated_hugetlb_pages_leave_the_free_pool(hugepages: int) -> None:
    _, before = native.hugepages_2m()
    with allocate_host(8 * MIB, pin="none", hugepages="auto") as buf:
        assert buf.kind == "hugetlb"
        _, during = native.hugepages_2m()
        assert before - during == 4
    _, after = native.hugepages_2m()
    assert after == before


@pytest.mark.hugepages
def test_hugetlb_with_mlock_and_numa(hugepages: int) -> None:
    node = native.numa_nodes()[0]
    try:
        buf = allocate_host(4 * MIB, pin="mlock", hugepages="required", numa_node=node)
    except errors.FeatureUnavailableError as exc:
        pytest.skip(f"mlock is not allowed here: {exc}")
    with buf:
        assert buf.kind == "hugetlb"
        assert buf.pinned == "mlock"
        assert buf.numa_node == node


def test_pool_too_small_says_how_many_and_how_to_grow() -> None:
    total, available = pool_or_skip()
    need = available + 3
    with pytest.raises(errors.HugePagesExhaustedError) as info:
        allocate_host(need * 2 * MIB, pin="none", hugepages="required", populate=False)
    message = str(info.value)
    assert isinstance(info.value, MemoryError)
    assert f"needs {need} hugepages of 2 MiB" in message
    assert f"{available} free of {total}" in message
    grow = re.search(r"echo (\d+) \| sudo tee /proc/sys/vm/nr_hugepages", message)
    assert grow is not None, message
    assert int(grow.group(1)) == total + 3


def test_pool_too_small_on_a_node_names_the_node_path() -> None:
    pool_or_skip()
    node = native.numa_nodes()[0]
    _, available = native.hugepages_2m(node)
    with pytest.raises(errors.HugePagesExhaustedError) as info:
        allocate_host(
            (available + 1) * 2 * MIB,
            pin="none",
            hugepages="required",
            numa_node=node,
            populate=False,
        )
    assert f"/sys/devices/system/node/node{node}/hugepages/hugepages-2048kB/nr_hugepages" in str(
        info.value
    )


def test_auto_never_fails_for_lack_of_pages(options) -> None:
    _, available = pool_or_skip()
    size = (available + 2) * 2 * MIB
    with allocate_host(size, pin="none", hugepages="auto", populate=False) as buf:
        assert buf.kind == "anonymous"
        assert buf.hugepages == "none"
    native.option_set("auto_fallback_thp", 1)
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    thp_on = thp.exists() and "[never]" not in thp.read_text()
    with allocate_host(size, pin="none", hugepages="auto", populate=False) as buf:
        assert buf.kind == "anonymous"
        assert buf.hugepages == ("thp" if thp_on else "none")


def test_read_hugepage_info_matches_sysfs() -> None:
    info = read_hugepage_info()
    total, _ = pool_or_skip()
    assert info is not None
    assert info[0] == total
    assert info[2] == 2


def test_read_hugepage_info_unavailable(tmp_path) -> None:
    assert read_hugepage_info(tmp_path / "missing") is None
    (tmp_path / "nr_hugepages").write_text("12\n")
    (tmp_path / "free_hugepages").write_text("5\n")
    assert read_hugepage_info(tmp_path) == (12, 5, 2)
    (tmp_path / "free_hugepages").write_text("garbage\n")
    assert read_hugepage_info(tmp_path) is None
