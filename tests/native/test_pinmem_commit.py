"""Incremental commit of a reserved mapping (``pinmem_commit`` / ``HostBuffer.commit``).

A lazily growing pool reserves its range once and commits it in steps
while the committed part is in use; these tests check residency and
pinning after each step, typed errors, the fake-CUDA register path
(chunks, rollback, unregister at close) and a commit running in a thread
while the main thread uses the committed part.
"""

from __future__ import annotations

import ctypes
import threading
import time
from pathlib import Path

import pytest

from kvpool import errors, native
from kvpool.native.buffer import HostBuffer, allocate_host, attach_shm, live_mappings

MIB = 1 << 20


def reserve(size: int, **kwargs: object) -> HostBuffer:
    """A reservation: mapped, nothing resident, nothing pinned."""
    return allocate_host(size, pin="none", populate=False, **kwargs)


def resident(buf: HostBuffer, offset: int = 0, length: int | None = None) -> int:
    """Bytes of the buffer (or of a range of it) resident in RAM."""
    size = buf.mapped_size - offset if length is None else length
    return native.resident_bytes(buf.address + offset, size)


# ---------------------------------------------------------------- steps


def test_reservation_committed_in_steps(smaps) -> None:
    step, size = 32 * MIB, 256 * MIB
    with reserve(size) as buf:
        address = buf.address
        assert (buf.committed_bytes, buf.pinned_bytes, buf.pinned) == (0, 0, "none")
        assert resident(buf) == 0
        how = None
        for i in range(size // step):
            how = buf.commit(i * step, step)
            # CUDA is off in these tests: auto means mlock where allowed.
            assert how in ("mlock", "none")
            done = (i + 1) * step
            assert resident(buf, i * step, step) == step
            assert resident(buf) == done
            assert buf.committed_bytes == done
            assert buf.pinned_bytes == (done if how == "mlock" else 0)
            if how == "mlock":
                assert smaps.fields(buf.address, buf.mapped_size).get("Locked", 0) == done
            # pinned speaks for the whole buffer: only when all of it is.
            assert buf.pinned == (how if done == size else "none")
            assert buf.address == address
            assert buf.populate_method in ("madvise", "first-touch")
        region = native.query(buf.address)
        assert region.committed_bytes == size
        assert region.pinned == how


def test_commit_keeps_what_was_written_before() -> None:
    with reserve(8 * MIB) as buf:
        view = buf.memoryview()
        view[5 * MIB : 5 * MIB + 5] = b"hello"
        assert buf.commit(4 * MIB, 4 * MIB, pin="none") == "none"
        assert bytes(view[5 * MIB : 5 * MIB + 5]) == b"hello"
        del view


def test_shared_memory_commit_keeps_the_other_side_s_data(options) -> None:
    # Without MADV_POPULATE_WRITE the commit touches each page itself.
    native.option_set("use_populate_write", 0)
    name = "/kvpool-test-commit-shm"
    with reserve(4 * MIB, shm_name=name, shm_reuse=True) as owner:
        with attach_shm(name, pin="none") as other:
            other.memoryview()[3 * MIB : 3 * MIB + 6] = b"shared"
            assert other.commit(0, 4 * MIB, pin="none") == "none"
            assert other.populate_method == "first-touch"
        assert owner.commit(0, 4 * MIB, pin="none") == "none"
        assert bytes(owner.memoryview()[3 * MIB : 3 * MIB + 6]) == b"shared"
        assert resident(owner) == 4 * MIB


def test_mlock_step_reports_mlock_or_raises(smaps, options, faults) -> None:
    with reserve(8 * MIB) as buf:
        try:
            how = buf.commit(0, 4 * MIB, pin="mlock")
        except errors.FeatureUnavailableError as exc:
            pytest.skip(f"mlock is not allowed here: {exc}")
        assert how == "mlock"
        assert smaps.fields(buf.address, buf.mapped_size)["Locked"] == 4 * MIB
        faults.set("mlock_eperm")
        with pytest.raises(errors.FeatureUnavailableError, match="memlock limit"):
            buf.commit(4 * MIB, 4 * MIB, pin="mlock")
        assert buf.committed_bytes == 4 * MIB
        assert buf.commit(4 * MIB, 4 * MIB) == "none"  # auto degrades
        assert (buf.committed_bytes, buf.pinned_bytes, buf.pinned) == (8 * MIB, 4 * MIB, "none")


@pytest.mark.hugepages
def test_hugetlb_commits_in_2mib_steps(hugepages: int) -> None:
    with reserve(8 * MIB, hugepages="required") as buf:
        assert buf.kind == "hugetlb" and buf.page_size == 2 * MIB
        with pytest.raises(errors.InvalidArgumentError, match="2 MiB hugetlb"):
            buf.commit(MIB, 2 * MIB)
        for offset in range(0, 8 * MIB, 2 * MIB):
            buf.commit(offset, 2 * MIB, pin="none")
            assert resident(buf) == offset + 2 * MIB
        assert buf.committed_bytes == 8 * MIB


# ---------------------------------------------------------------- errors


def test_bad_input_raises_typed_errors() -> None:
    with reserve(16 * MIB) as buf:
        with pytest.raises(errors.InvalidArgumentError, match="page size 4096") as info:
            buf.commit(100, 4096)
        assert isinstance(info.value, ValueError)
        with pytest.raises(errors.InvalidArgumentError, match="length must be"):
            buf.commit(0, 0)
        with pytest.raises(errors.InvalidArgumentError, match="offset must be"):
            buf.commit(-4096, 4096)
        with pytest.raises(errors.InvalidArgumentError, match="must be an int"):
            buf.commit(0.0, 4096)  # type: ignore[arg-type]
        with pytest.raises(errors.InvalidArgumentError, match="must be an int"):
            buf.commit(True, 4096)  # type: ignore[arg-type]
        with pytest.raises(errors.InvalidArgumentError, match=r"mapped size is 16\.00 MiB"):
            buf.commit(12 * MIB, 8 * MIB)
        with pytest.raises(errors.InvalidArgumentError, match="cuda-register"):
            buf.commit(0, 4096, pin="cuda-alloc")
        with pytest.raises(errors.InvalidArgumentError, match="pin must be one of"):
            buf.commit(0, 4096, pin="pinned")
        with pytest.raises(errors.InvalidArgumentError, match="threads must be"):
            buf.commit(0, 4096, threads=0)
        with pytest.raises(errors.FeatureUnavailableError, match="needs CUDA"):
            buf.commit(0, 4096, pin="cuda-register")
        assert buf.committed_bytes == 0 and resident(buf) == 0
        buf.commit(0, 4 * MIB, pin="none")
        with pytest.raises(errors.InvalidArgumentError, match="committed before"):
            buf.commit(2 * MIB, 4 * MIB, pin="none")
        assert buf.committed_bytes == 4 * MIB
    with allocate_host(4 * MIB, pin="none") as populated:
        assert populated.committed_bytes == populated.mapped_size
        with pytest.raises(errors.InvalidArgumentError, match="committed whole"):
            populated.commit(0, 4096)


def test_unknown_address_is_an_invalid_handle() -> None:
    buf = reserve(4 * MIB)
    address = buf.address
    with pytest.raises(errors.InvalidHandleError, match="inside the mapping"):
        native.commit(address + 4096, 0, 4096)
    buf.close()
    assert buf.unmapped
    with pytest.raises(errors.InvalidHandleError, match="not a live mapping"):
        native.commit(address, 0, 4096)


def test_commit_after_close_raises() -> None:
    buf = reserve(4 * MIB)
    view = buf.memoryview()  # keeps the memory, not the buffer, open
    buf.close()
    with pytest.raises(errors.PoolClosedError, match="closed"):
        buf.commit(0, 4096)
    assert not buf.unmapped
    del view
    assert buf.unmapped


# ------------------------------------------------------------ fake CUDA


class FakeCuda:
    """The fake runtime's books (libpinmem/tests/fake_cudart.c) via ctypes."""

    def __init__(self, path: Path) -> None:
        self.lib = ctypes.CDLL(str(path))
        self.lib.fake_cuda_is_registered.argtypes = [ctypes.c_void_p, ctypes.c_size_t]

    def reset(self) -> None:
        self.lib.fake_cuda_reset()

    def stats(self) -> dict[str, int]:
        values = [ctypes.c_int() for _ in range(4)]
        largest = ctypes.c_size_t()
        self.lib.fake_cuda_stats(*(ctypes.byref(v) for v in values), ctypes.byref(largest))
        names = ("live_registrations", "live_allocations", "registers", "unregisters")
        books = {n: v.value for n, v in zip(names, values, strict=True)}
        return {**books, "largest": largest.value}

    def registered(self, address: int, size: int) -> bool:
        return bool(self.lib.fake_cuda_is_registered(address, size))


@pytest.fixture
def fake(fake_cudart: Path, options, monkeypatch) -> FakeCuda:
    for name in ("FAIL_REGISTER_N", "MAX_REGISTER_BYTES", "DEVICES", "REGISTER_DELAY_MS"):
        monkeypatch.delenv(f"KVPOOL_FAKE_CUDA_{name}", raising=False)
    native.cuda_reload(str(fake_cudart))
    books = FakeCuda(fake_cudart)
    books.reset()
    return books


def test_fake_cuda_register_steps_rollback_and_unregister(fake, monkeypatch) -> None:
    native.option_set("register_chunk", 4 * MIB)
    buf = reserve(32 * MIB)
    assert buf.commit(0, 12 * MIB, pin="cuda-register") == "cuda-register"
    assert buf.commit(12 * MIB, 8 * MIB) == "cuda-register"  # auto prefers CUDA
    assert fake.stats()["live_registrations"] == 5
    assert fake.stats()["largest"] == 4 * MIB
    assert fake.registered(buf.address + 12 * MIB, 4 * MIB)
    assert buf.register_chunks == 5
    assert (buf.committed_bytes, buf.pinned_bytes, buf.pinned) == (20 * MIB, 20 * MIB, "none")
    with pytest.raises(errors.NativeError, match="CUDA-pinned"):
        native.cuda_reload("")

    # The 2nd chunk of the next commit fails: its 1st is rolled back, the
    # earlier commits stay registered, and the range can be retried.
    fake.reset()
    monkeypatch.setenv("KVPOOL_FAKE_CUDA_FAIL_REGISTER_N", "2")
    with pytest.raises(errors.OutOfMemoryError, match="chunk 2 of 3") as info:
        buf.commit(20 * MIB, 12 * MIB)
    assert "unregistered 1 of the 1" in str(info.value)
    monkeypatch.delenv("KVPOOL_FAKE_CUDA_FAIL_REGISTER_N")
    books = fake.stats()
    assert (books["registers"], books["unregisters"], books["live_registrations"]) == (2, 1, 5)
    assert buf.committed_bytes == 20 * MIB and buf.register_chunks == 5
    assert buf.commit(20 * MIB, 12 * MIB) == "cuda-register"
    assert (buf.pinned, buf.pinned_bytes, buf.register_chunks) == ("cuda-register", 32 * MIB, 8)

    fake.reset()
    buf.close()
    books = fake.stats()
    assert books["live_registrations"] == 0
    assert books["unregisters"] == 8  # every chunk of every commit, once


def test_close_during_a_commit_frees_after_it(fake, monkeypatch) -> None:
    native.option_set("register_chunk", 16 * MIB)
    monkeypatch.setenv("KVPOOL_FAKE_CUDA_REGISTER_DELAY_MS", "300")
    buf = reserve(16 * MIB)
    before = live_mappings()[0]
    result: list[str] = []
    worker = threading.Thread(target=lambda: result.append(buf.commit(0, 16 * MIB)))
    worker.start()
    deadline = time.monotonic() + 10
    while fake.stats()["registers"] == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    buf.close()  # the commit holds the mapping; it is freed when the commit ends
    assert not buf.unmapped or not worker.is_alive()
    worker.join()
    assert result == ["cuda-register"]
    assert buf.unmapped
    assert live_mappings()[0] == before - 1
    books = fake.stats()
    assert books["live_registrations"] == 0
    assert books["unregisters"] == 1


# --------------------------------------------------------------- threads


def test_thread_commits_while_main_uses_the_committed_part() -> None:
    step, size = 16 * MIB, 128 * MIB
    with reserve(size) as buf:
        buf.commit(0, step, pin="none")
        view = buf.memoryview()
        errors_seen: list[BaseException] = []

        def grow() -> None:
            try:
                for offset in range(step, size, step):
                    buf.commit(offset, step, pin="auto", threads=1)
            except BaseException as exc:  # reported by the main thread
                errors_seen.append(exc)

        worker = threading.Thread(target=grow)
        worker.start()
        written: dict[int, bytes] = {}
        limits: set[int] = set()
        rounds = 0
        while worker.is_alive() or rounds < 50:
            # Only what is committed now is used, as the pool would do.
            limit = buf.committed_bytes
            limits.add(limit)
            # 64-byte slots: two writes hit the same bytes or none of them.
            offset = (rounds * 1_048_573) % (limit - 64) // 64 * 64
            data = rounds.to_bytes(8, "little") * 8
            view[offset : offset + 64] = data
            assert bytes(view[offset : offset + 64]) == data
            written[offset] = data
            rounds += 1
        worker.join()
        assert not errors_seen, errors_seen
        assert min(limits) < size  # the main thread worked while the pool grew
        assert buf.committed_bytes == size
        assert resident(buf) == size
        for offset, data in written.items():
            assert bytes(view[offset : offset + 64]) == data
        del view


def test_same_range_from_two_threads_commits_once() -> None:
    with reserve(32 * MIB) as buf:
        barrier = threading.Barrier(2)
        outcomes: list[str] = []

        def attempt() -> None:
            barrier.wait()
            try:
                outcomes.append(buf.commit(0, 32 * MIB, pin="none"))
            except (errors.InvalidArgumentError, errors.NativeError) as exc:
                outcomes.append(type(exc).__name__)

        threads = [threading.Thread(target=attempt) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(outcomes)[0] in ("InvalidArgumentError", "NativeError")
        assert "none" in outcomes
        assert buf.committed_bytes == 32 * MIB
