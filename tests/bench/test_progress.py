"""kvpool.cli.progress: silent off a terminal, drawn on one, KVPOOL_PROGRESS overrides."""

from __future__ import annotations

import io

import pytest

from kvpool.cli.progress import ENV_VAR, Progress, progress, progress_enabled


class FakeTTY(io.StringIO):
    """A text stream that claims to be a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _no_env_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)


def test_silent_when_not_a_tty() -> None:
    out = io.StringIO()
    assert not progress_enabled(out)
    with Progress(3, "work", stream=out) as bar:
        for _ in range(3):
            bar.advance(1)
        bar.set_label("other", force=True)
    assert list(progress(range(5), label="x", stream=out)) == [0, 1, 2, 3, 4]
    assert out.getvalue() == ""


def test_draws_on_a_tty_and_clears_after() -> None:
    out = FakeTTY()
    assert progress_enabled(out)
    with Progress(4, "copying", stream=out, min_interval=0) as bar:
        bar.advance(2)
        text = out.getvalue()
        assert "\r[" in text and " 50% copying" in text
        assert "#" * 15 + " " * 15 in text  # 30 wide, half full
        bar.advance(2, label="done")
    text = out.getvalue()
    assert "100% done" in text
    assert text.endswith("\r")  # the line is wiped when the block ends


def test_env_forces_on_and_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "1")
    out = io.StringIO()
    assert progress_enabled(out)
    assert list(progress(["a", "b"], label="items", stream=out)) == ["a", "b"]
    assert "100% items" in out.getvalue()

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


def test_render_is_clamped_and_handles_unknown_totals() -> None:
    bar = Progress(2, "over", enabled=False)
    bar.advance(5)
    assert bar.render().startswith("[" + "#" * 30 + "] 100%")
    assert "..." in Progress(0, "unknown", enabled=False).render()


def test_throttle_skips_redraws_but_not_forced_ones() -> None:
    out = FakeTTY()
    bar = Progress(1000, "t", stream=out, min_interval=3600)
    bar.advance(1, label="first")  # first draw is never throttled
    drawn = out.getvalue()
    bar.advance(1, label="second")
    assert out.getvalue() == drawn
    bar.set_label("forced", force=True)
    assert "forced" in out.getvalue()
    bar.close()
    bar.close()  # idempotent


def test_iterator_without_len_is_indeterminate() -> None:
    out = FakeTTY()
    items = list(progress((i for i in range(3)), label="gen", stream=out))
    assert items == [0, 1, 2]
    assert "... gen" in out.getvalue()


def test_leaving_the_loop_early_clears_the_bar() -> None:
    out = FakeTTY()
    gen = progress(range(10), label="early", stream=out)
    for i in gen:
        if i == 2:
            break
    gen.close()
    assert out.getvalue().endswith("\r")
