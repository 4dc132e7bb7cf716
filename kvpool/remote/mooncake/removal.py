"""Removing Mooncake entries: by key (leases waited out) and by key prefix (one master call).

* :func:`remove_keys` - ``batch_remove`` of the keys; a key a reader holds
  a lease on (or one being written) is retried with a backoff until the
  store's ``timeout``, then fails with ``StoreTimeoutError``.
* :func:`remove_prefix` - ``remove_by_regex`` of ``^`` and the prefix:
  the master walks its keys and removes every match in one call (bounded
  by Mooncake's own RPC timeout, ``MC_RPC_TIMEOUT_MS``).  The prefix is
  written byte for byte as ``\\xHH`` escapes of its UTF-8 form (the form
  the client sends), so no character of it acts as regex syntax.  Mooncake
  removes only entries no reader holds a lease on (``force`` stays off: a
  forced remove could free memory a transfer is still reading), and says
  nothing of those it kept: an entry read or checked within the master's
  lease (``--default_kv_lease_ttl``, 10 s by default) stays, and a later
  call removes it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import kvpool.remote.mooncake.codes as codes

__all__ = ["prefix_regex", "remove_keys", "remove_prefix"]

_PLAIN = frozenset(b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


def prefix_regex(mkey_prefix: str) -> str:
    """The regular expression of every Mooncake key that starts with ``mkey_prefix``."""
    out = ["^"]
    for byte in mkey_prefix.encode("utf-8"):
        out.append(chr(byte) if byte in _PLAIN else f"\\x{byte:02x}")
    return "".join(out)


def remove_keys(
    client: Any, mkeys: Sequence[str], timeout: float, where: Callable[[int], str]
) -> int:
    """Remove every key (one call, leased ones retried); how many existed.

    Args:
        client: the Mooncake client.
        mkeys: the Mooncake keys.
        timeout: seconds to wait for leases to clear.
        where: ``i -> message prefix`` naming key ``i``.

    Raises:
        StoreTimeoutError: a lease still held a key after ``timeout``.
        StoreConnectionError / RemoteStoreError: Mooncake failed.
    """
    pending = list(range(len(mkeys)))
    removed = 0
    backoff = codes.Backoff(timeout)
    while True:
        codes_now = client.batch_remove([mkeys[i] for i in pending])
        leased = []
        for i, rc in zip(pending, codes_now, strict=True):
            if rc == 0:
                removed += 1
            elif rc in codes.RETRYABLE:
                leased.append(i)
            elif rc != codes.NOT_FOUND:
                raise codes.error_for(rc, where(i))
        if not leased:
            return removed
        if not backoff.wait():
            raise codes.error_for(codes.HAS_LEASE, where(leased[0]))
        pending = leased


def remove_prefix(client: Any, mkey_prefix: str, where: str) -> int:
    """Remove every unleased key that starts with ``mkey_prefix`` (see the module); how many.

    Raises:
        StoreConnectionError / RemoteStoreError: Mooncake failed.
    """
    rc = client.remove_by_regex(prefix_regex(mkey_prefix), False)
    if rc < 0:
        raise codes.error_for(rc, where)
    return int(rc)
