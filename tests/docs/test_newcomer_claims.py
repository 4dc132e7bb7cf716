"""What README and the guides tell a newcomer, checked against what kvpool does.

* troubleshooting.md's import-shadowing symptoms are the errors a script
  gets when it sits next to a clone named ``kvpool`` and no installed kvpool
  wins over it (``python -S``: no site-packages at all);
* README's and stores.md's word on timeouts: the network stores take a
  ``timeout``, a ``FileStore`` refuses one.
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvpool.errors import ArgumentTypeError
from kvpool.remote import (
    AsyncFileStore,
    AsyncRedisClusterStore,
    AsyncRedisStore,
    FileStore,
    MooncakeStore,
    RedisClusterStore,
    RedisStore,
)

ROOT = Path(__file__).resolve().parents[2]


def text_blocks(page: str, section: str) -> list[str]:
    """The ``text`` code blocks of one section (``## section``) of a docs page."""
    body = (ROOT / "docs" / page).read_text().split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```text\n(.*?)```", body, re.S)]


@pytest.mark.parametrize(
    ("script", "which"),
    [
        ("import kvpool\nfrom kvpool import MemoryFormat\n", 0),
        ("import kvpool\nkvpool.MixedMemoryAllocator(1 << 20)\n", 1),
    ],
)
def test_the_import_shadowing_symptoms_are_the_real_ones(
    tmp_path: Path, script: str, which: int
) -> None:
    clone = tmp_path / "kvpool"  # a clone made with `git clone ... kvpool`
    (clone / "kvpool").mkdir(parents=True)
    (clone / "README.md").write_text("kvpool\n")
    (tmp_path / "mine.py").write_text(script)
    done = subprocess.run(
        [sys.executable, "-S", "mine.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    shown = text_blocks("troubleshooting.md", "Import shadowing")
    assert done.stderr.strip().splitlines()[-1] == shown[which], done.stderr


def test_network_stores_take_a_timeout_and_file_stores_refuse_one(tmp_path: Path) -> None:
    for store in (RedisStore, AsyncRedisStore, RedisClusterStore, AsyncRedisClusterStore):
        assert "timeout" in inspect.signature(store.__init__).parameters, store
    assert "timeout" in inspect.signature(MooncakeStore.__init__).parameters
    for store in (FileStore, AsyncFileStore):
        with pytest.raises(ArgumentTypeError, match="timeout"):
            store(tmp_path, timeout=1.0)
    readme = (ROOT / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| Stores |"))
    assert "on the network stores (Redis/Valkey, Redis Cluster, Mooncake)" in row
    assert "bounded by its `timeout`" in row
    assert "a `FileStore` call is local I/O and takes no `timeout`" in row
    stores = (ROOT / "docs" / "guide" / "stores.md").read_text()
    assert "A `FileStore` takes no `timeout` (`FileStore(d, timeout=1)` raises" in stores
