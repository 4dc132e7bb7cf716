"""The chunks the tier knows its store holds: lookups of them answer at once.

The tier learns a chunk is in the store when it stored it, loaded it or an
existence check found it; it forgets one the store removed (an eviction, an
unusable entry) or that failed to load.  A store shared with other engines
may drop a chunk without this process seeing it (another engine's eviction,
a ``ttl``): that costs one failed load, after which the chunk is forgotten.
The set is bounded (least recently used first out), so its memory is too.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable

__all__ = ["KnownChunks"]


class KnownChunks:
    """A bounded set of ``OffloadKey`` s, least recently used out first.

    Args:
        limit: most keys held (about 200 bytes each).

    Thread safety: any thread may call any method.
    Complexity: O(1) per key.
    """

    def __init__(self, limit: int = 1 << 20) -> None:
        self.limit = limit
        self._keys: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._keys)

    def touch(self, key: bytes) -> bool:
        """True when ``key`` is known (it becomes the most recently used)."""
        with self._lock:
            if key not in self._keys:
                return False
            self._keys.move_to_end(key)
            return True

    def add(self, keys: Iterable[bytes]) -> None:
        """Learn that the store holds ``keys``."""
        with self._lock:
            for key in keys:
                self._keys[key] = None
                self._keys.move_to_end(key)
            while len(self._keys) > self.limit:
                self._keys.popitem(last=False)

    def discard(self, keys: Iterable[bytes]) -> None:
        """Forget ``keys`` (removed from the store, or not loadable)."""
        with self._lock:
            for key in keys:
                self._keys.pop(key, None)

    def clear(self) -> None:
        """Forget every key."""
        with self._lock:
            self._keys.clear()
