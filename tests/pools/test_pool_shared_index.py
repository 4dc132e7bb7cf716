"""A shared pool's index: typed views of the creator's objects, rebuilt in another process.

The children get only the pool's name and an offset or key on their
command line: every shape, dtype and format comes from the segment.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from pool_helpers import KV_DTYPE, KV_FMT, KV_SHAPE, MIB, count_mappings, paged_kwargs

import kvpool
from kvpool import MemoryFormat
from kvpool.pool.shmindex import MAX_KEY_BYTES

# argv: name, then "key=<key>" or "off=<offset>" items.  For each, the
# child prints the layout it found and the sum of the values, then doubles
# the values in place (so the parent sees the child wrote through a typed view).
CHILD = r"""
import sys
import kvpool

name, items = sys.argv[1], sys.argv[2:]
with kvpool.attach_pool(name) as peer:
    assert peer.indexed
    for item in items:
        kind, _, what = item.partition("=")
        where = int(what) if kind == "off" else what
        entry = peer.entry(where)
        groups = peer.tensors(where)
        total = sum(float(t.double().sum()) for t in groups)
        shapes = ";".join("x".join(map(str, s)) for s in entry.shapes)
        dtypes = ";".join(str(d).removeprefix("torch.") for d in entry.dtypes)
        print(entry.offset, shapes, dtypes, entry.fmt.name, entry.key, total)
        for t in groups:
            t.mul_(2)
        del groups
print("done")
"""


def run_child(python: str, env: dict[str, str], *args: object) -> list[str]:
    done = subprocess.run(
        [python, "-c", CHILD, *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "done", done.stdout
    return lines[:-1]


def fill(t: torch.Tensor, start: float) -> None:
    t.copy_(torch.arange(t.numel(), dtype=torch.float64).add_(start).view(t.shape).to(t.dtype))


def test_child_rebuilds_typed_views_by_key_and_offset(
    shm_name: str, python: str, child_env: dict[str, str], mappings: int
) -> None:
    with kvpool.MixedMemoryAllocator(MIB, shm_name=shm_name) as pool:
        pool.allocate(torch.Size([10]), torch.uint8, KV_FMT).ref_count_down()  # offsets matter
        kv = pool.allocate(torch.Size([2, 3, 4, 5]), torch.bfloat16, MemoryFormat.KV_2LTD)
        mla = pool.allocate(torch.Size([1, 2, 7, 3]), torch.float32, MemoryFormat.KV_MLA_FMT)
        multi = pool.allocate(
            [torch.Size([2, 4]), torch.Size([7])], [torch.uint8, torch.int64], MemoryFormat.BINARY
        )
        fill(kv.tensor, 1)
        fill(mla.tensor, 100)
        fill(multi.get_tensor(0), 0)
        fill(multi.get_tensor(1), -3)
        pool.publish("layer-0", kv)
        before = [kv.tensor.double().sum().item(), mla.tensor.double().sum().item()]
        multi_sums = [multi.get_tensor(i).double().sum().item() for i in range(2)]

        lines = run_child(
            python,
            child_env,
            shm_name,
            "key=layer-0",
            f"off={mla.shm_offset}",
            f"off={multi.shm_offset}",
        )
        got = [line.split() for line in lines]
        assert got[0][:5] == [str(kv.shm_offset), "2x3x4x5", "bfloat16", "KV_2LTD", "layer-0"]
        assert float(got[0][5]) == before[0]
        assert got[1][:5] == [str(mla.shm_offset), "1x2x7x3", "float32", "KV_MLA_FMT", "None"]
        assert float(got[1][5]) == before[1]
        assert got[2][:5] == [str(multi.shm_offset), "2x4;7", "uint8;int64", "BINARY", "None"]
        assert float(got[2][5]) == sum(multi_sums)
        # The child wrote through its typed views into the creator's objects.
        assert kv.tensor.double().sum().item() == 2 * before[0]
        assert mla.tensor.double().sum().item() == 2 * before[1]
        assert [multi.get_tensor(i).double().sum().item() for i in range(2)] == [
            2 * x for x in multi_sums
        ]
        for obj in (kv, mla, multi):
            obj.ref_count_down()
    del pool, kv, mla, multi
    assert count_mappings() == mappings


def test_child_reads_a_paged_pool(shm_name: str, python: str, child_env: dict[str, str]) -> None:
    partial = torch.Size([2, 4, 5, 8])  # 5 of 16 tokens: smaller than a page
    with kvpool.MixedMemoryAllocator(
        MIB, use_paging=True, shm_name=shm_name, **paged_kwargs()
    ) as pool:
        assert pool.describe()["shm_index_slots"] == MIB // (KV_SHAPE.numel() * KV_DTYPE.itemsize)
        objs = [pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT) for _ in range(3)]
        part = pool.allocate(partial, KV_DTYPE, KV_FMT)
        fill(objs[2].tensor, 5)
        fill(part.tensor, 7)
        lines = run_child(
            python, child_env, shm_name, f"off={objs[2].shm_offset}", f"off={part.shm_offset}"
        )
        assert lines[0].split()[1:4] == ["2x4x16x8", "float16", "KV_2LTD"]
        assert lines[1].split()[1:4] == ["2x4x5x8", "float16", "KV_2LTD"]
        assert torch.equal(
            part.tensor, (torch.arange(part.tensor.numel()) + 7).view(partial).to(KV_DTYPE) * 2
        )
        for obj in (*objs, part):
            obj.ref_count_down()


def test_the_index_follows_placements_and_frees(shm_name: str) -> None:
    with (
        kvpool.MixedMemoryAllocator(MIB, shm_name=shm_name) as pool,
        kvpool.attach_pool(shm_name) as peer,
    ):
        a = pool.allocate(torch.Size([8192]), torch.uint8, KV_FMT)  # two 4 KiB blocks
        b = pool.allocate(torch.Size([16]), torch.float32, KV_FMT)
        assert [e.offset for e in peer.entries()] == [a.shm_offset, b.shm_offset]
        off = a.shm_offset
        a.ref_count_down()  # freed without the pool seeing it: the entry stays...
        assert peer.entry(off).shapes == (torch.Size([8192]),)
        c = pool.allocate(torch.Size([3, 4]), torch.int16, KV_FMT)  # ...until replaced
        assert c.shm_offset == off
        entry = peer.entry(off)
        assert (entry.shapes, entry.dtypes) == ((torch.Size([3, 4]),), (torch.int16,))
        assert peer.tensor(off).shape == (3, 4)
        pool.free(c)  # through the pool: the entry goes
        with pytest.raises(kvpool.InvalidHandleError, match=f"offset {off}"):
            peer.entry(off)
        pool.publish("b", b)
        assert peer.entry("b").offset == b.shm_offset
        pool.batched_free([b])
        with pytest.raises(kvpool.InvalidHandleError, match="key 'b'"):
            peer.tensor("b")
        assert peer.entries() == []


def test_a_key_names_one_object_and_moves(shm_name: str) -> None:
    with (
        kvpool.MixedMemoryAllocator(MIB, shm_name=shm_name) as pool,
        kvpool.attach_pool(shm_name) as peer,
    ):
        a, b = (pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT) for _ in range(2))
        pool.publish("k", a)
        pool.publish("k", b)
        assert peer.entry("k").offset == b.shm_offset
        assert peer.entry(a.shm_offset).key is None  # a keeps its entry, without the key
        pool.publish("é" * (MAX_KEY_BYTES // 2), a)  # 56 bytes of UTF-8
        assert peer.entry("é" * (MAX_KEY_BYTES // 2)).offset == a.shm_offset
        a.ref_count_down()
        b.ref_count_down()


def test_a_full_index_evicts_the_oldest_entry(shm_name: str) -> None:
    with (
        kvpool.MixedMemoryAllocator(MIB, shm_name=shm_name, shm_index_slots=4) as pool,
        kvpool.attach_pool(shm_name) as peer,
    ):
        objs = [pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT) for _ in range(6)]
        assert [e.offset for e in peer.entries()] == [o.shm_offset for o in objs[2:]]
        for obj in objs:
            obj.ref_count_down()


def test_publish_errors(shm_name: str) -> None:
    with kvpool.MixedMemoryAllocator(MIB) as private:
        obj = private.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
        with pytest.raises(kvpool.FeatureUnavailableError, match="shm_name"):
            private.publish("k", obj)
        with kvpool.MixedMemoryAllocator(MIB, shm_name=shm_name) as pool:
            with pytest.raises(kvpool.InvalidHandleError, match="not allocated by this pool"):
                pool.publish("k", obj)
            mine = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
            for key in ("", "x" * (MAX_KEY_BYTES + 1), 7):
                with pytest.raises(kvpool.InvalidArgumentError, match="key"):
                    pool.publish(key, mine)  # type: ignore[arg-type]
            deep = pool.allocate(torch.Size([1] * 7), torch.float32, KV_FMT)  # 7 dimensions
            with pytest.raises(kvpool.InvalidArgumentError, match="cannot be described"):
                pool.publish("deep", deep)
            mine.ref_count_down()
            with pytest.raises(kvpool.InvalidHandleError, match="freed"):
                pool.publish("k", mine)
            deep.ref_count_down()
        obj.ref_count_down()


def test_segments_without_an_index(shm_name: str) -> None:
    with kvpool.MixedMemoryAllocator(MIB, shm_name=shm_name, shm_index_slots=0) as pool:
        assert "shm_index_slots" not in pool.describe()
        obj = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
        with kvpool.attach_pool(shm_name) as peer:
            assert not peer.indexed and peer.size == MIB
            with pytest.raises(kvpool.FeatureUnavailableError, match="no object index"):
                peer.tensor(obj.shm_offset)
        with pytest.raises(kvpool.FeatureUnavailableError):
            pool.publish("k", obj)
        obj.ref_count_down()
    with kvpool.MixedMemoryAllocator(MIB, shm_name=shm_name) as pool:
        with kvpool.attach_pool(shm_name, MIB) as part:  # mapped in part: raw bytes only
            assert not part.indexed
            with pytest.raises(kvpool.FeatureUnavailableError):
                part.entries()
        with kvpool.attach_pool(shm_name) as whole:
            assert whole.indexed and whole.size == MIB
            with pytest.raises(kvpool.InvalidArgumentError, match="offset"):
                whole.entry(1.5)  # type: ignore[arg-type]


@pytest.mark.parametrize("slots", [-1, 1.5, "8", True, 1 << 23])
def test_bad_index_slots(shm_name: str, slots: object) -> None:
    with pytest.raises(kvpool.InvalidArgumentError, match="shm_index_slots"):
        kvpool.MixedMemoryAllocator(MIB, shm_name=shm_name, shm_index_slots=slots)
    with pytest.raises(kvpool.SharedMemoryNotFoundError):
        kvpool.attach_pool(shm_name)


def test_a_damaged_index_is_a_typed_error(shm_name: str) -> None:
    with kvpool.MixedMemoryAllocator(MIB, shm_name=shm_name) as pool:
        obj = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
        segment = pool.backing.buffer.memoryview()
        # A slot whose bytes no longer match its CRC is never returned.
        header_at = MIB
        slot_at = header_at + 64 + 1024
        segment[slot_at + 40] ^= 0xFF  # the first group's dtype code
        with (
            kvpool.attach_pool(shm_name) as peer,
            pytest.raises(kvpool.InvalidHandleError, match="no object"),
        ):
            peer.entry(obj.shm_offset)
        # A header that is not one makes attaching fail with the reason.
        segment[header_at] ^= 0xFF
        with pytest.raises(kvpool.InvalidHandleError, match="header is damaged"):
            kvpool.attach_pool(shm_name)
        segment[header_at] ^= 0xFF
        del segment
        obj.ref_count_down()


def test_readers_never_see_a_torn_entry(
    shm_name: str, python: str, child_env: dict[str, str]
) -> None:
    # The child scans the index while the parent keeps placing and freeing
    # objects of different layouts: every entry it gets must be whole.
    scanner = r"""
import sys
import kvpool
layouts = {(2, 4, 16, 8): "float16", (64,): "int32", (3, 5, 7): "uint8"}
with kvpool.attach_pool(sys.argv[1]) as peer:
    print("ready", flush=True)
    seen = 0
    for _ in range(3000):
        for e in peer.entries():
            assert layouts[tuple(e.shapes[0])] == str(e.dtypes[0]).removeprefix("torch."), e
            seen += 1
print("seen", seen)
"""
    layouts = [
        (torch.Size([2, 4, 16, 8]), torch.float16),
        (torch.Size([64]), torch.int32),
        (torch.Size([3, 5, 7]), torch.uint8),
    ]
    with kvpool.MixedMemoryAllocator(MIB, shm_name=shm_name, shm_index_slots=64) as pool:
        child = subprocess.Popen(
            [python, "-c", scanner, shm_name],
            env=child_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready"
            live: list[kvpool.MemoryObj] = []
            i = 0
            while child.poll() is None and i < 2_000_000:
                shape, dtype = layouts[i % 3]
                obj = pool.allocate(shape, dtype, KV_FMT)
                assert obj is not None
                live.append(obj)
                if len(live) > 20:
                    old = live.pop(0)
                    if i % 2:
                        pool.free(old)  # the index forgets it at once
                    else:
                        old.ref_count_down()  # the entry stays until replaced
                i += 1
            out, err = child.communicate(timeout=120)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(10)
        assert child.returncode == 0, err
        assert out.split()[0] == "seen" and int(out.split()[1]) > 0
        for obj in live:
            obj.ref_count_down()


def test_attach_pool_never_unlinks(shm_name: str, python: str, child_env: dict[str, str]) -> None:
    # Unlike multiprocessing.shared_memory, a child that attached and exited
    # leaves the creator's segment in place.
    with kvpool.MixedMemoryAllocator(MIB, shm_name=shm_name):
        code = "import sys, kvpool; kvpool.attach_pool(sys.argv[1]).close()"
        done = subprocess.run(
            [python, "-c", code, shm_name], env=child_env, timeout=120, check=False
        )
        assert done.returncode == 0
        kvpool.attach_pool(shm_name).close()  # still there


def test_help_of_attach_pool_names_what_to_use() -> None:
    text = kvpool.attach_pool.__doc__ or ""
    for name in ("tensor(where)", "entry(where)", "view", "close()", "multiprocessing"):
        assert name in text
    assert sys.modules["kvpool.pool.shared"].AttachedPool.__doc__
