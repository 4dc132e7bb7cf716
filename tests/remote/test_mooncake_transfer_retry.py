"""A failed Mooncake transfer of an entry that did not change is read again, not called a lost node.

Mooncake fails a read whose replica is replaced under it (by one of the same
size) with ``TRANSFER_FAIL``, the code of a node it cannot reach.  A get reads
such an entry again (twice) before it raises ``StoreConnectionError``; a node
that keeps failing is still reported.  The client is wrapped so that the first
transfers fail, on a real master and storage node.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

import kvpool
from kvpool.errors import StoreConnectionError
from kvpool.remote import MooncakeStore
from kvpool.remote.mooncake import codes

from .conftest import KV_DTYPE, KV_FMT, KV_SHAPE, fill

pytestmark = pytest.mark.mooncake


class FailingTransfers:
    """A Mooncake client whose next ``failures`` entry reads fail with TRANSFER_FAIL."""

    def __init__(self, client: Any, failures: int) -> None:
        self._client = client
        self.failures = failures

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def batch_get_into_multi_buffers(self, *args: Any) -> list[int]:
        if self.failures > 0:
            self.failures -= 1
            return [codes.TRANSFER_FAIL]
        return list(self._client.batch_get_into_multi_buffers(*args))


@pytest.mark.parametrize(("failures", "read"), [(1, True), (2, True), (5, False)])
def test_a_failed_transfer_of_an_unchanged_entry_is_read_again(
    mooncake_client: Any, pool: kvpool.TensorMemoryAllocator, failures: int, read: bool
) -> None:
    store = MooncakeStore(client=mooncake_client, prefix=f"t-{uuid.uuid4().hex[:12]}:")
    obj = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    assert obj is not None
    data = fill(obj, 7)
    store.put("k", obj)
    obj.ref_count_down()
    flaky = FailingTransfers(mooncake_client, failures)
    store.client = flaky
    try:
        if read:
            got = store.get("k", pool)  # the stored layout: header first, then the entry
            assert got is not None and bytes(got.byte_array) == data
            got.ref_count_down()
        else:
            with pytest.raises(StoreConnectionError, match="could not be reached"):
                store.get("k", pool)
    finally:
        store.client = mooncake_client
        store.delete("k")
        store.close()
