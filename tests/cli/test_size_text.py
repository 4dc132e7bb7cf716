"""Sizes as text: the command line and the Python API read them alike, or the API names the fix.

The command line takes ``--size 64MB``; the Python API takes sizes as ints
and refuses ``"64MB"`` with a message naming the exact call that reads it
as the command line does (``kvpool.parse_size``).
"""

from __future__ import annotations

import argparse

import pytest

import kvpool
from kvpool.cli.args import size_arg

READINGS = [
    ("65536", 65536),
    ("4K", 4 << 10),
    ("64M", 64 << 20),
    ("64MB", 64 << 20),
    ("64MiB", 64 << 20),
    ("64 MiB", 64 << 20),
    ("64mb", 64 << 20),
    ("1.5GiB", 3 << 29),
    ("2T", 2 << 40),
]


@pytest.mark.parametrize(("text", "size"), READINGS)
def test_the_api_and_the_command_line_read_a_size_alike(text: str, size: int) -> None:
    assert kvpool.parse_size(text) == size
    assert size_arg(text) == size


@pytest.mark.parametrize("text", ["lots", "0", "-1M", "1.5", "infG", "nanM", "", "MB"])
def test_what_is_not_a_size_is_refused_by_both(text: str) -> None:
    with pytest.raises(kvpool.InvalidArgumentError):
        kvpool.parse_size(text)
    with pytest.raises(argparse.ArgumentTypeError):
        size_arg(text)


def test_parse_size_takes_text_only() -> None:
    with pytest.raises(kvpool.ArgumentTypeError, match="must be a str"):
        kvpool.parse_size(64)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "make",
    [
        kvpool.MixedMemoryAllocator,
        kvpool.HostMemoryAllocator,
        lambda size: kvpool.allocate_host(size),
        lambda size: kvpool.LazyMemoryAllocator(16 << 20, size),
        lambda size: kvpool.LazyMemoryAllocator(size, 128 << 20),
        lambda size: kvpool.attach_pool("/kvpool-test-no-such-pool", size),
    ],
    ids=["mixed", "host", "allocate_host", "lazy_final", "lazy_init", "attach_pool"],
)
def test_a_pool_size_as_text_is_refused_with_the_exact_fix(make) -> None:
    # It said only "size must be an int, got str '64MB'".
    with pytest.raises(kvpool.ArgumentTypeError) as caught:
        make("64MB")
    assert "pass kvpool.parse_size('64MB')" in str(caught.value)
    assert isinstance(caught.value, TypeError) and isinstance(caught.value, ValueError)


def test_the_fix_named_makes_the_pool_the_command_line_would() -> None:
    with kvpool.MixedMemoryAllocator(kvpool.parse_size("64MB")) as pool:
        assert pool.stats().total_bytes == 64 << 20
