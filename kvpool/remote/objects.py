"""What stores do with memory objects: hold them over I/O, encode them, allocate destinations.

Copies and lifetimes
--------------------
A store never copies an object's bytes in Python: ``put`` hands the
object's ``byte_array`` (a memoryview of the pool memory) to the kernel
(``writev``, ``sendall``), and ``get`` reads straight into the
``byte_array`` of a newly allocated object (``preadv``, ``recv_into``).
While the I/O runs the store holds a reference on the object
(``ref_count_up`` ... ``ref_count_down``), so its memory cannot go back
to the pool underneath the I/O.

A ``get`` that fails - a truncated or corrupted entry, a layout that does
not match, a lost connection - frees the object it allocated before it
raises: nothing half-written is ever returned and nothing leaks.

Letting go of views
-------------------
A view of an object's bytes (its ``byte_array``, a slice of it, a cffi
buffer over it) keeps those bytes from going back to the pool, whatever
happened to the object (:mod:`kvpool.pool.lease`).  So no view a store
takes may outlive the call that took it: a miss, a corrupt entry or a
failed put would leave pool bytes held past the call, and strict mode
would raise ``ViewsOutliveHandleError`` at the free.  A call's views sit
in its own locals and in the locals of the frames an error went through,
which the exception's traceback keeps for as long as anyone keeps the
exception (a slice in a callee, a cffi buffer over the view, a request
built from it).  Two places let go of them:

* a ``get`` frees a destination it will not return with :func:`discard`,
  naming the views it took of it.  ``discard`` first clears the finished
  frames of the exception its caller is handling, if any (:func:`let_go`),
  then releases the named views (``memoryview.release()`` disarms every
  reference to a view object at once: a local, an argument, a tuple, a
  closure), then frees the object: its bytes are back in the pool before
  the call returns, and the free is not one under live views.
* a ``put`` holds views of the caller's object.  When it fails, its
  exception leaves the store through the store's boundary (the counting
  wrapper every :class:`~kvpool.remote.base.RemoteStore` operation has,
  the put wrapper of :class:`~kvpool.remote.aiobase.AsyncRemoteStore`),
  which calls :func:`let_go` on it: the call's finished frames are
  cleared, and the caller's next ``ref_count_down`` frees the object as
  if the put had never run.

Only frames below the caller's are cleared: an exception some frame up
the stack was already handling when the store was called is left alone,
with everything chained to it.  Tracebacks keep every file and line;
only the locals of the failed call's finished frames are gone.  The
success path does none of this.

Kinds of objects
----------------
* Host objects of pools (one group or several): stored and read.
* ``BINARY_BUFFER`` destinations: an allocator that answers a
  ``BINARY_BUFFER`` request with a Python byte buffer
  (``MixedMemoryAllocator``) gets a ``BytesBufferMemoryObj`` of the
  entry's byte length, filled with its bytes.  A ``BytesBufferMemoryObj``
  cannot be *stored* (it has no shapes and dtypes to record): an
  ``InvalidArgumentError`` says so.
* Device objects (GPU memory): refused with ``FeatureUnavailableError``
  both ways (copy to or from a host object; the stores do not stage).
* ``GDSMemoryObject`` placeholders (their bytes live in a slab file):
  refused with ``FeatureUnavailableError`` both ways.
* Any other destination whose ``byte_array`` is not a writable host
  buffer of the entry's size is refused with ``InvalidArgumentError``
  and freed.
"""

from __future__ import annotations

import contextlib
import sys
import traceback
import zlib
from collections.abc import Callable
from types import FrameType

import torch

from kvpool.errors import (
    FeatureUnavailableError,
    InvalidArgumentError,
    InvalidHandleError,
    KVPoolError,
    OutOfMemoryError,
)
from kvpool.formats import MemoryFormat
from kvpool.pool.handle import TensorMemoryObj
from kvpool.pool.interface import MemoryAllocatorInterface
from kvpool.pool.objects import MemoryObj
from kvpool.pool.placeholders import BytesBufferMemoryObj, GDSMemoryObject
from kvpool.remote.header import Layout, encode_header, layout_for

__all__ = [
    "allocate",
    "allocator_for",
    "describe",
    "destination",
    "discard",
    "encode_entry",
    "hold",
    "let_go",
    "release",
]


def hold(obj: object, action: str) -> None:
    """Take a reference on ``obj`` for the duration of an I/O.

    Raises:
        InvalidArgumentError: ``obj`` is not a memory object.
        InvalidHandleError: ``obj`` was freed (nothing is held then).
    """
    if obj.__class__ is not TensorMemoryObj:
        if not isinstance(obj, MemoryObj):
            raise InvalidArgumentError(f"{action}: expected a MemoryObj, got {type(obj).__name__}")
        if isinstance(obj, GDSMemoryObject):
            raise FeatureUnavailableError(
                f"{action} of {obj!r}: a GDSMemoryObject's bytes live in its GPUDirect-Storage "
                "slab file, not in memory; read them into a host object first"
            )
        if isinstance(obj, BytesBufferMemoryObj):
            raise InvalidArgumentError(
                f"{action} of {obj!r}: a byte buffer object has no shapes and dtypes for the "
                "entry's header; allocate a BINARY object of torch.Size([n]) uint8 from a pool "
                "and copy the bytes into it"
            )
    if not obj.is_valid():
        raise InvalidHandleError(f"{action} of a freed memory object {obj!r}")
    obj.ref_count_up()
    # Freed between the check and the count (the count was then ignored).
    if not obj.is_valid():
        raise InvalidHandleError(f"{action} of a freed memory object {obj!r}")


def release(obj: MemoryObj) -> None:
    """Drop the reference :func:`hold` took (nothing if the object died meanwhile)."""
    if obj.is_valid():
        obj.ref_count_down()


def describe(obj: MemoryObj) -> tuple[Layout, MemoryFormat, memoryview]:
    """The layout, format and byte view of an object about to be stored.

    Raises:
        InvalidArgumentError: the object has no (shapes, dtypes) layout
            (e.g. a ``BytesBufferMemoryObj``).
        InvalidHandleError: the object was freed.
        FeatureUnavailableError: the object lives in device memory.
    """
    layout = layout_for(obj.get_shapes(), obj.get_dtypes())
    view = obj.byte_array
    if view.__class__ is not memoryview:
        view = memoryview(view)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    if view.nbytes > layout.nbytes:
        raise InvalidArgumentError(
            f"{obj!r} has {view.nbytes} bytes but its layout only {layout.nbytes}"
        )
    return layout, obj.get_memory_format(), view


def encode_entry(
    obj: MemoryObj, checksum: bool, key_tag: int | None = None
) -> tuple[bytes, memoryview]:
    """The header of ``obj``'s entry and the bytes that follow it (see :func:`describe`).

    Args:
        obj: the object about to be stored (held by the caller).
        checksum: record a CRC-32 of the payload (one pass over the bytes).
        key_tag: the store key's tag, for stores that record it.

    Raises:
        As :func:`describe`.
    """
    layout, fmt, view = describe(obj)
    crc = zlib.crc32(view) if checksum else None
    return encode_header(layout, fmt, view.nbytes, crc, key_tag), view


def discard(obj: MemoryObj | None, *views: memoryview | None) -> None:
    """Free an object a ``get`` allocated and will not return (a miss, an error).

    First lets go of every view of it the call holds (see the module
    notes): the caller's ``views`` (None ignored) are released, and the
    finished frames of the exception the caller is handling, if any, are
    cleared.  So its bytes go back to the pool now, and the free is not
    reported as one under live views.  An already dead object is ignored;
    placeholders that cannot be counted (``GDSMemoryObject``) are left alone.
    """
    if sys.exc_info()[1] is not None:  # the caller is handling or unwinding an error
        _let_go_handled(sys._getframe(1))
    for view in views:
        if view is not None:
            _release_view(view)
    if obj is not None and obj.is_valid():
        with contextlib.suppress(NotImplementedError):
            obj.ref_count_down()


def let_go(exc: BaseException | None) -> None:
    """Clear what the finished frames of a failed call's exception hold.

    For an exception the caller caught or collected (e.g. one per key of a
    batch) and will raise or drop: the locals of the frames it went
    through - views, cffi buffers, requests built over an object's bytes -
    are dropped, here and in the exceptions chained to it (``__cause__``,
    ``__context__``).  Frames still running (the caller's) are left as
    they are, and so is an exception that a frame above the caller was
    already handling when the store was called (and everything chained to
    it).  The traceback still shows every file and line.

    Complexity: O(frames of the tracebacks + depth of the stack); only
    error paths call it.
    """
    if exc is not None:
        _clear_frames(exc, sys._getframe(1))


def _let_go_handled(caller: FrameType) -> None:
    """:func:`let_go` of the exception ``caller`` itself is handling or unwinding, if any.

    ``sys.exc_info()`` also reports an exception some frame *above* the
    caller is handling (a store called from an ``except`` block); that one
    is the caller's caller's business, told apart by its traceback, whose
    first frame is the frame handling it.
    """
    handled = sys.exc_info()[1]
    if handled is not None:
        tb = handled.__traceback__
        if tb is not None and tb.tb_frame is caller:
            _clear_frames(handled, caller)


def _clear_frames(exc: BaseException, here: FrameType) -> None:
    above: set[int] | None = None
    seen: set[int] = set()
    todo = [exc]
    while todo:
        error = todo.pop()
        if id(error) in seen:
            continue
        seen.add(id(error))
        tb = error.__traceback__
        if tb is not None:
            if above is None:
                above = set()
                frame = here.f_back
                while frame is not None:
                    above.add(id(frame))
                    frame = frame.f_back
            if id(tb.tb_frame) in above:
                continue  # handled up the stack before this call: not ours
            traceback.clear_frames(tb)  # running frames (ours) are skipped
        if error.__cause__ is not None:
            todo.append(error.__cause__)
        if error.__context__ is not None:
            todo.append(error.__context__)


def _release_view(view: memoryview) -> None:
    # A view still exported (a buffer over it that is alive elsewhere)
    # cannot be released; the free that follows then reports it.
    with contextlib.suppress(BufferError):
        view.release()


def allocator_for(allocator: MemoryAllocatorInterface, key: bytes) -> MemoryAllocatorInterface:
    """The allocator of one key's destination: ``allocator`` itself, or its range for ``key``.

    An allocator with a ``for_key`` method (a
    :class:`~kvpool.remote.placement.Placement`) chooses each key's memory
    itself; every store asks here, per key, before it allocates.
    """
    for_key = getattr(allocator, "for_key", None)
    return allocator if for_key is None else for_key(key)  # type: ignore[no-any-return]


def allocate(
    allocator: MemoryAllocatorInterface,
    layout: Layout,
    fmt: MemoryFormat,
    where: str | Callable[[], str],
) -> MemoryObj:
    """Allocate the destination of a ``get``.

    ``where`` names the entry in the error message (a callable is only
    called on error).

    Raises:
        OutOfMemoryError: the allocator is full (``allocate`` returned None).
        PoolClosedError: the allocator was closed.
        InvalidArgumentError: the allocator refuses the layout.
    """
    try:
        obj = allocator.allocate(layout.alloc_shapes, layout.alloc_dtypes, fmt)
    except (MemoryError, OverflowError) as exc:
        if isinstance(exc, KVPoolError):
            raise
        obj = None  # e.g. a byte buffer allocator asked for an absurd size
    if obj is None:
        if callable(where):
            where = where()
        raise OutOfMemoryError(
            f"{where}: the allocator {allocator!r} has no room for an object of "
            f"{layout.nbytes} bytes; free objects or use a larger pool"
        )
    return obj


def destination(
    allocator: MemoryAllocatorInterface,
    layout: Layout,
    fmt: MemoryFormat,
    where: str | Callable[[], str],
) -> tuple[MemoryObj, memoryview]:
    """Allocate the destination of a ``get`` and its writable byte view.

    The view is a one-dimensional byte memoryview of exactly
    ``layout.nbytes`` bytes over the object's memory.  A byte buffer object
    returned for a ``BINARY_BUFFER`` request (whose first dimension is its
    length) is replaced by one of the layout's byte length.

    Raises:
        OutOfMemoryError / PoolClosedError / InvalidArgumentError: as :func:`allocate`.
        FeatureUnavailableError: the object lives in device memory or is a
            ``GDSMemoryObject`` (it is freed first).
        InvalidArgumentError: its bytes are not a writable host buffer of
            the layout's size (it is freed first).
    """
    obj = allocate(allocator, layout, fmt, where)
    view: memoryview | None = None
    if obj.__class__ is TensorMemoryObj:
        try:
            view = obj.byte_array
        except BaseException:
            discard(obj)
            raise
        if view.nbytes == layout.nbytes and not view.readonly:
            return obj, view
    elif isinstance(obj, BytesBufferMemoryObj) and obj.get_size() != layout.nbytes:
        flat = layout_for([torch.Size([layout.nbytes])], [torch.uint8])
        obj = allocate(allocator, flat, fmt, where)
    try:
        if isinstance(obj, GDSMemoryObject):
            raise FeatureUnavailableError(
                f"{where() if callable(where) else where}: the allocator gave a GDSMemoryObject, "
                "whose bytes live in a slab file; read into a host pool's object instead"
            )
        try:
            view = obj.byte_array
        except NotImplementedError as exc:
            raise FeatureUnavailableError(
                f"{where() if callable(where) else where}: {obj!r} has no byte view ({exc})"
            ) from None
        # A view of our own (a memoryview of a memoryview shares its buffer):
        # discard may release it, and an object's byte_array may be cached.
        view = memoryview(view)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        if view.readonly or view.nbytes != layout.nbytes:
            raise InvalidArgumentError(
                f"{where() if callable(where) else where}: the allocator gave {obj!r}, whose "
                f"byte_array is {'read-only' if view.readonly else f'{view.nbytes} bytes'}; "
                f"the entry needs a writable buffer of {layout.nbytes} bytes"
            )
    except BaseException:
        discard(obj, view)
        raise
    return obj, view
