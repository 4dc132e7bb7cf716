"""The harness on vLLM's own tiers: chunks cascade, leave the primary and come back byte for byte.

Another engine of the same layout finds them through a shared tier, one
of another layout finds none; the byte check catches a tier that moves
no bytes; each engine's ``/dev/shm`` region goes when it closes, or when
vLLM refuses a tier.  A tier added to ``SHARED_TIERS`` (conftest) runs
every test here that takes ``shared_tier``.
"""

from __future__ import annotations

import mmap
import uuid
from pathlib import Path
from typing import Any

import pytest

from .harness import Layout

LAYOUTS = [
    Layout(),
    Layout(world_size=2, dtype="bfloat16", blocks_per_chunk=1),
    Layout(model="kvpool-test/tiny-llama-4kv", world_size=4, kv_heads=4, dtype="float32",
           block_tokens=8, blocks_per_chunk=4),
]  # fmt: skip


def _name(layout: Layout) -> str:
    return f"tp{layout.world_size}-{layout.dtype}-{layout.block_tokens}x{layout.blocks_per_chunk}"


@pytest.mark.parametrize("layout", LAYOUTS, ids=_name)
def test_chunks_come_back_from_the_tier_after_eviction(engines: Any, shared_tier: dict,
                                                        layout: Layout) -> None:  # fmt: skip
    engine = engines([shared_tier], layout)
    keys = engine.keys(1, chunks=4)
    with engine.request() as req:
        result = engine.store(keys, req)
    assert result.stored == keys and not result.refused
    engine.settle()
    assert all(engine.in_primary(key) for key in keys)

    filler = engine.evict(keys)
    assert filler >= engine.num_chunks - len(keys)
    assert not any(engine.in_primary(key) for key in keys)

    with engine.request() as req:
        got = engine.load(keys, req)
    assert got.hits == len(keys)
    assert got.matched == keys and not got.mismatched
    assert got.steps > 1  # the lookups waited for the promotion
    assert all(engine.in_primary(key) for key in keys)


def test_a_second_engine_finds_the_first_ones_chunks(engines: Any, shared_tier: dict) -> None:
    first = engines([shared_tier])
    second = engines([shared_tier])
    keys = first.keys(7, chunks=3)
    assert second.keys(7, chunks=3) == keys  # same prompt, same keys
    with first.request() as req:
        first.store(keys, req)
    first.settle()
    assert not any(second.in_primary(key) for key in keys)

    with second.request() as req:
        got = second.load(keys, req)
    assert got.hits == len(keys)
    assert got.matched == keys and not got.mismatched


OTHER_LAYOUTS = {
    "dtype": Layout(dtype="bfloat16"),
    "model": Layout(model="kvpool-test/other-llama"),
    "chunk": Layout(blocks_per_chunk=1),
    "kv-cache-layout": Layout(kv_cache_layout="LBNHC"),
}


@pytest.mark.parametrize("other", OTHER_LAYOUTS.values(), ids=OTHER_LAYOUTS.keys())
def test_an_engine_of_another_layout_finds_none(engines: Any, shared_tier: dict,
                                                other: Layout) -> None:  # fmt: skip
    """Same tokens, so the same block hashes, but other bytes: a miss, never wrong bytes."""
    first = engines([shared_tier])
    second = engines([shared_tier], other)
    keys = first.keys(11, chunks=2)
    with first.request() as req:
        first.store(keys, req)
    first.settle()

    # The second engine asks for the same keys (its chunks of those tokens
    # end on the same blocks): only the layout tells the chunks apart.
    theirs = second.keys(11, chunks=2 * first.layout.blocks_per_chunk // other.blocks_per_chunk)
    assert set(keys) <= set(theirs)
    with second.request() as req:
        got = second.load(keys, req)
    if shared_tier["type"] == "fs" and other.kv_cache_layout is not None:
        # vLLM 0.33's own fs tier names a direct row's file without the KV cache layout,
        # so it shares the chunk (the harness's bytes do not depend on the layout; a GPU's
        # would be in the other order). kvpool's key tag names it: a miss.
        assert got.hits == len(keys)
        return
    assert got.hits == 0 and not got.mismatched


def test_vllm_fs_tier_is_shared_across_tensor_parallel_sizes(engines: Any, tmp_path: Any) -> None:
    """One rank's chunk is two ranks' slots end to end: vLLM's premise for sharing them."""
    tier = {"type": "fs", "root_dir": str(tmp_path / "fs"), "n_read_threads": 2,
            "n_write_threads": 2}  # fmt: skip
    one = engines([tier], Layout(world_size=1))
    two = engines([tier], Layout(world_size=2))
    keys = one.keys(3, chunks=2)
    with one.request() as req:
        one.store(keys, req)
    one.settle()
    with two.request() as req:
        got = two.load(keys, req)
    assert got.matched == keys and not got.mismatched


def test_the_byte_check_catches_a_tier_that_moves_no_bytes(engines: Any) -> None:
    """vLLM's example tier keeps only keys: its promotions leave the rows as they were."""
    engine = engines([{"type": "example"}])
    keys = engine.keys(5, chunks=2)
    with engine.request() as req:
        engine.store(keys, req)
    engine.evict(keys)
    with engine.request() as req:
        got = engine.load(keys, req)
    assert got.hits == len(keys)
    assert got.mismatched == keys and not got.matched


def test_each_engine_has_its_region_and_close_removes_it(engines: Any, shared_tier: dict) -> None:
    lay = Layout(world_size=2, blocks_per_chunk=3, primary_bytes=1 << 20)
    first = engines([shared_tier], lay)
    second = engines([shared_tier], lay)
    assert first.shm_path != second.shm_path
    assert first.shm_path.exists() and second.shm_path.exists()

    # vLLM's geometry is the layout's: a row is every rank's slot, page-aligned.
    row = -(-lay.chunk_bytes // mmap.PAGESIZE) * mmap.PAGESIZE
    assert first.row_bytes == row
    assert first.num_chunks == lay.primary_bytes // row
    view = first.manager.primary_tier.get_kv_memoryview()
    assert (view.shape, view.strides[0]) == ((first.num_chunks, row), row)

    first.close()
    first.close()  # idempotent
    assert not first.shm_path.exists() and second.shm_path.exists()


def test_a_tier_vllm_cannot_build_leaves_no_region(engines: Any) -> None:
    """A tier configuration vLLM refuses stops the engine, and its region goes with it."""
    engine_id = f"kvpool-refused-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ValueError, match="Unknown secondary tier type"):
        engines([{"type": "no-such-tier"}], engine_id=engine_id)
    assert not list(Path("/dev/shm").glob(f"vllm_offload_{engine_id}*"))
