"""MooncakeStore: entries in a Mooncake Store, moved straight from and into pool memory.

Mooncake Store (``pip install 'kvpool[mooncake]'``) is the distributed
KV-cache engine of Mooncake: a master keeps the key -> replica map, storage
nodes (``mooncake_client`` processes, or any client that contributes a
segment) hold the bytes, and a transfer engine moves them over TCP or RDMA.
kvpool builds on it and adds nothing distributed of its own.

Each entry is one Mooncake object, ``prefix + key``, holding kvpool's
header (:mod:`kvpool.remote.header`) followed by the object's bytes, so a
reader checks the same header as with every other store.

How the bytes move
------------------
* **Registration.**  The memory of each pool an object comes from is
  registered with Mooncake's transfer engine once (``register_buffer`` of
  the pool's whole range, on first use) and deregistered when the pool
  closes (the pool's close hook) or the store closes.  RDMA needs it; over
  TCP it is what lets the engine read and write the memory in place.
* **Storage.**  :meth:`MooncakeStore.mount_segment` contributes kvpool
  shared memory (populated, pinned, NUMA-bound on request) as a segment of
  this client, so this node's share of the store lives in kvpool memory
  (:mod:`kvpool.remote.mooncake.segments`).
* **put** hands Mooncake two buffers per entry - the header, written into
  a small registered header slot, and the object's memory by address - as
  one object (``batch_put_from_multi_buffers``), after one
  ``batch_is_exist`` for the batch.  The object's bytes are never copied
  in Python.
* **headerless** (``headerless=True``): an entry is the object's bytes
  alone, one buffer instead of two, read only with the layout given; what
  that gives up is listed in :mod:`kvpool.remote.mooncake.raw`; such a
  store also moves registered host ranges as they are (:mod:`~kvpool.remote.mooncake.ranges`).
* **get** with a known layout and format allocates the object first and
  reads header and bytes in one call (``batch_get_into_multi_buffers``):
  the header lands in a header slot and is checked, the bytes land in the
  object.  Without a layout (or for an entry whose size differs from the
  requested layout, e.g. a narrowed object) it reads the header first
  (``get_size`` and a ranged read), allocates the stored layout, then reads
  the whole entry.  A failed get frees the object it allocated.

Replacing an entry (upsert)
---------------------------
``put`` replaces, like every kvpool store.  A Mooncake ``put`` keeps the
first value of a key, so a key that already exists (``batch_is_exist``
says so) is replaced with Mooncake's atomic
``upsert_parts``: readers see the old entry or the new one, never a gap or
a mix.  That call copies the entry once, in C++, through the client's
local buffer (``local_buffer_size``), so replacing an entry larger than it
raises :class:`~kvpool.errors.RemoteStoreError` saying so; new keys, the
common case for content-addressed KV caches, take the zero-copy path.
``replace=False`` (keys that name their content) skips the check and
keeps existing entries (:mod:`kvpool.remote.mooncake.ops`).

Leases and retries
------------------
After every read the master gives the reader a lease on the entry
(``--default_kv_lease_ttl``, 10 s by default) during which it cannot be
removed (``OBJECT_HAS_LEASE``); a read of an entry being written answers
``REPLICA_IS_NOT_READY``.  Both clear by themselves: ``delete`` and
``get`` retry them until ``timeout`` seconds have passed, then raise
:class:`~kvpool.errors.StoreTimeoutError`.

Errors
------
Mooncake's codes map to kvpool's errors (:mod:`kvpool.remote.mooncake.codes`):
``OBJECT_NOT_FOUND`` is ``None``/``False``, a stored entry larger than its
header says is :class:`~kvpool.errors.CorruptEntryError`, an unreachable
master or storage node :class:`~kvpool.errors.StoreConnectionError`, any
other code :class:`~kvpool.errors.RemoteStoreError` with the code and its
name.  A Mooncake call itself cannot be interrupted: ``timeout`` bounds
kvpool's retries, Mooncake's own RPC timeouts bound each call.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import torch

import kvpool.remote.mooncake.codes as codes
from kvpool.checks import check_bool, check_int, check_seconds, keywords_of, takes_keywords
from kvpool.errors import (
    CorruptEntryError,
    InvalidArgumentError,
    OutOfMemoryError,
    StoreTimeoutError,
)
from kvpool.formats import MemoryFormat
from kvpool.native.limits import check_ram_bytes
from kvpool.pool.interface import MemoryAllocatorInterface
from kvpool.pool.objects import MemoryObj
from kvpool.remote.base import (
    Key,
    RemoteStore,
    check_pairs,
    check_stored,
    get_request,
    key_bytes,
    key_list,
    prefix_bytes,
)
from kvpool.remote.header import EntryInfo, Layout, layout_for
from kvpool.remote.mooncake.client import connect, import_mooncake, parse_url, split_host_port
from kvpool.remote.mooncake.memory import HeaderSlabs, PoolRegions, Slab, address_of
from kvpool.remote.mooncake.ops import (
    FIRST_READ,
    Entry,
    check_read_header,
    read_header,
    rounds,
    write_entries,
)
from kvpool.remote.mooncake.ranges import RangeCalls
from kvpool.remote.mooncake.raw import raw_entry, raw_get
from kvpool.remote.mooncake.removal import remove_keys, remove_prefix
from kvpool.remote.mooncake.segments import MountedSegment, Segments
from kvpool.remote.objects import allocator_for, destination, discard, encode_entry, hold, release

__all__ = ["MAX_REPLICAS", "MooncakeStore"]

#: Most copies of an entry a store may ask Mooncake to keep.
MAX_REPLICAS = 1024


class MooncakeStore(RemoteStore, RangeCalls):
    """A store of entries in a Mooncake Store (see the module docstring).

    Args:
        master: the master's RPC address, ``host:port``.
        metadata: the transfer engine's metadata service:
            ``http://host:port/metadata`` (e.g. the master's built-in one,
            ``--enable_http_metadata_server``), ``etcd://host:port`` or
            ``P2PHANDSHAKE``; default ``http://<master host>:8080/metadata``.
        protocol: ``"tcp"`` or ``"rdma"``.
        device: RDMA device name(s), e.g. ``"mlx5_0"`` (``""`` for TCP).
        local_hostname: the address other nodes reach this process at
            (default: the local address that routes to the master).
        replicas: copies Mooncake keeps of each entry.
        segment_size: bytes of memory this process contributes to the store
            (0: it only reads and writes, storage nodes hold the bytes).
        local_buffer_size: bytes of the client's local buffer (what an
            upsert copies through; the largest entry that can be replaced).
        prefix: prepended to every key (namespaces kvpool's entries).
        checksum: record a CRC-32 of every payload on ``put`` (checked on
            ``get`` whenever an entry has one).
        timeout: seconds kvpool retries a lease or a not-ready entry, and
            waits for the master to accept a connection at start.
        client: an already set up ``MooncakeDistributedStore`` to use
            instead of making one (the store does not close it); the other
            connection arguments are then ignored.
        headerless: store each entry as the object's bytes alone, without
            kvpool's header (one Mooncake buffer per entry instead of two);
            ``get`` then needs shapes, dtypes and fmt and checks only the
            stored size: no layout, format or CRC check, no narrowed
            objects, no ``head`` (:mod:`kvpool.remote.mooncake.raw`).
        replace: a put replaces an existing entry (True, every store's
            contract).  False: it leaves it as it is, with no existence
            check (a key named twice in a batch keeps its first object).

    Raises:
        FeatureUnavailableError: Mooncake's client is not installed.
        InvalidArgumentError: a bad argument; ``checksum`` with ``headerless``.
        StoreConnectionError: the master cannot be reached, or setup failed.

    Thread safety: every call may run from several threads at once (the
    Mooncake client is thread-safe and releases the GIL during transfers).
    """

    def __init__(
        self,
        master: str = "127.0.0.1:50051",
        *,
        metadata: str | None = None,
        protocol: str = "tcp",
        device: str = "",
        local_hostname: str | None = None,
        replicas: int = 1,
        segment_size: int = 0,
        local_buffer_size: int = 64 << 20,
        prefix: Key = "kvpool:",
        checksum: bool = False,
        timeout: float = 5.0,
        client: Any = None,
        headerless: bool = False,
        replace: bool = True,
    ) -> None:
        super().__init__(1)
        _, config_cls = import_mooncake()
        self.headerless = check_bool("headerless", headerless)
        self.replace = check_bool("replace", replace)
        if self.headerless and checksum:
            raise InvalidArgumentError(
                "checksum=True records a CRC in the entry's header, and a headerless store "
                "writes none: choose one"
            )
        timeout = check_seconds("timeout", timeout)  # type: ignore[assignment]
        replicas = check_int("replicas", replicas, low=1, high=MAX_REPLICAS)
        # Mooncake allocates both at set-up: more than this machine's RAM
        # could only fail there, less clearly (or abort the process).
        segment_size = check_ram_bytes("segment_size", segment_size)
        local_buffer_size = check_ram_bytes("local_buffer_size", local_buffer_size)
        if not isinstance(protocol, str) or protocol not in ("tcp", "rdma"):
            raise InvalidArgumentError(f"protocol must be 'tcp' or 'rdma', got {protocol!r}")
        if not isinstance(device, str):
            raise InvalidArgumentError(f"device must be a str, got {device!r}")
        self._prefix = key_bytes(prefix)
        self._checksum = check_bool("checksum", checksum)
        self.timeout = float(timeout)
        self.local_buffer_size = local_buffer_size
        self._config = config_cls()
        self._config.replica_num = replicas
        host, port = split_host_port(master, "master")
        self.server = f"mooncake://{host}:{port}"
        self._owns_client = client is None
        if client is None:
            client = connect(
                host,
                port,
                metadata=metadata,
                protocol=protocol,
                device=device,
                local_hostname=local_hostname,
                segment_size=segment_size,
                local_buffer_size=local_buffer_size,
                timeout=self.timeout,
            )
        self.client = client
        self._slabs = HeaderSlabs(client)
        self._regions = PoolRegions(client)
        self._segments = Segments(client, protocol)
        self._writing = (self._config, self.timeout, local_buffer_size, self.replace)

    @classmethod
    @takes_keywords(keywords_of(__init__, skip=2) or ())  # the master comes from the URL
    def from_url(cls, url: str, **options: Any) -> MooncakeStore:
        """A store from ``mooncake://MASTER:PORT?metadata=...&protocol=tcp&...``.

        The query may carry any keyword of the constructor except
        ``client`` (sizes in bytes, ``timeout`` in seconds, ``checksum``
        ``0``/``1``); ``options`` adds the others.

        Raises:
            InvalidArgumentError: a malformed URL, or an option given twice.

        Otherwise it raises what the constructor raises.
        """
        master, parsed = parse_url(url)
        twice = sorted(set(parsed) & set(options))
        if twice:
            raise InvalidArgumentError(
                f"{', '.join(twice)} given both in the URL {url!r} and as keyword argument(s)"
            )
        return cls(master, **parsed, **options)

    # -- plumbing ----------------------------------------------------

    def _mkey(self, kb: bytes) -> str:
        # latin-1 maps each byte to one code point: any bytes key, one name.
        return (self._prefix + kb).decode("latin-1")

    def object_key(self, key: Key) -> str:
        """The Mooncake key the entry ``key`` lives under (``prefix + key``, bytes as latin-1).

        For tools that talk to Mooncake directly (e.g. a forced
        ``client.remove(store.object_key(k), True)``).
        """
        return self._mkey(key_bytes(key))

    def _where(self, action: str, kb: bytes | None) -> str:
        if kb is None:
            return f"{action} on {self.server}"
        return f"{action} {kb!r} on {self.server}"

    def registered_regions(self) -> list[tuple[int, int]]:
        """``(address, nbytes)`` of each pool range registered with Mooncake now."""
        return self._regions.registered()

    def register_memory(self, memory: Any, nbytes: int | None = None) -> tuple[int, int]:
        """Register a long-lived host range (a CPU tensor, a writable buffer or an address) once.

        Objects inside it then skip the per-call register/unregister that memory of an
        allocator without ``memory_region()`` (e.g. LMCache's) pays; :meth:`close` drops
        it.  Args/returns/raises: :meth:`~kvpool.remote.mooncake.memory.PoolRegions.add_range`.
        """
        self._check_open()
        return self._regions.add_range(memory, nbytes, self._where("register_memory", None))

    def unregister_memory(self, memory: Any) -> None:
        """Deregister a range :meth:`register_memory` registered (its tensor or address).

        Raises:
            InvalidArgumentError: no such range; ArgumentTypeError: a bad ``memory``.
        """
        self._regions.remove_range(memory, self._where("unregister_memory", None))

    def mount_segment(
        self,
        size: int,
        *,
        shm_name: str | None = None,
        numa_node: int | None = None,
        pin: str = "auto",
    ) -> MountedSegment:
        """Contribute ``size`` bytes of kvpool shared memory to the store.

        kvpool makes a POSIX shared-memory buffer (populated, pinned as
        ``pin`` says, bound to ``numa_node`` if given) and Mooncake mounts
        its file (``/dev/shm/<name>``) as a segment of this client: the
        master may then place entries of any client in it.  The segment is
        this store's until :meth:`MountedSegment.unmount` or :meth:`close`
        (entries held only in it are lost then).  O(size) to populate.

        Args:
            size: bytes, 1 MiB up to the host's RAM.
            shm_name: the segment's name ('/' then 1..255 characters);
                default a fresh ``/kvpool-mooncake-<pid>-...`` name.
            numa_node: bind the memory to this node.
            pin: "auto" (cudaHostRegister with CUDA, else mlock where the
                limit allows), "none", "mlock" or "cuda-register".

        Returns:
            The :class:`~kvpool.remote.mooncake.segments.MountedSegment`.

        Raises:
            InvalidArgumentError: a bad size, name, node or pin mode.
            SharedMemoryExistsError: ``shm_name`` exists already.
            MemoryLimitError / OutOfMemoryError: the memory is not there.
            PoolClosedError: the store was closed.
            RemoteStoreError: Mooncake refused the mount (nothing is kept).
        """
        self._check_open()
        return self._segments.mount(
            size,
            shm_name=shm_name,
            numa_node=numa_node,
            pin=pin,
            where=self._where("mount_segment", None),
        )

    def mounted_segments(self) -> list[MountedSegment]:
        """The segments this store mounted and has not unmounted."""
        return self._segments.mounted()

    # -- put ---------------------------------------------------------

    def put(self, key: Key, memory_obj: MemoryObj) -> None:
        """Store ``memory_obj`` under ``key``, replacing any entry (see the module docstring).

        Raises:
            InvalidArgumentError: bad key or object.
            InvalidHandleError: the object was freed.
            PoolClosedError: the store was closed.
            StoreConnectionError: the master or a storage node cannot be reached.
            StoreTimeoutError: the entry stayed busy for ``timeout`` seconds.
            RemoteStoreError: Mooncake refused (e.g. no space), with its code.
        """
        self.batched_put([key], [memory_obj])

    def batched_put(self, keys: Sequence[Key], memory_objs: Sequence[MemoryObj]) -> None:
        """Store each object under its key: one reservation, one transfer, one seal for all.

        Each entry is written whole or not at all; after an error, which
        entries of the batch were written is unspecified.

        It raises what :meth:`put` raises; the lists differing in length is an
        ``InvalidArgumentError`` (nothing is stored).
        """
        check_pairs(keys, memory_objs)
        kbs = key_list(keys)
        self._check_open()
        if not kbs:
            return
        held: list[MemoryObj] = []
        temporary: list[tuple[int, int] | None] = []
        slab: Slab | None = None
        try:
            for obj in memory_objs:
                hold(obj, "batched_put" if len(kbs) > 1 else "put")
                held.append(obj)
            encode = raw_entry if self.headerless else encode_entry
            described = [encode(obj, self._checksum) for obj in held]
            slab = self._slabs.take(sum(len(h) for h, _ in described))
            entries = []
            off = 0
            for kb, obj, (header, view) in zip(kbs, held, described, strict=True):
                end = off + len(header)
                slab.view[off:end] = header
                address = address_of(obj, view)
                temporary.append(self._regions.ensure(obj, address, view.nbytes))
                where = self._where("put", kb)
                slot = slab.view[off:end]
                entries.append(Entry(where, self._mkey(kb), slot, slab.ptr + off, view, address))
                off = end
            write_entries(self.client, entries, *self._writing)
        finally:
            if slab is not None:
                self._slabs.give(slab)
            for reg in temporary:
                self._regions.release_temporary(reg)
            for obj in held:
                release(obj)

    # -- get ---------------------------------------------------------

    def get(
        self,
        key: Key,
        allocator: MemoryAllocatorInterface,
        shapes: torch.Size | Sequence[torch.Size] | None = None,
        dtypes: torch.dtype | Sequence[torch.dtype] | None = None,
        fmt: MemoryFormat | None = None,
    ) -> MemoryObj | None:
        """Read ``key`` into a new object (see :meth:`RemoteStore.get`).

        Raises:
            InvalidArgumentError: bad key or arguments; the stored layout
                or format differs from the requested one.
            CorruptEntryError: damaged header, wrong length, payload CRC
                mismatch, or an object kvpool did not write.
            OutOfMemoryError: the allocator is full.
            PoolClosedError: the allocator or the store was closed.
            StoreConnectionError / StoreTimeoutError / RemoteStoreError: as
                for :meth:`put`.
        """
        return self.batched_get([key], allocator, shapes, dtypes, fmt)[0]

    def batched_get(
        self,
        keys: Sequence[Key],
        allocator: MemoryAllocatorInterface,
        shapes: torch.Size | Sequence[torch.Size] | None = None,
        dtypes: torch.dtype | Sequence[torch.dtype] | None = None,
        fmt: MemoryFormat | None = None,
    ) -> list[MemoryObj | None]:
        """``get`` for each key; with a layout and a format, one read for the whole batch.

        Returns:
            One object (or None for a missing key) per key, in order.

        It raises what :meth:`get` raises; every object this call allocated is freed first.
        """
        kbs = key_list(keys)
        self._check_open()
        layout, fmt = get_request(allocator, shapes, dtypes, fmt)
        out: list[MemoryObj | None] = [None] * len(kbs)
        if not kbs:
            return out
        try:
            if self.headerless:
                names = [(self._mkey(kb), self._where("get", kb)) for kb in kbs]
                allocators = [allocator_for(allocator, kb) for kb in kbs]
                raw_get(
                    self.client, self._regions, names, allocators, layout, fmt, out, self.timeout
                )
                return out
            if layout is not None and fmt is not None:
                later = self._get_known(kbs, allocator, layout, fmt, out)
            else:
                later = list(range(len(kbs)))
            for i in later:
                out[i] = self._get_one(kbs[i], allocator, layout, fmt)
        except BaseException:
            for obj in out:
                discard(obj)
            raise
        return out

    def _get_known(
        self,
        kbs: list[bytes],
        allocator: MemoryAllocatorInterface,
        layout: Layout,
        fmt: MemoryFormat,
        out: list[MemoryObj | None],
    ) -> list[int]:
        """Read every entry of the requested size in one call; returns the keys left over."""
        hs, nbytes = layout.header_size, layout.nbytes
        total = hs + nbytes
        later: list[int] = []
        wanted: list[int] = []
        view_of: dict[int, memoryview] = {}
        for i, kb in enumerate(kbs):
            try:
                out[i], view_of[i] = destination(
                    allocator_for(allocator, kb), layout, fmt, lambda kb=kb: self._where("get", kb)
                )
            except OutOfMemoryError:  # full: the one-by-one path tells a miss from no room
                later.append(i)
            else:
                wanted.append(i)
        if not wanted:
            return later
        ptr_of = {i: address_of(out[i], view_of[i]) for i in wanted}  # type: ignore[arg-type]
        temporary: list[tuple[int, int] | None] = []
        slab = self._slabs.take(hs * len(wanted))
        try:
            for i in wanted:
                reg = self._regions.ensure(out[i], ptr_of[i], view_of[i].nbytes)  # type: ignore[arg-type]
                temporary.append(reg)
            mkeys = [self._mkey(kb) for kb in kbs]
            plain = layout.plain_header(fmt)
            # A key twice in one Mooncake batch is read once: one round per repeat.
            for part in rounds(mkeys, wanted):
                got = self.client.batch_get_into_multi_buffers(
                    [mkeys[i] for i in part],
                    [[slab.ptr + j * hs, ptr_of[i]] for j, i in enumerate(part)],
                    [[hs, nbytes]] * len(part),
                )
                for j, (i, rc) in enumerate(zip(part, got, strict=True)):
                    obj = out[i]
                    if rc == total:
                        header = slab.view[j * hs : (j + 1) * hs]
                        if header != plain:
                            where = self._where("get", kbs[i])
                            check_read_header(header, layout, fmt, view_of[i], where)  # type: ignore[arg-type]
                        continue
                    out[i] = None
                    discard(obj, view_of.pop(i))
                    if rc == codes.NOT_FOUND:
                        continue
                    if rc in (codes.BUFFER_TOO_SMALL, codes.TRANSFER_FAIL, codes.NOT_READY):
                        # Another size (narrowed, other layout), or being written.
                        later.append(i)
                        continue
                    raise codes.error_for(rc, self._where("get", kbs[i]))
        finally:
            self._slabs.give(slab)
            for reg in temporary:
                self._regions.release_temporary(reg)
        return sorted(later)

    def _get_one(
        self,
        kb: bytes,
        allocator: MemoryAllocatorInterface,
        layout: Layout | None,
        fmt: MemoryFormat | None,
    ) -> MemoryObj | None:
        """Header first, then the entry into an object of the stored layout."""
        where = self._where("get", kb)
        mkey = self._mkey(kb)
        backoff = codes.Backoff(self.timeout)
        slab = self._slabs.take(FIRST_READ)
        transfer_retries = 2  # reads again after a failed transfer of an unchanged size
        try:
            while True:
                try:
                    found = read_header(self.client, self._slabs, slab, mkey, where)
                except codes.Busy as busy:
                    if not backoff.wait():
                        raise codes.error_for(busy.code, where) from None
                    continue
                if found is None:
                    return None
                info, header, total = found
                check_stored(info, layout, fmt, where)
                hs = info.header_size
                if hs > slab.size:
                    self._slabs.give(slab)
                    slab = self._slabs.take(hs)
                stored = layout or layout_for(info.shapes, info.dtypes)
                placed = allocator_for(allocator, kb)
                obj, full = destination(placed, stored, fmt or info.fmt, where)
                view = None
                rc = codes.TRANSFER_FAIL
                try:
                    view = full[: info.size]
                    address = address_of(obj, view)
                    reg = self._regions.ensure(obj, address, view.nbytes)
                    try:
                        if info.size:
                            rc = self.client.batch_get_into_multi_buffers(
                                [mkey], [[slab.ptr, address]], [[hs, info.size]]
                            )[0]
                        else:
                            rc = self.client.batch_get_into([mkey], [slab.ptr], [hs])[0]
                    finally:
                        self._regions.release_temporary(reg)
                    if rc == total and slab.view[:hs] == header:
                        if info.payload_crc is not None and zlib.crc32(view) != info.payload_crc:
                            raise CorruptEntryError(f"{where}: payload CRC mismatch")
                        if info.size != info.layout_size:
                            obj.set_used_size(info.size)
                        return obj
                except BaseException:
                    discard(obj, view, full)
                    raise
                discard(obj, view, full)
                if rc == codes.NOT_FOUND:
                    return None
                # Replaced between the header and the read (another size, or
                # another header), or being written: read it again.
                changed = rc == total or rc in (codes.BUFFER_TOO_SMALL, codes.NOT_READY)
                if rc == codes.TRANSFER_FAIL:
                    # A same-size replace under the read fails as a lost node does.
                    changed = self.client.get_size(mkey) != total or transfer_retries > 0
                    transfer_retries -= 1
                if not changed or not backoff.wait():
                    if rc == total:
                        raise StoreTimeoutError(
                            f"{where}: the entry kept changing for {self.timeout} s"
                        )
                    raise codes.error_for(rc if rc < 0 else codes.TRANSFER_FAIL, where)
        finally:
            self._slabs.give(slab)

    # -- the rest ----------------------------------------------------

    def exists(self, key: Key) -> bool:
        """True when ``key`` exists in the store (see :meth:`RemoteStore.exists`)."""
        return self.batched_exists([key])[0]

    def batched_exists(self, keys: Sequence[Key]) -> list[bool]:
        """``exists`` for each key, in one call."""
        kbs = key_list(keys)
        self._check_open()
        if not kbs:
            return []
        found = self.client.batch_is_exist([self._mkey(kb) for kb in kbs])
        for kb, rc in zip(kbs, found, strict=True):
            if rc not in (0, 1):
                raise codes.error_for(rc if rc < -1 else -1, self._where("exists", kb))
        return [rc == 1 for rc in found]

    def delete(self, key: Key) -> bool:
        """Remove ``key``; a reader's lease is waited out for up to ``timeout`` seconds.

        Returns:
            True when the entry existed.

        Raises:
            StoreTimeoutError: a lease still holds the entry after ``timeout``.
            StoreConnectionError / RemoteStoreError: Mooncake failed.
        """
        return self.batched_delete([key]) == 1

    def batched_delete(self, keys: Sequence[Key]) -> int:
        """Remove every key (one call, leased ones retried); returns how many existed.

        It raises what :meth:`delete` raises.
        """
        kbs = key_list(keys)
        self._check_open()
        if not kbs:
            return 0
        mkeys = [self._mkey(kb) for kb in kbs]
        where = self._where
        return remove_keys(self.client, mkeys, self.timeout, lambda i: where("delete", kbs[i]))

    def delete_prefix(self, prefix: Key) -> int:
        """Remove every entry whose key starts with ``prefix``; how many were removed.

        As :meth:`RemoteStore.delete_prefix`: one ``remove_by_regex`` of
        ``prefix`` under the store's ``prefix`` on the master (bounded by
        Mooncake's RPC timeout).  Entries a reader holds a lease on - read
        or checked within the master's lease, 10 s by default - stay
        (:mod:`kvpool.remote.mooncake.removal`); call again after it.
        """
        pb = prefix_bytes(prefix)
        self._check_open()
        return remove_prefix(self.client, self._mkey(pb), self._where("delete_prefix", pb))

    def head(self, key: Key) -> EntryInfo | None:
        """The stored header of ``key`` (see :meth:`RemoteStore.head`).

        Raises:
            CorruptEntryError: damaged header, wrong length, or an object
                kvpool did not write.
        """
        kb = key_bytes(key)
        self._check_open()
        where = self._where("head", kb)
        if self.headerless:
            raise InvalidArgumentError(f"{where}: a headerless store writes no header to read")
        slab = self._slabs.take(FIRST_READ)
        backoff = codes.Backoff(self.timeout)
        try:
            while True:
                try:
                    found = read_header(self.client, self._slabs, slab, self._mkey(kb), where)
                    break
                except codes.Busy as busy:
                    if not backoff.wait():
                        raise codes.error_for(busy.code, where) from None
        finally:
            self._slabs.give(slab)
        return None if found is None else found[0]

    def _close(self) -> None:
        self._segments.close()
        self._regions.close()
        self._slabs.close()
        if self._owns_client:
            self.client.close()

    def __repr__(self) -> str:
        server = self.__dict__.get("server", "(not set up)")
        return f"<MooncakeStore {server}{' closed' if self.__dict__.get('_closed') else ''}>"
