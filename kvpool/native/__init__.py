"""The native layer: the only code that talks to libpinmem.

Rooms inside: :mod:`~kvpool.native.calls` (cffi loading, the status table and
one thin wrapper per C call), :mod:`~kvpool.native.buffer` (``HostBuffer``, the
one Python owner of a mapping), :mod:`~kvpool.native.machine` (what the machine
offers) and :mod:`~kvpool.native.numa` (which node memory should live on).

``from kvpool import native`` gives the wrappers of :mod:`kvpool.native.calls`
(``native.alloc``, ``native.option_set`` ...) and the buffer functions.
"""

from kvpool.native.buffer import HostBuffer, allocate_host, attach_shm, live_mappings, unlink_shm
from kvpool.native.calls import *  # noqa: F403 - the wrappers are this package's API
from kvpool.native.calls import __all__ as _calls_all
from kvpool.native.machine import Capabilities, capabilities

__all__ = [
    *_calls_all,
    "Capabilities",
    "HostBuffer",
    "allocate_host",
    "attach_shm",
    "capabilities",
    "live_mappings",
    "unlink_shm",
]
