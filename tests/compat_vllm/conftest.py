"""vLLM 0.33.0's own tiering offload manager on a CPU: the vLLM compatibility suite's setup.

This folder runs in an environment that has ``vllm==0.33.0`` (``make
compat`` builds and caches one from the list ``kvpool install-vllm`` installs,
``kvpool/integrations/vllm/requirements-vllm033.txt``;
see ``tests/compat/make_venv.py``).  Where vLLM is not installed the folder
is not collected; ``KVPOOL_REQUIRE_VLLM=1`` (set by ``make compat``) makes
that an error.  The kvpool imported must be this checkout's.

Before vLLM is imported the process is set up as the harness needs it:
``VLLM_TARGET_DEVICE=cpu`` (vLLM's CPU platform), ``HF_HOME`` a folder of
this session's with ``HF_HUB_OFFLINE=1`` (the models are ``config.json``
files filed there by :class:`harness.ModelStore`) and vLLM's log at
WARNING unless ``VLLM_LOGGING_LEVEL`` says otherwise.

Fixtures: ``engines`` makes :class:`harness.Engine` s (closed after the
test); ``shared_tier`` is the ``secondary_tiers`` entry of each tier that
copies bytes and can be shared by engines, one parameter per tier in
:data:`SHARED_TIERS` (add one there to run the harness's tests on it);
``redis_server``, ``redis_cluster``, ``mooncake`` are real servers on
loopback (tests/remote's starters), stopped after the session.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from compat_gate import engine_here
from compat_servers import mooncake, redis_cluster  # noqa: F401 (fixtures)

if not engine_here("vllm", "KVPOOL_REQUIRE_VLLM"):
    collect_ignore_glob = ["*"]
else:
    # Read by vLLM and huggingface_hub when they are imported: set first.
    _HF_HOME = Path(tempfile.mkdtemp(prefix="kvpool-vllm-hf-"))
    os.environ["HF_HOME"] = str(_HF_HOME)
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove this session's model cache."""
    home = globals().get("_HF_HOME")
    if home is not None:
        shutil.rmtree(home, ignore_errors=True)


# -- engines -----------------------------------------------------------------


@pytest.fixture(scope="session")
def model_store() -> Any:
    """The session's offline model cache (:class:`harness.ModelStore`)."""
    from huggingface_hub import constants

    from .harness import ModelStore

    hub = Path(constants.HF_HUB_CACHE)
    if not constants.HF_HUB_OFFLINE or _HF_HOME not in hub.parents:
        raise pytest.UsageError(
            f"huggingface_hub was imported before this conftest set HF_HOME (its cache is "
            f"{hub}, offline={constants.HF_HUB_OFFLINE}); run tests/compat_vllm on its own"
        )
    return ModelStore(hub)


@pytest.fixture
def engines(model_store: Any) -> Iterator[Callable[..., Any]]:
    """``make(tiers, layout=None, **kw)``: a :class:`harness.Engine`, closed after the test.

    ``kw`` goes to the Engine (``engine_id``, ``extra``).  Every engine is
    closed, the last made first; the first error is raised after all are.
    """
    from .harness import Engine

    made: list[Any] = []

    def make(tiers: list[dict[str, Any]], layout: Any = None, **kw: Any) -> Any:
        engine = Engine(model_store, tiers, layout, **kw)
        made.append(engine)
        return engine

    yield make
    errors = []
    for engine in reversed(made):
        try:
            engine.close()
        except Exception as exc:  # close the others, then report it
            errors.append(exc)
    if errors:
        raise errors[0]


def fs_tier(request: pytest.FixtureRequest, root: Path) -> dict[str, Any]:
    """vLLM's own ``fs`` tier in a folder of the test's, with few threads (2 CPUs)."""
    return {"type": "fs", "root_dir": str(root / "fs"), "n_read_threads": 2, "n_write_threads": 2}


#: The tiers the harness's shared-tier tests run on: a name, and a function
#: of the test's request and a folder of its own that gives the
#: ``secondary_tiers`` entry.  The entry must name fresh storage for the
#: test (that folder, or a key prefix of its own on a session's server);
#: engines of one test given the same entry share it.  A tier on a server
#: takes the server from its fixture, e.g.
#: ``lambda request, root: {"type": "KVPoolTier", "module_path":
#: "kvpool.integrations.vllm", "url": request.getfixturevalue("redis_server").url}``.
def kvpool_tier(url: str, **options: Any) -> dict[str, Any]:
    """The ``secondary_tiers`` entry of kvpool's tier on ``url`` (few threads: 2 CPUs)."""
    return {
        "type": "KVPoolTier",
        "module_path": "kvpool.integrations.vllm",
        "url": url,
        "threads": 2,
        **options,
    }


def _fresh_prefix() -> str:
    """A key prefix of the test's own on a session's server (fresh storage per test)."""
    return f"t{uuid.uuid4().hex[:10]}:"


SHARED_TIERS: dict[str, Callable[[pytest.FixtureRequest, Path], dict[str, Any]]] = {
    "fs": fs_tier,
    "kvpool-file": lambda request, root: kvpool_tier(str(root / "kv")),
    "kvpool-redis": lambda request, root: kvpool_tier(
        request.getfixturevalue("redis_server").url, prefix=_fresh_prefix()
    ),
    "kvpool-cluster": lambda request, root: kvpool_tier(
        request.getfixturevalue("redis_cluster").url, prefix=_fresh_prefix()
    ),
    "kvpool-mooncake": lambda request, root: kvpool_tier(
        request.getfixturevalue("mooncake").url, prefix=_fresh_prefix()
    ),
}


@pytest.fixture(params=sorted(SHARED_TIERS))
def shared_tier(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """Each tier of :data:`SHARED_TIERS`: its ``secondary_tiers`` entry, on fresh storage."""
    return SHARED_TIERS[request.param](request, tmp_path)


# -- servers -----------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_server() -> Iterator[Any]:
    """A real redis-server on loopback (tests/remote's ``start_redis``)."""
    from remote.redis_servers import need_redis, start_redis

    server = start_redis(need_redis())
    yield server
    server.stop()


# redis_cluster and mooncake: tests/compat_servers.py (imported at the top).
