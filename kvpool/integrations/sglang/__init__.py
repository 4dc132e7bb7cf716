"""SGLang HiCache on kvpool's stores: an L3 storage backend SGLang loads by configuration.

::

    python -m sglang.launch_server --model-path ... \\
        --enable-hierarchical-cache --hicache-mem-layout page_first \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "kvpool",
            "module_path": "kvpool.integrations.sglang",
            "class_name": "KVPoolHiCacheStorage",
            "interface_v1": 1, "url": "redis://127.0.0.1:6379/0"}'

SGLang (0.5.23) imports :class:`KVPoolHiCacheStorage`, checks it is a
``HiCacheStorage``, makes it with its ``HiCacheStorageConfig`` and then
registers its host pool.  ``url`` is any store
:func:`kvpool.remote.open_store` takes (a directory, ``file:///``,
``redis://``, ``rediss://``, ``redis-cluster://``, ``mooncake://``);
other keys are options of that store
(:mod:`~kvpool.integrations.sglang.config`).  SGLang's threads call the
blocking store themselves (:mod:`~kvpool.integrations.sglang.storage`).  Pages move between SGLang's
host pool and the store with no staging copy
(:mod:`~kvpool.integrations.sglang.pages`); every layout of the MHA and MLA
host pools that SGLang can address works.

Importing this package needs SGLang; ``import kvpool`` never does.
"""

from __future__ import annotations

from kvpool.integrations.sglang.config import HiCacheConfigError
from kvpool.integrations.sglang.storage import KVPoolHiCacheStorage

__all__ = ["HiCacheConfigError", "KVPoolHiCacheStorage"]
