"""One pool type: a backing (where the bytes are) times a placement policy.

:class:`MemoryPool` owns a :class:`~kvpool.pool.backing.Backing` and places
objects in it with an extent policy
(:class:`~kvpool.pool.extent.TensorMemoryAllocator`) or a paged one
(:class:`~kvpool.pool.paged.PagedTensorMemoryAllocator`).  It can also route
``BINARY_BUFFER`` requests to ordinary Python byte buffers.  The
reference API's allocator classes (:mod:`kvpool.allocators`) are thin
named constructions of this one class.

Lifecycle: ``close()`` is idempotent and ``with`` closes on exit.  It
invalidates every object of the pool and returns the memory; a view made
before (a ``byte_array`` slice, a tensor) keeps the mapping alive until it
is released, so nothing dangles.  Garbage collection of the pool is only
a backstop for close(): a live object keeps its pool alive, so the
backstop runs once the pool and all its objects are unreachable.

Thread safety: the placement policy's lock is the pool's one lock; the
pool adds none.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

import kvpool.native.limits as limits
import kvpool.pool.extent
import kvpool.pool.paged  # noqa: F401 - registers the paged policy
from kvpool.checks import (
    REQUIRED,
    check_batch_size,
    check_bool,
    check_int,
    check_power_of_two,
    check_size,
    refuse_in_place,
)
from kvpool.errors import (
    ArgumentTypeError,
    InvalidArgumentError,
    OutOfMemoryError,
    PoolClosedError,
    RequestTooLargeError,
)
from kvpool.formats import MAX_LAYOUT_BYTES, MemoryFormat, format_hint
from kvpool.misuse import ReportOnce
from kvpool.pool.backing import Backing
from kvpool.pool.handle import TensorMemoryObj
from kvpool.pool.interface import MemoryAllocatorInterface, PoolStats
from kvpool.pool.monitor import live_pools, register_pool
from kvpool.pool.objects import MemoryObj
from kvpool.pool.placeholders import BytesBufferMemoryObj
from kvpool.pool.policy import PlacementPolicy, PlacementSpec, check_object_list

__all__ = [
    "BUFFER_MIN_COST",
    "BUFFER_ROOM_CHECK",
    "TENSOR_FORMATS",
    "BufferAllocator",
    "MemoryPool",
    "check_align_bytes",
    "live_pools",
]


#: Formats a pool places in its own memory (BINARY_BUFFER goes to byte buffers).
TENSOR_FORMATS = frozenset(
    {
        MemoryFormat.KV_2LTD,
        MemoryFormat.KV_T2D,
        MemoryFormat.KV_2TD,
        MemoryFormat.KV_MLA_FMT,
        MemoryFormat.BINARY,
        MemoryFormat.EC_TD,
        MemoryFormat.HS_TD,
    }
)


#: What one byte buffer counts at least against a :class:`BufferAllocator`'s
#: bound (its Python objects), so that a batch of empty buffers is bounded too.
BUFFER_MIN_COST = 64

#: Byte-buffer requests from this size up are checked against the memory
#: that can still be made resident (:func:`kvpool.native.limits.headroom`).
BUFFER_ROOM_CHECK = 64 << 20


class BufferAllocator(MemoryAllocatorInterface):
    """Objects over fresh Python ``bytearray``s (``BINARY_BUFFER``).

    A request's length is the first dimension of its (first) shape, as in
    the reference API; the dtypes are ignored.

    Args:
        device: kept for the reference API; only "cpu" is meaningful.

    Attributes:
        max_bytes: the most bytes one call may allocate (a batch counts all
            its buffers, each at least :data:`BUFFER_MIN_COST` bytes): the
            machine's RAM (``MemTotal``), or what :meth:`bounded` was given.  A
            :class:`MemoryPool` that routes ``BINARY_BUFFER`` here
            (``MixedMemoryAllocator``) bounds it by its own size, so a byte
            buffer is never larger than the pool.

    A request beyond ``max_bytes`` returns None, as a full pool does, and is
    reported once (a warning; :class:`~kvpool.errors.RequestTooLargeError`
    in strict mode).
    """

    def __init__(self, device: str = "cpu") -> None:
        self.device = device
        #: The most bytes one call may allocate (see the class docstring).
        self.max_bytes = limits.host_ram() or MAX_LAYOUT_BYTES
        self._name = "BufferAllocator"
        self._report_too_large = ReportOnce()  # warned once per owner

    @classmethod
    def bounded(
        cls, max_bytes: int, *, name: str = "BufferAllocator", device: str = "cpu"
    ) -> BufferAllocator:
        """A buffer allocator whose calls allocate at most ``max_bytes`` each.

        Args:
            max_bytes: the bound, > 0.
            name: what its messages call it (the pool that routes to it).
            device: as in the constructor.

        Raises:
            InvalidArgumentError: ``max_bytes`` is not a positive int.
        """
        self = cls(device)
        self.max_bytes = check_size("max_bytes", max_bytes)
        self._name = name if isinstance(name, str) else "BufferAllocator"
        return self

    @staticmethod
    def _length(shapes: Any) -> int:
        """The requested length: the first dimension of the (first) shape."""
        shape = shapes
        if isinstance(shapes, list) and shapes and not isinstance(shapes[0], int):
            shape = shapes[0]
        if not isinstance(shape, (tuple, list)) or not shape:
            raise ArgumentTypeError(
                f"a byte buffer's shape must be a torch.Size (or a list of them) starting with "
                f"its length in bytes, got {type(shapes).__name__} {shapes!r}"
            )
        dims = [check_int("byte buffer dimension", d, low=0) for d in shape]
        if math.prod(dims) > MAX_LAYOUT_BYTES:
            raise InvalidArgumentError(
                f"the byte buffer shape {tuple(dims)} describes more than {MAX_LAYOUT_BYTES} "
                "elements (the int64 limit)"
            )
        return dims[0]

    def _fits(self, length: int, count: int, what: str) -> bool:
        """True when ``count`` buffers of ``length`` bytes are within the bound.

        Raises:
            MemoryLimitError: a request of :data:`BUFFER_ROOM_CHECK` bytes or
                more does not fit in what can be made resident now (a memory
                cgroup, the host's available RAM), so it is refused before
                Python zeroes it and the kernel kills the process.
        """
        cost = max(length, BUFFER_MIN_COST) * count
        if cost <= self.max_bytes:
            if cost >= BUFFER_ROOM_CHECK:  # big: would it fit now? (a few file reads)
                limits.headroom().check(cost, f"{what} of {count} byte buffer(s) of {length} bytes")
            return True
        message = (
            f"{what} of {count} byte buffer(s) of {length} bytes from {self._name} can never "
            f"succeed: more than its bound of {self.max_bytes} bytes; it returned None"
        )
        self._report_too_large(RequestTooLargeError, message)
        return False

    @staticmethod
    def _buffer(length: int) -> bytearray:
        try:
            return bytearray(length)
        except MemoryError:
            raise OutOfMemoryError(
                f"no memory for a byte buffer of {length} bytes; free objects or ask for less"
            ) from None

    def allocate(
        self,
        shapes: torch.Size | list[torch.Size] = REQUIRED,
        dtypes: torch.dtype | list[torch.dtype] = REQUIRED,
        fmt: MemoryFormat = MemoryFormat.BINARY_BUFFER,
        allocator_type: str | None = None,
        **unknown: Any,
    ) -> BytesBufferMemoryObj | None:
        """A zeroed byte buffer of ``shapes[0]`` bytes (the dtype is ignored).

        Returns:
            The object, or None when the length is beyond ``max_bytes``.

        Raises:
            InvalidArgumentError: the shape does not start with a length >= 0,
                or describes more than int64 elements.
            MemoryLimitError: a large buffer does not fit in the memory left
                (cgroup or host; an ``OutOfMemoryError``).
            OutOfMemoryError: the machine has no memory for it.
        """
        if unknown or shapes is REQUIRED or dtypes is REQUIRED:
            refuse_in_place(self, unknown, shapes, dtypes)
        n = self._length(shapes)
        if not self._fits(n, 1, "allocate"):
            return None
        return BytesBufferMemoryObj(self._buffer(n))

    def batched_allocate(
        self,
        shapes: torch.Size | list[torch.Size] = REQUIRED,
        dtypes: torch.dtype | list[torch.dtype] = REQUIRED,
        batch_size: int = REQUIRED,
        fmt: MemoryFormat = MemoryFormat.BINARY_BUFFER,
        allocator_type: str | None = None,
        **unknown: Any,
    ) -> list[BytesBufferMemoryObj] | None:
        """``batch_size`` zeroed byte buffers (None when beyond ``max_bytes``).

        Raises:
            InvalidArgumentError: bad shape or batch size.
            OutOfMemoryError: the machine has no memory for them (MemoryLimitError:
                large buffers that do not fit in the memory left).
        """
        if unknown or shapes is REQUIRED or dtypes is REQUIRED or batch_size is REQUIRED:
            refuse_in_place(self, unknown, shapes, dtypes, batch_size)
        n = self._length(shapes)
        check_batch_size(batch_size)
        if not self._fits(n, batch_size, "batched_allocate"):
            return None
        return [BytesBufferMemoryObj(self._buffer(n)) for _ in range(batch_size)]

    def free(
        self, memory_obj: MemoryObj = REQUIRED, allocator_type: str | None = None, **unknown: Any
    ) -> None:
        """Nothing to do: the buffer is garbage-collected."""
        if unknown or memory_obj is REQUIRED:
            refuse_in_place(self, unknown, memory_obj)

    def batched_free(
        self,
        memory_objs: list[MemoryObj] = REQUIRED,
        allocator_type: str | None = None,
        update_stats: bool = True,
        **unknown: Any,
    ) -> None:
        """Nothing to do: the buffers are garbage-collected."""
        if unknown or memory_objs is REQUIRED:
            refuse_in_place(self, unknown, memory_objs)

    def __str__(self) -> str:
        return "BufferAllocator"


def _check_formats(formats: object) -> frozenset[MemoryFormat]:
    """Validate the ``formats`` argument of a pool (an iterable of MemoryFormat)."""
    try:
        result = frozenset(formats)  # type: ignore[arg-type]
    except TypeError:
        raise ArgumentTypeError(
            f"formats must be an iterable of MemoryFormat, got {type(formats).__name__}"
        ) from None
    for fmt in result:
        if fmt.__class__ is not MemoryFormat:
            raise ArgumentTypeError(
                f"formats must hold MemoryFormat members, got {fmt!r}{format_hint(fmt)}"
            )
    return result


def check_align_bytes(align_bytes: object) -> int:
    """Validate an ``align_bytes`` argument.

    Raises:
        InvalidArgumentError: not a positive power of two.
    """
    return check_power_of_two("align_bytes", align_bytes)


class MemoryPool(MemoryAllocatorInterface):
    """A backing plus a placement policy, with one lock and a lifecycle.

    Args:
        backing: the memory (the pool owns it and closes it).
        placement: the placement policy over ``backing``, or the
            :class:`~kvpool.pool.policy.PlacementSpec` that builds one.
        byte_buffers: route ``BINARY_BUFFER`` requests to Python byte
            buffers (as the reference's MixedMemoryAllocator does).
        formats: the formats placed in the pool's memory (default: every
            tensor format); others raise.
        name: what ``str(pool)`` says (the reference class name).

    Attributes:
        allocator: the placement policy.
        buffer: the pool's memory as a flat ``uint8`` tensor.
        size: bytes of memory.
    """

    def __init__(
        self,
        backing: Backing,
        placement: PlacementSpec | PlacementPolicy,
        *,
        byte_buffers: bool = False,
        formats: Iterable[MemoryFormat] = TENSOR_FORMATS,
        name: str = "MemoryPool",
    ) -> None:
        # The one construction sequence of every pool: the policy over the
        # backing, and the backing closed if anything fails (nothing leaks).
        if not isinstance(backing, Backing):
            raise ArgumentTypeError(
                f"backing must be a kvpool Backing (HostBacking, TorchBacking...), got "
                f"{type(backing).__name__}"
            )
        try:
            if backing.closed:
                raise PoolClosedError(f"cannot build a pool over a closed backing {backing!r}")
            byte_buffers = check_bool("byte_buffers", byte_buffers)
            if not isinstance(name, str):
                raise ArgumentTypeError(f"name must be a str, got {type(name).__name__}")
            formats = _check_formats(formats)
            if isinstance(placement, PlacementPolicy):
                policy = placement
            elif isinstance(placement, PlacementSpec):
                policy = placement.build(backing.tensor, backing.view)
            else:
                raise ArgumentTypeError(
                    f"placement must be a PlacementSpec or a PlacementPolicy, got "
                    f"{type(placement).__name__}"
                )
            # No object may straddle two CUDA registrations of the memory.
            policy.respect_registrations(backing.registrations())
        except BaseException:
            backing.close()
            raise
        self.backing = backing
        self.allocator: Any = policy
        # The policy (which every live object references) keeps its pool
        # alive, so the garbage-collection backstop below never closes a
        # pool whose objects are still in use.
        policy.keep_alive = self
        policy.outer = self
        # Byte buffers are bounded by the pool's size (see BufferAllocator).
        self.buffer_allocator = (
            BufferAllocator.bounded(max(backing.size, BUFFER_MIN_COST), name=name)
            if byte_buffers
            else None
        )
        self._formats = formats
        self._name = name
        register_pool(self)

    # -- attributes of the reference API -------------------------------

    @property
    def buffer(self) -> torch.Tensor:
        """The pool's memory as a flat ``uint8`` tensor (zero-copy)."""
        return self.backing.tensor

    @property
    def size(self) -> int:
        """Bytes of memory."""
        return self.backing.size

    @property
    def address_manager(self) -> Any:
        """The policy's address manager (AddressManager or PagedAddressManager)."""
        return self.allocator.address_manager

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran (the policy's state: one flag, not two)."""
        return self.allocator.closed

    def get_paged_buffers(self) -> tuple[torch.Tensor, ...] | None:
        """One flat tensor per page for a paged pool (io_uring fixed buffers), else None."""
        if self.allocator.kind == "paged":
            return self.allocator.get_paged_buffers()
        return None

    @property
    def num_active_allocations(self) -> int:
        """Live objects in the pool's memory."""
        return self.allocator.num_active_allocations

    # -- allocation ----------------------------------------------------

    # The hot calls check their keywords in place (kvpool.checks.HOT_CALLS)
    # and reach the policy through the helpers below, never through each
    # other (nor super()): so do the subclasses' (IndexedPool,
    # LazyMemoryAllocator), and a call pays for two checks, the pool's and
    # the policy's, whatever the class.

    def _placer(self, fmt: object) -> MemoryAllocatorInterface:
        """The allocator placing ``fmt``: the policy, or the byte buffers; raise otherwise."""
        try:
            if fmt in self._formats:
                return self.allocator  # type: ignore[no-any-return]
        except TypeError:  # unhashable: not a format (refused below)
            pass
        else:
            if fmt is MemoryFormat.BINARY_BUFFER and self.buffer_allocator is not None:
                return self.buffer_allocator
        supported = sorted(f.name for f in self._formats)
        if self.buffer_allocator is not None:
            supported.append("BINARY_BUFFER")
        error = InvalidArgumentError if fmt.__class__ is MemoryFormat else ArgumentTypeError
        raise error(
            f"unsupported memory format {type(fmt).__name__} {fmt!r} for {self._name}; "
            f"supported: MemoryFormat.{', MemoryFormat.'.join(supported)}{format_hint(fmt)}"
        )

    def _is_byte_buffer(self, memory_obj: object) -> bool:
        """True for an object of the pool's byte buffers (freeing it needs nothing)."""
        return self.buffer_allocator is not None and isinstance(memory_obj, BytesBufferMemoryObj)

    def _pool_objects(self, memory_objs: object) -> Sequence[MemoryObj]:
        """The list argument of a batched free, validated, without byte-buffer objects."""
        objs = check_object_list(memory_objs, "batched_free")
        if self.buffer_allocator is None:
            return objs
        return [o for o in objs if not isinstance(o, BytesBufferMemoryObj)]

    def allocate(
        self,
        shapes: torch.Size | list[torch.Size] = REQUIRED,
        dtypes: torch.dtype | list[torch.dtype] = REQUIRED,
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        allocator_type: str | None = None,
        **unknown: Any,
    ) -> MemoryObj | None:
        """Allocate one object (see :meth:`TensorMemoryAllocator.allocate`).

        Returns:
            The object, or None when the pool is full.

        Raises:
            InvalidArgumentError: bad layout or unsupported format.
            PoolClosedError: the pool was closed.
        """
        if unknown or shapes is REQUIRED or dtypes is REQUIRED:
            refuse_in_place(self, unknown, shapes, dtypes)
        return self._placer(fmt).allocate(shapes, dtypes, fmt)

    def batched_allocate(
        self,
        shapes: torch.Size | list[torch.Size] = REQUIRED,
        dtypes: torch.dtype | list[torch.dtype] = REQUIRED,
        batch_size: int = REQUIRED,
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        allocator_type: str | None = None,
        **unknown: Any,
    ) -> list[MemoryObj] | None:
        """Allocate ``batch_size`` objects, all or nothing (None when full).

        Raises:
            InvalidArgumentError: bad layout, batch size or format.
            PoolClosedError: the pool was closed.
        """
        if unknown or shapes is REQUIRED or dtypes is REQUIRED or batch_size is REQUIRED:
            refuse_in_place(self, unknown, shapes, dtypes, batch_size)
        return self._placer(fmt).batched_allocate(shapes, dtypes, batch_size, fmt)

    def free(
        self, memory_obj: MemoryObj = REQUIRED, allocator_type: str | None = None, **unknown: Any
    ) -> None:
        """Give an object back now (normally the last ``ref_count_down`` does).

        Byte-buffer objects need nothing.

        Raises:
            InvalidHandleError: the object belongs to another pool.
        """
        if unknown or memory_obj is REQUIRED:
            refuse_in_place(self, unknown, memory_obj)
        if memory_obj.__class__ is not TensorMemoryObj and self._is_byte_buffer(memory_obj):
            return
        self.allocator.free(memory_obj)

    def batched_free(
        self,
        memory_objs: list[MemoryObj] = REQUIRED,
        allocator_type: str | None = None,
        update_stats: bool = True,
        **unknown: Any,
    ) -> None:
        """Free each object of the list once, each by its own kind.

        The list may mix byte-buffer objects and pool objects; the caller's
        list is not modified.

        Raises:
            InvalidHandleError: an object belongs to another pool.
        """
        if unknown or memory_objs is REQUIRED:
            refuse_in_place(self, unknown, memory_objs)
        self.allocator.batched_free(self._pool_objects(memory_objs))

    # -- state ---------------------------------------------------------

    def memcheck(self) -> bool:
        """Verify every invariant of the placement; True when all hold."""
        return self.allocator.memcheck()

    def stats(self) -> PoolStats:
        """A consistent snapshot of the pool's accounting (see :class:`PoolStats`).

        Raises:
            PoolClosedError: the pool was closed.
        """
        if self.closed:
            raise PoolClosedError(f"stats of a closed {self._name}")
        return self.allocator.stats()

    def describe(self) -> dict[str, Any]:
        """The backing's description plus the policy in use."""
        info = dict(self.backing.describe())
        info["policy"] = self.allocator.kind
        info["pool"] = self._name
        return info

    def memory_region(self) -> tuple[int, int] | None:
        """The policy's :meth:`~PlacementPolicy.memory_region` (where every object lives)."""
        return self.allocator.memory_region()

    def add_close_hook(self, hook: Callable[[], None]) -> Callable[[], None]:
        """The policy's :meth:`~PlacementPolicy.add_close_hook` (run by :meth:`close`)."""
        return self.allocator.add_close_hook(hook)

    def close(self) -> None:
        """Invalidate every object and return the memory.  Idempotent.

        Views made earlier (``byte_array`` slices, tensors) keep the
        mapping alive until they are released.
        """
        self.allocator.close()  # both idempotent and thread-safe
        self.backing.close()

    def __enter__(self) -> MemoryPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        # A backstop only: close() is the contract.
        allocator = getattr(self, "allocator", None)  # None: __init__ failed
        if allocator is not None and not allocator.closed:
            with contextlib.suppress(Exception):  # never raise from a finalizer
                self.close()

    def __str__(self) -> str:
        return self._name

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<{self._name} {state} {self.describe()}>"
