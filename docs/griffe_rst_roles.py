"""A griffe extension for the API reference: Sphinx roles in docstrings become code spans.

kvpool's docstrings are Google style (Args/Returns/Raises, which
mkdocstrings renders) and name other objects with Sphinx roles
(``:class:`~kvpool.errors.CorruptEntryError```), which Markdown would show
as raw text.  Before rendering, each role becomes an inline code span of
the name a reader sees (``CorruptEntryError`` for a ``~`` target, the
whole path otherwise), and a paragraph ending in reST's literal-block
marker ``::`` ends in ``:`` (the indented block after it is already a
Markdown code block).  Docstrings in the source stay as they are.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

# :class:`X`, :func:`~a.b.f`, :meth:`text <a.b.C.m>`, with an optional domain (:py:class:).
_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):`([^`]+)`")
_LITERAL_MARKER = re.compile(r"(\S)::[ \t]*$", re.MULTILINE)
_BARE_MARKER = re.compile(r"^([ \t]*)::[ \t]*$", re.MULTILINE)


def _shown(target: str) -> str:
    """What a reader sees for a role's target."""
    titled = re.fullmatch(r"(.*?)\s*<([^>]+)>", target)
    if titled:
        return titled.group(1)
    if target.startswith("~"):
        return target[1:].rsplit(".", 1)[-1]
    return target


def convert(text: str) -> str:
    """``text`` with Sphinx roles as code spans and ``::`` markers as colons."""
    text = _ROLE.sub(lambda m: f"`{_shown(m.group(1))}`", text)
    text = _BARE_MARKER.sub(r"\1", text)
    return _LITERAL_MARKER.sub(r"\1:", text)


class SphinxRolesToMarkdown(griffe.Extension):
    """Rewrite every loaded object's docstring with :func:`convert`."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = convert(obj.docstring.value)
