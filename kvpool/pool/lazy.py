"""A pool that is usable at once and grows to its full size in the background.

Pinning a large pool takes time (populating, mlock or cudaHostRegister:
about 0.1 s per GB even in parallel).  :class:`LazyMemoryAllocator`
reserves the whole address range once, without touching it, makes a
small first part resident and pinned, and lets a background thread do the
rest in fixed steps.  After each step the extent policy's address space
grows (``AddressManager.sbrk``), so allocations proceed from the start and
see more room as growth catches up; until then a request beyond the
current size returns None, as a full pool does.  Addresses never move.

Usable at once: with a small ``init_size`` (32 MiB is made resident and
pinned in about 12 ms here) a pool of any final size -- 64 GiB on a machine
with less RAM: the range is only reserved -- serves its first allocation
right after construction (``python -m kvpool.cli.bench.lazy_first``
measures it).

Growth stops safely at what the machine allows: before each step it reads
how much can still be made resident (:func:`kvpool.native.limits.headroom`:
each level of the memory cgroup and the available RAM, or the hugetlb
cgroup for hugetlb pages) and stops when the step would leave less than
``keep_free`` bytes; :meth:`kvpool.native.buffer.HostBuffer.commit` (and
libpinmem behind it) refuses a step beyond a limit itself too
(``MemoryLimitError``), which stops growth the same way.  Either way a
warning on the ``kvpool`` logger names the limit and its file,
:attr:`LazyMemoryAllocator.stopped_by` says why, :meth:`wait_ready` returns
False (it does not raise: the pool works, only smaller), and the pool keeps
the size it reached.  The first ``init_size`` bytes are checked in the
constructor, which raises ``MemoryLimitError`` when they do not fit.

Closing mid-growth stops the thread after its current step, then releases
everything; nothing leaks.

The constructor is LMCache 0.5.6's, ``LazyMemoryAllocator(init_size,
final_size, align_bytes, numa_mapping)``, and unlike LMCache's it works on
machines without an accelerator (memory is then mlocked where allowed, else
used unpinned).  As in LMCache, ``allocate``'s default format is
``UNDEFINED``.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import torch

import kvpool.native.calls as _native
import kvpool.native.limits as limits
from kvpool.checks import (
    REQUIRED,
    check_bool,
    check_int,
    check_seconds,
    check_size,
    refuse_in_place,
    takes_keywords,
)
from kvpool.errors import MemoryLimitError
from kvpool.formats import MemoryFormat
from kvpool.native.numa import resolve_numa_node
from kvpool.native.spec import HostSpec
from kvpool.native.units import format_bytes
from kvpool.pool.address import AddressManager
from kvpool.pool.backing import HostBacking, default_hugepages, pool_register_chunk
from kvpool.pool.objects import MemoryObj
from kvpool.pool.policy import PlacementSpec
from kvpool.pool.pools import TENSOR_FORMATS, MemoryPool, check_align_bytes

__all__ = ["LazyMemoryAllocator"]

logger = logging.getLogger("kvpool")


def _round_up(value: int, to: int) -> int:
    return (value + to - 1) // to * to


class LazyMemoryAllocator(MemoryPool):
    """Pinned extent pool that grows from ``init_size`` to ``final_size`` in the background.

    Args:
        init_size: bytes usable at once, in ``(0, final_size]``.
        final_size: final bytes of the pool, > 0.
        align_bytes: alignment of objects (a power of two).
        numa_mapping: bind to the node of the current GPU (calling CPU without
            GPUs); a :class:`~kvpool.NUMAMapping` or LMCache's.
        step_size: bytes added per growth step (default :attr:`COMMIT_SIZE`).
        use_hugepages: require 2 MiB hugepages.
        byte_buffers: route ``BINARY_BUFFER`` to Python byte buffers.
        start: start growing now (else call :meth:`start_growth`).
        keep_free: growth stops when a step would leave less than this many
            bytes that could still be made resident (default: 10% of the
            tightest memory limit - the container's cgroup limit, else RAM -
            at most 2 GiB); see :attr:`stopped_by`.

    Sizes are rounded up to the page size in use (4 KiB or 2 MiB); unlike
    LMCache, which rounds both sizes up to :attr:`PIN_CHUNK_SIZE`, the pool
    is exactly as large as asked.

    Raises:
        InvalidArgumentError: bad sizes.
        MemoryLimitError: ``init_size`` does not fit under a memory limit
            (cgroup, RAM); later steps that do not fit stop the growth instead.
        OutOfMemoryError: as :func:`kvpool.native.buffer.allocate_host`,
            whose other errors (hugepages, NUMA node, memlock) also apply.
    """

    #: LMCache pins growth in pieces of this size; kvpool pins each step in
    #: one commit, registered in chunks that are multiples of the alignment
    #: (no object straddles two registrations), so this is kept for
    #: LMCache's API only.
    PIN_CHUNK_SIZE = 1 << 26
    #: The default growth step: the usable space grows by this much at a time.
    COMMIT_SIZE = 1 << 30
    #: Growth progress is logged (INFO) every this many bytes, and at the end.
    LOG_INTERVAL = 10 << 30

    @takes_keywords()  # **kwargs keeps the reference's signature; it takes no option
    def __init__(
        self,
        init_size: int,
        final_size: int,
        align_bytes: int = AddressManager.ALIGN_BYTES,
        numa_mapping: Any = None,
        *,
        step_size: int | None = None,
        use_hugepages: bool = False,
        byte_buffers: bool = True,
        start: bool = True,
        keep_free: int | None = None,
        **kwargs: Any,
    ) -> None:
        if keep_free is None:
            # Relative to the limit that binds (a 1 GiB container keeps 100 MiB
            # free, not a tenth of the host's RAM, which it may never reach).
            tightest = limits.headroom(hugetlb=False).binding
            total = tightest.limit if tightest is not None else _native.probe()["mem_total"]
            keep_free = min(2 << 30, total // 10)
        self._keep_free = check_int("keep_free", keep_free, low=0)
        # The checkers return plain ints (numpy integers would overflow below).
        size = check_size("final_size", final_size)
        if step_size is None:
            step_size = self.COMMIT_SIZE
        step_size = check_size("step_size", step_size)
        align_bytes = check_align_bytes(align_bytes)
        start = check_bool("start", start)
        init_size = check_size("init_size", init_size, high=size, fix="0 < init_size <= final_size")
        # Reserved, not populated: the growth commits (populates and pins) it,
        # each step registered in chunks that are multiples of the alignment.
        spec = HostSpec(
            size,
            pin="none",
            populate=False,
            numa_node=resolve_numa_node(numa_mapping),
            hugepages="required"
            if check_bool("use_hugepages", use_hugepages)
            else default_hugepages(),
            register_chunk=pool_register_chunk(step_size, align_bytes),
        )
        backing = HostBacking(spec)
        try:
            page = backing.buffer.page_size
            # Growth works in whole pages that are also whole alignment units.
            unit = max(page, align_bytes)
            self._target = _round_up(size, page)
            self._step = _round_up(step_size, unit)
            first = min(_round_up(init_size, unit), self._target)
            backing.buffer.commit(0, first)
        except BaseException:
            backing.close()
            raise
        placement = PlacementSpec(
            "extent", align_bytes=align_bytes, init_address_space=min(first, size)
        )
        self._committed = first
        self._stop = threading.Event()
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._stopped_by: str | None = None
        self._thread: threading.Thread | None = None
        super().__init__(
            backing,
            placement,
            byte_buffers=check_bool("byte_buffers", byte_buffers),
            formats=TENSOR_FORMATS | {MemoryFormat.UNDEFINED},
            name="LazyMemoryAllocator",
        )
        if self._committed >= self._target:
            self._done.set()
        elif start:
            self.start_growth()

    # -- growth ----------------------------------------------------------

    def start_growth(self) -> None:
        """Start the background growth (no-op when running or finished)."""
        if self._done.is_set() or (self._thread is not None and self._thread.is_alive()):
            return
        self._thread = threading.Thread(target=self._grow, name="kvpool-lazy-grow", daemon=True)
        self._thread.start()

    def _room_for(self, step: int, hugetlb: bool) -> bool:
        """True when step bytes fit and keep_free bytes stay; else record why not."""
        binding = limits.headroom(hugetlb=hugetlb).binding
        if binding is None or binding.available - step >= self._keep_free:
            return True
        self._stopped_by = (
            f"{binding.describe()}: a step of {format_bytes(step)} would leave less than "
            f"keep_free={self._keep_free} bytes; {binding.fix}"
        )
        return False

    def _grow(self) -> None:
        buffer = self.backing.buffer  # type: ignore[attr-defined]
        am = self.allocator.address_manager
        logged = self._committed
        try:
            while self._committed < self._target and not self._stop.is_set():
                step = min(self._step, self._target - self._committed)
                if not self._room_for(step, buffer.kind == "hugetlb"):
                    break
                buffer.commit(self._committed, step)
                # The step's registrations are barriers before its space is used.
                self.allocator.respect_registrations(buffer.registrations())
                usable = min(self._committed + step, self.size) - am.get_heap_size()
                if usable > 0:
                    am.sbrk(usable)  # type: ignore[union-attr]
                self._committed += step
                done = self._committed >= self._target
                if done or self._committed - logged >= self.LOG_INTERVAL:
                    logger.info(
                        "LazyMemoryAllocator: %d of %d MiB resident and pinned (%s)",
                        self._committed >> 20,
                        self._target >> 20,
                        buffer.pinned,
                    )
                    logged = self._committed
        except MemoryLimitError as exc:  # the commit's own check: the same safe stop
            self._stopped_by = str(exc)
        except BaseException as exc:  # reported by wait_ready / grown state
            self._error = exc
            logger.error("LazyMemoryAllocator growth stopped at %d bytes: %s", self._committed, exc)
        finally:
            if self._stopped_by is not None:
                logger.warning(
                    "LazyMemoryAllocator stopped growing at %d of %d bytes: %s",
                    self._committed,
                    self._target,
                    self._stopped_by,
                )
            self._done.set()

    # -- LMCache's interface ---------------------------------------------

    def allocate(
        self,
        shapes: torch.Size | list[torch.Size] = REQUIRED,
        dtypes: torch.dtype | list[torch.dtype] = REQUIRED,
        fmt: MemoryFormat = MemoryFormat.UNDEFINED,
        allocator_type: str | None = None,
        **unknown: Any,
    ) -> MemoryObj | None:
        """Allocate one object (default format ``UNDEFINED``, as in LMCache).

        Returns:
            The object, or None while the grown space cannot hold it.
        """
        if unknown or shapes is REQUIRED or dtypes is REQUIRED:
            refuse_in_place(self, unknown, shapes, dtypes)
        # MemoryPool.allocate's work without its check (see MemoryPool._placer).
        return self._placer(fmt).allocate(shapes, dtypes, fmt)

    def batched_allocate(
        self,
        shapes: torch.Size | list[torch.Size] = REQUIRED,
        dtypes: torch.dtype | list[torch.dtype] = REQUIRED,
        batch_size: int = REQUIRED,
        fmt: MemoryFormat = MemoryFormat.UNDEFINED,
        allocator_type: str | None = None,
        **unknown: Any,
    ) -> list[MemoryObj] | None:
        """Allocate ``batch_size`` objects, all or nothing (default format ``UNDEFINED``)."""
        if unknown or shapes is REQUIRED or dtypes is REQUIRED or batch_size is REQUIRED:
            refuse_in_place(self, unknown, shapes, dtypes, batch_size)
        return self._placer(fmt).batched_allocate(shapes, dtypes, batch_size, fmt)

    def get_underlying_buffer(self) -> torch.Tensor:
        """The whole reserved range as a flat ``uint8`` tensor (for RDMA registration).

        Only the first :attr:`usable_bytes` are handed out so far.
        """
        return self.buffer

    def get_address_manager(self) -> AddressManager:
        """The address manager; its heap size is the space grown so far."""
        return self.allocator.address_manager  # type: ignore[no-any-return]

    @property
    def stopped_by(self) -> str | None:
        """Why growth stopped short of the full size at the machine's limit, or None."""
        return self._stopped_by

    @property
    def committed_bytes(self) -> int:
        """Bytes made resident and pinned so far."""
        return self._committed

    @property
    def usable_bytes(self) -> int:
        """Bytes the placement can hand out now."""
        return self.allocator.address_manager.get_heap_size()

    @property
    def growing(self) -> bool:
        """True while the background thread is still adding memory."""
        return not self._done.is_set()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until the pool has its full size.

        Returns:
            True when fully grown.  False when not: on timeout (``growing``
            is still True), or when growth stopped at a memory limit
            (:attr:`stopped_by` says which; the pool stays usable at
            ``usable_bytes``, and a warning was logged).

        Args:
            timeout: seconds to wait at most (a finite number >= 0; 0 does
                not wait), or None to wait for the growth to end.

        Raises:
            InvalidArgumentError: a bad timeout.
            Exception: the error that stopped the growth, if one other than
                a memory limit did (re-raised here).
        """
        finished = self._done.wait(
            check_seconds("timeout", timeout, allow_none=True, allow_zero=True)
        )
        if self._error is not None:
            raise self._error
        return finished and self._committed >= self._target

    def close(self) -> None:
        """Stop growing (after the current step), then release everything. Idempotent."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        super().close()
