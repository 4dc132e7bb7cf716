"""Old import path of the host-memory functions; they live in :mod:`kvpool.native.buffer`."""

from kvpool.native.buffer import HostBuffer, allocate_host, attach_shm, live_mappings, unlink_shm

__all__ = ["HostBuffer", "allocate_host", "attach_shm", "live_mappings", "unlink_shm"]
