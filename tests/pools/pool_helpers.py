"""Constants and helpers shared by the pool tests (imported by the test modules)."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable

import torch

import kvpool
from kvpool import MemoryFormat
from kvpool.native.buffer import live_mappings

MIB = 1 << 20
GIB = 1 << 30

#: One KV chunk: 2 x 4 layers x 16 tokens x 8 values of float16 = 2048 bytes.
KV_SHAPE = torch.Size([2, 4, 16, 8])
KV_DTYPE = torch.float16
KV_BYTES = KV_SHAPE.numel() * KV_DTYPE.itemsize
KV_FMT = MemoryFormat.KV_2LTD


def paged_kwargs() -> dict[str, object]:
    """The keyword arguments of a paged pool of KV chunks (one chunk per page)."""
    return {"shapes": [KV_SHAPE], "dtypes": [KV_DTYPE], "fmt": KV_FMT}


def cuda_present() -> bool:
    """True when torch or libpinmem sees a CUDA device (some expectations differ there)."""
    if torch.cuda.is_available():
        return True
    try:
        return bool(kvpool.capabilities().cuda_available)
    except Exception:
        return False


def count_mappings() -> int:
    """Collect garbage, then count the native mappings alive in this process."""
    gc.collect()
    return live_mappings()[0]


def wait_for(predicate: Callable[[], bool], deadline: float = 20.0) -> bool:
    """Poll ``predicate`` until it holds or ``deadline`` seconds pass.

    Only for liveness (a thread that must eventually exit); no test asserts
    how long anything took.
    """
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def threads_named(name: str) -> list[threading.Thread]:
    """The live threads of this process with that name."""
    return [t for t in threading.enumerate() if t.name == name and t.is_alive()]


def pattern(n: int, seed: int) -> bytes:
    """``n`` deterministic bytes that differ for different seeds."""
    return bytes((i * 31 + seed * 7 + (i >> 8)) & 0xFF for i in range(n))
