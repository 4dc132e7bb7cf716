"""Shared by every test folder.

Its presence puts ``tests/`` on ``sys.path``, so test helpers that more
than one folder needs (``hugepage_pool``) are imported from there.
"""
