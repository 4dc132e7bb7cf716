"""fork(): a child that touches an inherited pool or object gets a typed error, never SIGSEGV.

A pinned (mlocked) mapping is MADV_DONTFORK, so the child does not even map
it: before kvpool checked, reading a live object's ``byte_array`` in the
child died with SIGSEGV.  Each test forks a real child, lets it touch the
parent's pool, and checks how the child ended and that the parent's data is
intact.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
from pool_helpers import KV_DTYPE, KV_FMT, KV_SHAPE, MIB, paged_kwargs

import kvpool

# What the child reports through its exit status.
TYPED_ERROR, WRONG_ERROR, NO_ERROR = 7, 8, 9

POOLS = {
    "mixed": lambda: kvpool.MixedMemoryAllocator(MIB),
    "mixed-paged": lambda: kvpool.MixedMemoryAllocator(MIB, use_paging=True, **paged_kwargs()),
    "pin": lambda: kvpool.PinMemoryAllocator(MIB),
    "host": lambda: kvpool.HostMemoryAllocator(MIB),
}

TOUCHES = {
    "byte_array": lambda pool, obj: bytes(obj.byte_array[:16]),
    "raw_data": lambda pool, obj: obj.raw_data.sum(),
    "data_ptr": lambda pool, obj: obj.data_ptr,
    "allocate": lambda pool, obj: pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT),
    "buffer-view": lambda pool, obj: pool.backing.buffer.memoryview(),
}


def _in_child(touch: Callable[[Any, Any], object], pool: Any, obj: Any) -> int:
    try:
        touch(pool, obj)
    except kvpool.InheritedAcrossForkError:
        return TYPED_ERROR
    except BaseException:
        return WRONG_ERROR
    return NO_ERROR


@pytest.mark.parametrize("touch", sorted(TOUCHES))
@pytest.mark.parametrize("kind", sorted(POOLS))
def test_a_forked_child_gets_a_typed_error(kind: str, touch: str) -> None:
    pool = POOLS[kind]()
    obj = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    obj.byte_array[:4] = b"kvp!"  # a view exists before the fork, as in real use
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        os._exit(_in_child(TOUCHES[touch], pool, obj))
    _, status = os.waitpid(pid, 0)
    assert not os.WIFSIGNALED(status), f"the child died of signal {os.WTERMSIG(status)}"
    assert os.WEXITSTATUS(status) == TYPED_ERROR
    # The parent's pool and data are untouched.
    assert obj.is_valid()
    assert bytes(obj.byte_array[:4]) == b"kvp!"
    obj.ref_count_down()
    assert pool.memcheck()
    pool.close()


def test_a_child_may_attach_a_shared_pool_by_name(shm_name: str) -> None:
    pool = kvpool.MixedMemoryAllocator(MIB, shm_name=shm_name)
    obj = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    obj.byte_array[:5] = b"hello"
    offset = obj.shm_offset
    pid = os.fork()
    if pid == 0:
        try:
            attached = kvpool.attach_pool(shm_name)
            ok = bytes(attached.view[offset : offset + 5]) == b"hello"
            attached.close()
            os._exit(0 if ok else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    obj.ref_count_down()
    pool.close()


def test_the_fork_handler_leaves_the_parent_alone() -> None:
    pool = kvpool.MixedMemoryAllocator(MIB)
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    obj = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    assert obj is not None and obj.byte_array is not None
    obj.ref_count_down()
    pool.close()
