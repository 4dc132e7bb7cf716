"""Tests of kvpool.remote (a package, so that the tests share conftest helpers)."""
