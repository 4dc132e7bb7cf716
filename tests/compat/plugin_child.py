"""Run a plugin scenario on LMCache's own memory (no ``install()``), print its evidence as JSON.

``python tests/compat/plugin_child.py SPEC.json``, where the spec holds
``url``, ``extra`` (more ``extra_config`` lines), ``head`` (top-level YAML
lines), ``folder`` (for the config file) and ``n``/``partial`` (the
chunks).  The last stdout line is the JSON of
:func:`plugin_cases.round_trip`, plus ``allocator`` (the class of LMCache's
allocator, to show it is LMCache's own) and ``close_s``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("LMCACHE_LOG_LEVEL", "WARNING")


def main(spec_path: str) -> int:
    """Run the spec's round trip; print the evidence."""
    import plugin_cases as cases

    spec = json.loads(Path(spec_path).read_text())
    text = cases.config_text(spec["url"], *spec.get("extra", []), head=spec.get("head", ""))
    manager = cases.make_manager(cases.load_config(text, Path(spec["folder"])))
    try:
        allocator = manager.allocator_backend.memory_allocator
        evidence = cases.round_trip(manager, n=spec.get("n", 6), partial=spec.get("partial", 5))
        evidence["allocator"] = f"{type(allocator).__module__}.{type(allocator).__name__}"
        evidence["kvpool_installed"] = "kvpool.integrations.lmcache.finder" in sys.modules and any(
            type(f).__name__ == "KvpoolModuleFinder" for f in sys.meta_path
        )
    finally:
        started = time.monotonic()
        manager.close()
        close_s = time.monotonic() - started
    evidence["close_s"] = close_s
    print(json.dumps(evidence))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
