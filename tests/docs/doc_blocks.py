"""Fenced code blocks of the README and docs/, with the comment that marks how each is checked.

A block is a fenced block (three backticks and a language).  The HTML
comment on the line right before it says what the tests do with it:

* none, for a ``python`` block: it runs, on its own, as a user would
  copy-paste it;
* ``<!-- not run: REASON -->``: it is not run, for the reason given (a
  block in any other language must carry this, or ``run with``);
* ``<!-- run with: redis -->`` (``redis-cluster``, ``mooncake``): it runs
  with the test's server in place of the default address it names;
* ``<!-- continues -->``: it runs after the python block before it on the
  same page (a page that builds one example in steps).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(\S*)\s*$")
MARK = re.compile(r"^<!--\s*(not run|run with|continues)\s*(?::\s*(.*?))?\s*-->\s*$")
SERVERS = ("redis", "redis-cluster", "mooncake")

#: The addresses a runnable block may name, replaced by the test's servers.
DEFAULT_URLS = {
    "redis": ["redis://127.0.0.1:6379/0"],
    "redis-cluster": ["redis-cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002"],
    "mooncake": [
        "mooncake://127.0.0.1:50051?metadata=http://127.0.0.1:8080/metadata&protocol=tcp",
    ],
}


@dataclass
class Block:
    """One fenced block: where it is, its language and text, and its mark."""

    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    mark: str | None  # "not run", "run with", "continues" or None
    detail: str  # the reason, or the server

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    """The README and every Markdown page of the docs."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of one page, in order.

    Raises:
        ValueError: a fence that is never closed, or a mark with no block under it.
    """
    lines = path.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        mark = MARK.match(lines[i])
        if mark and not (i + 1 < len(lines) and FENCE.match(lines[i + 1])):
            raise ValueError(f"{path}:{i + 1}: a mark with no fenced block right under it")
        if not opening or not opening.group(1):
            i += 1
            continue
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise ValueError(f"{path}:{start + 1}: a fence that is never closed")
        before = MARK.match(lines[start - 1]) if start else None
        found.append(
            Block(
                path=path,
                line=start + 1,
                lang=opening.group(1),
                text="\n".join(body) + "\n",
                mark=before.group(1) if before else None,
                detail=(before.group(2) or "") if before else "",
            )
        )
        i += 1
    return found
