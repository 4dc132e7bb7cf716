"""Fixtures and helpers for the pure-Python core tests (no native library needed).

* Every test starts with strict mode *off* (whatever ``KVPOOL_STRICT`` says)
  and gets the previous setting back afterwards; ``strict``
  (``tests/conftest.py``) switches it on for one test.
* ``kvlog`` is pytest's ``caplog`` capturing the ``kvpool`` logger at
  WARNING, with a helper that returns the captured warning messages.
* ``make_extent`` / ``make_paged`` build small pools over fresh tensors.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import pytest
import torch
from core_helpers import PAGED_DTYPE, PAGED_SHAPE

import kvpool

KIB = 1024
PAGE = 4096


@pytest.fixture(autouse=True)
def _strict_off() -> Iterator[None]:
    previous = kvpool.set_strict_mode(False)
    yield
    kvpool.set_strict_mode(previous)


class KVLog:
    """Warnings (and worse) logged on the ``kvpool`` logger during a test."""

    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        self._caplog = caplog

    def messages(self, level: int = logging.WARNING) -> list[str]:
        return [
            r.getMessage()
            for r in self._caplog.records
            if r.name.startswith("kvpool") and r.levelno >= level
        ]

    def clear(self) -> None:
        self._caplog.clear()


@pytest.fixture
def kvlog(caplog: pytest.LogCaptureFixture) -> KVLog:
    caplog.set_level(logging.WARNING, logger="kvpool")
    return KVLog(caplog)


@pytest.fixture
def make_extent() -> Callable[..., kvpool.TensorMemoryAllocator]:
    """``make_extent(nbytes=64 KiB, align_bytes=4096, **kw)`` over a zeroed uint8 tensor."""

    def build(
        nbytes: int = 64 * KIB, align_bytes: int = PAGE, **kwargs: object
    ) -> kvpool.TensorMemoryAllocator:
        return kvpool.TensorMemoryAllocator(
            torch.zeros(nbytes, dtype=torch.uint8), align_bytes, **kwargs
        )

    return build


# One page of the default paged layout: [2, 2, 16, 8] float16 = 1 KiB.


@pytest.fixture
def make_paged() -> Callable[..., kvpool.PagedTensorMemoryAllocator]:
    """``make_paged(pages=8, shapes=[PAGED_SHAPE], dtypes=[PAGED_DTYPE], fmt=KV_2LTD)``."""

    def build(
        pages: int = 8,
        shapes: list[torch.Size] | None = None,
        dtypes: list[torch.dtype] | None = None,
        fmt: kvpool.MemoryFormat = kvpool.MemoryFormat.KV_2LTD,
    ) -> kvpool.PagedTensorMemoryAllocator:
        shapes = [PAGED_SHAPE] if shapes is None else shapes
        dtypes = [PAGED_DTYPE] if dtypes is None else dtypes
        page = kvpool.get_size_bytes(shapes, dtypes)
        return kvpool.PagedTensorMemoryAllocator(
            torch.zeros(page * pages, dtype=torch.uint8), shapes, dtypes, fmt
        )

    return build
