"""Counting a FileStore mixin's calls in the store's counters, around their keyword guard.

:class:`~kvpool.remote.base.RemoteStore` wraps a store's own operations
when the class is defined, outside their keyword guard: a refused keyword
is an error of the call, counted as one.  The mixins that hold a
FileStore's other calls (:mod:`kvpool.remote.file.reads`,
:mod:`kvpool.remote.file.ranges`) are no RemoteStore subclasses, so their
calls are wrapped the same way here, where they are defined.
"""

from __future__ import annotations

from collections.abc import Callable

from kvpool.remote.counters import counted_method

__all__ = ["counted_calls"]


def counted_calls(*ops: str) -> Callable[[type], type]:
    """A class decorator counting the class's ``ops``; apply it above the keyword guard."""

    def count(cls: type) -> type:
        for op in ops:
            setattr(cls, op, counted_method(op, vars(cls)[op]))
        return cls

    return count
