"""A real Mooncake Store on loopback for the tests: a master and one storage node.

``start_mooncake()`` starts them with
:func:`kvpool.cli.bench.localservers.start_mooncake` (the master's built-in
HTTP metadata server, so no etcd; one ``mooncake_client`` storage node with
a 256 MiB segment; free loopback ports).  Both binaries ship in the
``mooncake`` package folder of ``mooncake-transfer-engine-non-cuda``
(``pip install 'kvpool[mooncake]'``) and need ``libibverbs1`` even for TCP.

Without them the tests skip with the reason, unless
``KVPOOL_REQUIRE_MOONCAKE=1`` (set by ``.ci/run``), which makes that a
failure.

The master's read lease is 300 ms (``--default_kv_lease_ttl``) instead of
10 s, so a test that deletes what it just read waits 0.3 s at most; the
lease tests set their own store timeouts around it.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from kvpool.cli.bench import localservers
from kvpool.cli.bench.localservers import MooncakeDeployment

__all__ = ["LEASE_MS", "MooncakeDeployment", "need_mooncake", "start_mooncake"]

REQUIRE_MOONCAKE = os.environ.get("KVPOOL_REQUIRE_MOONCAKE", "").strip().lower() in (
    "1",
    "true",
    "yes",
)
#: The master's read lease in the tests, in milliseconds.
LEASE_MS = 300


def need_mooncake() -> Path:
    """The folder with ``mooncake_master``/``mooncake_client``, or skip (fail when required)."""
    spec = importlib.util.find_spec("mooncake")
    folder = None
    if spec is not None and spec.submodule_search_locations:
        folder = Path(next(iter(spec.submodule_search_locations)))
    reason = ""
    if folder is None:
        reason = "Mooncake is not installed (pip install 'kvpool[mooncake]')"
    elif not (folder / "mooncake_master").exists() or not (folder / "mooncake_client").exists():
        reason = f"no mooncake_master/mooncake_client in {folder}"
    else:
        try:
            import mooncake.store  # noqa: F401
        except ImportError as exc:
            reason = f"Mooncake's client does not load ({exc}; apt-get install libibverbs1)"
    if not reason:
        return folder  # type: ignore[return-value]
    if REQUIRE_MOONCAKE:
        pytest.fail(f"KVPOOL_REQUIRE_MOONCAKE is set but {reason}")
    pytest.skip(f"{reason}; KVPOOL_REQUIRE_MOONCAKE=1 makes this a failure")


def start_mooncake(segment: str = "256 MB") -> MooncakeDeployment:
    """A master and a storage node for the tests (skips or fails without Mooncake)."""
    return localservers.start_mooncake(need_mooncake(), segment, LEASE_MS)
