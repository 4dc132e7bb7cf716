"""Evicting a bounded FileStore's least recently used entries: files removed, keys reported.

:class:`~kvpool.remote.file.bound.Bound` decides which entries go;
:class:`Evictor` removes their files and says so:

* each file is removed by one libpinmem call
  (:func:`~kvpool.native.entry.evict_entry`) only if it is still the file
  the store recorded (same inode, mtime and size): an entry another
  process wrote since is left in place (it is that process's to count),
  so an eviction never loses data beyond what least-recently-used implies.
  A reader that opened the file still reads it whole.  Each eviction holds
  its key's lock (:meth:`~kvpool.remote.file.bound.Bound.lock_for`), as
  this store's puts and deletes of the key do;
* with ``reuse_files`` the removed file becomes a spare that the next put
  overwrites (:class:`~kvpool.remote.file.spares.Spares`): on tmpfs that
  put then allocates no pages;
* the keys whose entries left the directory (removed, or found already
  gone) are handed to the store's ``on_evict`` callback, once per store
  call, in the thread that evicted; the store's counters count the
  evictions (``evict``: ``entries`` files removed, ``nbytes`` their bytes,
  ``misses`` entries found gone or rewritten by another process).

Neither fails the put that evicted (its entry is stored): a callback that
raises is counted (``on_evict`` errors in the counters), a file that cannot
be removed (a read-only or failing file system) is counted (``evict``
errors) and stays recorded as the least recently used, for the next
eviction to try again; each is logged once per store.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable

from kvpool.native import entry as entry_calls
from kvpool.remote.counters import StoreCounters
from kvpool.remote.file.bound import Bound, Record
from kvpool.remote.file.spares import Spares, temp_name

__all__ = ["Evictor"]

logger = logging.getLogger("kvpool")

_clock = time.perf_counter


class Evictor:
    """Removes the files of a bounded store's evicted entries (see the module notes).

    Args:
        bound: the store's index (for its per-key locks).
        bprefix: the store's directory and separator, as bytes.
        seq: the store's counter for temporary names.
        spares: the store's spare files.
        counters: the store's counters.
        on_evict: the store's callback, or None.
        where: names the store in messages.
    """

    def __init__(
        self,
        bound: Bound,
        bprefix: bytes,
        seq: itertools.count[int],
        spares: Spares,
        counters: StoreCounters,
        on_evict: Callable[[list[bytes]], object] | None,
        where: str,
    ) -> None:
        self._bound = bound
        self._lock_for = bound.lock_for
        self._bprefix = bprefix
        self._seq = seq
        self._spares = spares
        self._counters = counters
        self._on_evict = on_evict
        self._where = where
        self._logged = False

    def remove(self, victims: list[tuple[bytes, Record]], keep: bool, evicted: list[bytes]) -> None:
        """Remove the victims' files; add the keys whose entries left to ``evicted``.

        Args:
            victims: ``(file name, record)`` pairs, already out of the index.
            keep: keep each removed file as a spare (``reuse_files``).
            evicted: receives the keys to report (not those of entries
                rewritten by another process, which stay).

        A file that cannot be removed is put back in the index (see the
        module notes); the others are still removed.
        """
        if not victims:
            return
        started = _clock()
        removed = freed = missed = 0
        for name, record in victims:
            temp = temp_name(self._bprefix, next(self._seq))
            try:
                with self._lock_for(name):
                    outcome = entry_calls.evict_entry(
                        self._bprefix + name, temp, record.stamp, keep
                    )
            except OSError as exc:
                self._bound.restore(name, record)  # still there: the next eviction tries again
                self._counters.observe("evict", 0.0, error=exc)
                self._warn_once(
                    f"evicting {name!r} failed: {exc.strerror or exc} "
                    f"({type(exc).__name__}); the store stays over its bound until an "
                    "eviction succeeds"
                )
                continue
            if outcome == entry_calls.EVICTED:
                removed += 1
                freed += record.stamp.size
                if keep:
                    self._spares.give(temp)
            else:
                missed += 1
            if outcome != entry_calls.CHANGED and record.key is not None:
                evicted.append(record.key)
        if removed or missed:
            self._counters.observe(
                "evict", _clock() - started, entries=removed, nbytes=freed, misses=missed
            )

    def report(self, evicted: list[bytes]) -> None:
        """Call ``on_evict(evicted)`` when there are keys and a callback (see the module notes)."""
        if not evicted or self._on_evict is None:
            return
        try:
            self._on_evict(evicted)
        except Exception as exc:
            self._counters.observe("on_evict", 0.0, error=exc)
            # Text only: the exception's frames reach the put's, which hold
            # views of the caller's objects (a log record may be kept).
            self._warn_once(f"on_evict raised {type(exc).__name__}: {exc}")

    def _warn_once(self, what: str) -> None:
        """Log ``what`` once per store (every failure is counted)."""
        if self._logged:
            return
        self._logged = True
        logger.warning(
            "%s: %s (puts still succeed; logged once per store, every failure is counted under "
            "evict or on_evict)",
            self._where,
            what,
        )
