"""The slot map of a Redis Cluster: which master serves which key.

A Redis Cluster splits its keyspace into 16384 *slots*; a key's slot is
the CRC16 (XMODEM) of the key, or of its *hash tag* - the part between the
first ``{`` and the next ``}`` when that part is not empty - modulo 16384
(:func:`key_slot`, as the Redis Cluster specification defines it).  Each
slot is served by one master.  :class:`SlotMap` holds that assignment as
read from ``CLUSTER SLOTS`` (:func:`parse_cluster_slots`), which every
Redis >= 3 and Valkey answer.
"""

from __future__ import annotations

import binascii
from collections.abc import Sequence
from typing import Any

from kvpool.errors import RemoteStoreError

__all__ = ["SLOTS", "Address", "SlotMap", "key_slot", "parse_cluster_slots"]

#: Slots of a Redis Cluster.
SLOTS = 16384

#: A node's ``(host, port)``.
Address = tuple[str, int]


def crc16(data: bytes) -> int:
    """CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), the cluster's hash.

    ``binascii.crc_hqx`` computes exactly this (in C).
    """
    return binascii.crc_hqx(data, 0)


def key_slot(key: bytes) -> int:
    """The slot of ``key``: CRC16 of its hash tag (if any, non-empty) or of the key, mod 16384."""
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            key = key[start + 1 : end]
    return crc16(key) % SLOTS


class SlotMap:
    """Which master serves each slot.

    Args:
        owners: per slot, the master's address or None (a slot no master
            serves: the cluster is incomplete).

    Attributes:
        masters: the masters' addresses, in the order first seen.
    """

    __slots__ = ("_owners", "masters")

    def __init__(self, owners: Sequence[Address | None]) -> None:
        if len(owners) != SLOTS:
            raise ValueError(f"a slot map has {SLOTS} entries, got {len(owners)}")
        self._owners = list(owners)
        seen: dict[Address, None] = {}
        for owner in owners:
            if owner is not None:
                seen.setdefault(owner, None)
        self.masters: list[Address] = list(seen)

    def owner(self, slot: int) -> Address | None:
        """The master serving ``slot`` (None when no master does)."""
        return self._owners[slot]

    def uncovered(self) -> int:
        """Slots no master serves."""
        return sum(owner is None for owner in self._owners)

    def __repr__(self) -> str:
        return f"<SlotMap {len(self.masters)} masters, {self.uncovered()} slots uncovered>"


def _text(value: Any, what: str) -> str:
    if not isinstance(value, bytes):
        raise RemoteStoreError(f"malformed CLUSTER SLOTS reply: {what} is {value!r:.60}")
    return value.decode("utf-8", errors="replace")


def parse_cluster_slots(reply: Any, asked: Address) -> SlotMap:
    """A :class:`SlotMap` from a ``CLUSTER SLOTS`` reply (as :meth:`Reader.reply` returns it).

    Each element is ``[start, end, [host, port, id, ...], replicas...]``; an
    empty host means the node that was asked (``asked``).

    Raises:
        RemoteStoreError: the server refused, or the reply is malformed.
    """
    if not isinstance(reply, list):
        raise RemoteStoreError(f"CLUSTER SLOTS on {asked[0]}:{asked[1]} answered {reply!r:.120}")
    owners: list[Address | None] = [None] * SLOTS
    for entry in reply:
        if (
            not isinstance(entry, list)
            or len(entry) < 3
            or not isinstance(entry[0], int)
            or not isinstance(entry[1], int)
            or not isinstance(entry[2], list)
            or len(entry[2]) < 2
            or not isinstance(entry[2][1], int)
        ):
            raise RemoteStoreError(f"malformed CLUSTER SLOTS entry {entry!r:.120}")
        start, end = entry[0], entry[1]
        if not 0 <= start <= end < SLOTS:
            raise RemoteStoreError(f"CLUSTER SLOTS names slots {start}-{end}, outside 0-16383")
        host = _text(entry[2][0], "a host") or asked[0]
        port = entry[2][1]
        if host == "?":  # the node's endpoint is unknown (Redis 7): no usable owner
            continue
        if not 0 < port < 65536:
            raise RemoteStoreError(f"CLUSTER SLOTS names port {port}")
        owner = (host, port)
        for slot in range(start, end + 1):
            owners[slot] = owner
    return SlotMap(owners)
