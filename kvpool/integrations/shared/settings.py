"""The store an engine's configuration names: its URL, its options, refused with the fix.

Both integrations read the same two things from their engine's
configuration - a ``url`` that :func:`kvpool.remote.open_async_store`
takes and keyword options of that store - next to keys the engine itself
reads.  :func:`read_store_settings` separates them: a key that is neither
the engine's, nor ``url``, nor an option of the URL's store is refused
with the closest accepted name.  Every message shows the URL and string
options redacted (:func:`~kvpool.remote.redis.config.redact_url`), and a
store's own refusal is scrubbed of the secrets it may quote.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kvpool.errors import ArgumentTypeError, KVPoolError, RemoteStoreError
from kvpool.remote import (
    AsyncRemoteStore,
    RemoteStore,
    open_async_store,
    open_store,
    store_kind,
    store_options,
)
from kvpool.remote.redis.config import redact_url, scrub, url_secrets

__all__ = [
    "StoreSettings",
    "open_settings_store",
    "read_store_settings",
    "refusal",
    "with_defaults",
]

_QUOTED = re.compile(r"'([A-Za-z_][A-Za-z0-9_]*)'")


@dataclass(frozen=True)
class StoreSettings:
    """The store one configured integration instance opens.

    Attributes:
        instance: the instance's name, as the engine's configuration names it.
        url: the store spec (may hold a password: show :attr:`shown_url`).
        options: the store's keyword arguments.
        prefix: how the configuration names an option (``remote_storage_plugin.kvpool.``,
            ``extra_config.``), for messages.
    """

    instance: str
    url: str
    options: dict[str, Any] = field(default_factory=dict)
    prefix: str = ""

    @property
    def shown_url(self) -> str:
        """The URL with its password and secret query values replaced by ``***``."""
        return redact_url(self.url)

    def describe(self) -> str:
        """``url (option=value, ...)`` for a start-up line (no secrets).

        A string option is shown as :func:`redact_url` shows a URL, since
        some are URLs that may hold a password (Mooncake's ``metadata``).
        """
        shown = ", ".join(
            f"{k}={redact_url(v) if isinstance(v, str) else v!r}"
            for k, v in sorted(self.options.items())
        )
        return f"{self.shown_url}" + (f" ({shown})" if shown else "")

    def secrets(self) -> tuple[str, ...]:
        """The passwords and secret query values in the URL and the string options.

        For :func:`~kvpool.remote.redis.config.scrub` to remove from texts
        that may quote them (a store's error message).
        """
        texts = [self.url, *(v for v in self.options.values() if isinstance(v, str))]
        found = {secret for text in texts for secret in url_secrets(text)}
        return tuple(sorted(found, key=len, reverse=True))


def read_store_settings(
    values: Mapping[str, Any] | None,
    *,
    instance: str,
    prefix: str,
    engine_keys: Collection[str],
    error: type[Exception],
    example: str = "redis://127.0.0.1:6379/0",
    asyncio: bool = True,
) -> StoreSettings:
    """The ``url`` and store options among ``values``, the engine's own keys left out.

    Args:
        values: the instance's keys (prefix already removed), or None.
        instance: the instance's name, for messages.
        prefix: how the configuration spells a key, for messages.
        engine_keys: keys the engine (or the integration) reads itself.
        error: the exception class to raise (the integration's config error).
        example: a URL for the message when ``url`` is missing.
        asyncio: the options of the asyncio store of the URL (True) or of
            the blocking one (False), as :func:`open_settings_store` opens it.

    Returns:
        The settings; the options are exactly the keys the URL's store takes.

    Raises:
        error: no ``url``, a ``url`` that is not a non-empty string or that
            no store takes, or a key that is neither the engine's nor an
            option of that store (named with the closest accepted key).
    """
    given = dict(values or {})
    url = given.pop("url", None)
    if url is None:
        raise error(
            f"{instance}: the configuration has no {prefix}url; set it to the store, e.g. "
            f'{prefix}url: "{example}" (any spec kvpool.remote.open_async_store takes: '
            "redis://, rediss://, redis-cluster://h1:p1,h2:p2, file:///path, mooncake://...)"
        )
    if not isinstance(url, str) or not url.strip():
        raise error(
            f"{instance}: {prefix}url must be a non-empty string, got "
            f"{type(url).__name__} {redact_url(str(url))!r}"
        )
    url = url.strip()
    try:
        accepted = store_options(url, asyncio=asyncio)
    except KVPoolError as exc:
        raise error(f"{instance}: {prefix}url is refused: {exc}") from None
    known = set(engine_keys)
    options = {k: v for k, v in given.items() if k not in known}
    for name in sorted(options):
        if name not in accepted:
            everything = sorted({"url", *known, *accepted})
            close = difflib.get_close_matches(str(name), everything, n=1)
            hint = f"; did you mean {prefix}{close[0]}?" if close else ""
            raise error(
                f"{instance} ({redact_url(url)}): unknown option {prefix}{name}{hint} "
                f"(accepted: {', '.join(everything)})"
            )
    return StoreSettings(instance, url, options, prefix)


def with_defaults(
    settings: StoreSettings,
    defaults: Mapping[str, Mapping[str, Any]],
    asyncio: bool = False,
    computed: Callable[[str], Any] | None = None,
) -> StoreSettings:
    """``settings`` plus an integration's per-kind store defaults that nobody set.

    A default applies when the URL's store takes the option and neither the
    configuration nor the URL's query sets it.

    Args:
        settings: as read by :func:`read_store_settings`.
        defaults: per store kind (``"file"``, ``"redis"``...), option -> value.
        asyncio: the options of the asyncio store (True) or the blocking one.
        computed: turns a default of ``None`` into its value, given the option's
            name (for defaults that depend on the machine); None leaves it None.

    Returns:
        The settings with the defaults added (the same object when none applies).
    """
    accepted = store_options(settings.url, asyncio=asyncio)
    in_query = set(parse_qs(urlsplit(settings.url).query))
    added = {
        name: computed(name) if value is None and computed is not None else value
        for name, value in defaults.get(store_kind(settings.url), {}).items()
        if name in accepted and name not in settings.options and name not in in_query
    }
    if not added:
        return settings
    return dataclasses.replace(settings, options={**settings.options, **added})


def refusal(
    settings: StoreSettings, exc: Exception, label: str, error: type[Exception]
) -> Exception:
    """The config error for a store that refused ``settings`` (its secrets scrubbed).

    An unknown option (``ArgumentTypeError`` from the store's keyword
    check, which lists the accepted ones and the closest) is named by its
    configuration key; any other refusal is prefixed with ``label``.
    """
    text = scrub(str(exc), settings.secrets())  # a store may quote the value it refused
    if isinstance(exc, ArgumentTypeError):
        named = [n for n in _QUOTED.findall(text) if n in settings.options]
        if named:
            return error(
                f"{label}: unknown option {settings.prefix}{named[0]}: {text}; options go in "
                f"the configuration as {settings.prefix}<option>"
            )
    return error(f"{label}: the store refused its settings: {text}")


def open_settings_store(
    settings: StoreSettings, label: str, error: type[Exception], asyncio: bool = True
) -> Any:
    """The asyncio store of ``settings``, or the blocking one with ``asyncio=False``.

    An :class:`AsyncRemoteStore` for an engine with an event loop; a
    :class:`RemoteStore` for one that calls from its own threads.

    Raises:
        RemoteStoreError: the server does not answer (``mooncake://`` connects here).
        error: the store refused its settings (see :func:`refusal`).
    """
    opener = open_async_store if asyncio else open_store
    try:
        store: AsyncRemoteStore | RemoteStore = opener(settings.url, **settings.options)
    except RemoteStoreError:
        raise
    except (KVPoolError, TypeError, ValueError) as exc:
        raise refusal(settings, exc, label, error) from None
    return store
