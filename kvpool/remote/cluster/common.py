"""What the blocking and the asyncio cluster stores share: routed operations and the routing.

A call of a cluster store is an :class:`Op` - per item (a key, or keys of
one slot) its slot, the parts of its command(s) and the parser of its
replies - run by :meth:`ClusterCommon._routing`, the decisions of the
router written once as a generator of requests:

* :class:`Refresh`: read the slot map again (``required``: the call
  cannot go on without one; otherwise a failure leaves the earlier
  errors standing);
* :class:`Groups`: run each node's group of items and fill ``results``
  with each item's value, :class:`~kvpool.remote.cluster.route.Redirect`
  or (kvpool) exception.

The blocking :class:`~kvpool.remote.cluster.store.RedisClusterStore`
serves the requests with lanes stepped side by side from one thread
(:class:`~kvpool.remote.cluster.route.Lane`); the asyncio
:class:`~kvpool.remote.cluster.aio.AsyncRedisClusterStore` with one task
per node on the event loop (:meth:`Op.lane_plan`).  Both therefore route,
redirect, retry and fail exactly alike; only the I/O differs.

The builders (``_put_op``, ``_get_op``, ...) make the op of each store
method, and the ``_*_result`` helpers turn its results into the method's
return value or error.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

import kvpool.remote.redis.wire as wire
from kvpool.errors import RemoteStoreError, StoreConnectionError
from kvpool.formats import MemoryFormat
from kvpool.pool.interface import MemoryAllocatorInterface
from kvpool.pool.objects import MemoryObj
from kvpool.remote.cluster.route import ASKING, Redirect, read_routed
from kvpool.remote.cluster.slots import Address, SlotMap, key_slot
from kvpool.remote.header import EntryInfo, Layout, key_tag
from kvpool.remote.objects import allocator_for, discard
from kvpool.remote.redis.common import SMALL_WINDOW, Plan, RedisCommon
from kvpool.remote.redis.connection import pipelined
from kvpool.remote.redis.resp import ErrorReply, ProtocolError, Reader, Steps, command

__all__ = [
    "DEL_KEYS",
    "ClusterCommon",
    "Groups",
    "Op",
    "Refresh",
    "free_object",
    "lane_failed",
    "lane_window",
]

#: Keys of one slot per ``DEL`` of ``batched_delete``.
DEL_KEYS = 256

#: A node's group: ``(address, asking)`` -> the indices of its items.
GroupMap = dict[tuple[Address, bool], list[int]]


class Op:
    """One kind of command of a routed call: per item, its slot, parts and reply parser.

    Args:
        slots: the slot of each item (a key, or keys of one slot).
        parts: ``(i, asking) -> parts`` of item ``i``'s command(s).
        parse: ``(reader, i) -> parser`` of its replies.
        replies: commands (and so replies) per item.
        window: items in flight at once in the call (shared by its lanes).
    """

    __slots__ = ("parse", "parts", "replies", "slots", "window")

    def __init__(
        self,
        slots: list[int],
        parts: Callable[[int, bool], list[Any]],
        parse: Callable[[Any, int], Any],
        replies: int,
        window: int,
    ) -> None:
        self.slots = slots
        self.parts = parts
        self.parse = parse
        self.replies = replies
        self.window = window

    def lane_parts(self, idx: list[int], asking: bool, nonce: bytes) -> Callable[[int], list[Any]]:
        """``j -> parts`` of a lane's ``j``-th item; the last carries the end-of-call marker."""
        last = len(idx) - 1
        parts = self.parts

        def parts_of(j: int) -> list[Any]:
            out = parts(idx[j], asking)
            return [*out, wire.sentinel_command(nonce)] if j == last else out

        return parts_of

    def lane_steps(self, reader: Any, idx: list[int], asking: bool) -> Callable[[int], Steps]:
        """``j -> parser`` of the replies of the ``j``-th item of a lane (redirects recognized)."""
        parse, replies = self.parse, self.replies

        def steps_of(j: int) -> Steps:
            i = idx[j]
            return read_routed(reader, lambda r: parse(r, i), replies, asking)

        return steps_of

    def lane_plan(self, idx: list[int], asking: bool, window: int, out: list[Any]) -> Plan:
        """One node's share of the call as a plan: pipelined, then the end-of-call marker.

        The replies are appended to ``out`` as they are read (so that on an
        error it holds what was read, e.g. objects to free).
        """
        nonce = wire.new_nonce()
        parts_of = self.lane_parts(idx, asking, nonce)

        def plan(reader: Reader) -> Steps:
            steps_of = self.lane_steps(reader, idx, asking)
            yield from pipelined(len(idx), parts_of, steps_of, window, out)
            yield from wire.read_sentinel(reader, nonce)
            return out

        return plan


@dataclass(frozen=True)
class Refresh:
    """Routing request: read the slot map again.

    Attributes:
        required: no map is known yet, so a failure is the call's error;
            otherwise the driver ignores a :class:`RemoteStoreError` (the
            earlier errors of the keys stand).
    """

    required: bool


@dataclass(frozen=True)
class Groups:
    """Routing request: run each group on a connection of its node.

    Attributes:
        groups: ``(address, asking) -> item indices``.
        results: where each item's value, redirect or error goes.
    """

    groups: GroupMap
    results: list[Any]


_UNSET = object()


def lane_window(window: int, lanes: int) -> int:
    """Items in flight per lane: the call's window shared by its lanes, at least one each."""
    return max(1, -(-window // max(1, lanes)))


def lane_failed(out: list[Any], idx: list[int], error: BaseException, results: list[Any]) -> None:
    """A failed lane's items get ``error``, but for the entries read before the failure.

    An entry (a :class:`MemoryObj`, its key tag checked) proves whose reply
    it was; a count, an ``+OK`` or a miss read before the lane's end-of-call
    marker may be a late copy of another command's reply (the marker is
    what would have told), so those items fail too.
    """
    for j, i in enumerate(idx):
        value = out[j] if j < len(out) else None
        results[i] = value if isinstance(value, MemoryObj) else error


class ClusterCommon(RedisCommon):
    """Ops and routing decisions of a cluster store (a mixin over :class:`RedisCommon`).

    The store provides ``_nodes`` (its :class:`~kvpool.remote.cluster.nodes.ClusterNodes`).
    """

    _nodes: Any

    # -- routing ------------------------------------------------------

    def _routing(self, action: str, op: Op) -> Generator[Refresh | Groups, None, list[Any]]:
        """The routing of one call, as requests for its driver (see the module docstring).

        Returns:
            Per item its value or a (kvpool) exception.
        """
        nodes = self._nodes
        if not nodes.has_map():
            yield Refresh(True)
        results: list[Any] = [_UNSET] * len(op.slots)
        first_map: SlotMap = nodes.slot_map()
        groups: GroupMap = {}
        for i, slot in enumerate(op.slots):
            owner = first_map.owner(slot)
            if owner is None:
                results[i] = StoreConnectionError(
                    f"{action} on {self.server}: no master serves slot {slot} (the cluster is "
                    "incomplete or a slot is being reassigned)"
                )
            else:
                groups.setdefault((owner, False), []).append(i)
        if groups:
            yield Groups(groups, results)
        # One second chance: redirects, and keys whose master could not be reached.
        moved = any(isinstance(r, Redirect) and not r.ask for r in results)
        failed = {i for i, r in enumerate(results) if isinstance(r, StoreConnectionError)}
        if moved or failed:
            yield Refresh(False)
        retry: GroupMap = {}
        new_map: SlotMap = nodes.slot_map()
        for i, r in enumerate(results):
            if isinstance(r, Redirect):
                retry.setdefault((r.address, r.ask), []).append(i)
            elif i in failed:
                owner = new_map.owner(op.slots[i])
                if owner is not None and owner != first_map.owner(op.slots[i]):
                    retry.setdefault((owner, False), []).append(i)
        if retry:
            yield Groups(retry, results)
        for i, r in enumerate(results):
            if isinstance(r, Redirect):
                results[i] = RemoteStoreError(
                    f"{action} on {self.server}: slot {r.slot} was redirected twice (to "
                    f"{r.address[0]}:{r.address[1]}); the cluster is resharding, try again"
                )
        return results

    @staticmethod
    def _raise_first(results: list[Any], keep: Callable[[Any], None] | None = None) -> None:
        """Raise the first error of ``results`` (after ``keep`` of each result, e.g. a free)."""
        errors = [r for r in results if isinstance(r, BaseException)]
        if not errors:
            return
        if keep is not None:
            for r in results:
                keep(r)
        first = errors[0]
        if len(errors) > 1:
            first.add_note(f"{len(errors) - 1} more key(s) of the call failed")
        raise first

    def _rkeys(self, kbs: list[bytes]) -> list[bytes]:
        prefix = self._prefix
        return [prefix + kb for kb in kbs]

    # -- the ops ------------------------------------------------------

    def _put_op(self, kbs: list[bytes], held: Sequence[MemoryObj], px: int | None) -> Op:
        """``SET`` of each held object under its key."""
        rkeys = self._rkeys(kbs)
        commands = [self._set_parts(kb, obj, px) for kb, obj in zip(kbs, held, strict=True)]
        window = self._window_for(sum(c[1].nbytes for c in commands) // len(commands))

        def parts(i: int, asking: bool) -> list[Any]:
            return [ASKING, *commands[i]] if asking else commands[i]

        return Op([key_slot(k) for k in rkeys], parts, _read_ok, 1, window)

    def _put_result(self, action: str, kbs: list[bytes], results: list[Any]) -> None:
        self._raise_first(results)
        self._raise_refusals(action, kbs, results)

    def _get_op(
        self,
        action: str,
        kbs: list[bytes],
        allocator: MemoryAllocatorInterface,
        layout: Layout | None,
        fmt: MemoryFormat | None,
    ) -> Op:
        """``GET`` of each key, read straight into a new object."""
        rkeys = self._rkeys(kbs)
        commands = [wire.get_command(k) for k in rkeys]
        server = self.server

        def parts(i: int, asking: bool) -> list[Any]:
            return [ASKING, commands[i]] if asking else [commands[i]]

        def parse(reader: Any, i: int) -> Any:
            where = f"{action} {kbs[i]!r} on {server}"
            return wire.read_entry(
                reader, where, key_tag(rkeys[i]), allocator_for(allocator, kbs[i]), layout, fmt
            )

        # Without a layout the entries' size is unknown: one in flight per master.
        window = self._window_for(layout.nbytes) if layout is not None else 1
        return Op([key_slot(k) for k in rkeys], parts, parse, 1, window)

    def _get_result(self, results: list[Any]) -> list[MemoryObj | None]:
        """The objects read; on any error every one of them is freed first."""
        self._raise_first(results, keep=free_object)
        return results

    def _count_op(self, commands: list[bytes], slots: list[int], what: str) -> Op:
        """Commands answered by a count (``EXISTS``, ``DEL``)."""

        def parts(i: int, asking: bool) -> list[Any]:
            return [ASKING, commands[i]] if asking else [commands[i]]

        def parse(reader: Any, i: int) -> Any:
            return wire.read_count(reader, what)

        return Op(slots, parts, parse, 1, SMALL_WINDOW)

    def _count_result(self, action: str, results: list[Any]) -> list[int]:
        self._raise_first(results)
        for reply in results:
            if isinstance(reply, ErrorReply):
                raise self._refused(reply, action, None)
        return results

    def _exists_op(self, kbs: list[bytes]) -> Op:
        rkeys = self._rkeys(kbs)
        commands = [wire.exists_command(k) for k in rkeys]
        return self._count_op(commands, [key_slot(k) for k in rkeys], "EXISTS")

    def _delete_op(self, kbs: list[bytes]) -> Op:
        """A ``DEL`` per slot, of at most :data:`DEL_KEYS` keys (``CROSSSLOT`` forbids more)."""
        by_slot: dict[int, list[bytes]] = {}
        for rkey in self._rkeys(kbs):
            by_slot.setdefault(key_slot(rkey), []).append(rkey)
        commands: list[bytes] = []
        slots: list[int] = []
        for slot, rkeys in by_slot.items():
            for j in range(0, len(rkeys), DEL_KEYS):
                commands.append(wire.del_command(*rkeys[j : j + DEL_KEYS]))
                slots.append(slot)
        return self._count_op(commands, slots, "DEL")

    def _head_op(self, kb: bytes, length: int) -> Op:
        """``EXISTS``/``STRLEN``/``GETRANGE`` of the first ``length`` bytes of one entry."""
        rkey = self._prefix + kb
        tag = key_tag(rkey)
        where = f"head {kb!r} on {self.server}"

        def parts(i: int, asking: bool) -> list[Any]:
            if not asking:
                return [wire.head_commands(rkey, length)]
            getrange = command(b"GETRANGE", rkey, b"0", b"%d" % (length - 1))
            return [
                ASKING, wire.exists_command(rkey),
                ASKING, command(b"STRLEN", rkey),
                ASKING, getrange,
            ]  # fmt: skip

        def parse(reader: Any, i: int) -> Any:
            return wire.read_head(reader, where, tag)

        return Op([key_slot(rkey)], parts, parse, 3, 1)

    @staticmethod
    def _head_result(results: list[Any]) -> EntryInfo | int | None:
        """The header, None (no entry), or the longer length to read the header again with."""
        (info,) = results
        if isinstance(info, BaseException):
            raise info
        return info  # type: ignore[no-any-return]

    def _head_grew(self, kb: bytes) -> ProtocolError:
        return ProtocolError(
            f"head {kb!r} on {self.server}: the header kept growing between two reads"
        )


def _read_ok(reader: Any, i: int) -> Any:
    return wire.read_ok(reader)


def free_object(value: Any) -> None:
    """Free ``value`` if it is a memory object (a ``get`` result nobody will receive)."""
    if isinstance(value, MemoryObj):
        discard(value)
