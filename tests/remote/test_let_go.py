"""kvpool.remote.objects letting go of views: discard, let_go, and where they stop.

The store tests (test_store_views, test_cache_workload) show the outcome on
every store; these pin the mechanism down on a pool alone: a view kept by
a finished frame of an exception, or by any reference to a view the caller
names, no longer holds the bytes once ``discard``/``let_go`` ran; an
exception some frame above was handling is never touched.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch

import kvpool
from kvpool.remote.objects import destination, discard, let_go

from .conftest import KV_DTYPE, KV_FMT, KV_SHAPE

KV_BYTES = KV_SHAPE.numel() * KV_DTYPE.itemsize


@pytest.fixture
def small() -> Any:
    p = kvpool.TensorMemoryAllocator(torch.empty(4 * KV_BYTES, dtype=torch.uint8))
    yield p
    p.close()


def _layout() -> Any:
    from kvpool.remote.header import layout_for

    return layout_for([KV_SHAPE], [KV_DTYPE])


def _fail_holding(view: memoryview) -> None:
    part = view[8:64]  # a slice only this (finished) frame keeps
    part[0] = 1
    raise ValueError("the read failed")


def test_discard_lets_go_of_what_the_failed_callee_frames_and_the_caller_hold(
    small: Any, strict: None
) -> None:
    obj, view = destination(small, _layout(), KV_FMT, "test")
    kept = (view, lambda: view)  # more references to the same view object
    try:
        _fail_holding(view)
    except ValueError:
        discard(obj, view)  # strict mode: raises if any view were still alive
    assert small.stats().used_bytes == 0
    assert small.stats().held_by_views_bytes == 0
    with pytest.raises(ValueError, match="released"):
        kept[1]()[0]  # the caller's own view was released, wherever it is referenced


def test_a_miss_discard_needs_no_exception(small: Any, strict: None) -> None:
    obj, view = destination(small, _layout(), KV_FMT, "test")
    discard(obj, view)
    assert small.stats().used_bytes == 0


def test_let_go_clears_finished_frames_of_the_exception_and_its_chain(small: Any) -> None:
    obj = small.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)

    def inner() -> None:
        local = obj.byte_array
        raise KeyError(local.nbytes)

    def outer() -> None:
        try:
            inner()
        except KeyError as exc:
            raise RuntimeError("mapped") from exc

    try:
        outer()
    except RuntimeError as caught:
        let_go(caught)
        error = caught
    assert isinstance(error.__cause__, KeyError)
    # The frames are there (file and line), their locals are gone.
    frames = []
    tb = error.__cause__.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_name)
        assert "local" not in tb.tb_frame.f_locals
        tb = tb.tb_next
    assert frames[-1] == "inner"
    obj.ref_count_down()
    assert small.stats().held_by_views_bytes == 0  # no view survived in the traceback


def test_let_go_never_touches_an_exception_a_frame_above_was_handling(small: Any) -> None:
    def theirs() -> None:
        mine = "the caller's"  # noqa: F841 - read back through the frame
        raise KeyError("theirs")

    def store_call() -> BaseException:
        try:
            raise ValueError("ours")  # __context__: the caller's KeyError
        except ValueError as exc:
            let_go(exc)
            return exc

    try:
        theirs()
    except KeyError:
        handled = sys.exc_info()[1]
        ours = store_call()
        assert ours.__context__ is handled
    assert handled.__traceback__.tb_next.tb_frame.f_locals["mine"] == "the caller's"
