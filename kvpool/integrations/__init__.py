"""Bridges that run other projects' code on kvpool memory.

Each bridge is a subpackage named after the project it serves
(:mod:`kvpool.integrations.lmcache`).  A bridge only maps the other
project's names onto kvpool's public API and forwards events to the other
project's monitors; the memory management itself is kvpool's.
"""
