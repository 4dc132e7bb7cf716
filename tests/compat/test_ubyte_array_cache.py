"""LMCache's ``_get_cached_ubyte_array_type`` contract, on kvpool's helper and memory.

LMCache 0.5.6's test suite checks, through ``lmcache.v1.memory_management``,
that the helper maps a length to one ``ctypes`` array type, that different
lengths get different types, and that reading ``byte_array`` again and again
adds nothing to the helper's ``cache_info().currsize``.  With kvpool
installed, those names are kvpool's: this runs the same contract on them.
"""

from __future__ import annotations

import ctypes

import torch


def test_lmcache_s_helper_is_kvpool_s_and_keeps_the_contract() -> None:
    from lmcache.v1 import memory_management as mm

    import kvpool

    helper = mm._get_cached_ubyte_array_type
    assert helper.__module__ == "kvpool.helpers"  # installed: LMCache's name, kvpool's helper
    first, again, other = helper(1024), helper(1024), helper(2048)
    assert first is again
    assert first is not other
    assert issubclass(first, ctypes.Array) and first._length_ == 1024
    info = helper.cache_info()
    assert info.currsize >= 2 and info.hits >= 1
    assert kvpool._get_cached_ubyte_array_type.cache_info() == helper.cache_info()


def test_byte_array_adds_no_array_type() -> None:
    from lmcache.v1.memory_allocators.mixed_memory_allocator import MixedMemoryAllocator
    from lmcache.v1.memory_management import TensorMemoryObj, _get_cached_ubyte_array_type

    allocator = MixedMemoryAllocator(1 << 22)
    obj = allocator.allocate(torch.Size([4096]), torch.uint8)
    assert isinstance(obj, TensorMemoryObj)
    try:
        view = obj.byte_array
        before = _get_cached_ubyte_array_type.cache_info().currsize
        for _ in range(50):
            view = obj.byte_array
            assert isinstance(view, memoryview) and view.nbytes == 4096
        del view
        assert _get_cached_ubyte_array_type.cache_info().currsize == before
    finally:
        obj.ref_count_down()
        allocator.close()
