"""kvtier as SGLang's HiCache storage backend (the third level, under the
GPU and the host pool): KvtierStorage.

Targets SGLang v0.5.6.post2 (commit 5c8bd8b51b53, the version bump on
main; mem_cache/hicache_storage.py, mem_cache/memory_pool_host.py,
managers/cache_controller.py there). Loaded as a dynamic backend:

    python -m sglang.launch_server --model-path ... --page-size 64 \\
        --enable-hierarchical-cache --hicache-mem-layout page_first_direct \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
            "module_path": "kvtier.sglang", "class_name": "KvtierStorage",
            "interface_v1": 1, "socket": "/run/kvtier/kvtierd.sock"}'

with `kvtier serve --model <the model's config.json> --page-tokens 64
...` running on the node (the page size must be SGLang's --page-size).

HOW IT MAPS
  * Memory. The daemon copies pages straight into and out of SGLang's host
    KV pool, so it must map that memory: only a sealed memfd can be
    shared. register_mem_pool_host() (called by the controller right after
    the backend is made, before any KV is in the pool) allocates a memfd of
    the pool buffer's size, registers it with its layout (kvtier.layout
    derives per-layer offsets and block / kv / token / head strides from
    the buffer's own strides) and RE-HOMES the pool: its kv_buffer becomes
    an array of the same shape, dtype and strides over the memfd (numpy,
    or a torch tensor over it), its bytes moved over in 64 MiB slices,
    each slice of the old buffer handed back to the kernel as soon as it
    is copied (madvise), so the pool is never resident twice, however
    large --hicache-size is; a pinned pool is unpinned first and its new
    buffer page-locked again (cudaHostRegister), and the pool's per-layer
    pointer tables are rebuilt. It then checks the pool's own
    get_page_buffer_meta() pointers against the registered layout (MHA
    layer_first, page_first, page_first_direct; the MLA pool's layer_first,
    page_first, page_first_direct as SGLang 01c0ede38cc9 gives them).
    The MLA pool's latent row is its kv_cache_dim (SGLang's
    override_kv_cache_dim may make it wider than kv_lora_rank +
    qk_rope_head_dim); its per-layer pointer table (data_refs / data_ptrs,
    which SGLang's GPU copy kernels read) is rebuilt too. Refused with the
    reason: a pool split over decode-context-parallel ranks (dcp_size > 1:
    SGLang's own L3 storage paths assert it is 1) and a dummy MLA pool
    (a non-source rank's: no buffer).
    Layouts: layer_first, page_first (a page's tokens of one layer L*H*D*s
    apart: registered in rows), page_first_direct, page_head (heads before
    tokens, layers between them: rows), and the MLA pool's layer_first,
    page_first, page_first_direct (one latent per token; every TP rank
    holds the whole latent, so the ranks share pages as rank 0). Refused
    with the reason: Ascend's page_first_kv_split (a token's latent and
    rope parts in two buffers).
  * Keys. SGLang names page i by a chained SHA-256 (hex) over page i's
    tokens and page i-1's key: one key already stands for its whole
    prefix. Each becomes a 16-byte kvtier key with
    kvtier.keys_from_hashes([key], salt), salt = "sglang|<model>|tp<r>/<n>"
    (<model>: SGLang's served model name) plus the config's "salt" (TP
    ranks hold different heads: never the same key). Process- and
    restart-stable.
  * The index. kvtier names a prefix by all its keys from page 0, and a
    store needs its parents cached. SGLang does not reliably say where a
    call's keys sit: prefix_keys come only with
    "hicache_storage_pass_prefix_keys", the prefetch path leaves out the
    last host node's own pages, and an empty list is never extended past
    the first 128-page batch. So every SGLang page is stored as a prefix of
    ONE page (its chained key needs no parent): correct whatever SGLang
    passes and shared across processes. Each call is still one request
    and one job: batch_exists a KVT_LOOKUP_EACH lookup (the leading run of
    keys each cached), get and set a KVT_CACHE_IO_EACH job (every key a
    one-page prefix; a page that fails, fails alone). The
    daemon's tree is flat for SGLang pages: eviction is per-page LRU/LFU
    rather than leaves-first; SGLang's leading-run matching makes a page
    after a missing one useless, as it would be anyway.
  * Load or recompute. batch_exists answers only the leading pages worth
    prefetching, by kvtier's scheduler decision (kvtier.decide:
    kvt_sched_decide() over the pages' tier runs, the daemon's measured
    rates and the modeled prefill of "decide_profile"'s GPU for the model
    "decide_model" names, by default SGLang's model path): at the pin the
    controller prefetches that many and the scheduler computes the rest,
    as after a miss. Pages being stored right after them are waited for
    on the prefetch thread (at most "inflight_wait_s") when that is
    cheaper than computing them. The request's length is not told to a
    storage backend: one page of new tokens is assumed. "decide": false
    answers every cached page. exists() is a presence check.
  * Results. batch_get_v1 / batch_set_v1 return one bool per key: a page
    absent, corrupt (its checksum failed in the daemon) or not done in
    io_timeout_s is False, and SGLang recomputes from the first False on.
    A daemon that went away makes every page False (logged), never an
    exception on SGLang's I/O threads: they catch nothing and are never
    restarted, so anything a batch call could raise (bad host indices
    included) is caught, logged and counted instead.

THE GPU PATH (kvtier registering GPU memory by handle) does not apply
  here, read from SGLang's code at the pinned commit: the v1 storage calls
  name HOST-POOL indices only (batch_get_v1 / batch_set_v1(keys,
  host_indices)); prefetch lands pages in the host pool, and host -> GPU
  happens later, when the scheduler admits the request and allocates its
  device indices (the host pool's load_to_device_per_layer(device_pool,
  host_indices, device_indices, layer_id, io_backend): SGLang's transfer
  kernels or direct copies); GPU -> host is the pool's
  backup_from_device_all_layer, and only then are host pages handed to
  the storage backend (batch_set_v1 on the controller's backup thread). The backend never sees a device index, so the daemon
  has no GPU destination to DMA into, and its copies into and out of the
  host pool are host memory to host memory (a CPU copy, counted as such).
  Gaining from the GPU path would take SGLang's controller handing a
  storage backend device indices (a storage -> GPU load of its own), which
  its plugin interface does not offer; nothing is built for it here.

Not implemented (raise NotImplementedError saying so): the copying
interface (get / set / batch_get / batch_set: set "interface_v1": 1, which
SGLang needs anyway to pick the zero-copy calls for a dynamic backend),
clear() (the daemon's cache is shared by every engine of the node:
restart the daemon to drop it), GPU-resident pools, the v2 calls of
hybrid models' extra pools (batch_*_v2), should_split_heads.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Dict, List, Optional, Sequence

from sglang.srt.mem_cache.hicache_storage import (HiCacheStorage,
                                                  HiCacheStorageConfig,
                                                  HiCacheStorageExtraInfo)

from . import client as _client
from . import layout as _layout
from .client import Client, Geometry, KvtierError, Memory
from . import decide as _decide
from .keys import keys_from_hashes
from .staging import cuda_host_register

logger = logging.getLogger(__name__)

SGLANG_VERSION = "0.5.6.post2"
SGLANG_COMMIT = "5c8bd8b51b53b9b39eb1edec582ee43b21002106"

# extra-config keys: ours, and those SGLang reads (and normally pops)
_OWN_KEYS = {
    "socket": "the daemon's socket (default $KVT_SOCKET, else "
              "/run/kvtier/kvtierd.sock)",
    "ns": "the daemon's model namespace (default \"default\")",
    "tenant": "the tenant id to act as (default 0)",
    "salt": "extra text in every key's salt (default none)",
    "timeout_ms": "per daemon request (default 10000)",
    "io_timeout_s": "how long one batch_get_v1 / batch_set_v1 may wait "
                    "(default 30)",
    "wait_daemon_s": "how long to wait for the daemon at start (default 5)",
    "inflight_wait_s": "how long batch_exists may wait, on SGLang's prefetch "
                       "thread, for pages being stored when waiting is "
                       "cheaper than computing them (default 0.1)",
    **_decide.CONFIG_KEYS,
    "decide_model": "the model whose prefill the decision prices: its "
                    "config.json (a file, or a directory holding one) or a "
                    "kvtier preset (default: SGLang's model name, the "
                    "model path unless --served-model-name)",
}
_SGLANG_KEYS = {"backend_name", "module_path", "class_name", "interface_v1",
                "prefetch_threshold", "prefetch_timeout_base",
                "prefetch_timeout_per_ki_token",
                "hicache_storage_pass_prefix_keys"}
# re-homing moves this much of the pool at a time (module doc, "Memory")
_SLICE = 64 << 20


class _Indices(list):
    """Token-slot indices with the .tolist() the host pool calls."""

    def tolist(self) -> List[int]:
        return list(self)


def _index_list(host_indices: Any) -> List[int]:
    if hasattr(host_indices, "tolist"):
        return [int(i) for i in host_indices.tolist()]
    return [int(i) for i in host_indices]


def _is_torch(t: Any) -> bool:
    return type(t).__module__.startswith("torch")


def _dtype_name(name: str, itemsize: int) -> str:
    if name in ("float32", "float16", "bfloat16", "float8_e4m3fn",
                "float8_e5m2"):
        return name
    raise ValueError(f"kvtier.sglang: host pool dtype {name} ({itemsize} "
                     f"bytes): kvtier takes float32, float16, bfloat16 or "
                     f"float8")


_libc = None


def _move(src: int, dst: int, n: int) -> None:
    """Copy @n bytes from @src to @dst in slices of _SLICE, giving each
    copied slice of @src back to the kernel (MADV_DONTNEED on its whole
    pages): the resident total stays about one copy plus a slice."""
    global _libc
    import ctypes
    import mmap
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t,
                                  ctypes.c_int]
    pg = mmap.PAGESIZE
    done = 0
    while done < n:
        k = min(_SLICE, n - done)
        ctypes.memmove(dst + done, src + done, k)
        lo = (src + done + pg - 1) // pg * pg
        hi = (src + done + k) // pg * pg
        if hi > lo:
            _libc.madvise(lo, hi - lo, 4)   # MADV_DONTNEED
        done += k


def _rebuild_pointer_tables(pool: Any) -> None:
    """The pool's per-layer views and their address tables (what SGLang's
    GPU copy kernels read as host addresses), rebuilt over the re-homed
    kv_buffer: the MHA pool's k/v_data_refs and k/v_data_ptrs, the MLA
    pool's data_refs and data_ptrs (page_first's, and Ascend's
    page_first_kv_split's, are views with the first two axes swapped). A
    table left over the old buffer would make the engine's copies read
    and write memory the daemon never sees."""
    def swapped(t: Any) -> Any:
        return t.transpose(0, 1) if _is_torch(t) else t.swapaxes(0, 1)

    def table(views: List[Any], old: Any) -> Any:
        if _is_torch(old):
            import torch
            return torch.tensor([v.data_ptr() for v in views],
                                dtype=old.dtype, device=old.device)
        import numpy as np
        return np.array([v.__array_interface__["data"][0] for v in views],
                        dtype=old.dtype)

    first = pool.layout in ("page_first", "page_first_kv_split")
    L = pool.layer_num
    if hasattr(pool, "k_data_ptrs"):
        kt, vt = pool.k_buffer, pool.v_buffer
        if first:
            kt, vt = swapped(kt), swapped(vt)
        pool.k_data_refs = [kt[i] for i in range(L)]
        pool.v_data_refs = [vt[i] for i in range(L)]
        pool.k_data_ptrs = table(pool.k_data_refs, pool.k_data_ptrs)
        pool.v_data_ptrs = table(pool.v_data_refs, pool.v_data_ptrs)
    if getattr(pool, "data_ptrs", None) is not None:
        t = swapped(pool.kv_buffer) if first else pool.kv_buffer
        pool.data_refs = [t[i] for i in range(L)]
        pool.data_ptrs = table(pool.data_refs, pool.data_ptrs)


class KvtierStorage(HiCacheStorage):
    """SGLang HiCache storage backed by the node's kvtier daemon.

    Made by SGLang's StorageBackendFactory as
    KvtierStorage(storage_config, kwargs); the controller then calls
    register_mem_pool_host(pool) once. Thread-safe: SGLang's prefetch and
    backup threads call it concurrently.
    """

    def __init__(self, storage_config: HiCacheStorageConfig,
                 kwargs: Optional[Dict[str, Any]] = None) -> None:
        extra = dict(storage_config.extra_config or {})
        unknown = sorted(k for k in extra
                         if k not in _OWN_KEYS and k not in _SGLANG_KEYS)
        if unknown:
            known = ", ".join(f"{k} ({v})" for k, v in _OWN_KEYS.items())
            raise ValueError(f"kvtier.sglang: unknown extra-config key(s) "
                             f"{unknown}; kvtier's are: {known}")
        if not extra.get("interface_v1"):
            raise ValueError(
                "kvtier.sglang: add \"interface_v1\": 1 to "
                "--hicache-storage-backend-extra-config: kvtier copies pages "
                "straight into the host pool (batch_get_v1 / batch_set_v1); "
                "without it SGLang calls the copying batch_get / batch_set, "
                "which this backend does not implement")
        if getattr(storage_config, "should_split_heads", False):
            raise NotImplementedError(
                "kvtier.sglang: should_split_heads (engines of different TP "
                "sizes sharing pages split by heads, tp_lcm_size) is not "
                "implemented: kvtier keeps each TP rank's pages apart")
        self.config = storage_config
        self.mla = bool(storage_config.is_mla_model)
        self.socket: Optional[str] = extra.get("socket") or os.environ.get(
            "KVT_SOCKET") or "/run/kvtier/kvtierd.sock"
        self.ns = str(extra.get("ns", "default"))
        self.tenant = self._int(extra, "tenant", 0, 0)
        self.timeout_ms = self._int(extra, "timeout_ms", 10000, 1)
        self.io_timeout_s = self._num(extra, "io_timeout_s", 30.0)
        wait_s = self._num(extra, "wait_daemon_s", 5.0)
        self.inflight_wait_s = self._num(extra, "inflight_wait_s", 0.1)
        self.decide = extra.get("decide", True)
        if not isinstance(self.decide, bool):
            raise ValueError(f"kvtier.sglang: \"decide\" must be true or "
                             f"false, not {self.decide!r}")
        self._decide_profile = extra.get("decide_profile", "h100")
        self._decide_rates_s = extra.get("decide_rates_s", 0.5)
        self._decide_model = extra.get("decide_model")
        self._decide_fallbacks = 0
        self._decider: Optional[_decide.Decider] = None
        user_salt = extra.get("salt", "")
        if not isinstance(user_salt, str):
            raise ValueError("kvtier.sglang: \"salt\" must be a string")
        model = storage_config.model_name or ""
        self.salt = (f"sglang|{model}|tp{storage_config.tp_rank}/"
                     f"{storage_config.tp_size}")
        for f in ("pp_rank", "attn_cp_rank"):  # later SGLang versions
            if getattr(storage_config, f, None):
                self.salt += f"|{f}{getattr(storage_config, f)}"
        if user_salt:
            self.salt += "|" + user_salt
        self.client: Optional[Client] = None
        self.mem: Optional[Memory] = None
        self.geometry: Optional[Geometry] = None
        self.mem_pool_host: Any = None
        self._page = 0
        self._nblocks = 0
        self._lock = threading.Lock()
        self._errors = 0   # batch calls that failed whole (never raised)
        self._pin_fallbacks = 0  # a pinned pool re-homed pageable
        self._metrics: Dict[str, list] = {"prefetch_pgs": [], "backup_pgs": [],
                                          "prefetch_bandwidth": [],
                                          "backup_bandwidth": []}
        try:
            Client.wait_daemon(self.socket, timeout=wait_s)
        except (KvtierError, TimeoutError) as e:
            raise ConnectionError(
                f"kvtier.sglang: no kvtier daemon at {self.socket} "
                f"(start `kvtier serve --socket {self.socket} --model "
                f"<config.json> --page-tokens <SGLang's --page-size>`, or "
                f"set \"socket\"): {e}") from e

    @staticmethod
    def _int(extra: Dict[str, Any], key: str, default: int, low: int) -> int:
        v = extra.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"kvtier.sglang: \"{key}\" must be an integer "
                             f">= {low}, not {v!r}")
        return v

    @staticmethod
    def _num(extra: Dict[str, Any], key: str, default: float) -> float:
        v = extra.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise ValueError(f"kvtier.sglang: \"{key}\" must be a number of "
                             f"seconds > 0, not {v!r}")
        return float(v)

    # -- the host pool ----------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Connect to the daemon with the pool's geometry, move the pool's
        buffer into daemon-mapped memory (in slices: the pool's size is
        never held twice) and register that memory with the pool's layout
        (kvtier.layout: every layout of the pinned SGLang but Ascend's
        page_first_kv_split)."""
        pool = mem_pool_host
        if self.mem is not None:
            raise RuntimeError("kvtier.sglang: a host pool is already "
                               "registered with this backend")
        layout = getattr(pool, "layout", None)
        mla = self.mla or hasattr(pool, "kv_lora_rank")
        try:
            roles = _layout.sglang_roles(str(layout), mla)
        except _layout.LayoutError as e:
            raise ValueError(str(e).replace("kvtier:", "kvtier.sglang:")) \
                from None
        if not mla and not hasattr(pool, "head_num"):
            raise NotImplementedError(
                f"kvtier.sglang: {type(pool).__name__}: neither an MHA nor "
                f"an MLA host pool")
        if mla and getattr(pool, "dcp_size", 1) != 1:
            raise NotImplementedError(
                f"kvtier.sglang: the MLA host pool is split over "
                f"{pool.dcp_size} decode-context-parallel ranks (--dcp-size): "
                f"each holds a part of every page, which SGLang's own L3 "
                f"storage paths do not support either (get_data_page asserts "
                f"dcp_size == 1; SGLang {SGLANG_VERSION})")
        buf = pool.kv_buffer
        if buf is None:
            raise NotImplementedError(
                f"kvtier.sglang: {type(pool).__name__} has no buffer (a dummy "
                f"pool: a rank that is not the MLA source holds no KV); "
                f"register the source rank's pool")
        info = _layout.describe(buf)
        if not info.on_host:
            raise NotImplementedError(
                f"kvtier.sglang: the host pool is on {info.device}: only "
                f"host (CPU) pools are supported")
        L, P, N = pool.layer_num, pool.page_size, pool.size
        if mla:
            # the latent row: kv_lora_rank + qk_rope_head_dim, or SGLang's
            # override_kv_cache_dim (e.g. FP8 DSA's packed row)
            H, kv = 1, 1
            D = int(getattr(pool, "kv_cache_dim", 0) or
                    pool.kv_lora_rank + pool.qk_rope_head_dim)
        else:
            H, D, kv = pool.head_num, pool.head_dim, 2
        isz = info.itemsize
        if N != pool.page_num * P:
            raise ValueError(f"kvtier.sglang: host pool of {N} token slots, "
                             f"not {pool.page_num} pages of {P}")
        try:
            lay = _layout.derive([info], roles, P, H, D, kv, layers=L)
        except _layout.LayoutError as e:
            raise ValueError(f"kvtier.sglang: host pool buffer {info.shape}: "
                             f"{e}") from None
        if mla:
            # every TP rank holds the whole latent: the ranks share pages
            # (SGLang backs them up from rank 0 only)
            cfg = {"architectures": ["DeepseekV2ForCausalLM"],
                   "model_type": "deepseek_v2", "num_hidden_layers": L,
                   "num_attention_heads": 1, "num_key_value_heads": 1,
                   "hidden_size": D,
                   "kv_lora_rank": D - pool.qk_rope_head_dim,
                   "qk_rope_head_dim": pool.qk_rope_head_dim,
                   "torch_dtype": _dtype_name(info.dtype, isz)}
            rank = 0
        else:
            cfg = {"architectures": ["LlamaForCausalLM"],
                   "model_type": "llama", "num_hidden_layers": L,
                   "num_attention_heads": H * self.config.tp_size,
                   "num_key_value_heads": H * self.config.tp_size,
                   "head_dim": D, "hidden_size": H * self.config.tp_size * D,
                   "torch_dtype": _dtype_name(info.dtype, isz)}
            rank = self.config.tp_rank
        self.geometry = Geometry.from_config(
            cfg, page_tokens=P, tp_size=self.config.tp_size, tp_rank=rank,
            name=self.config.model_name or "sglang")
        try:
            self.client = Client(self.geometry, socket=self.socket, ns=self.ns,
                                 tenant=self.tenant,
                                 timeout_ms=self.timeout_ms)
        except KvtierError as e:
            if e.code != _client.KVT_EGEOM:
                raise ConnectionError(f"kvtier.sglang: connect to the daemon "
                                      f"at {self.socket}: {e}") from e
            raise ValueError(f"kvtier.sglang: the daemon at {self.socket} "
                             f"refused this engine (SGLang's --page-size, "
                             f"model and TP size must be the daemon's "
                             f"--page-tokens, --model and --tp): {e}") from e
        if self.decide:
            self._open_decider()
        nbytes = buf.nbytes if not _is_torch(buf) else \
            buf.numel() * buf.element_size()
        try:
            self.mem = self.client.alloc_memfd(
                nbytes, lay.offsets(info.addr), lay.nblocks, lay.block_stride,
                lay.kv_stride, lay.token_stride, head_stride=lay.head_stride)
        except BaseException:
            self.close()
            raise
        self._page, self._nblocks = P, pool.page_num
        self._rehome(pool, info, nbytes)
        if layout in ("layer_first", "page_first", "page_first_direct"):
            self._check_meta(pool, lay, mla)
        self.mem_pool_host = pool
        logger.info("kvtier.sglang: host pool (%s%s, %d pages of %d tokens, "
                    "%d bytes) registered with kvtierd at %s", layout,
                    " MLA" if mla else "", pool.page_num, P, nbytes,
                    self.socket)

    def _rehome(self, pool: Any, info: "_layout.Tensor", nbytes: int) -> None:
        """Point pool.kv_buffer at the registered memory (same shape,
        dtype, strides), moving its bytes over in slices of _SLICE and
        handing each slice of the old buffer back to the kernel right after
        (madvise DONTNEED): at no time are both copies resident. A pinned
        torch pool is unpinned first and the new buffer pinned again
        (cudaHostRegister), and the pool's per-layer pointer tables are
        rebuilt. A pool that cannot be pinned again works pageable (its
        copies synchronous, slower): logged at warning level and counted
        (pin_fallbacks in daemon_stats()["backend"])."""
        mem = self.mem
        assert mem is not None and mem.buffer is not None
        old = pool.kv_buffer
        new_addr = mem.layer_addrs[0] - mem.layer_offset(0)
        rt = None
        if _is_torch(old) and getattr(pool, "pin_memory", False):
            import torch
            if torch.cuda.is_available():
                rt = torch.cuda.cudart()
                rt.cudaHostUnregister(old.data_ptr())
        _move(info.addr, new_addr, nbytes)
        if _is_torch(old):
            import torch
            flat = torch.frombuffer(mem.buffer, dtype=old.dtype,
                                    count=old.numel())
            new = flat.as_strided(tuple(old.shape), tuple(old.stride()))
            if rt is not None:
                why = cuda_host_register(new.data_ptr(), nbytes)
                if why:
                    self._pin_fallbacks += 1
                    logger.warning(
                        "kvtier.sglang: the host pool was pinned, and its "
                        "registered memory (%d bytes) could not be (%s): "
                        "it is pageable now, its copies to and from the "
                        "GPU synchronous and slower", nbytes, why)
            pool.kv_buffer = new
        else:
            import numpy as np
            pool.kv_buffer = np.ndarray(old.shape, dtype=old.dtype,
                                        buffer=mem.buffer,
                                        strides=old.strides)
        _rebuild_pointer_tables(pool)

    def _check_meta(self, pool: Any, lay: "_layout.Layout", mla: bool
                    ) -> None:
        """The pool's own zero-copy pointers must be the registered layout's
        (else this SGLang's pool is not the one this backend was written
        for): per page, layer_first gives a pointer per layer (MHA: a K, V
        pair) of one page's rows of that layer, the page-first layouts one
        pointer (MHA: a pair) of the page's all layers."""
        if not hasattr(pool, "get_page_buffer_meta"):
            return      # an older pool without zero-copy metadata
        assert self.mem is not None
        base = self.mem.layer_addrs[0]
        P, L = self._page, pool.layer_num
        row = lay.token_stride if pool.layout == "layer_first" else None
        pages = [0, self._nblocks - 1]
        idx = _Indices(t for b in pages for t in range(b * P, b * P + P))
        ptrs, sizes = pool.get_page_buffer_meta(idx)
        want: List[int] = []
        for b in pages:
            if pool.layout == "layer_first":
                for l in range(L):
                    k = self.mem.layer_addrs[l] + b * lay.block_stride
                    want += [k] if mla else [k, k + lay.kv_stride]
                size = P * row
            else:
                k = base + b * lay.block_stride
                want += [k] if mla else [k, k + lay.kv_stride]
                size = lay.block_stride
        if list(ptrs) != want or any(s != size for s in sizes):
            raise RuntimeError(
                f"kvtier.sglang: the host pool's page pointers "
                f"(get_page_buffer_meta) do not match the {pool.layout} layout "
                f"this backend registered (written for SGLang "
                f"{SGLANG_VERSION}); refusing to copy pages")

    def close(self) -> None:
        """Disconnect (the daemon unmaps the pool; the pool's buffer stays
        valid in this process)."""
        cl, self.client = self.client, None
        self.mem = None
        if cl is not None:
            cl.close()

    # -- keys ---------------------------------------------------------------------

    def kvtier_keys(self, keys: Sequence[str]) -> List[bytes]:
        """The kvtier keys of SGLang page keys (see the module's doc)."""
        return keys_from_hashes(keys, self.salt)

    def _blocks(self, keys: Sequence[str], host_indices: Any) -> List[int]:
        if self.mem is None:
            raise RuntimeError("kvtier.sglang: no host pool registered "
                               "(register_mem_pool_host)")
        idx = _index_list(host_indices)
        P = self._page
        if len(idx) != len(keys) * P:
            raise ValueError(f"kvtier.sglang: {len(idx)} host slots for "
                             f"{len(keys)} pages of {P} tokens")
        blocks = []
        for i in range(len(keys)):
            first = idx[i * P]
            if first % P or idx[i * P:(i + 1) * P] != list(range(first,
                                                                  first + P)):
                raise ValueError(f"kvtier.sglang: host slots of page {i} are "
                                 f"not one aligned page ({idx[i * P:(i + 1) * P]})")
            blocks.append(first // P)
        return blocks

    # -- zero-copy I/O ----------------------------------------------------------------

    def _decide_geometry(self, P: int) -> Optional[Geometry]:
        """The model's geometry with its compute figures (the pool tells
        only the KV's): "decide_model", else SGLang's model name as a
        model directory. None (a counted, logged fallback) when neither
        names a config.json or a preset and none was set explicitly."""
        src = self._decide_model or self.config.model_name or ""
        c = self.config
        path = src if src.endswith(".json") else os.path.join(src,
                                                               "config.json")
        try:
            if src and os.path.isfile(path):
                return Geometry.from_config(path, page_tokens=P,
                                            tp_size=c.tp_size,
                                            tp_rank=c.tp_rank)
            return Geometry.from_preset(src, page_tokens=P,
                                        tp_size=c.tp_size, tp_rank=c.tp_rank)
        except (KvtierError, OSError, ValueError) as e:
            if self._decide_model:
                raise ValueError(f"kvtier.sglang: decide_model "
                                 f"{self._decide_model!r}: {e}") from None
        self._decide_fallbacks += 1
        logger.warning("kvtier.sglang: no config.json for model %r (set "
                       "\"decide_model\"): the decision is OFF, "
                       "batch_exists answers every cached page", src)
        return None

    def _open_decider(self) -> None:
        """kvtier.decide over the model's geometry."""
        try:
            g = self._decide_geometry(self.geometry.page_tokens)
            if g is not None:
                self._decider = _decide.Decider(
                    g, profile=self._decide_profile,
                    rates_every_s=self._decide_rates_s, what="kvtier.sglang")
        except (KvtierError, ValueError) as e:
            self.close()
            raise ValueError(f"{e} (set \"decide\": false to answer every "
                             f"cached page)") from None

    def batch_exists(self, keys: List[str],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None
                     ) -> int:
        """The number of leading @keys worth prefetching: of the leading
        run the daemon can load now, only the pages whose load lands
        before the prefill would have computed them (kvtier.decide; the
        controller prefetches that many and the scheduler computes the
        rest, as after a miss); with "decide": false, all of it. Pages
        being stored right after the run are waited for here (the prefetch
        thread, at most inflight_wait_s) when that is cheaper than
        computing them."""
        if self.client is None:
            return 0
        try:
            ks = self.kvtier_keys(keys)
            if self._decider is None:
                return self.client.lookup(ks, each=True).pages
            return self._decided(ks, extra_info)
        except Exception as e:  # never into SGLang's prefetch thread
            self._errors += 1
            logger.warning("kvtier.sglang: lookup of %d pages failed: %s",
                           len(keys), e)
            return 0

    def _decided(self, keys: List[bytes],
                 extra_info: Optional[HiCacheStorageExtraInfo]) -> int:
        """batch_exists by kvtier's scheduler decision. The request's
        context before @keys is the prefix keys SGLang passed (with
        hicache_storage_pass_prefix_keys; else taken as none) and its new
        tokens after them are not told to a storage backend: one page
        is assumed (MODELED, like the prefill itself)."""
        P = self._page
        prefix = getattr(extra_info, "prefix_keys", None) or ()
        deadline = time.monotonic() + self.inflight_wait_s
        while True:
            r = self.client.lookup(keys, each=True, runs=True)
            d = self._decider.decide(
                self.client, r, start=0, before=len(prefix),
                prompt=(len(prefix) + len(keys) + 1) * P,
                rid=f"{len(keys)} keys")
            wait = d.wait and time.monotonic() < deadline
            self._decider.count(d, wait)
            if not wait:
                return d.load
            time.sleep(min(0.005, max(0.0, deadline - time.monotonic())))

    def exists(self, key: str) -> bool:
        """Whether the daemon holds page @key (no decision: a question of
        presence, not of what to prefetch)."""
        if self.client is None:
            return False
        try:
            return self.client.lookup(self.kvtier_keys([key]),
                                      each=True).pages == 1
        except Exception as e:
            self._errors += 1
            logger.warning("kvtier.sglang: lookup of 1 page failed: %s", e)
            return False

    def _run(self, what: str, keys: List[str], host_indices: Any) -> List[bool]:
        """The batch, never raising: SGLang calls batch_get_v1 /
        batch_set_v1 from its prefetch-I/O and backup threads, which catch
        nothing and are never restarted — an exception would end L3 for
        the process. Anything that goes wrong is every page False, logged
        and counted (errors in daemon_stats()["backend"])."""
        try:
            return self._run_batch(what, keys, host_indices)
        except Exception as e:
            self._errors += 1
            logger.error("kvtier.sglang: %s of %d pages failed: %s", what,
                         len(keys), e)
            return [False] * len(keys)

    def _run_batch(self, what: str, keys: List[str], host_indices: Any
                   ) -> List[bool]:
        """One daemon job for the batch: every page a one-page prefix
        (KVT_CACHE_IO_EACH); a page that fails, fails alone."""
        blocks = self._blocks(keys, host_indices)
        cl, mem = self.client, self.mem
        assert cl is not None and mem is not None
        if not keys:
            return []
        fn = cl.load if what == "load" else cl.store
        ok = [False] * len(keys)
        t0 = time.monotonic()
        try:
            with fn(mem, self.kvtier_keys(keys), blocks, each=True) as job:
                try:
                    failed = set(job.wait(timeout=self.io_timeout_s))
                except TimeoutError:
                    job.cancel()
                    failed = set(job.wait())
                    logger.warning("kvtier.sglang: %s of %d pages not done "
                                   "in %.1f s", what, len(keys),
                                   self.io_timeout_s)
                ok = [b not in failed for b in blocks]
        except KvtierError as e:  # refused, or the daemon went away
            logger.error("kvtier.sglang: %s of %d pages failed: %s", what,
                         len(keys), e)
        dt = time.monotonic() - t0
        done = sum(ok)
        if done:
            gbps = done * self.geometry.page_bytes / max(dt, 1e-9) / 1e9
            side = "prefetch" if what == "load" else "backup"
            with self._lock:
                self._metrics[side + "_pgs"].append(done)
                self._metrics[side + "_bandwidth"].append(gbps)
        return ok

    def batch_get_v1(self, keys: List[str], host_indices: Any,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None
                     ) -> List[bool]:
        """Load the pages of @keys into the host pool's pages at
        @host_indices (page_size token slots per key). One bool per key:
        False for a page absent, corrupt or late (nothing usable in it)."""
        return self._run("load", keys, host_indices)

    def batch_set_v1(self, keys: List[str], host_indices: Any,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None
                     ) -> List[bool]:
        """Store the host pool's pages at @host_indices under @keys. One
        bool per key; a page the daemon already has counts as stored."""
        return self._run("store", keys, host_indices)

    # -- the copying interface: not implemented ----------------------------------------

    def _no_copy(self, name: str) -> NotImplementedError:
        return NotImplementedError(
            f"kvtier.sglang: {name}() (SGLang's copying interface) is not "
            f"implemented: kvtier moves pages straight between the daemon and "
            f"the registered host pool; set \"interface_v1\": 1 so SGLang "
            f"calls batch_get_v1 / batch_set_v1")

    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> Any:
        raise self._no_copy("get")

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> Any:
        raise self._no_copy("batch_get")

    def set(self, key: str, value: Optional[Any] = None,
            target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        raise self._no_copy("set")

    def batch_set(self, keys: List[str], values: Optional[Any] = None,
                  target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        raise self._no_copy("batch_set")

    # -- the rest of the interface ----------------------------------------------------

    def clear(self) -> None:
        """Not supported: the daemon's cache is shared by every engine of the
        node (SGLang logs this error and reports the clear as failed)."""
        raise NotImplementedError(
            "kvtier.sglang: clear() is not supported: the kvtier daemon's "
            "cache is shared by every engine on the node; restart the daemon "
            "(without persistence) to drop it")

    def get_stats(self) -> Any:
        """SGLang's StorageMetrics since the last call (pages and GB/s per
        batch_get_v1 / batch_set_v1), when SGLang enabled storage metrics;
        else None."""
        with self._lock:
            m = self._metrics
            self._metrics = {k: [] for k in m}
        if not getattr(self.config, "enable_storage_metrics", True):
            return None
        from sglang.srt.metrics.collector import StorageMetrics
        return StorageMetrics(prefetch_pgs=m["prefetch_pgs"],
                              backup_pgs=m["backup_pgs"],
                              prefetch_bandwidth=m["prefetch_bandwidth"],
                              backup_bandwidth=m["backup_bandwidth"])

    def daemon_stats(self) -> Dict[str, Any]:
        """The daemon's metrics (docs/METRICS.md)."""
        if self.client is None:
            raise RuntimeError("kvtier.sglang: not connected")
        out = self.client.stats()
        out["backend"] = {"errors": self._errors,
                          "pin_fallbacks": self._pin_fallbacks,
                          "decide_fallbacks": self._decide_fallbacks,
                          "decide": dict(self._decider.stats)
                          if self._decider else None}
        return out
