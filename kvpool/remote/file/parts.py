"""Splitting a file store's batch into parts that run at once, one thread each.

A batch's files are independent, and on tmpfs every copy is CPU work in
the kernel: one thread leaves the other CPUs idle on a quiet machine and
gets one share of one CPU on a busy one.  So a large batched put or get
(one whose layout is given) is cut into contiguous parts of at least
:data:`SPLIT_MIN_BYTES`, at most as many as the store has threads:

* :func:`split_bounds` - the parts of a batch;
* :func:`run_parts` - runs them: the first in the caller's thread (no
  thread hop for it), the others in the store's threads, and returns every
  part's outcome once *all* have ended - a put never returns while a part
  still reads the caller's objects.

:class:`~kvpool.remote.file.store.FileStore` runs its batches this way with
``io_threads`` > 1; :class:`~kvpool.remote.file.aio.AsyncFileStore` splits
the same way into ``batch_threads`` parts (each in a thread, the event
loop waiting).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from typing import Any

__all__ = ["SPLIT_MIN_BYTES", "batch_nbytes", "default_batch_threads", "run_parts", "split_bounds"]

#: A batch smaller than this many bytes per part is not split (a part costs
#: a thread hop, tens of microseconds; 256 KiB take about 100 on tmpfs).
SPLIT_MIN_BYTES = 256 << 10
#: Most parts a batch is split into by default.
_MAX_DEFAULT_PARTS = 4


def default_batch_threads() -> int:
    """The CPUs this process may run on, at most four: the parts a batch is split into."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, _MAX_DEFAULT_PARTS))


def batch_nbytes(objs: Sequence[Any]) -> int:
    """The bytes of a batch's objects, for :func:`split_bounds`.

    An object that cannot say its size counts 0: the put itself reports it.
    """
    total = 0
    for obj in objs:
        with contextlib.suppress(Exception):
            total += int(obj.get_size())
    return total


def split_bounds(count: int, nbytes: int, most: int) -> list[tuple[int, int]]:
    """``(start, end)`` of the parts a batch of ``count`` entries and ``nbytes`` bytes makes.

    At most ``most`` parts, at least :data:`SPLIT_MIN_BYTES` each; one part
    (the whole batch) when it is too small to split.
    """
    n = max(1, min(most, count, nbytes // SPLIT_MIN_BYTES))
    return [(i * count // n, (i + 1) * count // n) for i in range(n)]


def run_parts(
    executor: Executor, fn: Callable[..., Any], parts: Sequence[tuple[Any, ...]]
) -> list[Any]:
    """``fn(*args)`` of every part at once; each part's result or exception, in order.

    The first part runs in the calling thread, the others in ``executor``;
    this returns only when every part has ended.

    Args:
        executor: the threads of the other parts.
        fn: the work of one part.
        parts: the arguments of each part.
    """
    futures: list[Future[Any]] = [executor.submit(fn, *args) for args in parts[1:]]
    outcomes: list[Any] = []
    try:
        outcomes.append(fn(*parts[0]))
    except Exception as exc:
        outcomes.append(exc)
    for future in futures:
        try:
            outcomes.append(future.result())
        except Exception as exc:
            outcomes.append(exc)
    return outcomes
