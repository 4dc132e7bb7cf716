"""vLLM 0.33's tiering offload manager on a CPU, built from a user's JSON, driven as vLLM drives it.

:class:`Engine` is one vLLM engine's scheduler side, made the way ``vllm
serve MODEL --kv-transfer-config JSON`` makes it, with every secondary
tier named in the JSON (vLLM's ``fs`` or ``example``, or an out-of-tree
one by ``module_path``); :class:`Layout` is the model and the chunk
geometry, so two engines with the same or different layouts can run side
by side (and share a tier).

What is vLLM's own code, run as it runs in a real engine:

* the command line: ``EngineArgs``' argument parser reads ``--model``,
  ``--dtype``, ``--tensor-parallel-size``, ``--block-size`` and the
  ``--kv-transfer-config`` JSON (validated into ``KVTransferConfig``), and
  ``create_engine_config()`` builds the ``VllmConfig`` (``ModelConfig``
  reads the model's ``config.json`` and checks its architecture);
* the engine core's KV-cache planning (``resolve_kv_cache_layout``,
  ``get_global_kv_cache_groups``, ``get_kv_cache_configs``,
  ``generate_scheduler_kv_cache_config``) and its ``init_none_hash``;
* the ``OffloadingConnector`` in its scheduler role, which builds the
  offloading config, the ``TieringOffloadingSpec`` and, through the spec
  and ``SecondaryTierFactory``, the ``TieringOffloadingManager`` with its
  primary tier (a ``/dev/shm/vllm_offload_<engine_id>.mmap`` region) and
  its secondary tiers;
* the keys: vLLM's block hashes of the prompt's tokens
  (``hash_block_tokens``), one ``make_offload_key`` per chunk, as the
  offloading scheduler makes them;
* the worker's view of the primary tier: each rank maps the region with
  vLLM's ``SharedOffloadRegion(rank=r)`` and takes its slot of every row
  with ``create_next_worker_view``, as ``TieringOffloadingSpec.create_worker``
  does, from a spec the "worker" builds for itself from the same configs.

What stands in, and why:

* the model is a ``config.json`` only (:class:`ModelStore`, in an offline
  Hugging Face cache): the scheduler never loads weights or a tokenizer
  (``--skip-tokenizer-init``), and this machine has no network;
* ``VLLM_TARGET_DEVICE=cpu`` (set by the conftest): vLLM's platform is the
  CPU's, since there is no GPU;
* the workers' reports to the engine core - each layer's
  ``FullAttentionSpec``, the KV-cache layouts their attention backends
  support (vLLM's default preference: no backend declares one) and the
  GPU memory left for the KV cache (``gpu_blocks`` blocks) - are made from
  the :class:`Layout`, because no model runs;
* the GPU copies: vLLM's ``CPUOffloadingWorker`` needs CUDA, so a store
  writes known bytes (:meth:`Engine.content`) into each rank's slot of the
  rows the manager gave, and a load reads the slots back and compares;
* the scheduler: ``OffloadingConnectorScheduler`` needs requests, block
  tables and scheduler outputs, so :class:`Engine` calls the manager
  itself, under ``manager.lock``, in the order the scheduler does (see
  :meth:`Engine.store`, :meth:`Engine.load`, :meth:`Engine.step`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
    build_offloading_config,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
    OffloadingConnector,
)
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.attention.backends.utils import (
    get_supported_kv_cache_layouts,
    resolve_kv_cache_layout,
)
from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs
from vllm.v1.core.kv_cache_utils import (
    generate_scheduler_kv_cache_config,
    hash_block_tokens,
    init_none_hash,
)
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.kv_offload.base import (
    LookupResult,
    OffloadKey,
    ReqContext,
    ScheduleEndContext,
    make_offload_key,
)
from vllm.v1.kv_offload.factory import OffloadingSpecFactory

from .layout import DTYPES, VOCAB, Layout, ModelStore
from .workers import Workers

# Layout and ModelStore come from .layout: an Engine's user needs both.
__all__ = ["Engine", "LoadResult", "Layout", "ModelStore", "Request", "StoreResult"]

#: How long :meth:`Engine.load`, :meth:`Engine.settle` and :meth:`Engine.evict`
#: wait for a tier by default, in seconds.
TIMEOUT = 30.0
_POLL = 0.002


@dataclass
class Request:
    """One request as the manager sees it: its ``ReqContext``, new until its first step."""

    context: ReqContext
    new: bool = True

    @property
    def req_id(self) -> str:
        """The request's id."""
        return self.context.req_id


@dataclass
class StoreResult:
    """What one GPU-to-primary store did.

    ``stored``: the keys written to the primary tier (those it lacked);
    ``evicted``: keys the primary tier dropped to make room; ``refused``:
    True when the primary tier could not take the chunks at all (every
    slot pinned by a transfer in flight).
    """

    stored: list[OffloadKey] = field(default_factory=list)
    evicted: list[OffloadKey] = field(default_factory=list)
    refused: bool = False


@dataclass
class LoadResult:
    """What one primary-to-GPU load found.

    ``hits``: the leading chunks found (the scheduler loads only a run
    from the start); ``matched`` / ``mismatched``: of those, the keys
    whose rows held / did not hold :meth:`Engine.content` on every rank;
    ``steps``: scheduler steps the lookups took.
    """

    hits: int = 0
    matched: list[OffloadKey] = field(default_factory=list)
    mismatched: list[OffloadKey] = field(default_factory=list)
    steps: int = 0


class Engine:
    """One vLLM engine's scheduler side with its offload tiers, and its simulated workers.

    Every manager call is made under ``manager.lock`` (``shutdown`` without
    it), as vLLM's scheduler makes it.  Close it (or use it as a context
    manager): the tiers shut down and the ``/dev/shm`` region goes.

    Args:
        store: where ``layout.model``'s ``config.json`` is filed.
        tiers: the ``secondary_tiers`` list of the JSON, as a user writes it.
        layout: the model and chunk geometry.
        engine_id: ``kv_transfer_config.engine_id`` (names the ``/dev/shm``
            region); a fresh one by default.
        extra: more ``kv_connector_extra_config`` keys (``eviction_policy``...).
        kv_events: start it with KV cache events on (``--kv-events-config``, the
            ``null`` publisher): the manager's ``take_events`` then has them.

    Raises:
        argparse.ArgumentError: vLLM's ``KVTransferConfig`` refused the JSON
            (the error says why).
        ValueError: what vLLM raises for a tier it cannot build, or for
            the layout.
    """

    _parser: FlexibleArgumentParser | None = None

    def __init__(self, store: ModelStore, tiers: Sequence[dict[str, Any]],
                 layout: Layout | None = None, *, engine_id: str | None = None,
                 extra: dict[str, Any] | None = None,
                 kv_events: bool = False) -> None:  # fmt: skip
        self.layout = layout or Layout()
        self.kv_events = kv_events
        self.engine_id = engine_id or f"kvpool-{uuid.uuid4().hex[:12]}"
        store.ensure(self.layout)
        self.user_json: dict[str, Any] = {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "engine_id": self.engine_id,
            "kv_connector_extra_config": {
                "spec_name": "TieringOffloadingSpec",
                "cpu_bytes_to_use": self.layout.primary_bytes,
                "blocks_per_chunk": self.layout.blocks_per_chunk,
                "secondary_tiers": [dict(tier) for tier in tiers],
                **(extra or {}),
            },
        }
        self.vllm_config = self._engine_config()
        worker_configs = self._plan_kv_cache()
        # EngineCore seeds the block hashes once per process the same way.
        self._hash = get_hash_fn_by_name(self.vllm_config.cache_config.prefix_caching_hash_algo)
        init_none_hash(self._hash)
        scheduler_config = generate_scheduler_kv_cache_config(worker_configs)
        self.vllm_config.cache_config.num_gpu_blocks = scheduler_config.num_blocks
        self._positions: dict[OffloadKey, int] = {}
        self._requests = 0
        self._fillers = 0
        self.closed = False
        self.connector = OffloadingConnector(
            self.vllm_config, KVConnectorRole.SCHEDULER, scheduler_config
        )
        try:
            self.manager = self.connector.scheduler.manager
            # A worker process builds its own spec from the same configs.
            self.worker_spec = OffloadingSpecFactory.create_spec(
                build_offloading_config(self.vllm_config, worker_configs[0])
            )
            self._worker = Workers(self.worker_spec, self.layout.world_size)
        except BaseException:
            self.connector.shutdown()
            raise

    # -- construction ----------------------------------------------------

    @classmethod
    def _cli(cls) -> FlexibleArgumentParser:
        if cls._parser is None:  # building it takes about a second
            # exit_on_error=False: a refused argument raises instead of exiting.
            cls._parser = EngineArgs.add_cli_args(FlexibleArgumentParser(exit_on_error=False))
        return cls._parser

    def _engine_config(self) -> Any:
        lay = self.layout
        argv = [
            "--model", lay.model, "--dtype", lay.dtype, "--skip-tokenizer-init",
            "--tensor-parallel-size", str(lay.world_size),
            "--block-size", str(lay.block_tokens), "--max-model-len", str(lay.max_model_len),
            "--kv-transfer-config", json.dumps(self.user_json),
        ]  # fmt: skip
        if self.kv_events:
            argv += ["--kv-events-config",
                     json.dumps({"enable_kv_cache_events": True, "publisher": "null"})]  # fmt: skip
        args = self._cli().parse_args(argv)
        return EngineArgs.from_cli_args(args).create_engine_config()

    def _plan_kv_cache(self) -> list[Any]:
        """The engine core's KV-cache planning over the workers' (stand-in) reports."""
        lay = self.layout
        spec = FullAttentionSpec(
            block_size=lay.block_tokens,
            num_kv_heads=lay.kv_heads // lay.world_size,
            head_size=lay.head_dim,
            dtype=DTYPES[lay.dtype],
        )
        layers = {f"model.layers.{i}.self_attn.attn": spec for i in range(lay.layers)}
        reports = [dict(layers) for _ in range(lay.world_size)]
        supported = [layout.name for layout in get_supported_kv_cache_layouts(())]
        if lay.kv_cache_layout is not None:  # set before resolving: it then wins outright
            self.vllm_config.cache_config.kv_cache_layout = lay.kv_cache_layout
        resolve_kv_cache_layout(self.vllm_config, [supported] * lay.world_size, layers.values())
        groups = get_global_kv_cache_groups(self.vllm_config, reports)
        self.vllm_config.adjust_dcp_kv_cache_interleave_size(groups)
        memory = [lay.gpu_block_count * lay.block_bytes] * lay.world_size
        configs = get_kv_cache_configs(self.vllm_config, reports, memory, groups)
        for config in configs:
            config.kv_cache_layout = self.vllm_config.cache_config.kv_cache_layout
        return configs

    # -- what the engine holds -------------------------------------------

    @property
    def tiers(self) -> list[Any]:
        """The secondary tiers, in the JSON's order."""
        return list(self.manager.secondary_tiers)

    @property
    def num_chunks(self) -> int:
        """Rows of the primary tier."""
        return int(self.worker_spec.num_chunks)

    @property
    def row_bytes(self) -> int:
        """Bytes between rows of the primary tier (every rank's slot, then padding)."""
        return int(self.worker_spec.kv_bytes_per_chunk)

    @property
    def shm_path(self) -> Path:
        """The primary tier's ``/dev/shm`` file."""
        return Path(f"/dev/shm/vllm_offload_{self.engine_id}.mmap")

    # -- prompts and their chunks ----------------------------------------

    def tokens(self, seed: int | str, chunks: int) -> list[int]:
        """A prompt of ``chunks`` whole chunks of token ids, the same for the same seed."""
        rng = random.Random(seed)
        return [rng.randrange(VOCAB) for _ in range(chunks * self.layout.tokens_per_chunk)]

    def keys(self, tokens: Sequence[int] | int | str,
             chunks: int | None = None) -> list[OffloadKey]:  # fmt: skip
        """The offload keys of a prompt's whole chunks, as vLLM's offloading scheduler makes them.

        Args:
            tokens: the prompt's token ids, or a seed for :meth:`tokens`.
            chunks: with a seed, how many chunks.

        Returns:
            One key per whole chunk: the block hash of its last block, group 0.
        """
        if isinstance(tokens, (int, str)):
            if chunks is None:
                raise ValueError("keys(seed) needs chunks=: how many chunks the prompt has")
            tokens = self.tokens(tokens, chunks)
        size = self.layout.block_tokens
        parent = None
        keys: list[OffloadKey] = []
        for block, start in enumerate(range(0, len(tokens) - size + 1, size)):
            parent = hash_block_tokens(self._hash, parent, tokens[start : start + size])
            if (block + 1) % self.layout.blocks_per_chunk == 0:
                key = make_offload_key(parent, 0)
                keys.append(key)
                self._positions[key] = len(keys) * self.layout.tokens_per_chunk
        return keys

    def content(self, key: OffloadKey) -> bytes:
        """The KV bytes of a chunk: a function of the model, the dtype and the key only.

        So a tensor-parallel engine's ranks together hold what one rank of
        another world size holds (vLLM's premise for a parallelism-agnostic
        tier), and another model's or dtype's bytes differ.
        """
        seed = f"{self.layout.model}|{self.layout.dtype}|".encode() + bytes(key)
        return hashlib.shake_256(seed).digest(self.layout.chunk_bytes)

    # -- the scheduler's calls -------------------------------------------

    @contextlib.contextmanager
    def request(self, name: str | None = None) -> Iterator[Request]:
        """A request from first sight to end: ``on_new_request``, then ``on_request_finished``."""
        self._requests += 1
        req = Request(ReqContext(req_id=name or f"req-{self._requests}"))
        with self.manager.lock:
            self.manager.on_new_request(req.context)
        try:
            yield req
        finally:
            with self.manager.lock:
                self.manager.on_request_finished(req.context)
            self.step()

    def step(self, *requests: Request) -> None:
        """End one scheduler step: ``on_schedule_end``, naming the requests new this step."""
        new = [req.req_id for req in requests if req.new]
        with self.manager.lock:
            self.manager.on_schedule_end(ScheduleEndContext(new_req_ids=new, preempted_req_ids=()))
        for req in requests:
            req.new = False

    def _track(self, req: Request, keys: Sequence[OffloadKey]) -> None:
        for key in keys:
            position = self._positions.get(key)
            if position is not None:
                req.context.set_offload_key_position(key, position)

    def store(self, keys: Sequence[OffloadKey], req: Request) -> StoreResult:
        """Offload chunks as the scheduler and its workers do: GPU -> primary, then the cascade.

        One step: ``prepare_store``, the workers write each new chunk's
        :meth:`content` into its row, ``on_schedule_end``; the next step
        reports the store done (``complete_store``), which cascades the
        chunks to every secondary tier.
        """
        self._track(req, keys)
        with self.manager.lock:
            out = self.manager.prepare_store(list(keys), req.context)
        if out is None:
            self.step(req)
            return StoreResult(refused=True)
        stored = list(out.keys_to_store)
        for key, chunk_id in zip(stored, out.store_spec.chunk_ids, strict=True):
            self._worker.write(int(chunk_id), self.content(key))
        self.step(req)
        if stored:
            with self.manager.lock:
                self.manager.complete_store(stored, req.context)
        return StoreResult(stored=stored, evicted=list(out.evicted_keys))

    def _lookup_prefix(self, keys: Sequence[OffloadKey], req: Request) -> int | None:
        """One pass of the scheduler's prefix lookup: the leading hits, or None to ask again."""
        hits, deferred = 0, False
        with self.manager.lock:
            for key in keys:
                result = self.manager.lookup(key, req.context)
                if result is LookupResult.MISS:
                    break
                if result is LookupResult.RETRY:
                    deferred = True  # keep scanning: later keys start their own lookups
                    continue
                hits += 1
                deferred |= result is LookupResult.HIT_PENDING
        return None if deferred else hits

    def load(self, keys: Sequence[OffloadKey], req: Request, *,
             timeout: float = TIMEOUT) -> LoadResult:  # fmt: skip
        """Look chunks up as the scheduler does, step after step, then load the leading hits.

        A chunk in a secondary tier only is promoted into the primary tier
        first (the lookups answer RETRY or HIT_PENDING meanwhile).  The
        workers then read each hit's row and compare it with :meth:`content`.

        Raises:
            TimeoutError: the lookups still asked to wait after ``timeout`` seconds.
        """
        self._track(req, keys)
        result = LoadResult()
        deadline = time.monotonic() + timeout
        while True:
            hits = self._lookup_prefix(keys, req)
            result.steps += 1
            if hits is not None:
                break
            self.step(req)
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{len(keys)} chunks still pending after {timeout} s and "
                    f"{result.steps} steps (tiers: {[t.tier_type for t in self.tiers]})"
                )
            time.sleep(_POLL)
        result.hits = hits
        if not hits:
            self.step(req)
            return result
        found = list(keys[:hits])
        with self.manager.lock:
            spec = self.manager.prepare_load(found, req.context)
        self.step(req)
        for key, chunk_id in zip(found, spec.chunk_ids, strict=True):
            good = self._worker.read(int(chunk_id)) == self.content(key)
            (result.matched if good else result.mismatched).append(key)
        with self.manager.lock:
            self.manager.complete_load(found, req.context)
        return result

    def settle(self, timeout: float = TIMEOUT) -> int:
        """Step until no transfer is in flight (``has_pending_work`` is False); the steps taken.

        Raises:
            TimeoutError: still busy after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        steps = 0
        while True:
            self.step()
            steps += 1
            with self.manager.lock:
                busy = self.manager.has_pending_work()
            if not busy:
                return steps
            if time.monotonic() > deadline:
                raise TimeoutError(f"transfers still in flight after {timeout} s")
            time.sleep(_POLL)

    def _in_primary(self, key: OffloadKey) -> LookupResult:
        with self.manager.lock:
            return self.manager.primary_tier.lookup(key, ReqContext(req_id="in-primary"))

    def in_primary(self, key: OffloadKey) -> bool:
        """Whether the primary tier holds ``key``, ready to load."""
        return self._in_primary(key) is LookupResult.HIT

    def evict(self, keys: Sequence[OffloadKey], *, timeout: float = TIMEOUT) -> int:
        """Push ``keys`` out of the primary tier by storing other chunks, as new prompts would.

        The primary tier drops its least recently used chunks once it is
        full; the filler chunks cascade to the secondary tiers like any
        others, and it returns once those cascades have ended.

        Returns:
            How many filler chunks it took.

        Raises:
            TimeoutError: some of ``keys`` were still in the primary tier after
                ``timeout`` seconds.
        """
        batch = max(1, self.num_chunks // 4)
        stored = 0
        deadline = time.monotonic() + timeout
        with self.request(f"evict-{self._fillers}") as req:
            while any(self._in_primary(key) is not LookupResult.MISS for key in keys):
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"chunks still in the primary tier after {stored} filler chunks "
                        f"and {timeout} s"
                    )
                self._fillers += 1
                filler = self.keys(f"{self.engine_id}/filler/{self._fillers}", batch)
                result = self.store(filler, req)
                stored += len(result.stored)
                if result.refused:
                    self.settle(timeout)  # every slot pinned by a cascade: let them finish
        # The fillers' cascades pin their rows until they end; a promotion
        # meanwhile finds no free row and the lookup answers MISS.
        self.settle(timeout)
        return stored

    # -- the end ---------------------------------------------------------

    def close(self) -> None:
        """Unmap the workers' views, then shut the manager down (tiers, primary); idempotent."""
        if self.closed:
            return
        self.closed = True
        try:
            self._worker.close()
        finally:
            self.connector.shutdown()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
