"""The kvtier client: an engine process talking to the node daemon.

The same calls as the C client (include/kvtier/client.h), as Python
objects: a Client per process (or per TP rank), Memory the daemon has
mapped (page data never crosses the socket), and asynchronous Jobs that
copy pages between the daemon's tiers and that memory, layer by layer.

    geo = kvtier.Geometry.from_preset("llama-3.1-8b", page_tokens=16)
    with kvtier.Client(geo, socket="/run/kvtier/kvtierd.sock") as cl:
        mem = cl.alloc(nblocks=1024)            # shared, vLLM layout
        keys = cl.hash_tokens(prompt_ids)       # one key per full page
        hit = cl.lookup(keys).pages             # leading pages cached
        with cl.load(mem, keys[:hit], blocks=list(range(hit))) as job:
            for layer in range(geo.layers):
                job.wait_layer(layer)           # no round trip
                ...                             # this layer's compute
            failed = job.wait()                 # blocks to recompute

Buffers are raw addresses and sizes, so numpy arrays, torch tensors or
ctypes arrays all work without this package depending on any of them.

Errors raise KvtierError with the C library's code and detail text; a
daemon that went away raises ConnectionLost, and a request the daemon did
not answer in time raises RequestTimeout (a ConnectionLost and a
TimeoutError: the connection is dropped, connect again). Pages that could
not be loaded are not errors: they are the job's failed blocks, for the
engine to recompute.

Threads: every object may be used from any thread. Client.close() may
race a Job.wait() (or anything else) in another thread: the wait returns
(every block failed) and the handles are freed only once no call is
inside the library.

Files: this one holds Geometry, the lookup and rate results and Client;
the handles it hands out (Memory, ClientEvent, Job, JobStat) are in
kvtier/handles.py, the errors and the call checks in kvtier/_base.py;
every name is importable from here as before.
"""
from __future__ import annotations

import array
import ctypes
import fcntl
import json
import mmap
import os
import contextlib
import threading
import weakref
from ctypes import byref, c_uint32, c_uint64, c_void_p
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Optional, Sequence, Tuple, Union

from . import _lib
from . import keys as _keys
# the errors and the handles live in _base.py and handles.py; imported here
# (all of it, the private helpers too) so kvtier.client keeps every name
from ._base import (_BLOCK_FAILURES, _GONE, _KVT_CODES, KVT_EBUSY,  # noqa: F401
                    KVT_ECONFIG, KVT_ECORRUPT, KVT_EFULL, KVT_EGEOM,
                    KVT_ENODEV, KVT_ENOTBUILT, KVT_ENOTFOUND, KVT_EPRESET,
                    KVT_EPROTO, KVT_ESPEC, ConnectionLost, KvtierError,
                    RequestTimeout, _check, _Closable, _code_name, _raise,
                    _timeout_ns)
from ._lib import KVT_TIER_COUNT, TIER_NAMES, lib
from .handles import ClientEvent, Job, JobStat, Memory  # noqa: F401

# kvt_cache_lookup() flags (include/kvtier/cache.h)
_LOOKUP_TOUCH, _LOOKUP_EACH = 1 << 0, 1 << 1
# kvt_cache_io.flags
_IO_EACH = 1 << 0


def _u32_array(values: Sequence[int], what: str) -> "ctypes.Array[c_uint32]":
    """@values as a C uint32 array: converted in C (array.array), one
    buffer shared with ctypes; an out-of-range value is named."""
    n = len(values)
    try:
        a = array.array("I", values)
    except (OverflowError, TypeError):
        a = None
    if a is None or a.itemsize != 4:
        arr = (c_uint32 * n)()
        for i, v in enumerate(values):
            v = int(v)
            if not 0 <= v < (1 << 32):
                raise ValueError(f"kvtier: {what}[{i}] = {v} is out of "
                                 f"range")
            arr[i] = v
        return arr
    if not n:
        return (c_uint32 * 1)()
    return (c_uint32 * n).from_buffer(a)


def shared_memfd(size: int, name: str = "kvtier-kv"
                 ) -> "tuple[int, mmap.mmap]":
    """@size bytes of zeroed memory the daemon can map: a memfd sealed
    against shrinking and growing (the daemon checks), mapped shared here.
    Returns (fd, mapping); the caller owns both (register_fd() it, then
    close the fd when no more registrations need it)."""
    if size <= 0:
        raise ValueError(f"kvtier: shared memory of {size} bytes")
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK |
                    fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED,
                       mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.close(fd)
        raise
    return fd, mm


def version() -> str:
    """The C library's version string."""
    return lib.kvt_version().decode()


class Geometry:
    """A model's KV geometry on one TP rank (struct kvt_geom).

    page_tokens (P) must be the engine's block size; layers, kv_heads (H on
    this rank), head_dim (D) and dtype_bytes (s) give the KV shape: one
    page holds layers x 2 (K, V) chunks of P x H x D x s bytes.
    """

    def __init__(self, geom: _lib.Geom) -> None:
        self._g = geom

    @classmethod
    def from_preset(cls, name: str, page_tokens: int, tp_size: int = 1,
                    tp_rank: int = 0) -> "Geometry":
        """A known model ("llama-3.1-8b", ...; `kvtier info --models`)."""
        g = _lib.Geom()
        _check(lib.kvt_geom_preset(byref(g), name.encode(), page_tokens,
                                   tp_size, tp_rank), f"model preset {name!r}")
        return cls(g)

    @classmethod
    def from_config(cls, config: Union[str, os.PathLike, Dict[str, Any]],
                    page_tokens: int, tp_size: int = 1, tp_rank: int = 0,
                    name: str = "") -> "Geometry":
        """From a Hugging Face config.json: a path, its text, or a dict."""
        if isinstance(config, dict):
            text, label = json.dumps(config), name or "config"
        elif isinstance(config, os.PathLike) or (
                isinstance(config, str) and not config.lstrip().startswith("{")):
            with open(config, encoding="utf-8") as f:
                text = f.read()
            label = name or os.path.basename(os.path.dirname(
                os.path.abspath(config))) or "config"
        else:
            text, label = str(config), name or "config"
        g = _lib.Geom()
        _check(lib.kvt_geom_from_json(byref(g), text.encode(), label.encode(),
                                      page_tokens, tp_size, tp_rank),
               f"model config {label!r}")
        return cls(g)

    name = property(lambda s: s._g.name.decode())
    layers = property(lambda s: s._g.layers)
    kv_heads = property(lambda s: s._g.kv_heads)
    kv_heads_total = property(lambda s: s._g.kv_heads_total)
    head_dim = property(lambda s: s._g.head_dim)
    dtype_bytes = property(lambda s: s._g.dtype_bytes)
    page_tokens = property(lambda s: s._g.page_tokens)
    tp_size = property(lambda s: s._g.tp_size)
    tp_rank = property(lambda s: s._g.tp_rank)
    mla = property(lambda s: bool(s._g.mla))

    @property
    def kv(self) -> int:
        """2 (K and V), or 1 for MLA's single latent."""
        return 1 if self._g.mla else 2

    @property
    def chunk_bytes(self) -> int:
        """One page's K (or V) of one layer: P x H x D x s bytes."""
        g = self._g
        return g.page_tokens * g.kv_heads * g.head_dim * g.dtype_bytes

    @property
    def page_bytes(self) -> int:
        """One page: every layer, K and V."""
        return self.chunk_bytes * self.kv * self._g.layers

    def __repr__(self) -> str:
        g = self._g
        return (f"Geometry({self.name!r}, L={g.layers}, H={g.kv_heads}, "
                f"D={g.head_dim}, s={g.dtype_bytes}, P={g.page_tokens}, "
                f"tp={g.tp_rank}/{g.tp_size})")


@dataclass(frozen=True)
class LookupResult:
    """What a lookup found, in pages from page 0.

    pages:      leading pages a load can supply now;
    tier_pages: of which, by the tier of their fastest copy;
    inflight:   pages right after them still being stored or moved (ask
                again soon rather than recompute them); the daemon does
                not know when they land;
    runs:       with lookup(runs=True): the pages as (tier, pages) runs in
                prefix order (at most 8, adding up to pages), else ().
    """
    pages: int
    tier_pages: Dict[str, int]
    inflight: int
    runs: Tuple[Tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Rate:
    """The daemon's transfer engine's recent measured rate between two
    tier kinds (kvt_xfer_rate: decayed over ~2 s, queueing excluded);
    gbps 0 until something was measured."""
    gbps: float
    jobs: int
    total_bytes: float


class Client(_Closable):
    """One connection to the daemon (kvtierd / `kvtier serve`).

    geometry:   this process's Geometry; the daemon refuses another
                namespace's (KvtierError KVT_EGEOM);
    socket:     the daemon's socket (default $KVT_SOCKET, else
                /run/kvtier/kvtierd.sock);
    ns:         the model namespace the daemon serves ("default");
    tenant:     the tenant to act as (0); checked against the process's
                uid/gid by the daemon;
    timeout_ms: per request.

    Thread-safe: requests are serialized on the socket, waits are not.
    Use one Client per process, or one per TP rank.
    """

    def __init__(self, geometry: Geometry, *, socket: Optional[str] = None,
                 ns: str = "default", tenant: int = 0,
                 timeout_ms: int = 10000) -> None:
        self._h: Optional[int] = None
        self._lock = threading.Lock()
        # calls inside the library on this client's handles: close() frees
        # them only once none is (a wait in another thread, say)
        self._busy = 0
        self._idle = threading.Condition(self._lock)
        # memory lives until freed or the client closes (arrays may view
        # it); a job no one references any more is freed by the collector
        self._mems: "set[Memory]" = set()
        self._jobs: "weakref.WeakSet[Job]" = weakref.WeakSet()
        cfg = _lib.ClientConfig()
        cfg.size = ctypes.sizeof(_lib.ClientConfig)
        cfg.tenant = tenant
        self._socket = socket.encode() if socket else None
        self._ns = ns.encode()
        cfg.socket = self._socket
        cfg.ns = self._ns
        cfg.geom = ctypes.pointer(geometry._g)
        cfg.page_tokens = geometry.page_tokens
        cfg.tp_size = geometry.tp_size
        cfg.tp_rank = geometry.tp_rank
        cfg.timeout_ms = timeout_ms
        h = c_void_p()
        _check(lib.kvt_client_connect(byref(h), byref(cfg)),
               f"connect to kvtierd at {socket or os.environ.get('KVT_SOCKET') or '/run/kvtier/kvtierd.sock'}")
        self._h = h.value
        self.geometry = Geometry(_lib.Geom.from_buffer_copy(
            lib.kvt_client_geom(self._h).contents))

    @staticmethod
    def wait_daemon(socket: Optional[str] = None,
                    timeout: float = 10.0) -> None:
        """Wait until a daemon accepts connections at @socket."""
        _check(lib.kvt_client_wait_daemon(socket.encode() if socket else None,
                                          int(timeout * 1000)),
               f"wait for kvtierd at {socket}")

    def _handle(self) -> int:
        if self._h is None:
            raise ValueError("kvtier: the client is closed")
        return self._h

    @contextlib.contextmanager
    def _using(self) -> Iterator[Optional[int]]:
        """The C handle, held open for one call: None once the client is
        closed (or closing). close() waits for every holder to leave."""
        with self._lock:
            h = self._h
            if h is not None:
                self._busy += 1
        try:
            yield h
        finally:
            if h is not None:
                with self._lock:
                    self._busy -= 1
                    if not self._busy:
                        self._idle.notify_all()

    def _call(self, fn: Any, *args: Any) -> int:
        """fn(handle, *args) while the client is open, else a closed
        error."""
        with self._using() as h:
            if h is None:
                raise ValueError("kvtier: the client is closed")
            return fn(h, *args)

    def close(self) -> None:
        """Disconnect: the daemon cancels this client's jobs and unmaps its
        memory (returns once it has). Memory and Job objects of the client
        become unusable; a Job.wait() in another thread returns (every
        block failed). Safe to call from any thread, more than once."""
        with self._lock:
            h, self._h = self._h, None
            children = list(self._mems) + list(self._jobs)
            self._mems, self._jobs = set(), weakref.WeakSet()
        if h is None:
            return
        # waits in other threads return; new calls see the client closed
        lib.kvt_client_shutdown(h)
        with self._lock:
            while self._busy:
                self._idle.wait()
        for c in children:
            c._orphan()
        lib.kvt_client_close(h)

    @property
    def job_stop_s(self) -> float:
        """Seconds within which a live daemon ends any job of this client
        once it is cancelled: its lease plus the request timeout (waits
        longer than that mean a hung daemon)."""
        lease = self._call(lib.kvt_client_lease_ms)
        return (lease + self._call(lib.kvt_client_timeout_ms)) / 1000.0

    def fileno(self) -> int:
        """An eventfd the daemon signals when a job of this client is done
        (for select/poll/asyncio): when readable, read 8 bytes from it and
        poll the jobs you wait for."""
        return self._call(lib.kvt_client_fd)

    # -- keys and lookup ----------------------------------------------------

    def hash_tokens(self, tokens: Sequence[int]) -> "_keys.Keys":
        """The chained page keys of @tokens for this client's tenant: one
        per full page (a partial last page has none), as kvtier.Keys (a
        sequence of 16-byte keys in one buffer, which lookup(), load()
        and store() pass to C as it is)."""
        n = len(tokens)
        npages = n // self.geometry.page_tokens
        arr = _u32_array(tokens, "tokens")
        out = (_lib.PageKey * max(npages, 1))()
        _check(self._call(lib.kvt_client_hash_tokens, arr, n, out),
               "hash tokens")
        return _keys.from_c(out, npages)

    def lookup(self, keys: Sequence[bytes], touch: bool = True,
               each: bool = False, runs: bool = False) -> LookupResult:
        """How many leading pages of the prefix @keys the cache can supply
        (touch: count it as a hit for recency). each: every key is a
        one-page prefix of its own (pages stored one per call, as SGLang's
        self-chained page hashes are): the leading run of keys that are
        each cached, in one request. runs: where those pages are, as tier
        runs in prefix order (LookupResult.runs; a daemon too old for it
        raises KVT_EPROTO)."""
        r = _lib.LookupResult()
        if not keys:
            return LookupResult(0, {t: 0 for t in TIER_NAMES}, 0)
        ck = _keys.to_c(keys)
        flags = (_LOOKUP_TOUCH if touch else 0) | (_LOOKUP_EACH if each
                                                   else 0)
        out: Tuple[Tuple[str, int], ...] = ()
        if runs:
            cr = (_lib.CacheRun * _lib.KVT_CACHE_MAX_RUNS)()
            n = ctypes.c_size_t()
            _check(self._call(lib.kvt_client_lookup_runs, ck, len(keys),
                              flags, byref(r), cr, len(cr), byref(n)),
                   "lookup")
            if n.value > len(cr) or any(
                    cr[i].tier >= len(TIER_NAMES) for i in range(n.value)):
                raise KvtierError(KVT_EPROTO, "lookup",
                                  "the daemon answered bad tier runs")
            out = tuple((TIER_NAMES[cr[i].tier], int(cr[i].pages))
                        for i in range(n.value))
        else:
            _check(self._call(lib.kvt_client_lookup, ck, len(keys), flags,
                              byref(r)), "lookup")
        return LookupResult(r.pages, dict(zip(TIER_NAMES, r.tier_pages)),
                            r.inflight, out)

    # -- memory ---------------------------------------------------------------

    def alloc(self, nblocks: int) -> "Memory":
        """@nblocks engine blocks of zeroed host memory shared with the
        daemon, in vLLM's layout: per layer, the K chunks of every block,
        then the V chunks (kvt_client_mem_alloc)."""
        g = self.geometry
        base = (c_void_p * g.layers)()
        bs, ks, ts, m = c_uint64(), c_uint64(), c_uint64(), c_void_p()
        _check(self._call(lib.kvt_client_mem_alloc, nblocks, base,
                          byref(bs), byref(ks), byref(ts), byref(m)),
               f"alloc {nblocks} blocks")
        addrs = [int(base[i]) for i in range(g.layers)]
        span = (addrs[1] - addrs[0]) if g.layers > 1 else \
            ks.value + nblocks * bs.value
        buf = (ctypes.c_char * (span * g.layers)).from_address(addrs[0])
        mem = Memory(self, m.value, nblocks, bs.value, ks.value, ts.value,
                     addrs, memoryview(buf).cast("B"), None)
        self._adopt(mem)
        return mem

    def alloc_memfd(self, size: int, layer_offsets: Sequence[int],
                    nblocks: int, block_stride: int, kv_stride: int,
                    token_stride: int, head_stride: Optional[int] = None
                    ) -> "Memory":
        """@size bytes of zeroed host memory in a layout of the caller's:
        a memfd sealed against shrinking, mapped here and registered with
        the daemon. Layer l's block 0 (K) is at byte layer_offsets[l];
        strides as in register_fd(). For engines whose KV layout is not
        vLLM's (SGLang's host pool layouts)."""
        fd, mm = shared_memfd(size)
        try:
            mem = self.register_fd(fd, layer_offsets, nblocks, block_stride,
                                   kv_stride, token_stride, _map=mm,
                                   head_stride=head_stride)
        except BaseException:
            mm.close()
            raise
        finally:
            os.close(fd)
        return mem

    def register_fd(self, fd: int, layer_offsets: Sequence[int], nblocks: int,
                    block_stride: int, kv_stride: int, token_stride: int,
                    device: int = -1, *, head_stride: Optional[int] = None,
                    _map: Optional[mmap.mmap] = None) -> "Memory":
        """Register a memfd @fd (sealed F_SEAL_SHRINK) the caller laid out:
        layer l's block 0 (K) starts at byte layer_offsets[l]; a block's
        chunk at + block*block_stride + kv*kv_stride, token t, head h at
        + t*token_stride + h*head_stride (default D*s: a token's heads
        packed; other strides keep a chunk in rows, kvt_cache_attach_rows()
        — heads before tokens, layers between tokens). The fd stays the
        caller's. @device must be -1 (host memory)."""
        g = self.geometry
        if len(layer_offsets) != g.layers:
            raise ValueError(f"kvtier: {len(layer_offsets)} layer offsets "
                             f"for a model of {g.layers} layers")
        offs = (c_uint64 * g.layers)(*[int(o) for o in layer_offsets])
        m = c_void_p()
        if head_stride is None:
            head_stride = g.head_dim * g.dtype_bytes
        _check(self._call(lib.kvt_client_register_fd_rows, fd, offs,
                          g.layers, nblocks, block_stride, kv_stride,
                          token_stride, head_stride, device, byref(m)),
               "register memory")
        view = memoryview(_map) if _map is not None else None
        addrs = [0] * g.layers
        if _map is not None:
            base = ctypes.addressof(ctypes.c_char.from_buffer(_map))
            addrs = [base + int(o) for o in layer_offsets]
        mem = Memory(self, m.value, nblocks, block_stride, kv_stride,
                     token_stride, addrs, view, _map)
        mem.head_stride = head_stride
        self._adopt(mem)
        return mem

    # -- device memory --------------------------------------------------------

    def register_device(self, device: Any, layer_ptrs: Sequence[int],
                        nblocks: int, block_stride: int, kv_stride: int,
                        token_stride: int) -> "Memory":
        """Register engine KV in device memory of this process: per layer
        the device address of block 0's K chunk (strides as in
        register_fd()). @device is a kvtier.Device; the allocations holding
        the layers are found and sent by handle (kvt_client_register_ptrs),
        and the daemon moves pages between its page-locked tiers and them
        on the device, verified there."""
        g = self.geometry
        if len(layer_ptrs) != g.layers:
            raise ValueError(f"kvtier: {len(layer_ptrs)} layer addresses "
                             f"for a model of {g.layers} layers")
        base = (c_void_p * g.layers)(*[int(p) for p in layer_ptrs])
        m = c_void_p()
        _check(lib.kvt_client_register_ptrs(self._handle(), device._handle(),
                                            base, g.layers, nblocks,
                                            block_stride, kv_stride,
                                            token_stride, byref(m)),
               "register device memory")
        mem = Memory(self, m.value, nblocks, block_stride, kv_stride,
                     token_stride, [int(p) for p in layer_ptrs], None, None,
                     device=device.id)
        self._adopt(mem)
        return mem

    def register_handles(self, device: int, uuid: Optional[bytes],
                         segs: Sequence[Tuple[int, int, int, bytes]],
                         layer_seg: Sequence[int],
                         layer_off: Sequence[int], nblocks: int,
                         block_stride: int, kv_stride: int,
                         token_stride: int) -> "Memory":
        """Register engine KV by handles another library made: @segs are
        (kind, fd, bytes, handle) per allocation (kinds _lib.SEG_*), layer
        l at layer_off[l] of allocation layer_seg[l]
        (kvt_client_register_dev)."""
        g = self.geometry
        cs = (_lib.ClientSeg * max(len(segs), 1))()
        for i, (kind, fd, nbytes, handle) in enumerate(segs):
            cs[i].kind, cs[i].fd, cs[i].bytes = kind, fd, nbytes
            hb = bytes(handle or b"")[:64]
            ctypes.memmove(cs[i].handle, hb, len(hb))
        ls = (c_uint32 * g.layers)(*[int(x) for x in layer_seg])
        lo = (c_uint64 * g.layers)(*[int(x) for x in layer_off])
        u = (ctypes.c_uint8 * 16).from_buffer_copy(uuid) if uuid else None
        m = c_void_p()
        _check(lib.kvt_client_register_dev(self._handle(), device, u, cs,
                                           len(segs), ls, lo, g.layers,
                                           nblocks, block_stride, kv_stride,
                                           token_stride, byref(m)),
               "register device memory")
        mem = Memory(self, m.value, nblocks, block_stride, kv_stride,
                     token_stride, [0] * g.layers, None, None, device=device)
        self._adopt(mem)
        return mem

    def register_torch(self, tensors: Sequence[Any],
                       layout: Any = None) -> "Memory":
        """Register per-layer CUDA KV tensors (vLLM's FlashAttention shape
        (2, num_blocks, P, H, D), K and V at [0] and [1]; or any packed
        layout kvtier.layout.derive() gave, as @layout) by CUDA IPC
        handle, as PyTorch's storage sharing gives them (the caching
        allocator's segment and the offset in it): the daemon opens them
        in its own context on the same GPU (found by UUID) and DMAs
        straight between its tiers and them."""
        from . import torch_dev
        dev, uuid, segs, lseg, loff, bs, ks, ts, nb = \
            torch_dev.ipc_layout(tensors, self.geometry, layout)
        return self.register_handles(dev, uuid, segs, lseg, loff, nb, bs, ks,
                                     ts)

    # -- events ---------------------------------------------------------------

    def event(self, device: Any) -> "ClientEvent":
        """An IPC event of kvtier.Device @device, registered with the
        daemon: record it after the engine's writes to blocks a store
        names (or its reads of blocks a load overwrites) and pass it to
        the job; the daemon's copies wait for that record."""
        e = c_void_p()
        _check(lib.kvt_client_event_new(self._handle(), device._handle(),
                                        byref(e)), "register an event")
        return ClientEvent(self, e.value)

    def register_event(self, device: int, uuid: Optional[bytes], kind: int,
                       handle: bytes, fd: int = -1) -> int:
        """Register an IPC event another library made (PyTorch:
        torch.cuda.Event(interprocess=True).ipc_handle(), kind
        _lib.EVENT_CUDA_IPC): its id, for load()/store(event=)."""
        hb = (ctypes.c_uint8 * 64)()
        ctypes.memmove(hb, bytes(handle)[:64], min(64, len(handle)))
        u = (ctypes.c_uint8 * 16).from_buffer_copy(uuid) if uuid else None
        out = c_uint32()
        _check(lib.kvt_client_event_register(self._handle(), device, u, kind,
                                             hb, fd, byref(out)),
               "register an event")
        return out.value

    # -- jobs -------------------------------------------------------------------

    def _job(self, store: bool, mem: "Memory", keys: Sequence[bytes],
             blocks: Sequence[int], first: int, each: bool,
             event: Any = None) -> "Job":
        what = "store" if store else "load"
        if mem._client is not self or mem._h is None:
            raise ValueError(f"kvtier: {what}: memory not registered by "
                             f"this client (or freed)")
        if not 0 <= first <= len(keys) or (each and first):
            raise ValueError(f"kvtier: {what}: first={first} outside the "
                             f"{len(keys)} keys" + (" (each: must be 0)"
                                                    if each else ""))
        if len(blocks) != len(keys) - first:
            raise ValueError(f"kvtier: {what}: {len(blocks)} blocks for "
                             f"pages {first}..{len(keys) - 1}")
        for b in blocks:
            if not 0 <= int(b) < mem.nblocks:
                raise ValueError(f"kvtier: {what}: block {b} outside the "
                                 f"{mem.nblocks} registered")
        ck = _keys.to_c(keys)
        cb = _u32_array(blocks, "blocks")
        j = c_void_p()
        ev = event.id if isinstance(event, ClientEvent) else int(event or 0)
        fn = lib.kvt_client_store_ev if store else lib.kvt_client_load_ev
        _check(self._call(fn, mem._h, ck, len(keys), first, cb,
                          _IO_EACH if each else 0, ev, byref(j)), what)
        job = Job(self, j.value, [int(b) for b in blocks],
                  self.geometry.layers)
        job.device = mem.device
        self._adopt(job)
        return job

    def load(self, mem: "Memory", keys: Sequence[bytes],
             blocks: Sequence[int], first: int = 0,
             each: bool = False, event: Any = None) -> "Job":
        """Copy pages first..len(keys)-1 of the prefix @keys into @blocks
        of @mem, asynchronously. Never waits on the cache: a page not
        cached (or not loadable yet) puts its block on the failed list.
        each: every key is a one-page prefix of its own (page i into
        blocks[i]; first 0): one request for many such pages.
        event: device memory only — a ClientEvent (or registered event
        id) the daemon's copies wait for (the engine's last reads of the
        blocks)."""
        return self._job(False, mem, keys, blocks, first, each, event)

    def store(self, mem: "Memory", keys: Sequence[bytes],
              blocks: Sequence[int], first: int = 0,
              each: bool = False, event: Any = None) -> "Job":
        """Copy pages first..len(keys)-1 of the prefix @keys out of @blocks
        of @mem into the cache, asynchronously. The blocks must not change
        until the job is done; pages before @first must already be cached
        (or being stored); pages already cached are skipped. Nothing
        becomes visible unless every page landed; the per-layer sums of
        what landed are taken then, and every later load is verified
        against them (JobStat.verified is 0 for a store).
        each: every key a one-page prefix of its own (first 0); a page
        that finds no room fails alone.
        event: device memory only — a ClientEvent (or registered event
        id) recorded after the engine's writes to the blocks: the daemon
        reads them only after that (without it a store may read blocks
        still being written)."""
        return self._job(True, mem, keys, blocks, first, each, event)

    # -- the daemon -----------------------------------------------------------

    def stats(self) -> Dict[str, Any]:
        """The daemon's metrics (docs/METRICS.md) as a dict."""
        p = c_void_p()
        _check(self._call(lib.kvt_client_stats, byref(p)), "stats")
        try:
            text = ctypes.string_at(p.value).decode()
        finally:
            _lib.libc.free(p)
        return json.loads(text)

    FP_VLLM = 1     # fingerprint schemes (kvt_client_fingerprint)
    FP_SGLANG = 2

    def publish_fingerprint(self, scheme: int, fp: bytes) -> Tuple[int, int]:
        """Publish a 32-byte fingerprint of what determines this engine's
        page hashes (FPRINT; a one-way hash, never a seed) for this
        client's tenant: (distinct fingerprints of @scheme the tenant's
        engines published before that differ from @fp — nonzero: engines
        whose page keys never match this one's —, the tenant's conflict
        count)."""
        fp = bytes(fp)
        if len(fp) != 32:
            raise ValueError(f"kvtier: a fingerprint is 32 bytes, not "
                             f"{len(fp)}")
        others, conflicts = c_uint32(), c_uint64()
        _check(self._call(lib.kvt_client_fingerprint, scheme, fp,
                          byref(others), byref(conflicts)),
               "publish fingerprint")
        return others.value, conflicts.value

    def rates(self) -> Dict[Tuple[str, str], Rate]:
        """The daemon's measured transfer rates, {(source tier, destination
        tier): Rate}; an engine's registered memory is "hbm", so loads
        from tier t are (t, "hbm") and stores ("hbm", t)."""
        rt = (_lib.XferRate * (KVT_TIER_COUNT * KVT_TIER_COUNT))()
        _check(self._call(lib.kvt_client_rates, rt), "rates")
        return {(a, b): Rate(rt[i * KVT_TIER_COUNT + j].gbps,
                             rt[i * KVT_TIER_COUNT + j].jobs,
                             rt[i * KVT_TIER_COUNT + j].total_bytes)
                for i, a in enumerate(TIER_NAMES)
                for j, b in enumerate(TIER_NAMES)}

    def quiesce(self) -> None:
        """Wait until the daemon's background demotion has settled."""
        _check(self._call(lib.kvt_client_quiesce), "quiesce")

    def _adopt(self, obj: Union["Memory", "Job"]) -> None:
        with self._lock:
            if isinstance(obj, Memory):
                self._mems.add(obj)
            else:
                self._jobs.add(obj)

    def _forget(self, obj: Union["Memory", "Job"]) -> None:
        with self._lock:
            self._mems.discard(obj)  # type: ignore[arg-type]
            self._jobs.discard(obj)  # type: ignore[arg-type]
