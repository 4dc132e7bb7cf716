"""Process-wide monitors (placeholder; completed with the pools)."""

from __future__ import annotations

import threading
from typing import Any, ClassVar

__all__ = ["PinMonitor"]


class PinMonitor:
    """Records which memory objects are pinned (full version to come)."""

    _instance: ClassVar[PinMonitor | None] = None
    _instance_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pinned: dict[int, Any] = {}

    @classmethod
    def GetOrCreate(cls) -> PinMonitor:
        """Return the process-wide monitor, creating it on first use."""
        inst = cls._instance
        if inst is None:
            with cls._instance_lock:
                if cls._instance is None:
                    cls._instance = cls()
                inst = cls._instance
        return inst

    def on_pin(self, obj: Any) -> None:
        """Record a pin of ``obj``."""
        with self._lock:
            self._pinned[id(obj)] = obj

    def on_unpin(self, obj: Any) -> None:
        """Record that ``obj`` is no longer pinned."""
        with self._lock:
            self._pinned.pop(id(obj), None)
