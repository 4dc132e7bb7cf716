"""LMCache's memory and kvpool's stores: the allocator gets read into, the objects puts send.

Two memory modes, one connector:

* **kvpool memory** (:func:`kvpool.integrations.lmcache.install` ran):
  LMCache's ``LocalCPUBackend`` allocates kvpool objects, which the stores
  send and fill directly (their zero-copy paths).
* **LMCache's own memory**: its objects are not kvpool's.  A ``get``
  still reads straight into them (the stores fill any object whose
  ``byte_array`` is a writable host buffer of the right size); a ``put``
  sends a kvpool object built over the *same* bytes (:func:`sendable`,
  no copy), since the stores record a kvpool header and hold kvpool
  references.  :class:`MemoryFormat` members are translated by value.

Either way the only copy is the one a store makes into or out of the
object, as LMCache's own connectors make at least one.  With LMCache's
memory, :class:`Sender` wraps LMCache's whole CPU buffer once
(:func:`backend_buffer`) and lends each put's views from it, cheaper
than wrapping each object; with a Mooncake store,
:func:`register_backend_buffer` registers that buffer with Mooncake once
(as LMCache's own Mooncake connector does), so no call registers its
objects one by one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from lmcache.v1.memory_management import MemoryFormat as LMCacheFormat

from kvpool.errors import InvalidArgumentError, KVPoolError
from kvpool.formats import MemoryFormat
from kvpool.integrations.lmcache.remote_report import plugin_logger
from kvpool.pool.borrowed import BorrowedMemory, borrow
from kvpool.pool.objects import MemoryObj

__all__ = [
    "BackendAllocator",
    "Sender",
    "backend_buffer",
    "fits",
    "kvpool_format",
    "layer_layout",
    "register_backend_buffer",
    "sendable",
    "unsend",
]

#: True when LMCache's formats are kvpool's (install() ran before LMCache's import).
SAME_FORMATS = LMCacheFormat is MemoryFormat


#: LMCache's format members met so far, as kvpool's (an enum lookup by value costs ~1 µs).
_FORMATS: dict[Any, MemoryFormat] = {}


def kvpool_format(fmt: Any) -> MemoryFormat:
    """``fmt`` (an LMCache or kvpool member) as kvpool's :class:`MemoryFormat`."""
    if fmt.__class__ is MemoryFormat:
        return fmt  # type: ignore[no-any-return]
    found = _FORMATS.get(fmt)
    if found is None:
        found = _FORMATS[fmt] = MemoryFormat(fmt.value)
    return found


class BackendAllocator:
    """The allocator the stores read into: LMCache's local CPU backend, without its busy wait.

    ``LocalCPUBackend.allocate`` evicts from LMCache's hot cache when full
    and, by default, then sleeps and retries until memory frees up.  On
    the event loop that sleep would stall every call in flight - the puts
    whose completion frees the memory included - so this asks with
    ``busy_loop=False``: a full cache is an allocation that fails (the
    store raises ``OutOfMemoryError``, which the connector turns into a
    miss).

    Args:
        backend: LMCache's ``LocalCPUBackend`` (the connector context's).
    """

    __slots__ = ("_allocate",)

    def __init__(self, backend: Any) -> None:
        self._allocate = backend.allocate

    def allocate(
        self,
        shapes: torch.Size | Sequence[torch.Size],
        dtypes: torch.dtype | Sequence[torch.dtype],
        fmt: MemoryFormat | None = None,
    ) -> Any:
        """A new object of LMCache's backend, or None when its cache is full.

        Complexity: one ``LocalCPUBackend.allocate`` (eviction included).
        """
        if fmt is not None and not SAME_FORMATS:
            fmt = LMCacheFormat(fmt.value)
        return self._allocate(shapes, dtypes, fmt, eviction=True, busy_loop=False)


class Sender:
    """The kvpool objects a put sends for LMCache's objects, lent from LMCache's CPU buffer.

    LMCache's local CPU backend allocates every object from one host
    buffer (:func:`backend_buffer`).  This wraps it once and lends each
    object's view from it (:meth:`~kvpool.pool.borrowed.BorrowedMemory.lend`),
    about 40 % cheaper than wrapping each object's tensor
    (:func:`sendable`); an object outside the buffer (another allocator,
    a buffer LMCache made later) gets :func:`sendable`'s view.

    Args:
        backend: LMCache's ``LocalCPUBackend`` (or None: every object is
            wrapped by itself).

    The wrapper holds a reference to LMCache's buffer for the connector's life.
    """

    __slots__ = ("_lender",)

    def __init__(self, backend: Any) -> None:
        buffer = backend_buffer(backend)
        self._lender = BorrowedMemory(buffer) if buffer is not None else None

    def __call__(self, obj: Any) -> MemoryObj:
        """``obj`` as a kvpool object a store can put; end it with :func:`unsend`.

        Raises:
            InvalidArgumentError: as :func:`sendable`.

        Complexity: O(groups); one tensor slice.
        """
        lender = self._lender
        if lender is None or isinstance(obj, MemoryObj):
            return sendable(obj)
        raw = getattr(obj, "raw_data", None)
        if not isinstance(raw, torch.Tensor) or raw.device.type != "cpu":
            return sendable(obj)  # its refusal
        address, nbytes = raw.data_ptr(), obj.get_size()
        if not lender.contains(address, nbytes):
            return sendable(obj)
        return lender.lend(
            address,
            nbytes,
            list(obj.get_shapes()),
            list(obj.get_dtypes()),
            kvpool_format(obj.meta.fmt),
        )


def sendable(obj: Any) -> MemoryObj:
    """``obj`` as a kvpool object a store can put: itself, or a kvpool view of its bytes.

    The view is a borrowed object (:func:`kvpool.pool.borrowed.borrow`)
    over the same memory (no copy) with the object's shapes, dtypes and
    format; it owns nothing (no allocator is called when it ends).  End it with
    :func:`unsend` once the put returned; the caller keeps its reference on
    ``obj`` for that long, so the memory stays allocated.

    Raises:
        InvalidArgumentError: ``obj`` has no host tensor of its bytes (e.g.
            a byte-buffer object of a compressing serde).
    """
    if isinstance(obj, MemoryObj):
        return obj
    raw = getattr(obj, "raw_data", None)
    if not isinstance(raw, torch.Tensor) or raw.device.type != "cpu":
        raise InvalidArgumentError(
            f"cannot store {type(obj).__name__}: the kvpool plugin stores host tensor objects "
            "(use remote_serde: naive)"
        )
    return borrow(
        raw,
        list(obj.get_shapes()),
        list(obj.get_dtypes()),
        kvpool_format(obj.meta.fmt),
        nbytes=obj.get_size(),
    )


def unsend(original: Any, sent: MemoryObj) -> None:
    """End the view :func:`sendable` made (nothing when it returned ``original`` itself)."""
    if sent is not original and sent.is_valid():
        sent.ref_count_down()


def _token_axis(fmt: MemoryFormat, ndim: int) -> int:
    """Where the tokens are in a stored chunk's shape.

    A whole chunk (``KV_2LTD``, MLA ``[1, layers, tokens, hidden]``) has them at 2;
    one layer at 0 (``KV_T2D`` ``[tokens, kv, hidden]``, MLA ``[tokens, hidden]``),
    except ``KV_2TD`` ``[kv, tokens, hidden]``.  Not ``MemoryFormat.token_dim()``,
    which keeps LMCache's own values (1 for ``KV_T2D``, 0 for ``KV_2TD``).
    """
    if fmt is MemoryFormat.KV_2TD:
        return 1
    return 2 if ndim == 4 else 0


def layer_layout(
    shapes: Sequence[torch.Size], use_mla: bool, blending: bool
) -> tuple[list[torch.Size], MemoryFormat]:
    """One layer of a full chunk, as LMCache stores it with ``use_layerwise``.

    LMCache's cache engine then puts one object per layer and chunk, in
    the format its layerwise GPU connectors use: ``KV_T2D``
    ``[tokens, kv, hidden]``, ``KV_2TD`` ``[kv, tokens, hidden]`` with
    ``enable_blending``, ``KV_MLA_FMT`` ``[tokens, hidden]`` for MLA.

    Args:
        shapes: the full chunk's shapes, ``[kv, layers, tokens, hidden]`` per group.
        use_mla: the model uses MLA (``LMCacheMetadata.use_mla``).
        blending: LMCache's ``enable_blending``.

    Returns:
        The per-layer shapes and their format.
    """
    out: list[torch.Size] = []
    for shape in shapes:
        kv, _layers, tokens, hidden = shape
        if use_mla:
            out.append(torch.Size([tokens, hidden]))
        elif blending:
            out.append(torch.Size([kv, tokens, hidden]))
        else:
            out.append(torch.Size([tokens, kv, hidden]))
    if use_mla:
        return out, MemoryFormat.KV_MLA_FMT
    return out, MemoryFormat.KV_2TD if blending else MemoryFormat.KV_T2D


def fits(obj: Any, shapes: Sequence[torch.Size], dtypes: Sequence[torch.dtype], fmt: Any) -> bool:
    """True when ``obj`` is a chunk of the engine's layout, possibly a partial (last) one.

    LMCache's rule for a partial chunk (``reshape_partial_chunk``): the same
    shapes as a full chunk except fewer tokens, at least one.  The token
    axis is the format's: 2 of ``KV_2LTD`` ``[kv, layers, tokens, hidden]``,
    0 of the layerwise ``KV_T2D`` and MLA layouts, 1 of ``KV_2TD`` (see
    :func:`layer_layout`).  Dtypes and format must be the engine's.

    Complexity: O(groups x dimensions).
    """
    got_shapes = obj.get_shapes()
    if len(got_shapes) != len(shapes) or list(obj.get_dtypes()) != list(dtypes):
        return False
    want = kvpool_format(fmt)
    if kvpool_format(obj.get_memory_format()) is not want:
        return False
    for got, full in zip(got_shapes, shapes, strict=True):
        if len(got) != len(full):
            return False
        axis = _token_axis(want, len(full))
        for i, (g, f) in enumerate(zip(got, full, strict=True)):
            if g != f and not (i == axis and 0 < g < f):
                return False
    return True


def backend_buffer(backend: Any) -> torch.Tensor | None:
    """The host buffer LMCache's CPU allocator allocates from, or None.

    The buffer of LMCache's ``MixedMemoryAllocator`` (``pin_allocator.buffer``,
    else ``buffer``) when it is a CPU tensor; None for a kvpool allocator
    (it says where its memory is itself: ``memory_region()``), no backend,
    or anything else.
    """
    allocator = getattr(backend, "memory_allocator", None)
    if allocator is None or hasattr(allocator, "memory_region"):
        return None
    buffer = getattr(getattr(allocator, "pin_allocator", None), "buffer", None)
    if not isinstance(buffer, torch.Tensor):
        buffer = getattr(allocator, "buffer", None)
    if not isinstance(buffer, torch.Tensor) or buffer.device.type != "cpu":
        return None
    if not buffer.is_contiguous():
        return None
    return buffer


def register_backend_buffer(store: Any, backend: Any) -> tuple[int, int] | None:
    """Register the host buffer of LMCache's CPU allocator with ``store`` once, if both allow.

    Only a store with ``register_memory`` (Mooncake's) takes it, and only
    LMCache's own allocators need it: a kvpool allocator says where its
    memory is (``memory_region()``) and the store registers that itself.
    The buffer is the one LMCache's ``MixedMemoryAllocator`` allocates
    from (``pin_allocator.buffer``, else ``buffer``).  Closing the store
    deregisters it.  A refusal is not fatal: each call then registers its
    objects for itself, as without this.

    Args:
        store: the plugin's store.
        backend: LMCache's ``LocalCPUBackend`` (or None).

    Returns:
        ``(address, nbytes)`` registered, or None when nothing was.
    """
    register = getattr(store, "register_memory", None)
    buffer = backend_buffer(backend)
    if register is None or buffer is None:
        return None
    try:
        return register(buffer)  # type: ignore[no-any-return]
    except KVPoolError as exc:
        plugin_logger().info("LMCache's CPU buffer stays registered per call: %s", exc)
        return None
