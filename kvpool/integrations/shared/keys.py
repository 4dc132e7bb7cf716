"""Store keys that carry an engine configuration's identity, so configurations never mix.

An engine names a cached page by a hash of its tokens; the same tokens
cached by another model, another tensor-parallel shard, another KV dtype
or another memory layout are *different bytes*, and must be different
entries (SGLang's own backends leave the dtype out: sglang #33268).
:class:`KeySpace` turns the parts that make bytes differ into one short
tag that every key of the configuration carries::

    space = KeySpace("sglang", model="Qwen/Qwen3-8B", tp="0/2", dtype="bfloat16")
    space.key("a3f9...", 0)      # '5c1d0e9b2a7f4361.a3f9....0'
    space.prefix                 # '5c1d0e9b2a7f4361.': every key of the configuration
    space.text                   # 'sglang;model=Qwen/Qwen3-8B;tp=0/2;dtype=bfloat16'

The tag is the first 16 hex digits of the SHA-256 of :attr:`KeySpace.text`
(64 bits: two configurations collide with odds of 1 in 2^64).  It comes
first, so a configuration's entries are exactly those under
:attr:`KeySpace.prefix`: a store's ``delete_prefix`` removes them and no
other configuration's.  Keys are made of ``[0-9A-Za-z._-]`` only, so every
store takes them as they are: a file name without escaping, no Redis
Cluster hash tag (``{...}``) that would pin them to one slot (a common
prefix does not: a key's slot is the hash of all of it).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

from kvpool.errors import InvalidArgumentError

__all__ = ["KeySpace"]

_SAFE = re.compile(r"[0-9A-Za-z_.\-]+").fullmatch


class KeySpace:
    """The keys of one engine configuration (see the module docstring).

    Args:
        engine: the engine's name (``sglang``).
        **parts: what makes the configuration's bytes differ, in a fixed
            order (their ``str()`` is used; ``;`` and ``=`` are escaped).

    Attributes:
        text: the readable description (for logs).
        tag: its 16-hex-digit digest, carried by every key.
        prefix: ``tag + "."``, what every key of the configuration starts with.
    """

    __slots__ = ("prefix", "tag", "text")

    def __init__(self, engine: str, **parts: object) -> None:
        fields = [engine] + [f"{name}={_escape(str(value))}" for name, value in parts.items()]
        self.text = ";".join(fields)
        self.tag = hashlib.sha256(self.text.encode("utf-8")).hexdigest()[:16]
        self.prefix = self.tag + "."

    def key(self, name: str, part: int | None = None) -> str:
        """The store key of the engine's ``name`` (and of its ``part``, e.g. a page's K or V).

        Raises:
            InvalidArgumentError: ``name`` has characters outside ``[0-9A-Za-z._-]``
                (an engine hash is hex; anything else would need escaping).
        """
        if not _SAFE(name):
            raise InvalidArgumentError(
                f"engine key {name!r:.80} has characters outside [0-9A-Za-z._-]; pass the "
                "engine's hash as it is"
            )
        base = self.prefix + name
        return base if part is None else f"{base}.{part}"

    def keys(self, names: Sequence[str], parts: int) -> list[str]:
        """The keys of parts ``0 .. parts-1`` of every name, name by name (each name checked once).

        Raises:
            InvalidArgumentError: as :meth:`key`.
        """
        out: list[str] = []
        prefix = self.prefix
        for name in names:
            if not _SAFE(name):
                self.key(name)  # raises, naming the key
            base = prefix + name + "."
            out.extend([base + str(part) for part in range(parts)])
        return out

    def __repr__(self) -> str:
        return f"<KeySpace {self.text} ({self.tag})>"


def _escape(value: str) -> str:
    return value.replace("%", "%25").replace(";", "%3B").replace("=", "%3D")
