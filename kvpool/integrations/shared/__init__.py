"""What every engine integration needs, written once: settings, keys, outages, closing.

The engine rooms above (:mod:`kvpool.integrations.lmcache`,
:mod:`kvpool.integrations.sglang`) translate their engine's calls into
store calls; the rules they share live here, and import no engine:

* :mod:`.settings` - the store a configuration names (``url`` plus store
  options), unknown options refused with the closest name, passwords
  redacted in every message;
* :mod:`.keys` - store keys that carry the engine's identity (model,
  parallel ranks, KV dtype, layout), so two configurations never read
  each other's entries;
* :mod:`.report` - store errors as the engine sees them: a miss, one
  typed warning per outage, counters;
* :mod:`.calls` - calls in flight on an event loop, and a close that
  returns within a bound whatever is still running.
"""
