"""What the placement policies share: lifecycle, ownership, pins, view leases, backstops.

:class:`PlacementPolicy` is the base of
:class:`~kvpool.pool.extent.TensorMemoryAllocator` and
:class:`~kvpool.pool.paged.PagedTensorMemoryAllocator`, and implements the
policy side of :mod:`kvpool.pool.contract`.  A subclass supplies the
placement (allocate, batched forms, :meth:`~PlacementPolicy.release_locked`,
``_give_back_locked``, ``_add_barriers_locked``, stats, memcheck) and
registers itself in :data:`POLICIES`; this class supplies everything around
it:

* **ownership** - a pool frees only handles it made, and each once;
* **pins** - the pool's pinned-object counter and the monitor calls when a
  pinned object is freed;
* **views own their allocation** - a handle's views come from a
  :class:`~kvpool.pool.lease.ViewLease`; when the handle dies while views
  are alive, its bytes wait for the last view (counted in
  ``held_by_views_bytes``), the free is counted (``freed_under_views``)
  and logged at DEBUG - it is safe, and usual in asynchronous code - or
  raises :class:`~kvpool.errors.ViewsOutliveHandleError` in strict mode;
* **the garbage-collection backstop** - a handle dropped without
  ``ref_count_down`` is released by its ``__del__`` (with a warning), at
  once if the pool's lock is free, else queued and released under the
  lock before the pool next reports full or gives statistics;
* **close** - refuses new allocations, makes every handle dead (their views
  raise :class:`~kvpool.errors.PoolClosedError`) and drops every reference
  to the memory the policy and its live handles hold, so the memory goes
  with the last view made before;
* **registrations** - :meth:`~PlacementPolicy.respect_registrations`
  turns the boundaries between the memory's CUDA registrations into
  barriers (:mod:`kvpool.pool.barriers`) that the subclass's placement
  (``_add_barriers_locked``) never places an object across: a GPU copy
  across two registrations fails;
* **fork** - in a forked child every inherited policy is closed as
  "inherited": its handles raise
  :class:`~kvpool.errors.InheritedAcrossForkError` instead of touching the
  parent's memory (which a pinned pool's child does not even map).

Thread safety: one lock per pool (``lock``) guards the placement, the
counts of every object of the pool and the counters.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from kvpool.checks import REQUIRED, refuse_in_place
from kvpool.errors import (
    AddressSpaceExhaustedError,
    ArgumentTypeError,
    InheritedAcrossForkError,
    InvalidArgumentError,
    InvalidHandleError,
    LeakedHandleError,
    LeakedHandleWarning,
    PoolClosedError,
    RequestTooLargeError,
    ViewsOutliveHandleError,
)
from kvpool.formats import MAX_LAYOUT_BYTES, MemoryFormat, format_hint
from kvpool.misuse import ReportOnce, notice, report, strict_mode
from kvpool.pool.arena import Arena
from kvpool.pool.barriers import boundaries
from kvpool.pool.handle import TensorMemoryObj
from kvpool.pool.interface import MemoryAllocatorInterface
from kvpool.pool.lease import ViewLease, open_device_lease, open_host_lease, pool_array
from kvpool.pool.monitor import PinMonitor, usage_listener
from kvpool.pool.objects import MemoryObj
from kvpool.pool.placement import POLICIES, PlacementSpec, policy_builder, register_policy

__all__ = [
    "POLICIES",
    "PlacementPolicy",
    "PlacementSpec",
    "policy_builder",
    "register_policy",
]

logger = logging.getLogger("kvpool")

_TMO = TensorMemoryObj


def check_object_list(memory_objs: object, what: str) -> Sequence[Any]:
    """Validate the list argument of a batched free.

    Raises:
        InvalidArgumentError: not a list or tuple.
    """
    if not isinstance(memory_objs, (list, tuple)):
        raise InvalidArgumentError(
            f"{what} takes a list of memory objects, got {type(memory_objs).__name__}; "
            "wrap a single object in a list"
        )
    return memory_objs


def check_format(fmt: object) -> MemoryFormat:
    """Validate a ``fmt`` argument.

    Raises:
        InvalidArgumentError: ``fmt`` is not a :class:`MemoryFormat`.
    """
    if fmt.__class__ is not MemoryFormat:
        names = ", ".join(f.name for f in MemoryFormat)
        raise ArgumentTypeError(
            f"fmt must be a MemoryFormat ({names}), got {type(fmt).__name__} {fmt!r}"
            f"{format_hint(fmt)}"
        )
    return fmt  # type: ignore[return-value]


# Every policy of the process, for the fork handler (held weakly).
_live_policies: weakref.WeakSet[PlacementPolicy] = weakref.WeakSet()


def _inherited_by_a_child() -> None:
    # Runs in a forked child: the parent's policies are not the child's.
    for policy in list(_live_policies):
        try:
            policy.forget_after_fork()
        except Exception:  # a fork handler must not raise; the policy stays as it was
            logger.exception("kvpool: could not close an inherited pool in a forked child")


os.register_at_fork(after_in_child=_inherited_by_a_child)


class PlacementPolicy(MemoryAllocatorInterface):
    """Base of the placement policies (see the module docstring).

    Attributes:
        kind: the name the policy is registered under.
    """

    kind = ""
    # The HandleOwner calls (kvpool.pool.contract) the handles make on their
    # hot paths: not guarded against unknown keywords (kvpool.checks).
    _internal_calls = frozenset(("release_dropped", "open_lease", "dead_handle_error"))

    buffer: torch.Tensor
    base_address: int

    def _init_policy(self, arena: Arena, lock: Any) -> None:
        self._arena: Arena | None = arena
        self.buffer = arena.buffer
        self.base_address = arena.base_address
        self._view: memoryview | None = arena.view
        # What host leases slice (kvpool.pool.lease); dropped with the view.
        self._pool_bytes = pool_array(arena.view) if arena.view is not None else None
        #: The pool's one lock (contract: kvpool.pool.contract.HandleOwner).
        self.lock = lock
        #: True once closed, or in a forked child (contract: HandleOwner).
        self.closed = False
        self._closed_why = ""
        #: An object this policy keeps alive: the MemoryPool built on it, so
        #: that a live handle (which references its policy) keeps its pool.
        self.keep_alive: Any = None
        #: What handles' parent() is (contract: HandleOwner): this policy, or
        #: the pool built on it, which sets itself here (as in the reference,
        #: where a Mixed or Host allocator, not its inner one, owns objects).
        self.outer: Any = self
        # Told of every change of usage (None: nobody asked; no cost).
        self._usage: Any = usage_listener()
        self._report_too_large = ReportOnce()  # warned once per owner
        self._pinned = 0
        # Handles whose __del__ found the lock taken, released later.
        self._dropped: deque[TensorMemoryObj] = deque()
        # Leases of live handles and of bytes held by views; the leases whose
        # root died are queued in _returns by the weak reference callback.
        # (By id: a weak reference hashes like its referent, a numpy array.)
        self._leases: dict[int, ViewLease] = {}
        self._returns: deque[ViewLease] = deque()
        self._held_bytes = 0
        self._held_count = 0
        # Frees while views were alive, since the pool was made (monotonic).
        self._freed_under_views = 0
        # Strict mode: what the garbage-collection backstop reclaimed.
        self._leaked: list[str] = []
        self._close_hooks: dict[int, Callable[[], None]] = {}
        self._next_hook = 0
        _live_policies.add(self)

    def _report_usage_locked(self) -> None:
        """Tell the usage listener, if any, that this pool's usage changed."""
        listener = self._usage
        if listener is not None:
            listener(self)

    # -- hooks for the subclasses ----------------------------------------

    def release_locked(self, handle: TensorMemoryObj) -> None:
        """Give ``handle``'s memory back; the caller holds the lock and checked it."""
        raise NotImplementedError

    def _release_garbage_locked(self, obj: TensorMemoryObj) -> None:
        """Give back the memory of a handle being garbage-collected."""
        self.release_locked(obj)

    def _give_back_locked(self, lease: ViewLease) -> None:
        """Return the bytes of a lease whose last view is gone to the placement."""
        raise NotImplementedError

    def _forget_memory_locked(self) -> None:
        """Drop the subclass's own references to the memory (at close)."""

    # -- the handle contract (kvpool.pool.contract.HandleOwner) ------------

    def pin_changed_locked(self, delta: int) -> None:
        """A handle's pin count went 0 -> 1 (+1) or 1 -> 0 (-1); caller holds the lock."""
        self._pinned += delta

    def open_lease(self, handle: TensorMemoryObj) -> ViewLease:
        """The owner of ``handle``'s views (see :mod:`kvpool.pool.lease`); caller holds the lock."""
        if self._pool_bytes is not None:
            lease = open_host_lease(
                self._pool_bytes, handle.offset, handle.phy, handle.page, self._returns
            )
        else:
            lease = open_device_lease(
                self.buffer, handle.offset, handle.phy, handle.page, self._returns
            )
        self._leases[id(lease)] = lease
        return lease

    def dead_handle_error(self, handle: object, what: str) -> Exception:
        """The typed error for ``what`` on a dead handle of this policy."""
        if self._closed_why == "forked":
            return InheritedAcrossForkError(
                f"{what} of {handle!r} in a forked child (pid {os.getpid()}): the pool belongs "
                "to the parent process; in a child attach a shared-memory pool by name "
                "(kvpool.attach_pool) or create a new pool"
            )
        if self.closed:
            return PoolClosedError(
                f"{what} of a freed memory object {handle!r}: its pool was closed"
            )
        return InvalidHandleError(
            f"{what} of a freed memory object {handle!r}; its memory may belong to another "
            "object now"
        )

    def _retire_locked(self, obj: TensorMemoryObj) -> bool:
        """Detach a dying handle from its lease; True when views still hold its bytes.

        The bytes go back when the lease's root dies: at once (through
        the returns queue, drained here) when no view is left.
        """
        lease = obj.lease
        obj.lease = None
        obj._raw = None
        if lease is None:
            return False
        lease.held = True
        self._held_bytes += lease.phy
        self._held_count += 1
        alive = lease.detach()
        if alive:
            self._freed_under_views += 1
        if self._returns:
            self._drain_returns_locked()
        return alive

    def _drain_returns_locked(self) -> int:
        """Give back the bytes of every lease whose last view died; returns how many."""
        returns = self._returns
        count = 0
        while returns:
            lease = returns.popleft()
            if lease.returned or not lease.held:
                continue
            lease.returned = True
            self._held_bytes -= lease.phy
            self._held_count -= 1
            self._leases.pop(id(lease), None)
            if not self.closed:
                self._give_back_locked(lease)
            count += 1
        return count

    def _report_views_outlive(self, obj: object) -> None:
        # Safe (the bytes wait for the views) and counted: not misuse
        # outside strict mode.
        notice(
            ViewsOutliveHandleError,
            f"{obj!r} was freed while views of its bytes are alive; its bytes are not reused "
            "until the last view is gone. Free the object after you are done with its "
            "byte_array/tensor views (or drop the views first)",
        )

    @property
    def held_by_views_bytes(self) -> int:
        """Bytes of freed objects that views still hold (not reusable yet)."""
        return self._held_bytes

    @property
    def freed_under_views(self) -> int:
        """Objects freed while views of their bytes were alive, since the pool was made."""
        return self._freed_under_views

    @property
    def display_name(self) -> str:
        """What messages call this policy: the pool built on it (e.g.
        ``MixedMemoryAllocator``), else the policy's own name."""
        pool = self.keep_alive
        return str(pool) if pool is not None else str(self)

    def _refuse_too_large_locked(
        self, nbytes: int, capacity: int, what: str, too_wide: tuple[int, int] | None = None
    ) -> None:
        """A request failed: say so if it can never fit (the caller returns None).

        ``nbytes`` beyond :data:`~kvpool.formats.MAX_LAYOUT_BYTES` raises
        :class:`InvalidArgumentError`; beyond ``capacity`` (the whole pool),
        or with ``too_wide`` given (``(object bytes, widest span)``: an
        object of the request is wider than the widest span between CUDA
        registration boundaries, which no object crosses), it is reported
        once per pool (a warning), or raises
        :class:`RequestTooLargeError` in strict mode.  A request that only
        does not fit *now* is not reported.
        """
        if nbytes > MAX_LAYOUT_BYTES:
            raise InvalidArgumentError(
                f"{what} of {nbytes} bytes: more than {MAX_LAYOUT_BYTES} (the int64 limit)"
            )
        if too_wide is not None:
            message = (
                f"{what} from {self.display_name} can never succeed: an object of "
                f"{too_wide[0]} bytes (aligned) is wider than the pool's widest registered span "
                f"of {too_wide[1]} bytes (its memory is "
                "registered with CUDA in chunks, and an object never crosses two, where a GPU "
                "copy would fail); it returned None (as when full). Make the chunks larger "
                "than the largest object (a lazy pool's step_size, a pool's register_chunk) "
                "or split the object"
            )
        elif nbytes <= capacity:
            return
        else:
            message = (
                f"{what} of {nbytes} bytes from {self.display_name} can never succeed: the "
                f"whole pool has {capacity} bytes; it returned None (as when full). Use a "
                "larger pool or split the request"
            )
        self._report_too_large(RequestTooLargeError, message)

    # -- ownership and pins ------------------------------------------------

    def _check_owned(self, obj: object) -> TensorMemoryObj:
        if obj.__class__ is not _TMO or obj.owner is not self:  # type: ignore[attr-defined]
            raise InvalidHandleError(
                f"{obj!r} was not allocated by this {self.display_name}; free it with its own "
                "allocator"
            )
        return obj  # type: ignore[return-value]

    def _unpinned_by_free(self, obj: TensorMemoryObj) -> bool:
        """Account for freeing a pinned object; True when it was pinned."""
        if obj.record.pin_count > 0:
            obj.record.pin_count = 0
            self._pinned -= 1
            PinMonitor.GetOrCreate().on_unpin(obj)
            return True
        return False

    def free(
        self, memory_obj: MemoryObj = REQUIRED, allocator_type: str | None = None, **unknown: Any
    ) -> None:
        """Give an object's memory back now, whatever its counts.

        Normally the last ``ref_count_down`` does this.  Freeing an object
        twice is reported (see :mod:`kvpool.misuse`) and ignored.  Views of
        the object keep its bytes from being reused (see the module docstring).

        Raises:
            InvalidHandleError: the object belongs to another allocator.
        """
        if unknown or memory_obj is REQUIRED:
            refuse_in_place(self, unknown, memory_obj)
        obj: Any = memory_obj
        # _check_owned's and _unpinned_by_free's tests, inlined: this is the
        # hot path of every free (the calls cost more than the keyword check).
        if obj.__class__ is not _TMO or obj.owner is not self:
            self._check_owned(obj)  # raises
        lock = self.lock
        lock.acquire()
        try:
            if self.closed and self._closed_why == "closed":
                return  # a closed pool ended every object's life: not misuse
            if not obj.valid or self.closed:
                report(InvalidHandleError, f"free of an already freed object {obj!r}; ignored")
                return
            if obj.record.pin_count > 0:
                self._unpinned_by_free(obj)
            self.release_locked(obj)
        finally:
            lock.release()

    # -- the garbage-collection backstop -----------------------------------

    def release_dropped(self, handle: TensorMemoryObj) -> None:
        """Called by a live handle's ``__del__``: release its memory.

        Never blocks: when the lock is taken (another thread, or this one
        in the middle of a pool call), the handle is queued and released
        under the lock later.
        """
        lock = self.lock
        if not lock.acquire(False):
            self._dropped.append(handle)
            return
        try:
            self._release_dropped_locked(handle)
        finally:
            lock.release()

    def _release_dropped_locked(self, obj: TensorMemoryObj) -> None:
        if not obj.valid or self.closed:
            return
        meta = obj.record
        message = (
            f"reclaiming {obj!r}: it was garbage-collected with ref_count={meta.ref_count}, "
            f"pin_count={meta.pin_count} (ref_count_down()/unpin() was not called)"
        )
        # One report, a Python warning (a log line as well printed the event
        # twice): typed, so it can be filtered or made an error, and routed to
        # logging by logging.captureWarnings(True).  In strict mode the pool's
        # next stats()/memcheck()/close() raises as well.
        warnings.warn(message, LeakedHandleWarning, stacklevel=2)
        if strict_mode():
            self._leaked.append(message)
        self._unpinned_by_free(obj)
        self._release_garbage_locked(obj)

    def _raise_leaks(self) -> None:
        """Strict mode: raise for the handles the garbage collector reclaimed."""
        leaked, self._leaked = self._leaked, []
        if leaked:
            raise LeakedHandleError(
                f"{len(leaked)} memory object(s) of {self} were garbage-collected without "
                f"ref_count_down(): {'; '.join(leaked[:3])}"
            )

    def _drain_dropped_locked(self) -> int:
        """Release the queued garbage handles and view leases; returns how many there were."""
        dropped = self._dropped
        count = 0
        while dropped:
            self._release_dropped_locked(dropped.popleft())
            count += 1
        if self._returns:
            count += self._drain_returns_locked()
        return count

    def _retry_after_drain_locked(self, place: Any, *args: Any) -> Any:
        """``place(*args)``; on a full pool, release the queued garbage and retry.

        Returns:
            What ``place`` returned, or None when the pool stays full.
        """
        try:
            return place(*args)
        except AddressSpaceExhaustedError:
            return self._drain_and_retry_locked(place, *args)

    def _drain_and_retry_locked(self, place: Any, *args: Any) -> Any:
        """After ``place(*args)`` found the pool full: release the queued garbage and retry.

        Returns:
            What ``place`` returned, or None when the pool stays full.
        """
        if not self._drain_dropped_locked():
            return None
        try:
            return place(*args)
        except AddressSpaceExhaustedError:
            return None

    def _unpin_listed_locked(self, memory_objs: Sequence[Any]) -> None:
        """Drop the pins of the live objects of a batch about to be freed.

        Every object is checked to be this pool's first, so a foreign one
        raises before any pin is dropped.
        """
        for obj in memory_objs:
            self._check_owned(obj)
        for obj in memory_objs:
            if obj.valid:
                self._unpinned_by_free(obj)

    def _log_problems(self, problems: list[str]) -> bool:
        """Log memcheck's findings; True when there are none."""
        for problem in problems:
            logger.error("memcheck(%s): %s", self.display_name, problem)
        return not problems

    # -- the memory, for consumers that register it ------------------------

    def respect_registrations(self, spans: Iterable[tuple[int, int]]) -> None:
        """Keep every object inside one CUDA registration of the memory.

        Each boundary between registrations (:func:`~kvpool.pool.barriers.boundaries`
        of ``spans``, ``(offset, length)`` pairs) becomes a barrier no
        object handed out from now on crosses: a GPU copy across one fails.
        The pool calls it when it is made and when its memory grows.

        Raises:
            InvalidArgumentError: a boundary the placement cannot honour
                (inside a live object, or off its alignment).
        """
        cuts = boundaries(spans, self.buffer.numel())
        if cuts:
            with self.lock:
                self._add_barriers_locked(cuts)

    def _add_barriers_locked(self, offsets: list[int]) -> None:
        """Place nothing across ``offsets`` from now on; the caller holds the lock."""
        raise NotImplementedError

    def memory_region(self) -> tuple[int, int] | None:
        """``(address, nbytes)`` of the pool's host memory; None if closed or on a device.

        See :meth:`MemoryAllocatorInterface.memory_region`: every object of
        the pool lies in this range for the pool's whole life.
        """
        buffer = self.buffer
        if self.closed or buffer.device.type != "cpu":
            return None
        return self.base_address, buffer.numel()

    def add_close_hook(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Call ``hook()`` once when the pool closes (at once if it is closed already).

        Hooks run in the thread that closes the pool, after its objects
        are invalidated and before its memory is released (a pool's backing
        is closed after its policy), in the order they were added, outside
        the pool's lock.  An exception from a hook is logged, not raised.
        In a forked child the hooks are dropped, not run (what they release
        belongs to the parent).

        Returns:
            A function that removes the hook (idempotent); call it when the
            hook's owner goes away before the pool.
        """
        if not callable(hook):
            raise InvalidArgumentError(f"a close hook must be callable, got {hook!r}")
        with self.lock:
            if not self.closed:
                token = self._next_hook
                self._next_hook += 1
                self._close_hooks[token] = hook

                def remove() -> None:
                    with self.lock:
                        self._close_hooks.pop(token, None)

                return remove
        if self._closed_why != "forked":
            _run_hooks([hook], self)
        return _no_op

    # -- lifecycle ----------------------------------------------------------

    def close(self) -> None:
        """Invalidate every object and refuse further allocations.  Idempotent.

        The allocator and its live handles drop their references to the
        memory, so it can go once the caller (or the pool that built this
        allocator) releases it; views made earlier keep it alive.

        Raises:
            LeakedHandleError: strict mode, and objects of the pool were
                garbage-collected without ``ref_count_down`` (after closing).
        """
        self._shut("closed")
        self._raise_leaks()

    def forget_after_fork(self) -> None:
        """Close this policy in a forked child: every handle raises a typed error.

        Called by the fork handler in the child only; the parent is untouched.
        """
        # The parent's lock may have been held at fork time: a fresh one.
        # (Handles keep the old one: a handle whose lock another parent
        # thread held at the fork cannot count in the child.)
        self.lock = threading.Lock()
        self._shut("forked")

    def _shut(self, why: str) -> None:
        lock = self.lock
        lock.acquire()
        try:
            if self.closed:
                return
            self.closed = True
            self._closed_why = why
            self._dropped.clear()
            self._returns.clear()
            for lease in self._leases.values():
                lease.held = False
                lease.detach()
            self._leases.clear()
            self._view = self._pool_bytes = None
            self.buffer = torch.empty(0, dtype=torch.uint8, device=self.buffer.device)
            self._arena = None
            self._forget_memory_locked()
            pinned = self._pinned
            hooks, self._close_hooks = list(self._close_hooks.values()), {}
            if self._usage is not None:
                self._report_usage_locked()  # a closed pool holds nothing
        finally:
            lock.release()
        if pinned and why == "closed":
            # Its pinned objects are gone with it: the monitor lets go of them.
            PinMonitor.GetOrCreate().forget_owner(self)
        if why == "closed":
            _run_hooks(hooks, self)

    def _check_open(self, what: str) -> None:
        if self.closed:
            if self._closed_why == "forked":
                raise self.dead_handle_error(self, what)
            raise PoolClosedError(f"{what} on a closed {self.display_name}")

    def _report_already_freed(self, obj: object) -> None:
        if self.closed and self._closed_why == "closed":
            return  # a closed pool ended every object's life: not misuse
        report(InvalidHandleError, f"batched_free of an already freed object {obj!r}; skipped")


def _no_op() -> None:
    pass


def _run_hooks(hooks: list[Callable[[], None]], pool: object) -> None:
    for hook in hooks:
        try:
            hook()
        except Exception:
            logger.exception("a close hook of %s failed", pool)
