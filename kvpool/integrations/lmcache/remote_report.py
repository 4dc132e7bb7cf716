"""What the plugin says about store errors: misses for LMCache, few log lines, every event counted.

LMCache treats a remote error as a miss, and so does the connector: no
store error reaches LMCache's engine.  What gets logged (on the plugin's
logger, which LMCache's log settings govern):

==============================  =============================================
event                           log
==============================  =============================================
miss; full LMCache cache        nothing above DEBUG (normal events)
closing; a freed object         nothing above DEBUG
corrupt or foreign entry        one WARNING per entry read, naming the key
store unreachable, timing out,  one WARNING when it starts failing, one INFO
refusing (an outage)            when a call succeeds again; DEBUG in between
anything else (a bug)           a WARNING with its type, rate-limited as an outage
==============================  =============================================

Every call the connector makes is counted in its
:class:`~kvpool.remote.counters.StoreCounters` (errors by type), and
:attr:`Reporter.corrupt` / :attr:`Reporter.outages` count those events.
The :class:`Reporter` is the one every integration shares
(:mod:`kvpool.integrations.shared.report`); what is LMCache's is the logger.
"""

from __future__ import annotations

import logging

from kvpool.integrations.shared.report import Reporter, is_quiet

__all__ = ["LOGGER_NAME", "Reporter", "is_quiet", "plugin_logger"]

#: The plugin's logger: the module users name in LMCache's config.
LOGGER_NAME = "kvpool.integrations.lmcache.remote"


def plugin_logger() -> logging.Logger:
    """The plugin's logger, set up by LMCache's ``init_logger`` on first use.

    It then prints with LMCache's format at ``LMCACHE_LOG_LEVEL`` (INFO by
    default), next to LMCache's own lines, and does not propagate (as
    LMCache's loggers).
    """
    logger = logging.getLogger(LOGGER_NAME)
    if not logger.handlers:
        from lmcache.logging import init_logger

        logger = init_logger(LOGGER_NAME)
    return logger
