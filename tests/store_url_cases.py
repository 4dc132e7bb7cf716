"""The store specs every entry point must refuse, and the fix each message must name.

One table, used by every entry point's test (``open_store``, ``open_async_store``,
``kvpool demo --store``, the LMCache plugin, the SGLang backend, the vLLM tier), so
the URL rules of :mod:`kvpool.remote.urls` are checked the same way everywhere.
"""

from __future__ import annotations

from pathlib import Path

#: (spec, a fragment the refusal must contain): a typo never becomes a directory.
BAD_SPECS: list[tuple[str, str]] = [
    ("redis//127.0.0.1:6391/0", "did you mean 'redis://127.0.0.1:6391/0'"),
    ("rediss:/127.0.0.1", "did you mean 'rediss://127.0.0.1'"),
    ("127.0.0.1:6391", "did you mean 'redis://127.0.0.1:6391/0'"),
    ("redis:127.0.0.1", "did you mean 'redis://127.0.0.1'"),
    ("reddis://127.0.0.1:6391/0", "did you mean redis://"),
    ("mooncak://127.0.0.1:50051", "did you mean mooncake://"),
    ("redis://127.0.0.1:6391/db0", "'db0' is not a number"),
    ("redis://127.0.0.1:6391/\u00b2", "is not a number"),  # "²": isdigit() says it is
    ("redis://127.0.0.1:6391/0?db=3", "name the database once"),
    ("redis://", "names no host"),
    ("unix://", "names no socket"),
    ("127.0.0.1:6391,127.0.0.1:6392", "did you mean 'redis-cluster://127.0.0.1:6391,127.0."),
    ("file:relative", "did you mean './relative'"),
]

#: Ids for ``pytest.mark.parametrize``.
BAD_IDS = [spec for spec, _ in BAD_SPECS]


def missing_parent(tmp: Path) -> tuple[str, str]:
    """A ``file://`` spec whose parent is missing, and what its refusal must name."""
    parent = tmp / "no-such-parent" / "dir"
    return f"file://{parent / 'x'}", f"the parent '{parent}'"


def unmakeable(tmp: Path) -> tuple[str, str]:
    """A directory spec no process can create (a name longer than any file system takes),
    and what its refusal must say: a configuration error, never an outage to retry."""
    return str(tmp / ("k" * 300)), "give a directory this process may create"


def created_anything(where: Path) -> list[str]:
    """What exists under ``where`` (a refused spec must leave it empty)."""
    return sorted(str(p.relative_to(where)) for p in where.rglob("*"))
