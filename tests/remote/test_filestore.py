"""FileStore: file names, atomic writes, crashes, damaged files, durability."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import kvpool
from kvpool.errors import (
    ArgumentTypeError,
    CorruptEntryError,
    InvalidArgumentError,
    InvalidHandleError,
    RemoteStoreError,
)
from kvpool.remote import AsyncFileStore, FileStore, open_store
from kvpool.remote.header import FIXED_SIZE

from .conftest import KV_DTYPE, KV_FMT, KV_SHAPE, assert_clean, fill
from .hostile_server import bounded

KV_BYTES = KV_SHAPE.numel() * KV_DTYPE.itemsize


def _entry(store: FileStore, pool: kvpool.TensorMemoryAllocator, key: str = "k", seed: int = 1):
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    data = fill(src, seed)
    store.put(key, src)
    src.ref_count_down()
    return Path(store.path(key)), data


def _get_fails(
    store: FileStore, pool: kvpool.TensorMemoryAllocator, error: type, match: str | None
) -> None:
    """Both get paths raise ``error`` and leave the pool empty."""
    with pytest.raises(error, match=match):
        store.get("k", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    assert pool.stats().active_objects == 0 and pool.memcheck()
    with pytest.raises(error, match=match):
        store.get("k", pool)
    assert pool.stats().active_objects == 0 and pool.memcheck()


# -- names -------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "../escape",
        "/etc/passwd",
        ".",
        "..",
        "a/b/c",
        "\x00nul",
        "~user",
        ".hidden",
        "",
        "é",
        "x" * 300,
    ],
)
def test_keys_stay_inside_the_directory(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator, key: str
) -> None:
    directory = tmp_path / "store"
    with FileStore(directory) as store:
        path = Path(store.path(key))
        assert path.parent == directory
        assert path.name[0] in "kh" and "/" not in path.name and len(path.name) <= 201
        _, data = _entry(store, pool, key)
        assert sorted(os.listdir(tmp_path)) == ["store"]
        assert os.listdir(directory) == [path.name]
        got = store.get(key, pool)
        assert got is not None and bytes(got.byte_array) == data
        got.ref_count_down()


def test_distinct_keys_get_distinct_files(file_store: FileStore) -> None:
    keys = ["a", "A", "a/", "a%2F", "a%2f", b"a\xff", "a\udcff".encode("utf-8", "surrogatepass")]
    keys += ["y" * 250, "y" * 251]
    paths = {file_store.path(k) for k in keys}
    assert len(paths) == len(keys)


# -- atomicity ---------------------------------------------------------


def test_leftover_temp_file_is_invisible_and_cleaned(
    file_store: FileStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    path, data = _entry(file_store, pool)
    dead_pid = _dead_pid()
    stray = Path(file_store.directory) / f".tmp-{dead_pid}-0"
    stray.write_bytes(b"half a write")
    live = Path(file_store.directory) / f".tmp-{os.getpid()}-999999"
    live.write_bytes(b"ours, in flight")
    assert not file_store.exists(f".tmp-{dead_pid}-0")
    assert file_store.get(f".tmp-{dead_pid}-0", pool) is None
    assert file_store.cleanup_temp(min_age_s=3600) == 0  # too young
    assert file_store.cleanup_temp(min_age_s=0) == 1
    assert not stray.exists() and live.exists() and path.exists()
    live.unlink()
    got = file_store.get("k", pool)
    assert got is not None and bytes(got.byte_array) == data
    got.ref_count_down()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


_CRASHING_WRITER = textwrap.dedent(
    """
    import sys
    import torch, kvpool
    import kvpool.remote.file.store as filestore
    from kvpool import native

    store = filestore.FileStore(sys.argv[1])
    pool = kvpool.TensorMemoryAllocator(torch.empty(1 << 20, dtype=torch.uint8))
    obj = pool.allocate(torch.Size([2, 4, 16, 32]), torch.float16, kvpool.MemoryFormat.KV_2LTD)
    for fill in sys.argv[2:]:  # earlier puts (they leave a spare file to reuse)
        obj.byte_array[:] = bytes([int(fill)]) * obj.get_size()
        store.put("k", obj)
    obj.byte_array[:] = b"\\x5a" * obj.get_size()

    # The writer dies after its write, before its rename (libpinmem's test build).
    native.lib.pinmem_test_set_fault(native.lib.PINMEM_FAULT_ENTRY_DIE_BEFORE_RENAME, 1)
    store.put("k", obj)
    """
)


def test_writer_killed_before_rename_leaves_old_entry(
    file_store: FileStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    path, data = _entry(file_store, pool)
    proc = subprocess.run(
        [sys.executable, "-c", _CRASHING_WRITER, file_store.directory], capture_output=True
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    temps = [n for n in os.listdir(file_store.directory) if n.startswith(".tmp-")]
    assert len(temps) == 1
    # the temporary file holds the whole new entry, but nobody sees it
    assert os.path.getsize(Path(file_store.directory) / temps[0]) > KV_BYTES
    got = file_store.get("k", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    assert got is not None and bytes(got.byte_array) == data
    got.ref_count_down()
    # a store opened later removes it
    FileStore(file_store.directory, cleanup_temp_age_s=0).close()
    assert os.listdir(file_store.directory) == [path.name]


@pytest.mark.parametrize("reuse", [False, True])
def test_writer_killed_while_rewriting_a_reused_file(
    file_store: FileStore, pool: kvpool.TensorMemoryAllocator, reuse: bool
) -> None:
    # Three puts of "k" before the crash: the fourth rewrites the file the
    # second one replaced (kept as a spare).
    args = ["1", "2", "3"] if reuse else []
    proc = subprocess.run(
        [sys.executable, "-c", _CRASHING_WRITER, file_store.directory, *args],
        capture_output=True,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    got = file_store.get("k", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    if reuse:
        assert got is not None and bytes(got.byte_array) == b"\x03" * KV_BYTES
        got.ref_count_down()
    else:
        assert got is None
    FileStore(file_store.directory, cleanup_temp_age_s=0).close()
    assert os.listdir(file_store.directory) == ([Path(file_store.path("k")).name] if reuse else [])


def test_writer_killed_before_rename_leaves_no_entry(
    file_store: FileStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _CRASHING_WRITER, file_store.directory], capture_output=True
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    assert not file_store.exists("k")
    assert file_store.get("k", pool) is None
    assert file_store.head("k") is None


def test_failed_write_removes_its_temp_file(
    file_store: FileStore, pool: kvpool.TensorMemoryAllocator, faults: Any
) -> None:
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    faults.set("entry_enospc")  # the write system call fails with ENOSPC
    with pytest.raises(RemoteStoreError, match="No space left") as info:
        file_store.put("k", src)
    assert info.value.errno == 28
    assert os.listdir(file_store.directory) == []
    assert src.get_ref_count() == 1
    src.ref_count_down()


def test_failed_rewrite_of_a_spare_keeps_the_old_entry(
    file_store: FileStore, pool: kvpool.TensorMemoryAllocator, faults: Any
) -> None:
    _entry(file_store, pool)
    obj = _uniform(pool, 7)
    file_store.put("k", obj)  # the first entry's file is now a spare
    assert len(_spares(file_store)) == 1
    faults.set("entry_enospc")
    with pytest.raises(RemoteStoreError, match="No space left"):
        file_store.put("k", _uniform(pool, 8))
    faults.clear()
    assert _spares(file_store) == []  # the spare that failed is dropped
    got = file_store.get("k", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    assert got is not None and bytes(got.byte_array) == bytes([7]) * KV_BYTES
    got.ref_count_down()
    obj.ref_count_down()


def test_short_writes_and_reads_are_completed(
    file_store: FileStore, pool: kvpool.TensorMemoryAllocator, faults: Any
) -> None:
    faults.set("short_io")  # at most 1000 bytes per system call
    objs = [pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT) for _ in range(2)]
    for version in (3, 4):  # a new file, then a rewritten spare
        data = fill(objs[version - 3], version)
        file_store.put("k", objs[version - 3])
        got = file_store.get("k", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
        assert got is not None and bytes(got.byte_array) == data
        got.ref_count_down()
    pool.batched_free(objs)


# -- damaged files -----------------------------------------------------


@pytest.mark.parametrize("keep", [0, 1, FIXED_SIZE - 1, FIXED_SIZE, 127, 128, 129, 4096, -1])
def test_truncated_file(
    file_store: FileStore, pool: kvpool.TensorMemoryAllocator, keep: int
) -> None:
    path, _ = _entry(file_store, pool)
    size = path.stat().st_size
    os.truncate(path, keep if keep >= 0 else size + keep)
    _get_fails(file_store, pool, CorruptEntryError, "truncated")
    if keep >= FIXED_SIZE:
        with pytest.raises(CorruptEntryError):
            file_store.head("k")


def test_trailing_bytes(file_store: FileStore, pool: kvpool.TensorMemoryAllocator) -> None:
    path, _ = _entry(file_store, pool)
    with open(path, "ab") as f:
        f.write(b"!")
    _get_fails(file_store, pool, CorruptEntryError, "trailing")


@pytest.mark.parametrize(
    "offset", [0, 3, 4, 6, 8, 9, 12, 16, 20, 24, 28, 30, 32, 33, 35, 45, 72, 127]
)
def test_flipped_header_byte(
    file_store: FileStore, pool: kvpool.TensorMemoryAllocator, offset: int
) -> None:
    path, _ = _entry(file_store, pool)
    _flip(path, offset)
    _get_fails(file_store, pool, CorruptEntryError, None)
    with pytest.raises(CorruptEntryError):
        file_store.head("k")


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x10]))


@pytest.mark.parametrize("offset", [0, 1, KV_BYTES // 2, KV_BYTES - 1])
def test_flipped_payload_byte_with_checksum(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator, offset: int
) -> None:
    with FileStore(tmp_path / "s", checksum=True) as store:
        path, _ = _entry(store, pool)
        info = store.head("k")
        assert info is not None and info.payload_crc is not None
        _flip(path, info.header_size + offset)
        _get_fails(store, pool, CorruptEntryError, "CRC")


def test_flipped_payload_byte_without_checksum_is_not_detected(
    file_store: FileStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    # Documented: without checksum=True only the header and the length are checked.
    path, data = _entry(file_store, pool)
    info = file_store.head("k")
    assert info is not None and info.payload_crc is None
    _flip(path, info.header_size + 5)
    got = file_store.get("k", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    assert got is not None and bytes(got.byte_array) != data
    got.ref_count_down()


def test_checksum_entries_read_by_a_store_without_checksum(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator
) -> None:
    with FileStore(tmp_path / "s", checksum=True) as writer:
        path, _ = _entry(writer, pool)
    with FileStore(tmp_path / "s") as reader:
        _flip(path, reader.head("k").header_size)  # type: ignore[union-attr]
        _get_fails(reader, pool, CorruptEntryError, "CRC")  # the entry's CRC is checked


@pytest.mark.parametrize(
    "content",
    [b"", b"KVPS", b"hello world" * 100, b"KVPS\x02\x00" + bytes(200), b"\x00" * 8192],
)
def test_not_a_kvpool_file(
    file_store: FileStore, pool: kvpool.TensorMemoryAllocator, content: bytes
) -> None:
    Path(file_store.path("k")).write_bytes(content)
    _get_fails(file_store, pool, CorruptEntryError, None)
    with pytest.raises(CorruptEntryError):
        file_store.head("k")


def test_wrong_layout_size_is_an_argument_error(
    file_store: FileStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    _entry(file_store, pool)
    with pytest.raises(InvalidArgumentError, match=r"stored \[\(2, 4, 16, 32\) float16\]"):
        file_store.get("k", pool, torch.Size([2, 4, 16, 33]), KV_DTYPE, KV_FMT)
    assert pool.stats().active_objects == 0


def test_symlink_is_refused(
    file_store: FileStore, pool: kvpool.TensorMemoryAllocator, tmp_path: Path
) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"secret")
    os.symlink(target, file_store.path("k"))
    with pytest.raises(RemoteStoreError):
        file_store.get("k", pool)
    assert pool.stats().active_objects == 0


# -- hostile files -----------------------------------------------------
# Anything but a regular file with one link, owned by this user, at an
# entry's name is refused; at a spare's name it is discarded, never written.


def _spares(store: FileStore) -> list[Path]:
    return sorted(Path(store.directory).glob(".tmp-*"))


def _release_fifo(path: Path) -> None:
    """Let a reader stuck opening the FIFO go (the code before the fix blocked there)."""
    with contextlib.suppress(OSError):
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


def test_fifo_at_an_entry_does_not_hang(
    file_store: FileStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    fifo = Path(file_store.path("k"))
    os.mkfifo(fifo)
    try:
        for call in (
            lambda: file_store.get("k", pool, KV_SHAPE, KV_DTYPE, KV_FMT),
            lambda: file_store.get("k", pool),
            lambda: file_store.head("k"),
        ):
            with pytest.raises(CorruptEntryError, match="FIFO"):
                bounded(call, 10)
            assert pool.stats().active_objects == 0
    finally:
        _release_fifo(fifo)
    # put replaces it with a real entry
    _, data = _entry(file_store, pool)
    got = file_store.get("k", pool)
    assert got is not None and bytes(got.byte_array) == data
    got.ref_count_down()


def test_other_file_kinds_at_an_entry(
    file_store: FileStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    os.mkdir(file_store.path("d"))
    with pytest.raises(CorruptEntryError, match="directory"):
        bounded(lambda: file_store.get("d", pool))
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(file_store.path("s"))
        with pytest.raises(CorruptEntryError, match="not a regular file"):
            bounded(lambda: file_store.head("s"))


def test_hard_link_at_an_entry_is_neither_read_nor_overwritten(
    file_store: FileStore, pool: kvpool.TensorMemoryAllocator, tmp_path: Path
) -> None:
    # An outside file that even holds a valid entry, linked in under a key.
    path, _ = _entry(file_store, pool, "valid")
    outside = tmp_path / "outside"
    outside.write_bytes(path.read_bytes())
    precious = outside.read_bytes()
    os.link(outside, file_store.path("k"))
    with pytest.raises(CorruptEntryError, match="hard links"):
        bounded(lambda: file_store.get("k", pool))
    with pytest.raises(CorruptEntryError, match="hard links"):
        bounded(lambda: file_store.head("k"))
    # Replacing the entry swaps the link out as a spare; later puts must
    # discard it instead of rewriting it.
    for key in ("k", "other", "k", "third"):
        _entry(file_store, pool, key, seed=7)
        assert outside.read_bytes() == precious
    assert outside.stat().st_nlink == 1


def test_hard_link_or_fifo_planted_at_a_spare_is_discarded(
    file_store: FileStore, pool: kvpool.TensorMemoryAllocator, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"precious " * 1000)
    for plant in ("link", "fifo", "symlink"):
        _entry(file_store, pool, "k", seed=1)
        _entry(file_store, pool, "k", seed=2)  # the first file is now a spare
        (spare,) = _spares(file_store)
        spare.unlink()
        if plant == "link":
            os.link(outside, spare)
        elif plant == "fifo":
            os.mkfifo(spare)
        else:
            os.symlink(outside, spare)
        try:
            _, data = bounded(lambda: _entry(file_store, pool, "k", seed=3), 10)
        finally:
            if plant == "fifo":
                _release_fifo(spare)
        assert outside.read_bytes() == b"precious " * 1000
        got = file_store.get("k", pool)
        assert got is not None and bytes(got.byte_array) == data
        got.ref_count_down()
        assert plant == "link" or not spare.exists() or spare.is_file()
        file_store.delete("k")
        for leftover in _spares(file_store):
            leftover.unlink()


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")
def test_file_of_another_user_is_refused(
    file_store: FileStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    path, _ = _entry(file_store, pool)
    os.chown(path, 12345, -1)
    with pytest.raises(CorruptEntryError, match="owned by uid 12345"):
        bounded(lambda: file_store.get("k", pool))
    assert pool.stats().active_objects == 0


# -- the rest ----------------------------------------------------------


def test_durable_store(tmp_path: Path, pool: kvpool.TensorMemoryAllocator) -> None:
    with FileStore(tmp_path / "d", durable=True, io_threads=2) as store:
        objs = pool.batched_allocate(KV_SHAPE, KV_DTYPE, 4, KV_FMT)
        datas = [fill(o, i) for i, o in enumerate(objs)]  # type: ignore[union-attr]
        store.batched_put(["a", "b", "c", "d"], objs)  # type: ignore[arg-type]
        got = store.batched_get(["a", "b", "c", "d"], pool, KV_SHAPE, KV_DTYPE, KV_FMT)
        assert [bytes(g.byte_array) for g in got] == datas  # type: ignore[union-attr]
        pool.batched_free(objs + got)  # type: ignore[operator]


def test_threaded_batched_get_failure_frees_everything(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator
) -> None:
    with FileStore(tmp_path / "t", io_threads=2) as store:
        for i in range(6):
            _entry(store, pool, f"k{i}", i)
        os.truncate(store.path("k3"), 100)
        with pytest.raises(CorruptEntryError, match="truncated"):
            store.batched_get([f"k{i}" for i in range(6)], pool, KV_SHAPE, KV_DTYPE, KV_FMT)
        assert pool.stats().active_objects == 0


def test_bad_directories(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(InvalidArgumentError, match="not a directory"):
        FileStore(tmp_path / "file")
    with pytest.raises(InvalidArgumentError, match="path"):
        FileStore(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        FileStore("")
    with pytest.raises(InvalidArgumentError, match="io_threads"):
        FileStore(tmp_path / "x", io_threads=0)


def test_open_store_specs(tmp_path: Path) -> None:
    for spec in (
        str(tmp_path / "a"),
        tmp_path / "b",
        f"file://{tmp_path}/c",
        f"file://localhost{tmp_path}/d",
    ):
        with open_store(spec, checksum=True) as store:
            assert isinstance(store, FileStore)
            assert Path(store.directory).parent == tmp_path
    for bad in ("", "  ", "ftp://x/y", "file://otherhost/x", "file://", 3):
        with pytest.raises(InvalidArgumentError):
            open_store(bad)  # type: ignore[arg-type]


def test_open_store_refuses_options_the_store_does_not_take(tmp_path: Path) -> None:
    # a Redis option given with a directory spec, a misspelt flag, the spec twice
    for options, match in (
        ({"timeout": 0.5}, "'timeout'.*accepted: checksum"),
        ({"cheksum": True}, "did you mean 'checksum'"),
        ({"directory": "/tmp"}, "'directory'"),
    ):
        with pytest.raises(ArgumentTypeError, match=match):
            open_store(str(tmp_path / "s"), **options)
    with pytest.raises(ArgumentTypeError, match="io_threads"):
        AsyncFileStore(tmp_path / "s", io_threads=2)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"checksum": 1}, "checksum must be True or False"),
        ({"durable": "yes"}, "durable must be True or False"),
        ({"reuse_files": torch.zeros(2)}, "reuse_files must be True or False"),
        ({"cleanup_temp_age_s": float("nan")}, "cleanup_temp_age_s"),
        ({"cleanup_temp_age_s": -1}, "cleanup_temp_age_s"),
    ],
)
def test_flags_and_ages_are_checked(tmp_path: Path, options: dict, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        FileStore(tmp_path / "flags", **options)
    assert not (tmp_path / "flags").exists()  # refused before anything was created


def test_batched_calls_refuse_a_lone_key(tmp_path: Path) -> None:
    pool = kvpool.TensorMemoryAllocator(torch.empty(1 << 16, dtype=torch.uint8))
    with FileStore(tmp_path / "lone") as store:
        obj = pool.allocate(torch.Size([16]), torch.uint8, kvpool.MemoryFormat.BINARY)
        for call in (
            lambda: store.batched_exists("key"),
            lambda: store.batched_delete(b"key"),
            lambda: store.batched_get("key", pool),
            lambda: store.batched_put("key", [obj]),
            lambda: store.batched_put(["key"], obj),
            lambda: store.batched_exists(None),
        ):
            with pytest.raises(ArgumentTypeError, match="must be a list"):
                call()
        assert not store.exists("key") and not store.exists("k")
        obj.ref_count_down()
    pool.close()


def test_repr_and_context_manager(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "r")
    with store as same:
        assert same is store and "FileStore" in repr(store)
    assert store.closed and "closed" in repr(store)


def test_cleanup_ignores_foreign_names(file_store: FileStore) -> None:
    directory = Path(file_store.directory)
    (directory / ".tmp-notapid-1").write_bytes(b"")
    (directory / "unrelated").write_bytes(b"")
    old = time.time() - 7200
    os.utime(directory / ".tmp-notapid-1", (old, old))
    assert file_store.cleanup_temp(0) == 0
    assert sorted(os.listdir(directory)) == [".tmp-notapid-1", "unrelated"]


# -- reused files ------------------------------------------------------


def _uniform(pool: kvpool.TensorMemoryAllocator, value: int) -> kvpool.MemoryObj:
    obj = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    obj.byte_array[:] = bytes([value]) * KV_BYTES  # type: ignore[union-attr]
    return obj  # type: ignore[return-value]


def test_puts_reuse_replaced_files(
    file_store: FileStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    objs = [_uniform(pool, v) for v in range(4)]
    inodes = []
    for obj in objs:
        file_store.put("k", obj)
        inodes.append(os.stat(file_store.path("k")).st_ino)
    assert inodes[2] == inodes[0] and inodes[3] == inodes[1]  # two files take turns
    assert len(os.listdir(file_store.directory)) == 2  # the entry and one spare
    got = file_store.get("k", pool)
    assert got is not None and bytes(got.byte_array) == bytes([3]) * KV_BYTES
    got.ref_count_down()
    file_store.close()
    assert os.listdir(file_store.directory) == [Path(file_store.path("k")).name]
    pool.batched_free(objs)


def test_no_reuse_when_disabled(tmp_path: Path, pool: kvpool.TensorMemoryAllocator) -> None:
    with FileStore(tmp_path / "s", reuse_files=False) as store:
        obj = _uniform(pool, 1)
        inodes = set()
        for _ in range(4):
            store.put("k", obj)
            inodes.add(os.stat(store.path("k")).st_ino)
            assert len(os.listdir(store.directory)) == 1
        obj.ref_count_down()


def test_a_file_being_read_is_not_reused(
    file_store: FileStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    objs = [_uniform(pool, v) for v in range(4)]
    file_store.put("k", objs[0])
    reader = file_store._open_entry(b"k", "get")  # holds LOCK_SH, as a get does
    assert reader is not None
    for obj in objs[1:]:  # the second put would rewrite the reader's file
        file_store.put("k", obj)
    assert os.pread(reader, KV_BYTES + 4096, 0)[-KV_BYTES:] == bytes([0]) * KV_BYTES
    os.close(reader)
    got = file_store.get("k", pool)
    assert got is not None and bytes(got.byte_array) == bytes([3]) * KV_BYTES
    got.ref_count_down()
    pool.batched_free(objs)


def test_reader_reopens_when_its_file_was_swapped_out(
    file_store: FileStore, pool: kvpool.TensorMemoryAllocator, faults: Any
) -> None:
    a, b, c = (_uniform(pool, v) for v in (1, 2, 3))
    file_store.put("k", a)
    file_store.put("other", b)
    calls = []

    def racing_writer() -> None:
        # Between the reader's open and its lock, the writer swaps "k" out
        # and rewrites its old file for another key.
        calls.append(1)
        file_store.put("k", c)  # "k"'s old file becomes a spare
        file_store.put("other", a)  # ... rewritten with "other"'s entry

    faults.hook("read_before_lock", racing_writer)
    got = file_store.get("k", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    assert calls  # the race happened
    assert got is not None and bytes(got.byte_array) == bytes([3]) * KV_BYTES
    other = file_store.get("other", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    assert other is not None and bytes(other.byte_array) == bytes([1]) * KV_BYTES
    for obj in (a, b, c, got, other):
        obj.ref_count_down()


def _hammer(directory: str, writer: bool, seconds: float, results: Any) -> None:
    """Put (writer) or get and check (reader) 4 keys for ``seconds``."""
    store = FileStore(directory)
    pool = kvpool.TensorMemoryAllocator(torch.empty(4 << 20, dtype=torch.uint8))
    obj = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    assert obj is not None
    end = time.monotonic() + seconds
    n = bad = 0
    while time.monotonic() < end:
        key = n % 4
        if writer:  # every byte of an entry of key i is 16 * i + version
            obj.byte_array[:] = bytes([16 * key + n % 16]) * KV_BYTES
            store.put(str(key), obj)
        else:
            got = store.get(str(key), pool, KV_SHAPE, KV_DTYPE, KV_FMT)
            if got is not None:
                data = bytes(got.byte_array)
                if data != data[:1] * len(data) or data[0] // 16 != key:
                    bad += 1
                got.ref_count_down()
        n += 1
    results.put((writer, n, bad))


def test_processes_never_see_torn_or_foreign_entries(tmp_path: Path) -> None:
    # Two writers rewrite reused files while two readers read: without the
    # readers' lock and check, readers see mixed or other keys' bytes
    # (dozens per second on the development VM).
    directory = str(tmp_path / "shared")
    FileStore(directory).close()
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    procs = [ctx.Process(target=_hammer, args=(directory, w, 1.0, results)) for w in (1, 1, 0, 0)]
    for proc in procs:
        proc.start()
    out = [results.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(10)
        assert proc.exitcode == 0
    assert all(bad == 0 for _, _, bad in out), out
    assert all(n > 0 for _, n, _ in out), out


# -- batched_get: destinations first, then the reads ---------------------


def test_batched_get_needs_room_only_for_the_entries_found(file_store: FileStore) -> None:
    small = kvpool.TensorMemoryAllocator(torch.empty(3 * KV_BYTES, dtype=torch.uint8))
    big = kvpool.TensorMemoryAllocator(torch.empty(8 << 20, dtype=torch.uint8))
    for key, value in (("b", 2), ("e", 5)):
        obj = _uniform(big, value)
        file_store.put(key, obj)
        obj.ref_count_down()
    got = file_store.batched_get(list("abcdef"), small, KV_SHAPE, KV_DTYPE, KV_FMT)
    assert [None if g is None else g.byte_array[0] for g in got] == [None, 2, None, None, 5, None]
    small.batched_free([g for g in got if g is not None])
    assert_clean(small)
    small.close()
    big.close()


def test_batched_put_writes_every_good_pair_then_raises_the_first_error(
    file_store: FileStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    objs = [_uniform(pool, v) for v in range(4)]
    dead = _uniform(pool, 9)
    dead.ref_count_down()
    keys: list[Any] = ["a", "b", 5, "c", "a"]  # 5 is no key; "a" twice: the last wins
    with pytest.raises(InvalidHandleError, match="freed") as info:
        file_store.batched_put(keys, [objs[0], dead, objs[1], objs[2], objs[3]])
    assert info.value.__notes__ == ["1 more operation(s) of the batch failed"]
    assert not file_store.exists("b")
    got = file_store.batched_get(["a", "c"], pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    assert [g.byte_array[0] for g in got] == [3, 2]  # type: ignore[union-attr]
    assert all(o.get_ref_count() == 1 for o in objs)  # every hold was released
    pool.batched_free(got + objs)  # type: ignore[operator]


def test_batched_get_frees_everything_when_an_entry_is_damaged(
    file_store: FileStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    objs = [_uniform(pool, v) for v in range(4)]
    file_store.batched_put(["a", "b", "c", "d"], objs)
    pool.batched_free(objs)
    path = file_store.path("c")
    os.truncate(path, os.path.getsize(path) - 1)  # c is one byte short
    with pytest.raises(CorruptEntryError, match="truncated"):
        file_store.batched_get(["a", "b", "c", "d"], pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    # the pool fixture checks that nothing is left allocated
    got = file_store.batched_get(["d", "a"], pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    assert [g.byte_array[0] for g in got] == [3, 0]  # type: ignore[union-attr]
    pool.batched_free(got)
