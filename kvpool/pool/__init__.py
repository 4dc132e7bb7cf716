"""The pool layer: placement, backings, memory objects, policies, pools, monitors.

Where things go: a new placement policy is a module next to
:mod:`~kvpool.pool.extent` and :mod:`~kvpool.pool.paged`, registered in
:mod:`~kvpool.pool.policy`; a new source of bytes is a
:class:`~kvpool.pool.backing.Backing` subclass in :mod:`~kvpool.pool.backing`;
the one pool type, :class:`~kvpool.pool.pools.MemoryPool`, combines the two.
"""
