"""SGLang's host pages as store entries: each page's byte ranges, their keys, their lenders.

SGLang's host pool (``MHATokenToKVPoolHost``, ``MLATokenToKVPoolHost``)
says where a page's bytes are with ``get_page_buffer_meta(indices)``: a
list of ``(address, size)`` ranges, the same number for every page -

==================================  ==============================  ==========
layout                              ranges of one page              each holds
==================================  ==============================  ==========
MHA ``page_first``,                 2: K, V                         all layers
``page_first_direct``, ``page_head``
MHA ``layer_first``                 2 x layers: K, V of each layer  one layer
MLA ``page_first``,                 1                               all layers
``page_first_direct``
MLA ``layer_first``                 layers                          one layer
==================================  ==============================  ==========

Each range is one store entry, lent in place from the pool's buffer
(:class:`~kvpool.pool.borrowed.BorrowedMemory`): no staging copy.  Its key
is SGLang's page hash, the configuration's tag and the range's index
(:class:`~kvpool.integrations.shared.keys.KeySpace`): the tag covers the
model, the parallel ranks and sizes that change a page's bytes (TP for
MHA, PP, attention CP, DCP), the KV dtype, the layout and the page
geometry, so pages of different configurations never mix; a store that
keeps each range's bytes alone, without kvpool's header (Mooncake's
``headerless``), adds that to the tag, so its entries and those of a store
with headers never meet under one key.  MLA pages are the same on every TP
rank, so their keys leave the TP rank out and one rank writes them
(``is_storage_writer``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvpool.integrations.sglang.config import HiCacheConfigError
from kvpool.integrations.shared.keys import KeySpace
from kvpool.pool.borrowed import BorrowedMemory

__all__ = ["PageMap", "Segment"]

#: A page range: the lender, its address, its size, the entry's shapes and dtypes.
Segment = tuple[BorrowedMemory, int, int, list[torch.Size], list[torch.dtype]]


def _buffers(pool: Any) -> list[torch.Tensor]:
    """The host tensors a pool's pages live in (one for most layouts, K and V apart for some)."""
    found: list[torch.Tensor] = []
    for name in ("kv_buffer", "k_buffer", "v_buffer"):
        t = getattr(pool, name, None)
        if isinstance(t, torch.Tensor) and t.numel() and t.is_contiguous():
            inside = any(
                o.data_ptr() <= t.data_ptr() < o.data_ptr() + o.numel() * o.element_size()
                for o in found
            )
            if not inside:
                found.append(t)
    return found


class PageMap:
    """Where each of SGLang's host pages is, and the store keys of its ranges.

    Args:
        pool: SGLang's host pool (registered by ``register_mem_pool_host``).
        storage_config: SGLang's ``HiCacheStorageConfig``.
        label: names the backend in messages.
        headerless: the store keeps entries without kvpool's header (in the tag).

    Raises:
        HiCacheConfigError: a pool without host memory (allocator-only),
            or a layout whose pages kvpool cannot address (the message
            names the layouts that work).

    Attributes:
        per_page: ranges (entries) per page.
        space: the configuration's :class:`KeySpace`.
        lenders: the pool's buffers, lent per range.
        is_mla: the pool is an MLA pool (pages shared by the TP ranks).
    """

    def __init__(
        self, pool: Any, storage_config: Any, label: str, headerless: bool = False
    ) -> None:
        self.pool = pool
        self.is_mla = bool(storage_config.is_mla_model)
        layout = getattr(pool, "layout", None)
        buffers = _buffers(pool)
        if not buffers:
            raise HiCacheConfigError(
                f"{label}: SGLang's host pool {type(pool).__name__} has no host buffer to read "
                "and write pages in (an allocator-only pool); use an MHA or MLA host pool"
            )
        self.lenders = [BorrowedMemory(t) for t in buffers]
        self.page_size = int(pool.page_size)
        logical = getattr(pool, "logical_page_size", self.page_size)
        self.logical_page_size = int(logical() if callable(logical) else logical)
        try:
            ptrs, sizes = pool.get_page_buffer_meta(torch.arange(self.logical_page_size))
        except (ValueError, NotImplementedError, AssertionError) as exc:
            raise HiCacheConfigError(
                f"{label}: SGLang's host pool {type(pool).__name__} cannot address the pages of "
                f"layout {layout!r} ({exc}); start SGLang with --hicache-mem-layout page_first "
                "(or page_first_direct, page_head for MHA, layer_first)"
            ) from None
        self.per_page = len(ptrs)
        self.dtype: torch.dtype = pool.dtype
        for ptr, size in zip(ptrs, sizes, strict=True):
            self._lender(int(ptr), int(size), label)
        parts = self._identity(pool, storage_config, layout)
        if headerless:
            parts["entries"] = "headerless"
        self.space = KeySpace("sglang-hicache", **parts)

    @staticmethod
    def _identity(pool: Any, config: Any, layout: object) -> dict[str, object]:
        parts: dict[str, object] = {"model": config.model_name or ""}
        if not config.is_mla_model:
            parts["tp"] = f"{config.tp_rank}/{config.tp_size}"
        parts["pp"] = f"{config.pp_rank}/{config.pp_size}"
        parts["cp"] = f"{config.attn_cp_rank}/{config.attn_cp_size}"
        if getattr(config, "dcp_size", 1) > 1:
            parts["dcp"] = f"{config.dcp_rank}/{config.dcp_size}/{config.logical_page_size}"
        parts["dtype"] = str(pool.dtype).removeprefix("torch.")
        parts["layout"] = layout
        parts["page"] = pool.page_size
        dims = ("layer_num", "head_num", "head_dim", "v_head_dim", "kv_cache_dim")
        parts["geometry"] = ",".join(str(getattr(pool, d, "-")) for d in dims)
        return parts

    def _lender(self, address: int, nbytes: int, label: str) -> BorrowedMemory:
        for lender in self.lenders:
            if lender.contains(address, nbytes):
                return lender
        raise HiCacheConfigError(
            f"{label}: SGLang's host pool gave a page range ({nbytes} bytes at {address:#x}) "
            "outside its host buffers; this pool type is not supported"
        )

    def names(self, keys: Sequence[str]) -> list[str]:
        """The store keys of every range of the pages ``keys``, page by page."""
        return self.space.keys(keys, self.per_page)

    def ranges(
        self, keys: Sequence[str], host_indices: torch.Tensor
    ) -> tuple[list[int], list[int]]:
        """The address and size of every range of the pages at ``host_indices``, in order.

        Raises:
            HiCacheConfigError: the indices do not make ``len(keys)`` pages.
        """
        ptrs, sizes = self.pool.get_page_buffer_meta(host_indices)
        if len(ptrs) != len(keys) * self.per_page:
            raise HiCacheConfigError(
                f"SGLang asked for {len(keys)} pages but its host indices make "
                f"{len(ptrs) // max(self.per_page, 1)}"
            )
        return [int(p) for p in ptrs], [int(n) for n in sizes]

    def segments(self, keys: Sequence[str], host_indices: torch.Tensor) -> list[Segment]:
        """The ranges of the pages at ``host_indices`` (``page_size`` indices a page), in order.

        Raises:
            HiCacheConfigError: the indices do not make ``len(keys)`` pages.
        """
        ptrs, sizes = self.ranges(keys, host_indices)
        out: list[Segment] = []
        itemsize = self.dtype.itemsize
        for address, nbytes in zip(ptrs, sizes, strict=True):
            if nbytes % itemsize == 0:
                shapes, dtypes = [torch.Size([nbytes // itemsize])], [self.dtype]
            else:
                shapes, dtypes = [torch.Size([nbytes])], [torch.uint8]
            out.append((self._lender(address, nbytes, "kvpool"), address, nbytes, shapes, dtypes))
        return out
