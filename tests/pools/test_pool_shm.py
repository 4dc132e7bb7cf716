"""Shared-memory pools read and written by a second process through attach_pool."""

from __future__ import annotations

import hashlib
import subprocess

import pytest
import torch
from pool_helpers import (
    KV_BYTES,
    KV_DTYPE,
    KV_FMT,
    KV_SHAPE,
    MIB,
    count_mappings,
    paged_kwargs,
    pattern,
)

import kvpool

# The child attaches, checks each question object by its hash, and writes the
# bitwise complement of what it read into the matching answer object.
# argv: name, then (offset, length, sha256, answer offset, answer length)...
CHILD = r"""
import hashlib, sys
import kvpool

name, rest = sys.argv[1], sys.argv[2:]
pool = kvpool.attach_pool(name)
view = pool.view
for i in range(0, len(rest), 5):
    off, length, digest, answer_off, answer_len = rest[i:i + 5]
    off, length, answer_off, answer_len = int(off), int(length), int(answer_off), int(answer_len)
    data = bytes(view[off:off + length])
    if hashlib.sha256(data).hexdigest() != digest:
        print(f"child: object at {off} differs from the parent's", file=sys.stderr)
        sys.exit(3)
    if answer_len != length:
        print(f"child: answer length {answer_len} != {length}", file=sys.stderr)
        sys.exit(4)
    view[answer_off:answer_off + answer_len] = bytes(b ^ 0xFF for b in data)
kind = pool.describe()["kind"]
del view
pool.close()
print("ok", kind)
"""


def exchange(
    name: str,
    pairs: list[tuple[kvpool.MemoryObj, kvpool.MemoryObj]],
    python: str,
    env: dict[str, str],
) -> None:
    """Each (question, answer): the parent writes the question, the child answers it."""
    args: list[object] = [name]
    expected = []
    for seed, (question, answer) in enumerate(pairs):
        data = pattern(question.shm_byte_length, seed + 40)
        question.byte_array[:] = data
        answer.byte_array[:] = bytes(answer.shm_byte_length)
        expected.append((question, answer, data))
        args += [
            question.shm_offset,
            question.shm_byte_length,
            hashlib.sha256(data).hexdigest(),
            answer.shm_offset,
            answer.shm_byte_length,
        ]
    done = subprocess.run(
        [python, "-c", CHILD, *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok", "shm"]
    for question, answer, data in expected:
        assert bytes(answer.byte_array) == bytes(b ^ 0xFF for b in data)
        assert bytes(question.byte_array) == data  # untouched


def test_extent_pool_shared_with_a_child_process(
    shm_name: str, python: str, child_env: dict[str, str], mappings: int
) -> None:
    with kvpool.MixedMemoryAllocator(MIB, shm_name=shm_name) as pool:
        objs = [pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT) for _ in range(4)]
        small = pool.allocate(torch.Size([100]), torch.uint8, KV_FMT)
        small_answer = pool.allocate(torch.Size([100]), torch.uint8, KV_FMT)
        # not at offset 0, so the offsets matter
        exchange(shm_name, [(objs[2], objs[3]), (small, small_answer)], python, child_env)
        # In an extent pool the offset is the metadata's address.
        assert objs[2].shm_offset == objs[2].meta.address != 0
        assert objs[2].shm_byte_length == KV_BYTES
        assert small.shm_byte_length == 100
    del pool, objs, small, small_answer
    assert count_mappings() == mappings


def test_paged_pool_shared_with_a_child_process(
    shm_name: str, python: str, child_env: dict[str, str], mappings: int
) -> None:
    partial = torch.Size([2, 4, 5, 8])  # 5 of 16 tokens: 640 of 2048 bytes
    with kvpool.MixedMemoryAllocator(
        MIB, use_paging=True, shm_name=shm_name, **paged_kwargs()
    ) as pool:
        objs = [pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT) for _ in range(4)]
        part = pool.allocate(partial, KV_DTYPE, KV_FMT)
        part_answer = pool.allocate(partial, KV_DTYPE, KV_FMT)
        exchange(shm_name, [(objs[2], objs[3]), (part, part_answer)], python, child_env)
        # In a paged pool meta.address is the page index, shm_offset the byte offset.
        for obj in (*objs, part, part_answer):
            assert obj.shm_offset == obj.meta.address * KV_BYTES
        assert objs[2].meta.address != 0
        assert part.shm_byte_length == partial.numel() * KV_DTYPE.itemsize
    del pool, objs, part, part_answer, obj
    assert count_mappings() == mappings


def test_attach_in_process_sees_the_same_bytes(shm_name: str) -> None:
    with kvpool.MixedMemoryAllocator(MIB, shm_name=shm_name) as pool:
        obj = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
        peer = kvpool.attach_pool(shm_name)
        try:
            assert peer.describe()["shm_name"] == shm_name
            assert peer.size >= MIB
            off, n = obj.shm_offset, obj.shm_byte_length
            peer.view[off : off + n] = pattern(n, 8)
            assert bytes(obj.byte_array) == pattern(n, 8)
        finally:
            peer.close()
            peer.close()


def test_attacher_keeps_its_mapping_after_the_creator_closes(shm_name: str) -> None:
    pool = kvpool.MixedMemoryAllocator(MIB, shm_name=shm_name)
    obj = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    obj.byte_array[:] = pattern(KV_BYTES, 6)
    off = obj.shm_offset
    peer = kvpool.attach_pool(shm_name)
    pool.close()
    try:
        assert bytes(peer.view[off : off + KV_BYTES]) == pattern(KV_BYTES, 6)
        with pytest.raises(kvpool.SharedMemoryNotFoundError):
            kvpool.attach_pool(shm_name)  # the name went with the creator's close
    finally:
        peer.close()


def test_attach_to_a_missing_pool(shm_name: str) -> None:
    with pytest.raises(kvpool.SharedMemoryNotFoundError) as info:
        kvpool.attach_pool(shm_name)
    assert isinstance(info.value, FileNotFoundError)


def test_failed_shared_pool_construction_leaves_no_segment(shm_name: str, mappings: int) -> None:
    with pytest.raises(kvpool.InvalidArgumentError):
        # 1 MiB + 1 byte is not a whole number of 2048-byte pages
        kvpool.MixedMemoryAllocator(MIB + 1, use_paging=True, shm_name=shm_name, **paged_kwargs())
    with pytest.raises(kvpool.SharedMemoryNotFoundError):
        kvpool.attach_pool(shm_name)
    assert count_mappings() == mappings
