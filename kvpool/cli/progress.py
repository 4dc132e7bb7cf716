"""Progress bars for long kvpool commands, drawn by tqdm when it is installed.

``pip install 'kvpool[progress]'`` (or any tqdm) gives a bar on stderr while
``kvpool bench`` and ``kvpool demo`` run; without tqdm, or when the stream
is not a terminal, nothing is drawn and output that is redirected or piped
stays clean.  ``KVPOOL_PROGRESS`` overrides the terminal test: ``1`` draws
(even into a file or a pipe), ``0`` never draws.

Two forms::

    from kvpool.cli.progress import Progress, progress

    for item in progress(items, label="copying"):   # an iterator
        ...

    with Progress(total=4.0, label="benchmarks") as bar:   # a context manager
        bar.advance(0.5, label="churn trial 1/3")
        bar.set_label("churn trial 2/3")

A bar is driven by one thread.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TextIO, TypeVar

__all__ = ["ENV_VAR", "Progress", "progress", "progress_enabled", "tqdm_available"]

#: Environment variable that forces the bar on ("1") or off ("0").
ENV_VAR = "KVPOOL_PROGRESS"

_T = TypeVar("_T")
_TRUE = {"1", "true", "yes", "on", "always"}
_FALSE = {"0", "false", "no", "off", "never"}


def tqdm_available() -> bool:
    """True when tqdm can be imported (``pip install 'kvpool[progress]'``)."""
    return importlib.util.find_spec("tqdm") is not None


def progress_enabled(stream: TextIO | None = None) -> bool:
    """Return True when a bar should be drawn on ``stream`` (tqdm permitting).

    ``KVPOOL_PROGRESS`` decides when it is set to a recognised value
    (1/true/yes/on or 0/false/no/off); otherwise the bar is drawn only
    when ``stream`` (default: ``sys.stderr``) is a terminal.
    """
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class Progress:
    """A bar of ``total`` units, as a context manager; silent without tqdm.

    Args:
        total: units of work (0 or less: unknown).
        label: text shown next to the bar.
        stream: where to draw (default ``sys.stderr``).
        enabled: draw or not; None decides with :func:`progress_enabled`.
    """

    def __init__(
        self,
        total: float,
        label: str = "",
        *,
        stream: TextIO | None = None,
        enabled: bool | None = None,
    ) -> None:
        self.total = float(total)
        self.label = label
        self.done = 0.0
        out = sys.stderr if stream is None else stream
        draw = progress_enabled(out) if enabled is None else enabled
        self._bar: Any = None
        if draw and tqdm_available():
            from tqdm import tqdm

            self._bar = tqdm(
                total=self.total if self.total > 0 else None,
                desc=label,
                file=out,
                leave=False,
                dynamic_ncols=True,
            )

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def advance(self, amount: float = 1.0, label: str | None = None) -> None:
        """Add ``amount`` units of work done; optionally change the label."""
        self.done += amount
        if label is not None:
            self.set_label(label)
        if self._bar is not None:
            self._bar.update(amount)

    def set_label(self, label: str, force: bool = False) -> None:
        """Change the text next to the bar (``force`` redraws at once)."""
        self.label = label
        if self._bar is not None:
            self._bar.set_description_str(label, refresh=force)

    @property
    def drawing(self) -> bool:
        """True when a bar is on the stream."""
        return self._bar is not None

    def close(self) -> None:
        """Remove the bar from the stream.  Idempotent."""
        bar, self._bar = self._bar, None
        if bar is not None:
            bar.close()


def progress(items: Iterable[_T], label: str = "", *, stream: TextIO | None = None) -> Iterator[_T]:
    """Yield ``items`` while a bar counts them (its total is ``len(items)`` when known)."""
    total = len(items) if hasattr(items, "__len__") else 0  # type: ignore[arg-type]
    with Progress(total, label, stream=stream) as bar:
        for item in items:
            yield item
            bar.advance(1)
