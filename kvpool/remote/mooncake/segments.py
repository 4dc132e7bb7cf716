"""kvpool shared memory mounted as this process's share of a Mooncake Store.

A Mooncake client may contribute memory to the store: the master then
places replicas of entries in it, and other clients read and write it
through their transfer engines.  ``mount_segment`` of Mooncake's client
takes the *path* of a file to map; kvpool's POSIX shared memory is such a
file (``/dev/shm/<name>``).  So :class:`Segments` makes a kvpool
shared-memory buffer (populated, pinned as the machine allows, NUMA-bound
on request), hands its path to Mooncake, and keeps the buffer alive until
the segment is unmounted: the node's share of the store lives in memory
kvpool made and accounts for.

One owner only: the buffer is made here, for Mooncake, and is never a
pool's memory (a pool and Mooncake's allocator would both hand out its
bytes).  Mooncake maps the file itself, so closing kvpool's mapping after
the unmount, or a failed unmount, cannot leave Mooncake with freed memory.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import uuid
from typing import Any

import kvpool.remote.mooncake.codes as codes
from kvpool.checks import check_choice, check_optional_str
from kvpool.errors import InvalidArgumentError, PoolClosedError, RemoteStoreError
from kvpool.native.buffer import HostBuffer, allocate_host
from kvpool.native.limits import check_ram_bytes

__all__ = ["SHM_DIRECTORY", "MountedSegment", "Segments"]

#: Where POSIX shared-memory segments appear as files (glibc, Linux).
SHM_DIRECTORY = "/dev/shm"
#: Smallest segment: one 4 KiB page would hold no 512 KiB chunk; 1 MiB does.
_MIN_SEGMENT = 1 << 20
_names = itertools.count()
#: Pin modes a segment may ask for (shared memory is pinned by registering).
_PINS = {mode: mode for mode in ("auto", "none", "mlock", "cuda-register")}


class MountedSegment:
    """kvpool shared memory that Mooncake stores entries in.

    Made by :meth:`kvpool.remote.MooncakeStore.mount_segment`; unmounted by
    :meth:`unmount` or when the store closes (entries held only in it are
    lost then, as with any Mooncake segment that leaves).

    Attributes:
        segment_ids: Mooncake's ids of the mounted segment.
        buffer: kvpool's mapping of the same memory (read it to see the
            entries' bytes; do not write it while mounted).
    """

    def __init__(
        self, owner: Segments, buffer: HostBuffer, segment_ids: list[str], where: str
    ) -> None:
        self._owner = owner
        self.buffer = buffer
        self.segment_ids = list(segment_ids)
        self._where = where
        self._mounted = True

    @property
    def shm_name(self) -> str:
        """The shared-memory segment's name.

        The file Mooncake mapped is ``/dev/shm/<name without its leading '/'>``.
        """
        return self.buffer.shm_name or ""

    @property
    def size(self) -> int:
        """Bytes contributed to the store."""
        return self.buffer.size

    @property
    def mounted(self) -> bool:
        """True until :meth:`unmount` (or the store's close)."""
        return self._mounted

    def unmount(self) -> None:
        """Take the segment out of the store and free kvpool's buffer; idempotent.

        Raises:
            RemoteStoreError: Mooncake refused the unmount (the buffer is
                freed all the same: Mooncake's own mapping keeps its pages).
        """
        self._owner.unmount(self)

    def __repr__(self) -> str:
        state = "mounted" if self._mounted else "unmounted"
        return f"<MountedSegment {self.shm_name} {self.size} bytes {state}>"


class Segments:
    """The segments one store mounted (thread-safe).

    Args:
        client: the Mooncake client (``MooncakeDistributedStore``).
        protocol: the store's transfer protocol, ``"tcp"`` or ``"rdma"``.
    """

    def __init__(self, client: Any, protocol: str) -> None:
        self._client = client
        self._protocol = protocol
        self._lock = threading.Lock()
        self._mounted: list[MountedSegment] = []
        self._closed = False

    def mount(
        self,
        size: int,
        *,
        shm_name: str | None,
        numa_node: int | None,
        pin: str,
        where: str,
    ) -> MountedSegment:
        """Make ``size`` bytes of kvpool shared memory and mount them as a segment.

        Raises:
            InvalidArgumentError: size outside 1 MiB .. RAM, a bad name,
                node or pin mode.
            SharedMemoryExistsError: ``shm_name`` exists already.
            MemoryLimitError / OutOfMemoryError: the memory is not there.
            RemoteStoreError: Mooncake refused the mount (nothing is kept).
            PoolClosedError: the store closed while Mooncake mounted it (the
                segment is unmounted and freed again).
        """
        size = check_ram_bytes(
            "size", size, low=_MIN_SEGMENT, fix="a segment holds whole entries: 1 MiB up to RAM"
        )
        name = check_optional_str("shm_name", shm_name)
        pin = check_choice("pin", pin, _PINS)
        if name is None:
            name = f"/kvpool-mooncake-{os.getpid()}-{next(_names)}-{uuid.uuid4().hex[:8]}"
        buffer = allocate_host(size, shm_name=name, numa_node=numa_node, pin=pin)
        try:
            path = f"{SHM_DIRECTORY}/{name.lstrip('/')}"  # names may omit the '/'
            got = self._client.mount_segment(path, size, 0, self._protocol)
            got = got if isinstance(got, dict) else {}
            rc = int(got.get("ret", -1))
            ids = [str(i) for i in got.get("segment_ids", ())]
            if rc != 0 or not ids:
                raise codes.error_for(rc if rc < 0 else -1, f"{where}: mount_segment of {path}")
        except BaseException:
            buffer.close()
            raise
        segment = MountedSegment(self, buffer, ids, where)
        with self._lock:
            closing = self._closed
            if not closing:
                self._mounted.append(segment)
        if closing:  # the store closed while Mooncake mounted it: take it out again
            segment._mounted = False
            with contextlib.suppress(RemoteStoreError):
                self._unmount_now(segment)
            raise PoolClosedError(f"{where}: the store was closed during the mount")
        return segment

    def unmount(self, segment: MountedSegment) -> None:
        """Unmount ``segment`` (idempotent); see :meth:`MountedSegment.unmount`.

        Raises:
            InvalidArgumentError: the segment belongs to another store.
            RemoteStoreError: Mooncake refused (the buffer is freed anyway).
        """
        if not isinstance(segment, MountedSegment) or segment._owner is not self:
            raise InvalidArgumentError(
                f"{segment!r} is not a segment this store mounted; unmount it on its own store"
            )
        with self._lock:
            if not segment._mounted:
                return
            segment._mounted = False
            self._mounted.remove(segment)
        self._unmount_now(segment)

    def _unmount_now(self, segment: MountedSegment) -> None:
        try:
            rc = self._client.unmount_segment(segment.segment_ids, 0)
        finally:
            segment.buffer.close()
        if rc != 0:
            raise RemoteStoreError(
                f"{segment._where}: Mooncake refused to unmount {segment.shm_name} "
                f"(code {rc}); its memory was freed on kvpool's side"
            )

    def mounted(self) -> list[MountedSegment]:
        """The segments mounted now."""
        with self._lock:
            return list(self._mounted)

    def close(self) -> None:
        """Unmount every segment, and any that a mount still in progress adds; no errors."""
        with self._lock:
            self._closed = True
        for segment in self.mounted():
            with contextlib.suppress(RemoteStoreError):
                self.unmount(segment)
