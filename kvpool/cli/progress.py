"""A tiny, dependency-free progress bar for long kvpool commands.

It draws ``\\r[#########           ]  45% label`` on one line of a stream
(stderr by default) and draws nothing at all when that stream is not a
terminal, so redirected or piped output stays clean.  The environment
variable ``KVPOOL_PROGRESS`` overrides the decision: ``1`` forces the bar
on (even into a file or a pipe), ``0`` turns it off.

Two forms::

    from kvpool.cli.progress import Progress, progress

    for item in progress(items, label="copying"):   # an iterator
        ...

    with Progress(total=4.0, label="benchmarks") as bar:   # a context manager
        bar.advance(0.5, label="churn trial 1/3")
        bar.set_label("churn trial 2/3")

Redraws are throttled (at most one every ``min_interval`` seconds, except
the final one), so calling :meth:`Progress.advance` in a loop is cheap.
The bar is cleared when the block ends, leaving the line for the output
that follows.  It is not thread-safe: drive one bar from one thread.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TextIO, TypeVar

__all__ = ["ENV_VAR", "Progress", "progress", "progress_enabled"]

#: Environment variable that forces the bar on ("1") or off ("0").
ENV_VAR = "KVPOOL_PROGRESS"

_T = TypeVar("_T")
_TRUE = {"1", "true", "yes", "on", "always"}
_FALSE = {"0", "false", "no", "off", "never"}


def progress_enabled(stream: TextIO | None = None) -> bool:
    """Return True when a progress bar should be drawn on ``stream``.

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
    """A one-line progress bar; a context manager.

    Args:
        total: the amount of work (any positive number; steps need not be
            integers).  0 or less draws an indeterminate bar (no percentage).
        label: text shown after the percentage.
        stream: where to draw (default ``sys.stderr``).
        enabled: draw or not; None (default) asks :func:`progress_enabled`.
        width: characters inside the brackets.
        min_interval: minimum seconds between two redraws.
    """

    def __init__(
        self,
        total: float,
        label: str = "",
        *,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        width: int = 30,
        min_interval: float = 0.1,
    ) -> None:
        self.total = float(total)
        self.done = 0.0
        self.label = label
        self.stream: TextIO = sys.stderr if stream is None else stream
        self.enabled = progress_enabled(self.stream) if enabled is None else bool(enabled)
        self.width = max(1, int(width))
        self.min_interval = float(min_interval)
        self._last_draw = float("-inf")
        self._drawn_len = 0

    def __enter__(self) -> Progress:
        self._draw(force=True)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def advance(self, amount: float = 1.0, label: str | None = None) -> None:
        """Add ``amount`` to the work done (and optionally change the label); redraw."""
        self.done += amount
        if label is not None:
            self.label = label
        self._draw(force=self.total > 0 and self.done >= self.total)

    def set_label(self, label: str, force: bool = False) -> None:
        """Change the label and redraw (throttled unless ``force``).

        Pass ``force=True`` before a long step, so the label that names it
        is on screen while it runs.
        """
        self.label = label
        self._draw(force=force)

    def render(self) -> str:
        """The bar as text, without the leading carriage return."""
        if self.total > 0:
            frac = min(1.0, max(0.0, self.done / self.total))
            filled = round(frac * self.width)
            bar = "#" * filled + " " * (self.width - filled)
            text = f"[{bar}] {frac * 100:3.0f}%"
        else:
            text = f"[{'?' * self.width}]  ..."
        return f"{text} {self.label}" if self.label else text

    def _draw(self, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last_draw < self.min_interval:
            return
        self._last_draw = now
        text = self.render()
        # Pad with spaces to wipe what a longer previous line left behind.
        pad = max(0, self._drawn_len - len(text))
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()
        self._drawn_len = len(text)

    def close(self) -> None:
        """Clear the bar's line (idempotent)."""
        if self.enabled and self._drawn_len:
            self.stream.write("\r" + " " * self._drawn_len + "\r")
            self.stream.flush()
            self._drawn_len = 0


def progress(
    iterable: Iterable[_T],
    total: float | None = None,
    label: str = "",
    *,
    stream: TextIO | None = None,
    enabled: bool | None = None,
) -> Iterator[_T]:
    """Yield the items of ``iterable`` while drawing a bar (one step per item).

    ``total`` defaults to ``len(iterable)`` when it has one (else the bar is
    indeterminate).  The bar is cleared when the loop ends or is left early.
    """
    if total is None:
        try:
            total = len(iterable)  # type: ignore[arg-type]
        except TypeError:
            total = 0
    with Progress(total, label, stream=stream, enabled=enabled) as bar:
        for item in iterable:
            yield item
            bar.advance(1)
