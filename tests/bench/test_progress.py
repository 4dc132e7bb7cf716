"""kvpool.cli.progress: silent off a terminal or without tqdm, drawn by tqdm on one."""

from __future__ import annotations

import io

import pytest

from kvpool.cli import progress as progress_module
from kvpool.cli.progress import ENV_VAR, Progress, progress, progress_enabled, tqdm_available


class FakeTTY(io.StringIO):
    """A text stream that claims to be a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _no_env_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)


needs_tqdm = pytest.mark.skipif(not tqdm_available(), reason="tqdm is not installed")


def test_silent_when_not_a_tty() -> None:
    out = io.StringIO()
    assert not progress_enabled(out)
    with Progress(3, "work", stream=out) as bar:
        for _ in range(3):
            bar.advance(1)
        bar.set_label("other", force=True)
        assert not bar.drawing
    assert list(progress(range(5), label="x", stream=out)) == [0, 1, 2, 3, 4]
    assert out.getvalue() == ""


@needs_tqdm
def test_drawn_by_tqdm_on_a_tty_and_cleared_after() -> None:
    out = FakeTTY()
    with Progress(4, "copying", stream=out) as bar:
        bar.advance(2)
        bar.set_label("copying", force=True)
        assert bar.drawing
        assert "copying" in out.getvalue() and "2/4" in out.getvalue()
    assert not bar.drawing  # closed: tqdm wiped its line (leave=False)


def test_without_tqdm_nothing_is_drawn_even_on_a_tty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress_module, "tqdm_available", lambda: False)
    out = FakeTTY()
    with Progress(4, "copying", stream=out) as bar:
        bar.advance(4)
        assert not bar.drawing
    assert out.getvalue() == ""
    assert bar.done == 4


@needs_tqdm
def test_env_forces_on_and_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "1")
    out = io.StringIO()
    assert progress_enabled(out)
    assert list(progress(["a", "b"], label="items", stream=out)) == ["a", "b"]
    assert "items" in out.getvalue()

    monkeypatch.setenv(ENV_VAR, "0")
    tty = FakeTTY()
    assert not progress_enabled(tty)
    with Progress(1, stream=tty) as bar:
        bar.advance(1)
    assert tty.getvalue() == ""


def test_unrecognised_env_value_falls_back_to_isatty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "maybe")
    assert not progress_enabled(io.StringIO())
    assert progress_enabled(FakeTTY())


@needs_tqdm
def test_explicit_enabled_wins_over_the_stream() -> None:
    out = io.StringIO()
    with Progress(2, "x", stream=out, enabled=True) as bar:
        bar.advance(1)
    assert "x" in out.getvalue()


def test_closed_or_odd_streams_count_as_not_a_tty() -> None:
    closed = io.StringIO()
    closed.close()
    assert not progress_enabled(closed)
    assert not progress_enabled(object())  # type: ignore[arg-type]


def test_close_is_idempotent_and_counts_are_kept() -> None:
    bar = Progress(2, "over", enabled=False)
    bar.advance(5, label="later")
    assert bar.done == 5 and bar.label == "later"
    bar.close()
    bar.close()


@needs_tqdm
def test_iterator_without_len_has_an_unknown_total() -> None:
    out = FakeTTY()
    items = list(progress((i for i in range(3)), label="gen", stream=out))
    assert items == [0, 1, 2]
    assert "gen: 0it" in out.getvalue()  # tqdm's form for an unknown total
