"""Which placement policy a pool uses: :class:`PlacementSpec`, and the policies by name.

A policy module (:mod:`kvpool.pool.extent`, :mod:`kvpool.pool.paged`)
registers a builder under its name with :func:`register_policy`; a
:class:`PlacementSpec` names one and carries its options, and
:meth:`PlacementSpec.build` makes the policy over a pool's memory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from kvpool.checks import check_bool
from kvpool.errors import InvalidArgumentError
from kvpool.formats import normalize_layout

if TYPE_CHECKING:
    from kvpool.pool.policy import PlacementPolicy

__all__ = ["POLICIES", "PlacementSpec", "policy_builder", "register_policy"]


@dataclass(frozen=True)
class PlacementSpec:
    """Which placement policy a pool uses, and its options.

    Attributes:
        kind: a name registered with :func:`register_policy`: ``"extent"``
            (variable-size objects, the default) or ``"paged"`` (one object
            per fixed-size page).
        align_bytes: extent alignment, a power of two.
        init_address_space: extent bytes usable at first (lazy pools), or
            None for all of the memory.
        shapes: paged: the layout of a full page, one shape per group.
        dtypes: paged: the dtypes of the groups.
        fmt: paged: the objects' default format.
    """

    kind: str = "extent"
    align_bytes: int = 4096
    init_address_space: int | None = None
    shapes: Any = None
    dtypes: Any = None
    fmt: Any = None

    @classmethod
    def from_reference(
        cls, use_paging: object, options: dict[str, Any], *, align_bytes: int = 4096
    ) -> PlacementSpec:
        """The spec the reference's ``use_paging=`` and keyword arguments describe.

        Raises:
            InvalidArgumentError: ``use_paging`` is not a bool.
        """
        if check_bool("use_paging", use_paging):
            return cls(
                "paged",
                shapes=options.get("shapes"),
                dtypes=options.get("dtypes"),
                fmt=options.get("fmt"),
            )
        return cls("extent", align_bytes=options.get("align_bytes", align_bytes))

    def unit(self) -> int:
        """The bytes objects come in: a paged pool's page, else the alignment (0: unknown).

        A pool registers its memory in chunks that are multiples of it
        (:func:`~kvpool.pool.backing.pool_register_chunk`).
        """
        if self.kind != "paged":  # a bad alignment: the policy's build says why
            align = self.align_bytes
            return (
                align if isinstance(align, int) and not isinstance(align, bool) and align > 0 else 0
            )
        try:
            return max(normalize_layout(self.shapes, self.dtypes)[2], 0)
        except (TypeError, ValueError):  # a bad layout: the policy's build says why
            return 0

    def build(self, tensor: torch.Tensor, byte_view: memoryview | None) -> PlacementPolicy:
        """Build the policy over ``tensor`` with the registered builder.

        Raises:
            InvalidArgumentError: unknown kind, or options the policy refuses.
        """
        return policy_builder(self.kind)(tensor, byte_view, self)


#: Placement policies by name: builders ``(tensor, byte_view, spec) -> policy``
#: registered by each policy's module (see :func:`register_policy`).
POLICIES: dict[str, Callable[..., PlacementPolicy]] = {}


def register_policy(name: str, build: Callable[..., PlacementPolicy]) -> None:
    """Make a placement policy available to pools under ``name``.

    Args:
        name: what a :class:`PlacementSpec` calls it (``"extent"``, ``"paged"``).
        build: ``build(tensor, byte_view, spec)`` returning the policy.
    """
    POLICIES[name] = build


def policy_builder(name: object) -> Callable[..., PlacementPolicy]:
    """The builder registered under ``name``.

    Raises:
        InvalidArgumentError: no policy of that name.
    """
    build = POLICIES.get(name) if isinstance(name, str) else None
    if build is None:
        raise InvalidArgumentError(
            f"unknown placement policy {name!r}; choose one of {', '.join(sorted(POLICIES))}"
        )
    return build
