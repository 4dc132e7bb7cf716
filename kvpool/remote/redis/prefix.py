"""Removing every key under a prefix from one Redis node: ``SCAN MATCH`` and ``UNLINK``, as a plan.

The stores' ``delete_prefix`` runs :func:`delete_prefix_plan` on a node
(the server of a RedisStore, each master of a cluster), within the call's
deadline like every other plan (:mod:`kvpool.remote.redis.common`):

* ``SCAN cursor MATCH <prefix>* COUNT 1000`` walks the node's keyspace
  without blocking the server; the prefix is glob-escaped
  (:func:`glob_pattern`), so its ``*``, ``?``, ``[``, ``]`` and ``\\``
  match themselves;
* the keys of each step are removed with ``UNLINK`` (the server frees the
  values in the background), sent together with the next ``SCAN``: one
  round trip a step.  A single server takes up to 256 keys per ``UNLINK``;
  a cluster node gets one ``UNLINK`` per key (keys of different slots may
  not share a command), and a key whose slot moved meanwhile (``-MOVED``,
  ``-ASK``) is left to the node that now holds it;
* the call ends with the end-of-call marker (``wire.read_sentinel``).

``SCAN`` returns every key that exists for the whole walk at least once
(a key written meanwhile may be missed, one may come twice: ``UNLINK``
counts it once).  A keyspace too large to walk within the deadline ends
the call with the deadline's error; what was removed stays removed, and
the next call walks what is left.
"""

from __future__ import annotations

import kvpool.remote.redis.wire as wire
from kvpool.remote.redis.common import DEL_KEYS, Plan
from kvpool.remote.redis.resp import ErrorReply, ProtocolError, Reader, Send, Steps, command

__all__ = ["SCAN_COUNT", "delete_prefix_plan", "glob_pattern"]

#: Keys a ``SCAN`` step asks the server to look at (a hint; it may return more).
SCAN_COUNT = 1000

_GLOB = frozenset(b"*?[]\\")


def glob_pattern(raw_prefix: bytes) -> bytes:
    """The ``MATCH`` pattern of every key that starts with ``raw_prefix`` (escaped, then ``*``)."""
    escaped = bytearray()
    for byte in raw_prefix:
        if byte in _GLOB:
            escaped.append(0x5C)  # backslash
        escaped.append(byte)
    return bytes(escaped) + b"*"


def _read_scan(reader: Reader, where: str) -> Steps:
    """A ``SCAN`` reply: ``(cursor, keys)``; a refusal is a RemoteStoreError."""
    reply = yield from reader.reply()
    if isinstance(reply, ErrorReply):
        raise wire.refusal(reply, where)
    if (
        not isinstance(reply, list)
        or len(reply) != 2
        or not isinstance(reply[0], bytes)
        or not reply[0].isdigit()
        or not isinstance(reply[1], list)
        or not all(isinstance(k, bytes) for k in reply[1])
    ):
        raise ProtocolError(f"{where}: a SCAN reply that is not [cursor, [keys...]]")
    return reply[0], reply[1]


def delete_prefix_plan(
    raw_prefix: bytes, where: str, removed: list[int], one_key_each: bool = False
) -> Plan:
    """``reader -> plan`` removing every key of one node that starts with ``raw_prefix``.

    Args:
        raw_prefix: the keys' first bytes as the server stores them (the
            store's own prefix included).
        where: names the call in messages.
        removed: a one-item list the plan adds each removed key to (so a
            call cut off by its deadline still says how many it removed).
        one_key_each: one ``UNLINK`` per key (a cluster node).

    The plan returns ``removed[0]``.

    Raises (from the plan):
        RemoteStoreError: the server refused ``SCAN`` or (on a single
            server) ``UNLINK``.
        ProtocolError: a malformed reply.
    """
    pattern = glob_pattern(raw_prefix)
    count = b"%d" % SCAN_COUNT

    def scan(cursor: bytes) -> bytes:
        return command(b"SCAN", cursor, b"MATCH", pattern, b"COUNT", count)

    def plan(reader: Reader) -> Steps:
        yield Send((scan(b"0"),))
        cursor, keys = yield from _read_scan(reader, where)
        while True:
            if one_key_each:
                unlinks = [command(b"UNLINK", k) for k in keys]
            else:
                unlinks = [
                    command(b"UNLINK", *keys[i : i + DEL_KEYS])
                    for i in range(0, len(keys), DEL_KEYS)
                ]
            nonce = wire.new_nonce()
            last = wire.sentinel_command(nonce) if cursor == b"0" else scan(cursor)
            yield Send((*unlinks, last))
            for _ in unlinks:
                n = yield from wire.read_count(reader, "UNLINK")
                if isinstance(n, ErrorReply):
                    if one_key_each and n.code in ("MOVED", "ASK"):
                        continue  # the key's slot moved: the node holding it now has it
                    raise wire.refusal(n, where)
                removed[0] += n
            if cursor == b"0":
                yield from wire.read_sentinel(reader, nonce, where)
                return removed[0]
            cursor, keys = yield from _read_scan(reader, where)

    return plan
