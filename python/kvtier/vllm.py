"""kvtier as a vLLM v1 KV connector: KvtierConnector.

Targets vLLM's KV connector interface in three generations (docs/ENGINES.md
"Pinned versions"): v0.12.0 (tag commit 86e178f7c4d8; base.py read at
13f4ad0f55b0), the v0.16 - v0.28 one (base.py at 003df2961dd8) and current
vLLM (base.py, kv_connector_model_runner_mixin.py and
v1/worker/gpu/kv_connector.py at 00f4240ee645; scheduler.py at
00024d314514). Where they differ, kvtier.vllm_compat decides by what vLLM
passes; the method tables are tests/python/conformance/vllm.json. Loaded
out of tree:

    PYTHONHASHSEED=0 vllm serve <model> --block-size 16 \\
        --kv-transfer-config '{"kv_connector": "KvtierConnector",
            "kv_connector_module_path": "kvtier.vllm", "kv_role": "kv_both",
            "kv_connector_extra_config": {"socket": "/run/kvtier/kvtierd.sock",
                "tenant": 0, "namespace": "default"}}'

with `kvtier serve --model <the model's config.json> --page-tokens 16`
on the node (its page is one vLLM block: --page-tokens must equal
--block-size; --kv-dtype fp8 for vLLM's --kv-cache-dtype fp8).

HOW IT MAPS
  * Keys. vLLM names block i by a chained SHA-256 over block i-1's hash,
    block i's tokens and extra keys (cache_salt, LoRA, multimodal):
    request.block_hashes. Each becomes a 16-byte kvtier key with
    kvtier.keys_from_hashes(hashes, salt), salt = "vllm|<tenant>|
    <namespace>|<model>" plus the config's "salt". vLLM seeds the chain
    with NONE_HASH, which is random per process unless PYTHONHASHSEED is
    set: engines that share a cache (or survive a restart) must all set
    the same PYTHONHASHSEED, so the scheduler side refuses to start
    without it (extra_config "require_hash_seed": false to allow a cache
    only this process can hit). At its first lookup it publishes a
    fingerprint of what its hashes depend on (NONE_HASH, the hash
    algorithm, block size, model: vllm_compat.hash_fingerprint; never the
    seed) for its tenant, and warns once when the tenant's engines
    published another: engines whose pages never match each other's
    (the daemon counts it: kvtier_fingerprint_conflicts_total). TP ranks are kept apart by the daemon
    (each rank is its own root).
  * Scheduler side. get_num_new_matched_tokens() hashes nothing itself:
    it looks the request's keys up in the daemon (no touch: the call must
    be side-effect free) with the tier runs they are in, never counting
    the prompt's last token (vLLM must compute one), and answers with
    kvtier's scheduler decision (kvtier.decide: kvt_sched_decide(), the C
    code `kvtier demo`'s scheduler plans with): of the hit beyond vLLM's
    own prefix hits, only the leading tokens whose load lands before the
    prefill would have computed them, priced per tier run at the
    daemon's MEASURED load rates against the MODELED prefill of the
    hardware profile "decide_profile" (load_is_async=True); the rest vLLM
    computes. (None, False) — vLLM skips the request this step and asks
    again — when the pages right after the hit are in flight (being
    stored into the daemon, or computed by another request of this
    engine) and waiting for them is expected to be shorter than
    computing them; never for longer than "inflight_wait_s" in all.
    Decisions are counted in the scheduler side's connector stats and
    logged at debug level. "decide": false answers every cached page and
    waits whenever pages are in flight (bounded the same way), as before.
    update_state_after_alloc() records the blocks vLLM gave the load;
    build_connector_meta() packs this step's loads, the stores of pages
    that this step completes, and the preempted requests; request_finished()
    answers delay_free=True for a request with stores (or a load) the
    workers may still be running, which then return it in finished_sending.
  * Worker side. register_kv_caches() shares vLLM's KV tensors with the
    daemon, in whatever layout vLLM's attention backend gave them
    (kvtier.layout: FlashAttention NHD / HND, FlashInfer, the CPU
    backend's heads-before-tokens, MLA latents; fp8 as 1-byte elements):
    their own strides become the registered layout. GPU tensors are
    registered BY HANDLE (CUDA IPC handles of the allocator's segments
    and offsets, as PyTorch's storage sharing gives them:
    kvtier.torch_dev): the daemon opens them on the same GPU and moves
    pages straight between its page-locked tiers and them — loads by its
    gather kernel, stores by batched copy-engine DMA, both verified by a
    checksum kernel on the GPU; no CPU copy of a page byte. The device
    path takes layouts whose chunks are packed (a token's heads
    contiguous: FlashAttention NHD, FlashInfer NHD, MLA); layouts in rows
    (HND, heads before tokens) are refused there with the reason
    ("staging": true moves them). Host tensors are memory the daemon maps
    (a sealed memfd), in any layout: CPU torch tensors are RE-HOMED in
    place (Tensor.set_ onto a memfd view, contents copied) before any KV
    is in them; NumPy arrays must already be views of host_kv_buffer()
    memory — or, with "device": "emu", of emu_kv_buffer() memory: the
    emulated device (CI), registered by handle like a GPU's.
    start_load_kv() starts one load job per request (current vLLM calls
    it after the forward unless the step has a synchronous load: layerwise
    loads, load_is_async False, are started before it);
    async loads are reported by get_finished() when their job is done,
    their failed blocks by get_block_ids_with_load_errors() in the same
    step (vLLM recomputes them). With "load_mode": "layerwise" loads are
    synchronous: wait_for_layer_load() makes the compute stream wait for
    the layer (a stream wait on the job slot's word: the layer's
    attention starts once the layer has landed and been verified, no CPU
    round trip) on a GPU, and waits on the job's futex otherwise.
    save_kv_layer() copies nothing (the daemon reads the registered memory
    itself); wait_for_save() records an IPC event on the compute stream
    (GPU) and submits the step's store jobs naming it, so the daemon reads
    the blocks only after the step's KV writes — nothing is waited for or
    copied there: the blocks stay the request's until get_finished()
    returns it in finished_sending, and handle_preemptions() cancels a
    preempted request's stores before vLLM reuses its blocks.
  * "staging": true moves GPU KV through a pool of host blocks instead
    (kvtier.staging, any layout; "staging_blocks" sets its size, else
    2 GiB worth): an explicit choice with a cost, printed at start (the
    pages cross host memory several times and the GPU copies run inside
    the step). Never a fallback: a GPU cache the daemon cannot open is an
    error.

A daemon that goes away is not an error for vLLM: lookups answer no hit,
loads fail every block (recomputed), stores are counted as errors; both
sides reconnect at most every 5 s, the worker registering its caches
again.

Hybrid models (several KV cache groups: sliding-window or mamba layers
beside full attention) are kvtier.vllm_hybrid's: one daemon page per
(group, page; a mamba group's: its state block at a boundary),
the daemon serving one group's layers; the connector subclasses vLLM's
SupportsHMA where the interface has failed_recving.

Current vLLM's get_transfer_results() gives get_finished()'s sets and no
failed_recving (failures are per block; per request for hybrid models);
requires_kv_delivery is False (a
best-effort cache); requires_piecewise_for_cudagraph is True in layerwise
mode; finish_forward, reset_capture_state, has_pending_block_frees keep
the base's defaults.

Not done: mamba groups other than mamba_cache_mode "align", and hybrid
models on the v0.12 / v0.26 interfaces (refused at start, with the reason:
kvtier.vllm_hybrid.plan_of); KV events
(take_events); layouts in rows on the device path (refused, above). The
GPU path has run on the emulated device only (CI); scripts/gpu-check runs
it on a GPU.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Dict, List, Optional, Set, Tuple

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1, KVConnectorRole)

try:    # current vLLM (not v0.12): the workers call get_transfer_results()
    from vllm.distributed.kv_transfer.kv_connector.v1.base import \
        KVConnectorTransferResults
    _HAS_TRANSFER_RESULTS = True
except ImportError:
    _HAS_TRANSFER_RESULTS = False

    @dataclasses.dataclass
    class KVConnectorTransferResults:   # type: ignore[no-redef]
        """The fields of current vLLM's class, for releases without it
        (which never call get_transfer_results)."""
        finished_sending: Set[str] = dataclasses.field(default_factory=set)
        finished_recving: Set[str] = dataclasses.field(default_factory=set)
        failed_recving: Set[str] = dataclasses.field(default_factory=set)

from . import (KVT_ENOTFOUND, Client, ConnectionLost,
               Geometry, Job, KvtierError)
from . import Memory, keys_from_hashes
from .decide import Decider
from . import layout as _layout
from . import vllm_compat as _compat
from .staging import StagingPool
from .vllm_host import emu_kv_buffer, host_kv_buffer  # noqa: F401 (API)
from .vllm_meta import (KvtierConnectorMetadata, KvtierStats, LoadSpec,
                        SaveSpec, _FailedLoad)
from .vllm_register import _RECONNECT_S, _Registration
from . import vllm_hybrid as _hybrid
from .vllm_hybrid import _Hybrid

try:    # vLLM's hybrid memory allocator keeps several KV cache groups only
    # for connectors that subclass SupportsHMA: kvtier does where vLLM can
    # report a failed load of one (failed_recving; kvtier.vllm_hybrid)
    from vllm.distributed.kv_transfer.kv_connector.v1.base import \
        SupportsHMA
    _HMA: Tuple[type, ...] = (SupportsHMA,) if _HAS_TRANSFER_RESULTS \
        else ()
except ImportError:
    _HMA = ()

__all__ = ["KvtierConnector", "KvtierConnectorMetadata", "KvtierStats",
           "LoadSpec", "SaveSpec", "emu_kv_buffer", "host_kv_buffer"]

log = logging.getLogger("kvtier.vllm")


# -- the connector -------------------------------------------------------------

@dataclasses.dataclass
class _SchedReq:
    request: Any
    block_ids: List[int]
    saved: int = 0          # pages handed to the workers to store
    # keys of the pages it computes (in KvtierConnector._producing)
    produces: List[bytes] = dataclasses.field(default_factory=list)
    # hybrid models (kvtier.vllm_hybrid): a block table per group; pages
    # below sw_guard had their freed sliding-window blocks' stores waited
    gblocks: Optional[List[List[int]]] = None
    sw_guard: int = 0


class KvtierConnector(_Registration, _Hybrid, _compat._Fingerprint,
                      KVConnectorBase_V1, *_HMA):
    """vLLM v1 KV connector over the node's kvtier daemon.

    kv_connector_extra_config:
      socket            the daemon's socket ($KVT_SOCKET, else
                        /run/kvtier/kvtierd.sock)
      tenant            kvtier tenant id (0); namespace: the daemon's model
                        namespace ("default")
      model_config      the model's config.json (path or dict) when vLLM's
                        hf_config is not the one the daemon serves
      salt              extra key salt (str); model: name in the salt
                        (vLLM's served model)
      load_mode         "async" (default: the request waits for its load
                        off the forward path) or "layerwise" (loaded in
                        the step it runs, waited per layer)
      save              store computed pages (true)
      inflight_wait_s   how long, in all, a request may be deferred for
                        pages others are storing or computing (2.0)
      decide            load only what is worth loading, wait only when
                        cheaper (true: kvtier.decide; false: every cached
                        page, and wait whenever pages are in flight)
      decide_profile    hardware profile whose cost model prices the
                        prefill: MODELED, pick the engine's GPU ("h100";
                        "testbed-b": H200, "gh200"; profiles/)
      decide_rates_s    how often the daemon's measured rates are read
                        (0.5)
      require_hash_seed refuse to start without PYTHONHASHSEED (true)
      timeout_ms        per daemon request (10000)
    """

    def __init__(self, vllm_config: Any, role: KVConnectorRole,
                 kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role,
                         kv_cache_config=kv_cache_config)
        ktc = vllm_config.kv_transfer_config
        extra = dict(getattr(ktc, "kv_connector_extra_config", None) or {})
        known = {"socket", "tenant", "namespace", "model_config", "salt",
                 "model", "load_mode", "save", "inflight_wait_s",
                 "require_hash_seed", "timeout_ms", "staging",
                 "staging_blocks", "kv_shape", "device", "decide",
                 "decide_profile", "decide_rates_s"}
        unknown = sorted(set(extra) - known)
        if unknown:
            raise ValueError(f"kvtier.vllm: unknown kv_connector_extra_config "
                             f"key(s) {unknown}; known: {sorted(known)}")
        self._block_size = int(vllm_config.cache_config.block_size)
        self._socket: Optional[str] = extra.get("socket")
        tenant = extra.get("tenant", 0)
        if not isinstance(tenant, int) or isinstance(tenant, bool) or \
                not 0 <= tenant < (1 << 32):
            raise ValueError(f"kvtier.vllm: tenant must be an integer "
                             f"0..2^32-1, not {tenant!r}")
        self._tenant = tenant
        self._ns = str(extra.get("namespace", "default"))
        self._load_mode = extra.get("load_mode", "async")
        if self._load_mode not in ("async", "layerwise"):
            raise ValueError(f"kvtier.vllm: load_mode must be \"async\" or "
                             f"\"layerwise\", not {self._load_mode!r}")
        if self._load_mode == "layerwise" and not hasattr(
                KVConnectorBase_V1, "requires_piecewise_for_cudagraph"):
            # v0.12-era vLLM cannot be told: its full CUDA graphs would
            # skip the per-layer waits at replay
            log.warning("kvtier.vllm: load_mode \"layerwise\" waits per "
                        "layer inside the forward, which a full CUDA graph "
                        "skips at replay, and this vLLM has no "
                        "requires_piecewise_for_cudagraph to be asked: run "
                        "it with --compilation-config "
                        "'{\"cudagraph_mode\": \"PIECEWISE\"}' (or "
                        "--enforce-eager), or use load_mode \"async\"")
        self._save = bool(extra.get("save", True))
        self._inflight_wait = float(extra.get("inflight_wait_s", 2.0))
        self._timeout_ms = int(extra.get("timeout_ms", 10000))
        self._staging_mode = extra.get("staging", "auto")
        if self._staging_mode not in ("auto", True, False):
            raise ValueError(f"kvtier.vllm: staging must be \"auto\", true "
                             f"or false, not {self._staging_mode!r}")
        self._device_mode = extra.get("device", "auto")
        if self._device_mode not in ("auto", "emu"):
            raise ValueError(f"kvtier.vllm: device must be \"auto\" or "
                             f"\"emu\", not {self._device_mode!r}")
        self._staging_blocks = int(extra.get("staging_blocks", 0))
        if self._staging_blocks < 0:
            raise ValueError("kvtier.vllm: staging_blocks must be >= 0 "
                             "(0: the default)")
        mc = vllm_config.model_config
        served = getattr(mc, "served_model_name", None)
        if isinstance(served, (list, tuple)):
            served = served[0] if served else None
        model = str(extra.get("model") or served or mc.model)
        self._model = model
        self._salt = f"vllm|{tenant}|{self._ns}|{model}|" \
                     f"{extra.get('salt', '')}".encode()
        _compat.require_hash_seed(extra, role == KVConnectorRole.SCHEDULER)
        self._hplan = _hybrid.plan_of(kv_cache_config, self._block_size,
                                      self._load_mode, self._staging_mode,
                                      bool(_HMA), vllm_config.cache_config)
        self._salt_base = self._salt
        if self._hplan is not None:   # the reference group's keys: _keys()
            self._salt = self._hplan.salt(self._salt, self._hplan.ref)
        self._kv_shape = extra.get("kv_shape")
        if self._kv_shape is not None and \
                self._kv_shape not in _layout.VLLM_SHAPES:
            raise ValueError(f"kvtier.vllm: kv_shape must be one of "
                             f"{sorted(_layout.VLLM_SHAPES)}, not "
                             f"{self._kv_shape!r}")
        cfg = extra.get("model_config")
        if cfg is None:
            hf = mc.hf_config
            cfg = hf.to_dict() if hasattr(hf, "to_dict") else dict(hf)
        cfg = _compat.kv_dtype_config(cfg, getattr(vllm_config.cache_config,
                                            "cache_dtype", "auto"))
        if self._hplan is not None:   # the daemon serves one group's layers
            cfg = _hybrid.group_config(cfg, self._hplan.layers)
        pc = vllm_config.parallel_config
        tp = int(getattr(pc, "tensor_parallel_size", 1))
        rank = 0
        if role == KVConnectorRole.WORKER and tp > 1:
            from vllm.distributed import get_tensor_model_parallel_rank
            rank = int(get_tensor_model_parallel_rank())
        self._geom = Geometry.from_config(cfg, page_tokens=self._block_size,
                                          tp_size=tp, tp_rank=rank)
        self._client = self._connect()
        # scheduler state
        self._decider: Optional[Decider] = None
        decide = extra.get("decide", True)
        if not isinstance(decide, bool):
            raise ValueError(f"kvtier.vllm: decide must be true or false, "
                             f"not {decide!r}")
        if decide and role == KVConnectorRole.SCHEDULER:
            try:
                self._decider = Decider(
                    self._geom, profile=extra.get("decide_profile", "h100"),
                    overlap=self._load_mode == "layerwise",
                    rates_every_s=extra.get("decide_rates_s", 0.5),
                    what="kvtier.vllm")
            except KvtierError as e:
                raise KvtierError(e.code, "kvtier.vllm: the load-or-"
                                  "recompute decision (decide_profile; "
                                  "\"decide\": false loads every cached "
                                  "page)", e.detail) from None
        # keys of pages this engine's running requests compute: {key:
        # request id}, for requests that would compute them again
        self._producing: Dict[bytes, str] = {}
        self._reqs: Dict[str, _SchedReq] = {}
        self._pending_load: Dict[str, Tuple[List[bytes], int]] = {}
        self._loads_to_send: List[LoadSpec] = []
        self._loading: Set[str] = set()
        self._ever_saved: Set[str] = set()
        self._delayed: Set[str] = set()
        self._aborted: Set[str] = set()
        self._awaiting: Set[str] = set()   # reported by the workers yet
        self._waiting_since: Dict[str, float] = {}
        self._key_cache: Dict[str, Tuple[int, List[bytes]]] = {}
        self._hkeys: Dict[Tuple[str, int], List[bytes]] = {}
        self._sw_pending: Set[str] = set()
        self._failed_loads: Set[str] = set()   # failed_recving: no hit
        self._fp_sent = False      # fingerprint published on this connection
        self._fp_off = False       # the daemon cannot take one
        self._fp_warned = False
        self._fp_tries = 0         # lookups without a seeded NONE_HASH
        self.hash_conflicts = 0    # other engines' fingerprints that differ
        # worker state
        self._mem: Optional[Memory] = None
        self._register: Tuple[Any, ...] = ()
        self._dev: Any = None          # device path: the kvtier.Device
        self._torch_dev = False        # ... of torch CUDA tensors
        self._ipc_event: Any = None    # (torch event, id) for stores
        self._kv_list: List[Any] = []
        self._staging: Optional[StagingPool] = None
        self._layer_index: Dict[str, int] = {}
        self._load_jobs: Dict[str, Job] = {}
        self._sync_jobs: List[Tuple[str, Job]] = []
        self._store_jobs: Dict[str, List[Job]] = {}
        self._finishing: Set[str] = set()
        self._aborted_loads: Set[str] = set()
        self._load_errors: Set[int] = set()
        self._failed_recving: Set[str] = set()
        self._stats = KvtierStats(data={})
        self._down_since: Optional[float] = None
        self._retired: List[Tuple[Client, Optional[StagingPool]]] = []

    def _connect(self) -> Client:
        try:
            return Client(self._geom, socket=self._socket, ns=self._ns,
                          tenant=self._tenant, timeout_ms=self._timeout_ms)
        except KvtierError as e:
            if e.name == "KVT_EGEOM":
                hyb = "" if self._hplan is None else (
                    f" (a hybrid model: {len(self._hplan.groups)} KV cache "
                    f"groups of {self._hplan.layers} layers, one daemon page "
                    f"per group, so the daemon's --model is a config whose "
                    f"num_hidden_layers is {self._hplan.layers})")
                raise KvtierError(e.code, "kvtier.vllm: the daemon serves "
                                  "another model or page size: its "
                                  "--page-tokens must be vLLM's --block-size "
                                  f"({self._block_size}), its --model this "
                                  f"model's config{hyb}, its --tp vLLM's",
                                  e.detail)
            raise

    # -- keys ---------------------------------------------------------------

    def _keys(self, request: Any) -> List[bytes]:
        hashes = request.block_hashes
        cached = self._key_cache.get(request.request_id)
        if cached and cached[0] == len(hashes):
            return cached[1]
        keys = (cached[1] if cached else []) + keys_from_hashes(
            hashes[len(cached[1]) if cached else 0:], self._salt)
        self._key_cache[request.request_id] = (len(hashes), keys)
        return keys

    # ==========================================================================
    # scheduler side
    # ==========================================================================

    def get_num_new_matched_tokens(self, request: Any,
                                   num_computed_tokens: int
                                   ) -> Tuple[Optional[int], bool]:
        """(tokens worth loading beyond @num_computed_tokens,
        load_is_async); (None, False) to be asked again next step while
        the next pages are in flight and waiting is cheaper (module doc)."""
        P = self._block_size
        rid = request.request_id
        if rid in self._failed_loads:  # it failed once: vLLM recomputes it
            return 0, False
        # one token must be computed: never match the prompt's last
        limit = min(len(request.block_hashes), (request.num_tokens - 1) // P)
        start = num_computed_tokens // P
        if limit <= start:
            return 0, False
        keys = self._keys(request)[:limit]
        r = self._lookup(keys)
        self._check_fingerprint()
        if r is None:
            return 0, False
        if self._decider is None:
            if r.inflight and r.pages < limit and self._may_wait(rid):
                return None, False
            n = r.pages
        else:
            n = self._decide(request, keys, r, start, limit)
            if n is None:
                return None, False
        self._waiting_since.pop(rid, None)
        if self._hplan is not None and n > start:
            n = self._hyb_fit(request, n, start)
        if n <= start:
            return 0, False
        self._pending_load[rid] = (keys[:n], start)
        return (n - start) * P, self._load_mode == "async"

    def _may_wait(self, rid: str) -> bool:
        """A request may be deferred for pages in flight for
        inflight_wait_s from its first deferral, no longer."""
        t0 = self._waiting_since.setdefault(rid, time.monotonic())
        return time.monotonic() - t0 < self._inflight_wait

    def _decide(self, request: Any, keys: List[bytes], r: Any, start: int,
                limit: int) -> Optional[int]:
        """kvtier.decide's answer: the pages (from page 0) to take, or None
        to wait. The pages right after the hit that another running
        request of this engine computes count as in flight, expected when
        that request's modeled prefill reaches their end."""
        P = self._block_size
        rid = request.request_id
        edge = max(r.pages + r.inflight, start)
        produced, ready = 0, None
        for k in range(edge, limit):
            other = self._producing.get(keys[k])
            st = self._reqs.get(other) if other and other != rid else None
            if st is None:
                break
            done = int(getattr(st.request, "num_computed_tokens", 0))
            eta = self._decider.prefill_s(max(0, (k + 1) * P - done), done)
            ready = max(ready or 0.0, time.monotonic() + eta)
            produced += 1
        others = len(self._reqs) - (rid in self._reqs)
        try:
            d = self._decider.decide(self._client, r, start=start,
                                     prompt=request.num_tokens,
                                     others=others, transient=produced,
                                     transient_ready=ready, rid=rid)
        except KvtierError as e:  # never into vLLM's scheduler loop
            log.warning("kvtier.vllm: request %s: no decision (%s): "
                        "loading the whole hit", rid, e)
            return r.pages
        wait = d.wait and self._may_wait(rid)
        for k, v in self._decider.count(d, wait).items():
            self._stats.data[k] += v
        return None if wait else start + d.load

    def _lookup(self, keys: List[bytes]) -> Any:
        """The daemon's answer, or None (no hit) when it is unreachable:
        serving goes on without the cache, reconnecting at most once per
        _RECONNECT_S (a new daemon has an empty cache or its persistent
        ssd)."""
        if self._down_since is not None:
            if time.monotonic() - self._down_since < _RECONNECT_S:
                return None
            try:
                self._client.close()
                self._client = self._connect()
                log.warning("kvtier.vllm: reconnected to the daemon")
                self._down_since = None
                self._fp_sent = False   # a new daemon: publish again
            except KvtierError as e:
                self._down_since = time.monotonic()
                log.debug("kvtier.vllm: reconnect failed: %s", e)
                return None
        try:
            if self._decider is not None:
                return self._client.lookup(keys, touch=False, runs=True)
            return self._client.lookup(keys, touch=False)
        except KvtierError as e:
            self._down_since = time.monotonic()
            log.error("kvtier.vllm: lookup failed, serving without the "
                      "cache (reconnect in %.0f s): %s", _RECONNECT_S, e)
            return None

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None:
        """Record the blocks vLLM allocated (for the load when
        @num_external_tokens > 0)."""
        if self._hplan is not None:
            return self._hyb_after_alloc(request, blocks, num_external_tokens)
        rid = request.request_id
        ids = _compat.block_ids(blocks)
        st = self._reqs.get(rid)
        if st is None:
            self._reqs[rid] = st = _SchedReq(request, ids)
        plan = self._pending_load.pop(rid, None)
        if self._decider is not None:
            self._produce(st, len(plan[0]) if plan and num_external_tokens
                          else request.num_computed_tokens //
                          self._block_size)
        if num_external_tokens == 0 or plan is None:
            return
        keys, start = plan
        n = len(keys)
        if len(ids) < n:
            raise RuntimeError(f"kvtier.vllm: request {rid}: {len(ids)} blocks "
                               f"allocated for {n} pages")
        self._loads_to_send.append(LoadSpec(rid, keys, start, ids[start:n],
                                            self._load_mode == "async"))
        if self._load_mode == "async":
            self._loading.add(rid)
        st.saved = max(st.saved, n)     # loaded pages are in the cache

    def _produce(self, st: _SchedReq, first: int) -> None:
        """Request @st computes its prompt's pages from @first on: other
        requests needing them may wait for it (_decide)."""
        self._unproduce(st)
        for k in self._keys(st.request)[first:]:
            if k not in self._producing:
                self._producing[k] = st.request.request_id
                st.produces.append(k)

    def _unproduce(self, st: _SchedReq) -> None:
        rid = st.request.request_id
        for k in st.produces:
            if self._producing.get(k) == rid:
                del self._producing[k]
        st.produces = []

    def build_connector_meta(self, scheduler_output: Any
                             ) -> KvtierConnectorMetadata:
        """This step's loads, stores and preemptions for the workers."""
        meta = KvtierConnectorMetadata(loads=self._loads_to_send,
                                       delayed=self._delayed,
                                       aborted=self._aborted)
        self._loads_to_send = []
        self._delayed = set()
        self._aborted = set()
        for rid in getattr(scheduler_output, "preempted_req_ids", None) or ():
            meta.preempted.add(rid)
            st = self._reqs.get(rid)
            if st is not None:
                st.saved = st.sw_guard = 0
                st.block_ids, st.gblocks = [], None
                self._unproduce(st)
            self._loading.discard(rid)
        if self._hplan is not None:
            self._hyb_plan_saves(meta, scheduler_output)
            return meta
        if not self._save:
            return meta
        for rid, new, replace, computed, n in \
                _compat.scheduled_reqs(scheduler_output):
            st = self._reqs.get(rid)
            if st is None:
                continue
            if replace:     # its new blocks replace the old ones
                st.block_ids = list(new[0]) if new else []
            elif new:
                st.block_ids += list(new[0])
            self._plan_save(meta, rid, st, computed + n)
        return meta

    def _plan_save(self, meta: KvtierConnectorMetadata, rid: str,
                   st: _SchedReq, computed_after: int) -> None:
        keys = self._keys(st.request)
        upto = min(computed_after // self._block_size, len(keys),
                   len(st.block_ids))
        upto = _compat.publishable_blocks(st.request, upto)
        if upto <= st.saved:
            return
        meta.saves.append(SaveSpec(rid, keys[:upto], st.saved,
                                   st.block_ids[:upto]))
        st.saved = upto
        self._ever_saved.add(rid)

    def update_connector_output(self, connector_output: Any) -> None:
        """Workers' finished loads end this side's tracking of them; a
        request with a failed block is stored again from that block on
        once vLLM has recomputed it."""
        for rid in connector_output.finished_recving or ():
            self._loading.discard(rid)
            self._awaiting.discard(rid)
        for rid in connector_output.finished_sending or ():
            self._awaiting.discard(rid)
        for rid in getattr(connector_output, "failed_recving", None) or ():
            # vLLM starts it over: no hit again (a page that failed to
            # load would fail again), its pages stored anew
            self._failed_loads.add(rid)
            st = self._reqs.get(rid)
            if st is not None:
                st.saved = st.sw_guard = 0
        bad = connector_output.invalid_block_ids
        if bad:
            for st in self._reqs.values():
                hit = [i for i, b in enumerate(st.block_ids) if b in bad]
                if hit:
                    st.saved = min(st.saved, hit[0])

    def request_finished(self, request: Any, block_ids: List[int]
                         ) -> Tuple[bool, Optional[Dict[str, Any]]]:
        """delay_free=True while workers may still read the request's
        blocks (stores): they return it in finished_sending. A request
        aborted while its async load runs is not delayed here: vLLM keeps
        its blocks itself until the load is reported in finished_recving
        (it frees them then, and asserts nothing else reports them), so
        the workers stop the load and report it there."""
        rid = request.request_id
        st = self._reqs.pop(rid, None)
        if st is not None:
            self._unproduce(st)
        self._pending_load.pop(rid, None)
        self._key_cache.pop(rid, None)
        self._failed_loads.discard(rid)
        self._waiting_since.pop(rid, None)
        loading = rid in self._loading
        busy = rid in self._ever_saved and not loading
        self._ever_saved.discard(rid)
        self._loading.discard(rid)
        if loading:
            self._aborted.add(rid)
            self._awaiting.add(rid)
        if busy:
            self._delayed.add(rid)
            self._awaiting.add(rid)
        return busy, None

    def has_pending_push_work(self) -> bool:
        """True while a finished request's blocks wait for the workers
        (stores still reading them, an aborted load stopping): vLLM (the
        releases that ask) keeps stepping, so they are freed as soon as
        the workers are done rather than at the next request."""
        return bool(self._awaiting)

    def reset_cache(self) -> Optional[bool]:
        """The daemon's cache is the node's, shared with other engines:
        an engine does not drop it. Returns False (not reset)."""
        log.warning("kvtier.vllm: reset_cache: the kvtier cache is shared "
                    "by the node's engines and is not reset from vLLM")
        return False

    # ==========================================================================
    # worker side
    # ==========================================================================

    def _load(self, keys: List[bytes], blocks: List[int], first: int,
              each: bool = False) -> Any:
        if self._staging is not None:
            return self._staging.load(keys, blocks, first)
        return self._client.load(self._need_mem(), keys, blocks, first,
                                 each=each)

    def _store(self, keys: List[bytes], blocks: List[int], first: int,
               event: Any = None, each: bool = False) -> Any:
        if self._staging is not None:
            st = self._staging.store(keys, blocks, first)
            st.copy_all()  # the step's forward is done: every layer written
            st.submit()
            self._stats.data["store_dropped_pages"] += st.dropped
            return st
        return self._client.store(self._need_mem(), keys, blocks, first,
                                  each=each, event=event)

    def _need_mem(self) -> Memory:
        if self._mem is None:
            raise RuntimeError("kvtier.vllm: register_kv_caches() was not "
                               "called")
        return self._mem

    def handle_preemptions(self, kv_connector_metadata: Any) -> None:
        """Before vLLM reuses a preempted request's blocks: cancel its
        stores and loads and wait for them to stop — at most the daemon's
        lease plus the request timeout (Client.job_stop_s); a job still
        running then means a hung daemon: the connection is dropped (the
        client returns once the daemon let go, or says it did not) and
        re-made at the next step. vLLM v0.12-v0.15 pass the preempted
        request ids (a set, only in steps that preempted), later releases
        this step's connector metadata (every step): both are taken
        (kvtier.vllm_compat.preempted_ids). Hybrid models: the stores
        reading sliding-window blocks vLLM freed this step end first."""
        if self._hplan is not None:
            self._hyb_wait_stores(kv_connector_metadata)
        for rid in _compat.preempted_ids(kv_connector_metadata):
            jobs = self._store_jobs.pop(rid, [])
            job = self._load_jobs.pop(rid, None)
            for j in jobs + ([job] if job else []):
                try:
                    if j.cancel():
                        self._stats.data["cancelled"] += 1
                    j.wait(timeout=self._stop_s())
                except TimeoutError:
                    self._stop_timeout(rid)
                except KvtierError as e:
                    self._note_down(e)
                j.close()

    def _stop_s(self) -> float:
        try:
            return self._client.job_stop_s
        except (KvtierError, ValueError):
            return self._timeout_ms / 1000.0  # closed: waits return

    def _stop_timeout(self, rid: str) -> None:
        """A job of @rid did not stop in time: drop the connection (its
        jobs end as the daemon lets go; the worker reconnects)."""
        self._stats.data["stop_timeouts"] += 1
        log.error("kvtier.vllm: a job of request %s did not stop %.0f s "
                  "after its cancel: dropping the connection to the daemon",
                  rid, self._stop_s())
        self._client.close()
        if self._down_since is None:
            self._down_since = time.monotonic()

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        """Start this step's load jobs; take the requests whose blocks
        vLLM keeps for us (stopping their loads: aborted)."""
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvtierConnectorMetadata)
        for rid in meta.delayed:
            self._finishing.add(rid)
        for rid in meta.aborted:
            job = self._load_jobs.get(rid)
            if job is not None and rid not in self._aborted_loads:
                job.cancel()
                self._aborted_loads.add(rid)
        self._worker_reconnect()
        if self._staging is None:
            self._need_mem()
        self._sync_jobs = []
        groups: Dict[str, List[Any]] = {}
        for ls in meta.loads:
            try:
                job = self._load(ls.keys, ls.blocks, ls.first, ls.each)
            except KvtierError as e:
                # the daemon refused or went away: vLLM recomputes them
                log.error("kvtier.vllm: load of %s failed: %s", ls.req_id, e)
                self._note_down(e)
                job = _FailedLoad(ls.blocks)
            self._stats.data["loads"] += 1
            self._stats.data["load_pages"] += len(ls.blocks)
            if ls.is_async and self._hplan is not None:
                groups.setdefault(ls.req_id, []).append(job)
            elif ls.is_async:
                self._load_jobs[ls.req_id] = job
            else:
                self._sync_jobs.append((ls.req_id, job))
        for rid, jobs in groups.items():     # one per group: one job
            self._load_jobs[rid] = _hybrid._JobSet(jobs)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Layerwise loads: block until @layer_name is in place."""
        if not self._sync_jobs:
            return
        layer = self._layer_index[layer_name]
        if self._torch_dev:
            # the compute stream waits for the layer: no CPU round trip
            import torch
            s = self._dev.wrap_stream(torch.cuda.current_stream().cuda_stream)
            for _, job in self._sync_jobs:
                if isinstance(job, Job):
                    job.stream_wait(layer, s)
            return
        for rid, job in self._sync_jobs:
            try:
                job.wait_layer(layer, timeout=self._stop_s())
            except TimeoutError:  # a hung daemon: its blocks all fail
                self._stop_timeout(rid)

    def save_kv_layer(self, layer_name: str, kv_layer: Any,
                      attn_metadata: Any, **kwargs: Any) -> None:
        """Nothing to copy: the daemon reads the registered memory itself
        when wait_for_save() submits the step's stores."""
        return

    def wait_for_save(self) -> None:
        """Finish layerwise loads; submit this step's store jobs (they run
        on; get_finished() reports the requests whose stores are done)."""
        tainted = set()
        for rid, job in self._sync_jobs:
            if self._end_load(job):
                tainted.add(rid)
        self._sync_jobs = []
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvtierConnectorMetadata)
        if self._staging is None:
            self._need_mem()
        event = self._store_event() if meta.saves else None
        for ss in meta.saves:
            jobs = self._store_jobs.setdefault(ss.req_id, [])
            if ss.req_id in tainted:
                # this step computed past a block that did not load: what
                # it wrote is wrong and vLLM recomputes it; store nothing
                continue
            try:
                job = self._store(ss.keys, ss.blocks[ss.first:], ss.first,
                                  event, ss.each)
            except KvtierError as e:
                self._note_down(e)
                if e.code != KVT_ENOTFOUND or ss.first == 0 or ss.each:
                    self._stats.data["store_errors"] += 1
                    log.warning("kvtier.vllm: store of %s: %s", ss.req_id, e)
                    continue
                # a parent page left the cache: store the prefix whole
                job = self._store(ss.keys, ss.blocks, 0, event)
            jobs.append(job)
            self._stats.data["stores"] += 1
            self._stats.data["store_pages"] += len(ss.keys) - ss.first

    def _end_load(self, job: Job, rid: str = "") -> List[int]:
        try:
            failed = job.wait(timeout=self._stop_s())
        except TimeoutError:  # a hung daemon: drop it, every block fails
            self._stop_timeout("(load)")
            failed = job.wait(timeout=self._stop_s())
        if self._hplan is not None and failed:
            # block ids are a group's: vLLM takes only the whole request
            self._failed_recving.add(rid)
            self._stats.data["failed_requests"] += 1
        else:
            self._load_errors.update(failed)
        self._stats.data["load_failed_blocks"] += len(failed)
        job.close()
        return failed

    def get_finished(self, finished_req_ids: Set[str]
                     ) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        """(finished requests whose stores (or aborted load) are done:
        vLLM may free their blocks, requests whose async load is done).

        Which finished requests are reported is the scheduler side's
        choice (request_finished's delay_free), passed in the metadata,
        so both sides agree whatever the timing."""
        recving: Set[str] = set()
        sending: Set[str] = set()
        for rid, job in list(self._load_jobs.items()):
            if job.poll():
                del self._load_jobs[rid]
                if rid in self._aborted_loads:
                    # stopped: vLLM frees the blocks on finished_recving
                    self._aborted_loads.discard(rid)
                    job.close()
                    recving.add(rid)
                else:
                    self._end_load(job, rid)
                    recving.add(rid)
        for rid, jobs in list(self._store_jobs.items()):
            still = []
            for j in jobs:
                if j.poll():
                    failed = j.failed
                    self._stats.data["store_failed_blocks"] += len(failed)
                    j.close()
                else:
                    still.append(j)
            self._store_jobs[rid] = still
        for rid in list(self._finishing):
            if not self._store_jobs.get(rid) and rid not in self._load_jobs:
                self._finishing.discard(rid)
                self._store_jobs.pop(rid, None)
                sending.add(rid)
        if self._retired and not self._load_jobs and \
                not any(self._store_jobs.values()):
            self._close_retired()
        return (sending or None), (recving or None)

    def get_transfer_results(self, finished_req_ids: Set[str]
                             ) -> KVConnectorTransferResults:
        """What current vLLM's workers call instead of get_finished():
        get_finished()'s two sets, and failed_recving empty but for hybrid
        models — a failed load is reported per block
        (get_block_ids_with_load_errors), so vLLM keeps the pages that did
        land and recomputes from the first failed block; failed_recving
        makes it recompute (or fail) the whole request, the only way
        under several KV cache groups (kvtier.vllm_hybrid)."""
        sending, recving = self.get_finished(finished_req_ids)
        failed, self._failed_recving = self._failed_recving, set()
        return KVConnectorTransferResults(
            finished_sending=set(sending or ()),
            finished_recving=set(recving or ()), failed_recving=failed)

    @property
    def requires_kv_delivery(self) -> bool:
        """False: a best-effort cache. A request preempted while its
        stores run may finish (handle_preemptions stops the stores before
        its blocks are reused; a dropped store is a later miss), which is
        what current vLLM's base class asks of caches (its default, True
        for kv_both, recomputes such requests)."""
        return False

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: Dict[str, Any]
                                         ) -> bool:
        """True in "layerwise" load mode: wait_for_layer_load() is a
        layer-by-layer wait that a full CUDA graph cannot capture (it
        would be skipped at replay, the layer's attention reading blocks
        still being loaded), so vLLM must use PIECEWISE graphs. Async
        loads wait for nothing inside the forward: False."""
        return (extra_config or {}).get("load_mode", "async") == "layerwise"

    def _note_down(self, e: KvtierError) -> None:
        if isinstance(e, ConnectionLost) and self._down_since is None:
            self._down_since = time.monotonic()

    def get_block_ids_with_load_errors(self) -> Set[int]:
        """Blocks whose load failed since the last call (vLLM recomputes
        them)."""
        out, self._load_errors = self._load_errors, set()
        return out

    def get_kv_connector_stats(self) -> Optional[KvtierStats]:
        """Counters since the last call (None when nothing happened)."""
        if self._stats.is_empty():
            return None
        out, self._stats = self._stats, KvtierStats(data={})
        return out

    @classmethod
    def build_kv_connector_stats(cls, data: Optional[Dict[str, Any]] = None
                                 ) -> Optional[KvtierStats]:
        return KvtierStats(data=dict(data or {}))

    def shutdown(self) -> None:
        """Wait for stores to finish, then disconnect."""
        for jobs in self._store_jobs.values():
            for j in jobs:
                try:
                    j.wait(timeout=30)
                except Exception as e:  # the daemon went away: nothing to do
                    log.warning("kvtier.vllm: shutdown: %s", e)
        for job in self._load_jobs.values():
            job.cancel()
        self._store_jobs.clear()
        self._load_jobs.clear()
        self._close_retired()
        self._client.close()
