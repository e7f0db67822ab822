"""kvtier as a vLLM v1 KV connector: KvtierConnector.

Targets the KV connector interface of vLLM v0.12.0 (tag commit
86e178f7c4d8; vllm/distributed/kv_transfer/kv_connector/v1/base.py,
vllm/v1/core/sched/scheduler.py, vllm/v1/worker/
kv_connector_model_runner_mixin.py), also read on main at 003df2961dd8
(2026), where the calls used here are unchanged. Loaded out of tree:

    PYTHONHASHSEED=0 vllm serve <model> --block-size 16 \\
        --kv-transfer-config '{"kv_connector": "KvtierConnector",
            "kv_connector_module_path": "kvtier.vllm", "kv_role": "kv_both",
            "kv_connector_extra_config": {"socket": "/run/kvtier/kvtierd.sock",
                "tenant": 0, "namespace": "default"}}'

with `kvtier serve --model <the model's config.json> --page-tokens 16`
on the node (its page is one vLLM block: --page-tokens must equal
--block-size).

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
    only this process can hit). TP ranks are kept apart by the daemon
    (each rank is its own root).
  * Scheduler side. get_num_new_matched_tokens() hashes nothing itself:
    it looks the request's keys up in the daemon (no touch: the call must
    be side-effect free), never counting the prompt's last token (vLLM
    must compute one), and answers (tokens beyond the locally computed
    ones, load_is_async=True); None ("ask again") while the next pages
    are being stored by someone (bounded by "inflight_wait_s").
    update_state_after_alloc() records the blocks vLLM gave the load;
    build_connector_meta() packs this step's loads, the stores of pages
    that this step completes, and the preempted requests; request_finished()
    answers delay_free=True for a request with stores (or a load) the
    workers may still be running, which then return it in finished_sending.
  * Worker side. register_kv_caches() shares vLLM's KV tensors with the
    daemon. GPU tensors are registered BY HANDLE (CUDA IPC handles of the
    allocator's segments and offsets, as PyTorch's storage sharing gives
    them: kvtier.torch_dev): the daemon opens them on the same GPU and
    moves pages straight between its page-locked tiers and them — loads
    by its gather kernel, stores by batched copy-engine DMA, both
    verified by a checksum kernel on the GPU; no CPU copy of a page byte.
    Host tensors are memory the daemon maps (a sealed memfd): CPU torch
    tensors are RE-HOMED in place (Tensor.set_ onto a memfd view, contents
    copied) before any KV is in them; NumPy arrays must already be views
    of host_kv_buffer() memory — or, with "device": "emu", of
    emu_kv_buffer() memory: the emulated device (CI), registered by handle
    like a GPU's. The tensors have FlashAttention's shape (2, num_blocks,
    block_size, kv_heads, head_dim) per layer; their strides become the
    registered layout. start_load_kv() starts one load job per request;
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
    (kvtier.staging; "staging_blocks" sets its size, else 2 GiB worth):
    an explicit choice with a cost, printed at start (the pages cross host
    memory several times and the GPU copies run inside the step). Never a
    fallback: a GPU cache the daemon cannot open is an error.

A daemon that goes away is not an error for vLLM: lookups answer no hit,
loads fail every block (recomputed), stores are counted as errors; both
sides reconnect at most every 5 s, the worker registering its caches
again.

Not done: hybrid (HMA) models with several KV cache groups (refused: one
group only); MLA layouts; KV events (take_events). The GPU path has run on
the emulated device only (CI); scripts/gpu-check runs it on a GPU.
"""
from __future__ import annotations

import ctypes
import dataclasses
import logging
import mmap
import os
import time
from typing import Any, Dict, List, Optional, Set, Tuple

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import \
    KVConnectorStats

from . import (KVT_ENOTBUILT, KVT_ENOTFOUND, Client, ConnectionLost,
               Geometry, Job, KvtierError)
from . import Memory, keys_from_hashes
from .client import shared_memfd
from .staging import StagingPool

# host memory for staging GPU KV (when staging_blocks is not given): 2 GiB
_STAGING_BYTES = 2 << 30
# a scheduler side that lost its daemon tries again this often (seconds)
_RECONNECT_S = 5.0


class _FailedLoad:
    """A load the daemon did not take (it went away): every block failed,
    reported as a finished job so vLLM's bookkeeping runs as usual."""

    def __init__(self, blocks: List[int]) -> None:
        self.blocks = list(blocks)
        self.failed = list(blocks)

    def wait_layer(self, layer: int, timeout: Optional[float] = None) -> bool:
        return False

    def wait(self, timeout: Optional[float] = None) -> List[int]:
        return list(self.blocks)

    def poll(self) -> bool:
        return True

    def cancel(self) -> bool:
        return False

    def close(self) -> None:
        pass

__all__ = ["KvtierConnector", "KvtierConnectorMetadata", "KvtierStats",
           "LoadSpec", "SaveSpec", "host_kv_buffer"]

log = logging.getLogger("kvtier.vllm")


# -- host memory the daemon can map --------------------------------------------

@dataclasses.dataclass
class _HostBuffer:
    fd: int
    map: mmap.mmap
    base: int
    size: int


_BUFFERS: List[_HostBuffer] = []


def host_kv_buffer(nbytes: int) -> memoryview:
    """@nbytes of zeroed host memory the kvtier daemon can map: a memfd
    sealed against shrinking and growing, mapped shared here. Allocate
    KV caches in it (np.frombuffer / torch.frombuffer) before handing
    them to register_kv_caches(). Lives as long as the process."""
    if nbytes <= 0:
        raise ValueError(f"kvtier.vllm: host_kv_buffer({nbytes}): size must "
                         f"be positive")
    fd, mm = shared_memfd(nbytes, "kvtier-vllm-kv")
    base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    _BUFFERS.append(_HostBuffer(fd, mm, base, nbytes))
    return memoryview(mm)


_EMU: List[Any] = []   # [Device, [DeviceMemory ...]] of emu_kv_buffer()


def emu_kv_buffer(nbytes: int) -> memoryview:
    """@nbytes of zeroed emulated-device memory (kvtier.Device("emu")):
    allocate KV caches in it for "device": "emu" (CI's stand-in for GPU
    memory: the daemon opens it by handle and moves pages with device
    copies). Lives as long as the process."""
    from .device import Device
    if not _EMU:
        _EMU.extend([Device("emu"), []])
    mem = _EMU[0].alloc(nbytes)
    _EMU[1].append(mem)
    return memoryview((ctypes.c_char * nbytes).from_address(mem.ptr)
                      ).cast("B")


def _buffer_of(addr: int, end: int) -> Optional[_HostBuffer]:
    for b in _BUFFERS:
        if b.base <= addr and end <= b.base + b.size:
            return b
    return None


# -- tensors, without depending on torch or numpy ------------------------------

def _is_torch(t: Any) -> bool:
    return type(t).__module__.startswith("torch")


def _describe(t: Any) -> Tuple[int, Tuple[int, ...], Tuple[int, ...], int]:
    """(address, shape, byte strides, item size) of a torch tensor or a
    NumPy array."""
    if _is_torch(t):
        if t.device.type != "cpu":
            raise KvtierError(KVT_ENOTBUILT, "kvtier.vllm: register KV caches",
                              f"KV caches on {t.device} cannot be shared with "
                              f"the daemon: GPU memory registration is not "
                              f"implemented; leave \"staging\" at \"auto\" "
                              f"(or true) to move pages through host "
                              f"staging blocks")
        isz = t.element_size()
        return (t.data_ptr(), tuple(t.shape),
                tuple(s * isz for s in t.stride()), isz)
    ai = getattr(t, "__array_interface__", None)
    if ai is None:
        raise TypeError(f"kvtier.vllm: a KV cache must be a torch tensor or a "
                        f"NumPy array, not {type(t).__name__}")
    return (ai["data"][0], tuple(t.shape), tuple(t.strides), t.itemsize)


def _rehome_torch(caches: Dict[str, Any]) -> None:
    """Move CPU torch tensors into one host_kv_buffer(), in place
    (Tensor.set_): every holder of the tensor sees the new memory."""
    import torch
    total = 0
    offs = []
    for t in caches.values():
        offs.append(total)
        nb = t.numel() * t.element_size()
        total += (nb + 4095) // 4096 * 4096
    buf = host_kv_buffer(total)
    for off, t in zip(offs, caches.values()):
        if not t.is_contiguous():
            raise ValueError("kvtier.vllm: a KV cache tensor to re-home must "
                             "be contiguous")
        new = torch.frombuffer(buf, dtype=t.dtype, count=t.numel(),
                               offset=off).view(t.shape)
        new.copy_(t)
        t.set_(new)


# -- metadata and stats ------------------------------------------------------------

@dataclasses.dataclass
class LoadSpec:
    """Load pages first..len(keys)-1 of the prefix @keys into @blocks."""
    req_id: str
    keys: List[bytes]
    first: int
    blocks: List[int]
    is_async: bool = True


@dataclasses.dataclass
class SaveSpec:
    """Store pages first..len(keys)-1 of the prefix @keys out of
    blocks[first:] (@blocks: the request's blocks from page 0)."""
    req_id: str
    keys: List[bytes]
    first: int
    blocks: List[int]


@dataclasses.dataclass
class KvtierConnectorMetadata(KVConnectorMetadata):
    """One step's orders, scheduler side to worker side."""
    loads: List[LoadSpec] = dataclasses.field(default_factory=list)
    saves: List[SaveSpec] = dataclasses.field(default_factory=list)
    preempted: Set[str] = dataclasses.field(default_factory=set)
    # finished requests whose blocks vLLM keeps until the workers return
    # them in finished_sending (request_finished said delay_free)
    delayed: Set[str] = dataclasses.field(default_factory=set)


_STAT_KEYS = ("loads", "load_pages", "load_failed_blocks", "stores",
              "store_pages", "store_failed_blocks", "store_errors",
              "store_dropped_pages", "cancelled", "stop_timeouts")


@dataclasses.dataclass
class KvtierStats(KVConnectorStats):
    """Worker counters since the last interval (get_kv_connector_stats)."""

    def __post_init__(self) -> None:
        for k in _STAT_KEYS:
            self.data.setdefault(k, 0)

    def reset(self) -> None:
        self.data = {k: 0 for k in _STAT_KEYS}

    def aggregate(self, other: KVConnectorStats) -> "KvtierStats":
        for k in _STAT_KEYS:
            self.data[k] = self.data.get(k, 0) + other.data.get(k, 0)
        return self

    def reduce(self) -> Dict[str, int]:
        return dict(self.data)

    def is_empty(self) -> bool:
        return not any(self.data.get(k, 0) for k in _STAT_KEYS)


# -- the connector -------------------------------------------------------------

@dataclasses.dataclass
class _SchedReq:
    request: Any
    block_ids: List[int]
    saved: int = 0          # pages handed to the workers to store


class KvtierConnector(KVConnectorBase_V1):
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
      inflight_wait_s   how long a request waits for pages others are
                        storing (2.0)
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
                 "staging_blocks", "device"}
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
        self._salt = f"vllm|{tenant}|{self._ns}|{model}|" \
                     f"{extra.get('salt', '')}".encode()
        if role == KVConnectorRole.SCHEDULER and \
                extra.get("require_hash_seed", True) and \
                os.environ.get("PYTHONHASHSEED") is None:
            raise ValueError(
                "kvtier.vllm: PYTHONHASHSEED is not set: vLLM then seeds its "
                "block hashes at random per process and no other process (or "
                "restart) can hit this cache. Set the same PYTHONHASHSEED for "
                "every vLLM sharing the daemon, or set "
                "\"require_hash_seed\": false")
        groups = getattr(kv_cache_config, "kv_cache_groups", None)
        if groups is not None and len(groups) != 1:
            raise ValueError(f"kvtier.vllm: {len(groups)} KV cache groups "
                             f"(a hybrid model): not implemented, one only")
        cfg = extra.get("model_config")
        if cfg is None:
            hf = mc.hf_config
            cfg = hf.to_dict() if hasattr(hf, "to_dict") else dict(hf)
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
        self._reqs: Dict[str, _SchedReq] = {}
        self._pending_load: Dict[str, Tuple[List[bytes], int]] = {}
        self._loads_to_send: List[LoadSpec] = []
        self._loading: Set[str] = set()
        self._ever_saved: Set[str] = set()
        self._delayed: Set[str] = set()
        self._waiting_since: Dict[str, float] = {}
        self._key_cache: Dict[str, Tuple[int, List[bytes]]] = {}
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
        self._stats = KvtierStats(data={})
        self._down_since: Optional[float] = None
        self._retired: List[Tuple[Client, Optional[StagingPool]]] = []

    def _connect(self) -> Client:
        try:
            return Client(self._geom, socket=self._socket, ns=self._ns,
                          tenant=self._tenant, timeout_ms=self._timeout_ms)
        except KvtierError as e:
            if e.name == "KVT_EGEOM":
                raise KvtierError(e.code, "kvtier.vllm: the daemon serves "
                                  "another model or page size: its "
                                  "--page-tokens must be vLLM's --block-size "
                                  f"({self._block_size}), its --model this "
                                  "model's config, its --tp vLLM's", e.detail)
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
        """(tokens the daemon can supply beyond @num_computed_tokens,
        load_is_async); (None, False) while the next pages are being
        stored (ask again)."""
        P = self._block_size
        rid = request.request_id
        # one token must be computed: never match the prompt's last
        limit = min(len(request.block_hashes), (request.num_tokens - 1) // P)
        start = num_computed_tokens // P
        if limit <= start:
            return 0, False
        keys = self._keys(request)[:limit]
        r = self._lookup(keys)
        if r is None:
            return 0, False
        if r.inflight and r.pages < limit:
            t0 = self._waiting_since.setdefault(rid, time.monotonic())
            if time.monotonic() - t0 < self._inflight_wait:
                return None, False
        self._waiting_since.pop(rid, None)
        if r.pages <= start:
            return 0, False
        self._pending_load[rid] = (keys[:r.pages], start)
        return (r.pages - start) * P, self._load_mode == "async"

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
            except KvtierError as e:
                self._down_since = time.monotonic()
                log.debug("kvtier.vllm: reconnect failed: %s", e)
                return None
        try:
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
        rid = request.request_id
        ids = list(blocks.get_block_ids()[0])
        st = self._reqs.get(rid)
        if st is None:
            self._reqs[rid] = st = _SchedReq(request, ids)
        plan = self._pending_load.pop(rid, None)
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

    def build_connector_meta(self, scheduler_output: Any
                             ) -> KvtierConnectorMetadata:
        """This step's loads, stores and preemptions for the workers."""
        meta = KvtierConnectorMetadata(loads=self._loads_to_send,
                                       delayed=self._delayed)
        self._loads_to_send = []
        self._delayed = set()
        for rid in getattr(scheduler_output, "preempted_req_ids", None) or ():
            meta.preempted.add(rid)
            st = self._reqs.get(rid)
            if st is not None:
                st.saved = 0
                st.block_ids = []
            self._loading.discard(rid)
        if not self._save:
            return meta
        sched = scheduler_output.num_scheduled_tokens
        for nr in scheduler_output.scheduled_new_reqs:
            st = self._reqs.get(nr.req_id)
            if st is None:
                continue
            st.block_ids = list(nr.block_ids[0])
            self._plan_save(meta, nr.req_id, st,
                            nr.num_computed_tokens + sched.get(nr.req_id, 0))
        cr = scheduler_output.scheduled_cached_reqs
        for i, rid in enumerate(cr.req_ids):
            st = self._reqs.get(rid)
            if st is None:
                continue
            new = cr.new_block_ids[i]
            if cr.resumed_from_preemption[i] if hasattr(
                    cr, "resumed_from_preemption") else False:
                st.block_ids = list(new[0]) if new else []
            elif new:
                st.block_ids += list(new[0])
            self._plan_save(meta, rid, st,
                            cr.num_computed_tokens[i] + sched.get(rid, 0))
        return meta

    def _plan_save(self, meta: KvtierConnectorMetadata, rid: str,
                   st: _SchedReq, computed_after: int) -> None:
        keys = self._keys(st.request)
        upto = min(computed_after // self._block_size, len(keys),
                   len(st.block_ids))
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
        bad = connector_output.invalid_block_ids
        if bad:
            for st in self._reqs.values():
                hit = [i for i, b in enumerate(st.block_ids) if b in bad]
                if hit:
                    st.saved = min(st.saved, hit[0])

    def request_finished(self, request: Any, block_ids: List[int]
                         ) -> Tuple[bool, Optional[Dict[str, Any]]]:
        """delay_free=True while workers may still read (store) or write
        (load) the request's blocks: they return it in finished_sending."""
        rid = request.request_id
        self._reqs.pop(rid, None)
        self._pending_load.pop(rid, None)
        self._key_cache.pop(rid, None)
        self._waiting_since.pop(rid, None)
        busy = rid in self._ever_saved or rid in self._loading
        self._ever_saved.discard(rid)
        self._loading.discard(rid)
        if busy:
            self._delayed.add(rid)
        return busy, None

    def reset_cache(self) -> bool:
        """The daemon's cache is the node's, shared with other engines:
        an engine does not drop it. Returns False (not reset)."""
        log.warning("kvtier.vllm: reset_cache: the kvtier cache is shared "
                    "by the node's engines and is not reset from vLLM")
        return False

    # ==========================================================================
    # worker side
    # ==========================================================================

    def register_kv_caches(self, kv_caches: Dict[str, Any]) -> None:
        """Register vLLM's per-layer KV caches (FlashAttention shape
        (2, num_blocks, block_size, kv_heads, head_dim)) with the daemon;
        CPU torch tensors are re-homed into daemon-mappable memory first."""
        g = self._geom
        if len(kv_caches) != g.layers:
            raise ValueError(f"kvtier.vllm: {len(kv_caches)} KV cache layers "
                             f"for a model of {g.layers} layers")
        on_gpu = any(_is_torch(t) and t.device.type == "cuda"
                     for t in kv_caches.values())
        if self._staging_mode is not True:
            other = {str(t.device) for t in kv_caches.values()
                     if _is_torch(t) and t.device.type not in ("cpu", "cuda")}
            if other:
                raise ValueError(
                    f"kvtier.vllm: KV caches on {', '.join(sorted(other))}: "
                    f"the daemon opens CUDA memory by handle, or maps host "
                    f"memory (\"staging\": true moves other devices' KV "
                    f"through host blocks)")
        if self._staging_mode is True:
            self._register_staging(kv_caches)
            return
        if on_gpu or self._device_mode == "emu":
            self._register_device(kv_caches, on_gpu)
            return
        if any(_is_torch(t) for t in kv_caches.values()):
            for t in kv_caches.values():
                _describe(t)    # GPU: KVT_ENOTBUILT before anything moves
            if not all(_buffer_of(t.data_ptr(), t.data_ptr() + 1)
                       for t in kv_caches.values()):
                _rehome_torch(kv_caches)
        descs = [_describe(t) for t in kv_caches.values()]
        want = (2, None, g.page_tokens, g.kv_heads, g.head_dim)
        addr0, shape0, strides0, isz = descs[0]
        for name, (addr, shape, strides, sz) in zip(kv_caches, descs):
            if len(shape) != 5 or shape[0] != 2 or shape[2:] != want[2:]:
                raise ValueError(
                    f"kvtier.vllm: layer {name}: KV cache of shape {shape}; "
                    f"expected (2, num_blocks, {g.page_tokens}, {g.kv_heads}, "
                    f"{g.head_dim}) (FlashAttention layout; block size = the "
                    f"daemon's --page-tokens, heads per TP rank)")
            if sz != g.dtype_bytes:
                raise ValueError(f"kvtier.vllm: layer {name}: {sz}-byte "
                                 f"elements, the daemon's model has "
                                 f"{g.dtype_bytes}")
            if shape != shape0 or strides != strides0:
                raise ValueError(f"kvtier.vllm: layer {name}: shape/strides "
                                 f"differ from the first layer's")
        kv_stride, block_stride, token_stride, head_stride, elem = strides0
        if elem != isz or head_stride != g.head_dim * isz or \
                token_stride != g.kv_heads * g.head_dim * isz:
            raise ValueError("kvtier.vllm: each token's heads must be "
                             "contiguous in the KV cache")
        nblocks = shape0[1]
        span = kv_stride + (nblocks - 1) * block_stride + \
            g.page_tokens * token_stride
        buf = _buffer_of(min(d[0] for d in descs),
                         max(d[0] for d in descs) + span)
        if buf is None:
            raise ValueError(
                "kvtier.vllm: the KV caches are not in memory the daemon can "
                "map: NumPy arrays must be views of kvtier.vllm."
                "host_kv_buffer() (torch CPU tensors are re-homed)")
        offs = [d[0] - buf.base for d in descs]
        self._register = (buf.fd, offs, nblocks, block_stride, kv_stride,
                          token_stride)
        self._mem = self._client.register_fd(*self._register)
        self._layer_index = {n: i for i, n in enumerate(kv_caches)}

    def _register_device(self, kv_caches: Dict[str, Any],
                         on_gpu: bool) -> None:
        """Device memory by handle: torch CUDA tensors (their IPC
        handles), or NumPy views of emu_kv_buffer() memory."""
        tensors = list(kv_caches.values())
        self._layer_index = {n: i for i, n in enumerate(kv_caches)}
        self._kv_list = tensors
        if on_gpu:
            from .device import Device
            self._torch_dev = True
            self._dev = Device(tensors[0].device.index or 0)
            self._register = ("torch",)
            self._mem = self._client.register_torch(tensors)
            log.info("kvtier.vllm: GPU KV caches registered with the daemon "
                     "by IPC handle on %s: loads and stores are the "
                     "daemon's device copies, verified on the GPU",
                     self._dev.name)
            return
        g = self._geom
        descs = [_describe(t) for t in tensors]
        if not _EMU or not all(any(m.ptr <= d[0] < m.ptr + m.nbytes
                                   for m in _EMU[1]) for d in descs):
            raise ValueError("kvtier.vllm: \"device\": \"emu\" takes KV "
                             "caches in emu_kv_buffer() memory")
        kv_stride, block_stride, token_stride = descs[0][2][:3]
        if token_stride != g.kv_heads * g.head_dim * g.dtype_bytes:
            raise ValueError("kvtier.vllm: each token's heads must be "
                             "contiguous in the KV cache")
        self._dev = _EMU[0]
        self._register = ("emu", [d[0] for d in descs], descs[0][1][1],
                          block_stride, kv_stride, token_stride)
        self._mem = self._client.register_device(self._dev, *self._register[1:])

    def _store_event(self) -> Any:
        """GPU: an IPC event recorded now on the compute stream, after
        the step's KV writes (the daemon's store copies wait for it)."""
        if not self._torch_dev:
            return None
        import torch
        from .torch_dev import ipc_event
        if self._ipc_event is None:
            self._ipc_event = ipc_event(self._client)
        self._ipc_event[0].record(torch.cuda.current_stream())
        return self._ipc_event[1]

    def _register_staging(self, kv_caches: Dict[str, Any]) -> None:
        """"staging": true — move pages through a pool of host blocks the
        daemon maps (kvtier.staging), at a cost said at start."""
        g = self._geom
        nblocks = tuple(next(iter(kv_caches.values())).shape)[1]
        n = self._staging_blocks or min(
            nblocks, max(64, _STAGING_BYTES // g.page_bytes))
        self._staging = StagingPool(self._client, list(kv_caches.values()),
                                    n)
        self._layer_index = {name: i for i, name in enumerate(kv_caches)}
        log.warning(
            "kvtier.vllm: \"staging\": true — KV moves through %d host "
            "blocks (%s, %.1f GiB): a load's bytes are copied by the "
            "daemon's CPU into staging, gathered and copied to the device "
            "per layer inside the step, a store's copied out of the device "
            "synchronously in wait_for_save; each byte crosses host memory "
            "two or three times. Leave \"staging\" unset for the direct "
            "path (the daemon DMAs into GPU memory it opens by handle).",
            n, self._staging.pinned, n * g.page_bytes / (1 << 30))

    def _load(self, keys: List[bytes], blocks: List[int], first: int) -> Any:
        if self._staging is not None:
            return self._staging.load(keys, blocks, first)
        return self._client.load(self._need_mem(), keys, blocks, first)

    def _store(self, keys: List[bytes], blocks: List[int], first: int,
               event: Any = None) -> Any:
        if self._staging is not None:
            st = self._staging.store(keys, blocks, first)
            st.copy_all()  # the step's forward is done: every layer written
            st.submit()
            self._stats.data["store_dropped_pages"] += st.dropped
            return st
        return self._client.store(self._need_mem(), keys, blocks, first,
                                  event=event)

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
        re-made at the next step."""
        for rid in getattr(kv_connector_metadata, "preempted", ()):
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
            job = self._load_jobs.get(rid)
            if job is not None and rid not in self._aborted_loads:
                job.cancel()
                self._aborted_loads.add(rid)
        self._worker_reconnect()
        if self._staging is None:
            self._need_mem()
        self._sync_jobs = []
        for ls in meta.loads:
            try:
                job = self._load(ls.keys, ls.blocks, ls.first)
            except KvtierError as e:
                # the daemon refused or went away: vLLM recomputes them
                log.error("kvtier.vllm: load of %s failed: %s", ls.req_id, e)
                self._note_down(e)
                job = _FailedLoad(ls.blocks)
            self._stats.data["loads"] += 1
            self._stats.data["load_pages"] += len(ls.blocks)
            if ls.is_async:
                self._load_jobs[ls.req_id] = job
            else:
                self._sync_jobs.append((ls.req_id, job))

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
                                  event)
            except KvtierError as e:
                self._note_down(e)
                if e.code != KVT_ENOTFOUND or ss.first == 0:
                    self._stats.data["store_errors"] += 1
                    log.warning("kvtier.vllm: store of %s: %s", ss.req_id, e)
                    continue
                # a parent page left the cache: store the prefix whole
                job = self._store(ss.keys, ss.blocks, 0, event)
            jobs.append(job)
            self._stats.data["stores"] += 1
            self._stats.data["store_pages"] += len(ss.keys) - ss.first

    def _end_load(self, job: Job) -> List[int]:
        try:
            failed = job.wait(timeout=self._stop_s())
        except TimeoutError:  # a hung daemon: drop it, every block fails
            self._stop_timeout("(load)")
            failed = job.wait(timeout=self._stop_s())
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
                    self._aborted_loads.discard(rid)
                    job.close()
                else:
                    self._end_load(job)
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

    def _close_retired(self) -> None:
        """Close connections replaced by a reconnect, once none of their
        jobs is left (their staging memory is freed with them)."""
        for cl, pool in self._retired:
            try:
                if pool is not None:
                    pool.close()
            except KvtierError:
                pass  # the old daemon is gone: nothing to unregister
            cl.close()
        self._retired = []

    def _note_down(self, e: KvtierError) -> None:
        if isinstance(e, ConnectionLost) and self._down_since is None:
            self._down_since = time.monotonic()

    def _worker_reconnect(self) -> None:
        """The daemon went away: connect again (at most every
        _RECONNECT_S) and register the KV caches (or a new staging pool)
        with the new one. Called at the start of a step."""
        if self._down_since is None:
            return
        if time.monotonic() - self._down_since < _RECONNECT_S or (
                self._mem is None and self._staging is None):
            return
        cl: Optional[Client] = None
        try:
            cl = self._connect()
            if self._staging is not None:
                staging = StagingPool(cl, self._staging.kv,
                                      self._staging.nblocks)
            elif self._register[0] == "torch":
                mem = cl.register_torch(self._kv_list)
            elif self._register[0] == "emu":
                mem = cl.register_device(self._dev, *self._register[1:])
            else:
                mem = cl.register_fd(*self._register)
        except KvtierError as e:
            if cl is not None:
                cl.close()
            self._down_since = time.monotonic()
            log.debug("kvtier.vllm: reconnect failed: %s", e)
            return
        # jobs of the old connection finish reporting through it: it is
        # closed (and its staging memory freed) once they have
        self._retired.append((self._client, self._staging))
        self._client = cl
        self._ipc_event = None  # registered with the old daemon
        if self._staging is not None:
            self._staging = staging
        else:
            self._mem = mem
        self._down_since = None
        log.warning("kvtier.vllm: worker reconnected to the daemon")

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
