"""Fixtures of the packaging tests: a fresh, never-built copy of this checkout."""

from __future__ import annotations

from pathlib import Path

import pytest
from checkout_copy import copy_checkout


@pytest.fixture(scope="session")
def fresh_clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A never-built copy of this checkout (:mod:`checkout_copy`), shared: read only."""
    return copy_checkout(tmp_path_factory.mktemp("fresh") / "kvpool-src")
