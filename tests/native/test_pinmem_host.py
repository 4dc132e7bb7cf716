"""Each kind of host memory: allocated, written, read back, freed."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool import errors, native
from kvpool.native.buffer import HostBuffer, allocate_host, live_mappings

PAGE = mmap.PAGESIZE
MIB = 1 << 20


def roundtrip(buf: HostBuffer) -> None:
    """Write a pattern through a memoryview and read it back through a tensor."""
    view = buf.memoryview()
    pattern = os.urandom(4096)
    for offset in (0, buf.size // 2, buf.size - len(pattern)):
        view[offset : offset + len(pattern)] = pattern
    t = buf.tensor()
    assert t.numel() == buf.size
    assert bytes(t[buf.size - 4096 :].numpy()) == pattern
    assert bytes(view[:4096]) == pattern
    t[7] = 201
    assert view[7] == 201


def test_anonymous_unpinned(smaps) -> None:
    before = live_mappings()
    buf = allocate_host(24 * MIB + 5, pin="none")
    assert buf.kind == "anonymous"
    assert buf.pinned == "none"
    assert buf.hugepages == "none"
    assert buf.size == 24 * MIB + 5
    assert buf.mapped_size == 24 * MIB + PAGE
    assert buf.address % PAGE == 0
    assert live_mappings()[0] == before[0] + 1
    roundtrip(buf)
    buf.close()
    assert buf.unmapped
    assert not smaps.mapped(buf.address)
    assert live_mappings() == before


def test_mlock_pinned_is_locked(smaps) -> None:
    try:
        buf = allocate_host(16 * MIB, pin="mlock")
    except errors.FeatureUnavailableError as exc:
        pytest.skip(f"mlock is not allowed here: {exc}")
    try:
        assert buf.pinned == "mlock"
        fields = smaps.fields(buf.address, buf.mapped_size)
        assert fields["Locked"] == buf.mapped_size
        assert fields["Rss"] == buf.mapped_size
        roundtrip(buf)
    finally:
        buf.close()


def test_auto_without_cuda_is_mlock_or_none(smaps) -> None:
    with allocate_host(8 * MIB) as buf:
        assert buf.pinned in ("mlock", "none")
        locked = smaps.fields(buf.address, buf.mapped_size).get("Locked", 0)
        assert locked == (buf.mapped_size if buf.pinned == "mlock" else 0)
    assert buf.closed and buf.unmapped


def test_thp(smaps) -> None:
    with allocate_host(8 * MIB, pin="none", hugepages="thp") as buf:
        assert buf.address % (2 * MIB) == 0
        path = Path("/sys/kernel/mm/transparent_hugepage/enabled")
        mode = path.read_text() if path.exists() else "[never]"
        assert buf.hugepages == ("none" if "[never]" in mode else "thp")
        roundtrip(buf)


def test_shm_kind() -> None:
    name = f"/kvpool-test-kind-{os.getpid()}"
    with allocate_host(3 * MIB + 1, pin="none", shm_name=name) as buf:
        assert buf.kind == "shm"
        assert buf.shm_owner is True
        assert buf.shm_name == name
        assert os.path.exists(f"/dev/shm{name}")
        roundtrip(buf)
    assert not os.path.exists(f"/dev/shm{name}")


@pytest.mark.hugepages
def test_hugetlb_kind(hugepages: int, smaps) -> None:
    with allocate_host(3 * MIB, pin="none", hugepages="required") as buf:
        assert buf.kind == "hugetlb"
        assert buf.hugepages == "hugetlb-2MiB"
        assert buf.mapped_size == 4 * MIB
        assert buf.page_size == 2 * MIB
        fields = smaps.fields(buf.address, buf.mapped_size)
        assert fields["KernelPageSize"] == 2 * MIB
        roundtrip(buf)


def test_cuda_host_kind_with_fake_runtime(fake_cudart) -> None:
    native.cuda_reload(str(fake_cudart))
    before = live_mappings()
    with allocate_host(5 * MIB) as buf:
        assert buf.kind == "cuda-host"
        assert buf.pinned == "cuda-alloc"
        assert buf.populate_method == "driver"
        roundtrip(buf)
    assert live_mappings() == before


def test_unpopulated_is_not_resident(smaps) -> None:
    with allocate_host(16 * MIB, pin="none", populate=False) as buf:
        assert buf.populate_method == "none"
        assert native.resident_bytes(buf.address, buf.mapped_size) == 0
        buf.memoryview()[0] = 1
        assert native.resident_bytes(buf.address, buf.mapped_size) > 0


def test_tensor_is_zero_copy_uint8() -> None:
    with allocate_host(MIB, pin="none") as buf:
        t = buf.tensor()
        assert t.dtype == torch.uint8
        assert t.shape == (MIB,)
        assert t.data_ptr() == buf.address
        mv = buf.memoryview()
        assert mv.format == "B" and mv.ndim == 1 and not mv.readonly and mv.nbytes == MIB
        del t, mv


def test_repr_and_len() -> None:
    with allocate_host(MIB, pin="none") as buf:
        assert len(buf) == MIB
        assert "open" in repr(buf) and "anonymous" in repr(buf)
    assert "closed" in repr(buf)


@settings(max_examples=25, deadline=None)
@given(size=st.integers(min_value=1, max_value=6 * MIB))
def test_sizes_round_to_pages(size: int) -> None:
    with allocate_host(size, pin="none", populate=False) as buf:
        assert buf.size == size
        assert buf.mapped_size % PAGE == 0
        assert size <= buf.mapped_size < size + PAGE
        view = buf.memoryview()
        assert view.nbytes == size
        view[size - 1] = 0xAB
        assert view[size - 1] == 0xAB
        del view
