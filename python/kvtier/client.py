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
"""
from __future__ import annotations

import array
import ctypes
import errno
import fcntl
import json
import mmap
import os
import contextlib
import threading
import weakref
from ctypes import byref, c_uint32, c_uint64, c_void_p
from dataclasses import dataclass, field
from typing import (Any, Dict, Iterator, List, Optional, Sequence, Tuple,
                    TypeVar, Union)

from . import _lib
from . import keys as _keys
from ._lib import KVT_TIER_COUNT, TIER_NAMES, lib

_KVT_CODES = {
    -31900: "KVT_EFULL", -31901: "KVT_ESPEC", -31902: "KVT_EPRESET",
    -31903: "KVT_ECONFIG", -31904: "KVT_ENODEV", -31905: "KVT_ECORRUPT",
    -31906: "KVT_EGEOM", -31907: "KVT_ENOTBUILT", -31908: "KVT_ENOTFOUND",
    -31909: "KVT_EBUSY", -31910: "KVT_EPROTO",
}
KVT_EFULL, KVT_ESPEC, KVT_EPRESET, KVT_ECONFIG = -31900, -31901, -31902, -31903
KVT_ENODEV, KVT_ECORRUPT, KVT_EGEOM, KVT_ENOTBUILT = -31904, -31905, -31906, -31907
KVT_ENOTFOUND, KVT_EBUSY, KVT_EPROTO = -31908, -31909, -31910
# a job's codes for "this block could not be supplied" (failed blocks)
_BLOCK_FAILURES = (KVT_ENOTFOUND, KVT_EBUSY, KVT_ECORRUPT, -errno.EIO,
                   -errno.ECANCELED, -errno.ECONNRESET, -errno.EPIPE)
# kvt_cache_lookup() flags (include/kvtier/cache.h)
_LOOKUP_TOUCH, _LOOKUP_EACH = 1 << 0, 1 << 1
# kvt_cache_io.flags
_IO_EACH = 1 << 0
# the daemon went away: every block of the client's jobs failed
_GONE = (-errno.ECONNRESET, -errno.EPIPE)


_T = TypeVar("_T")


def _code_name(code: int) -> str:
    if code in _KVT_CODES:
        return _KVT_CODES[code]
    return errno.errorcode.get(-code, str(code))


class KvtierError(Exception):
    """An error of the kvtier library or daemon.

    code:   the negative C code (-errno or a KVT_E* value);
    name:   its symbolic name ("KVT_ENOTFOUND", "ECONNREFUSED", ...);
    detail: kvt_errdetail(): what failed and why, in the library's words.
    """

    def __init__(self, code: int, what: str, detail: str = "") -> None:
        self.code = code
        self.name = _code_name(code)
        self.detail = detail
        msg = lib.kvt_strerror(code).decode()
        text = f"{what}: {msg} ({self.name})"
        if detail and detail != msg:
            text += f": {detail}"
        super().__init__(text)


class ConnectionLost(KvtierError):
    """The daemon went away (-ECONNRESET / -EPIPE), or the connection was
    dropped: every job of the client failed with it (its waits return
    every block failed once the daemon has let go); reconnect with a new
    Client."""


class RequestTimeout(ConnectionLost, TimeoutError):
    """A request got no reply within the client's timeout_ms. The
    connection is dropped (a late reply would put every later one out of
    step): later calls raise ConnectionLost; connect again. For a load or
    store the call returned only once the daemon had let go of this
    client's memory (released True), or after lease_ms + timeout_ms with
    the daemon still holding it (released False: it is hung, and the
    request's blocks may still be written)."""

    def __init__(self, code: int, what: str, detail: str = "") -> None:
        super().__init__(code, what, detail)
        self.released = "may still be written" not in detail


def _raise(code: int, what: str, request: bool = True) -> None:
    """Raise for @code. @request: the call was a request to the daemon (a
    timeout drops the connection), not a wait with a timeout of its own."""
    detail = (lib.kvt_errdetail() or b"").decode(errors="replace")
    if code in (-errno.ECONNRESET, -errno.EPIPE):
        raise ConnectionLost(code, what, detail)
    if code == -errno.ETIMEDOUT:
        if request:
            raise RequestTimeout(code, what, detail)
        raise TimeoutError(f"{what}: timed out")
    raise KvtierError(code, what, detail)


def _check(code: int, what: str) -> int:
    if code < 0:
        _raise(code, what)
    return code


def _timeout_ns(timeout: Optional[float]) -> int:
    if timeout is None:
        return -1
    if timeout < 0:
        raise ValueError("kvtier: timeout must be >= 0 seconds or None")
    return int(timeout * 1e9)


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


class _Closable:
    """Context manager and finalizer over close()."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _T) -> _T:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


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


@dataclass(frozen=True)
class JobStat:
    """What one job did and waited for (read once it is done).

    verified: for a load, the pages whose every layer's checksum matched
    where they landed; for a store 0 — a store takes the per-layer sums
    of what landed in the cache (every later load is checked against
    them), but has nothing to compare them with, so it verifies nothing.
    """
    pages: int
    copied: int
    skipped: int
    failed: int
    verified: int
    bytes: int
    wait_s: float
    layer0_s: float
    total_s: float
    from_tier: Dict[str, int] = field(default_factory=dict)


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


class Memory(_Closable):
    """Engine KV memory the daemon has mapped.

    nblocks, block_stride, kv_stride, token_stride, head_stride: the
    layout (head_stride D*s unless registered in rows);
    layer_addrs: the address of block 0's K chunk of each layer (0 when
    the caller mapped it itself: register_fd);
    buffer: a writable memoryview of the whole mapping, when this package
    mapped it (alloc, alloc_memfd), else None.
    """

    def __init__(self, client: Client, h: int, nblocks: int,
                 block_stride: int, kv_stride: int, token_stride: int,
                 layer_addrs: List[int], buffer: Optional[memoryview],
                 mapping: Optional[mmap.mmap],
                 device: int = _lib.DEVICE_HOST) -> None:
        self._client: Optional[Client] = client
        self.device = device  # -1 host; else the device id
        self._h: Optional[int] = h
        self.nblocks = nblocks
        self.block_stride = block_stride
        self.kv_stride = kv_stride
        self.token_stride = token_stride
        self.head_stride = client.geometry.head_dim * \
            client.geometry.dtype_bytes
        self.layer_addrs = layer_addrs
        self.buffer = buffer
        self._map = mapping

    def addr(self, layer: int, block: int, kv: int = 0) -> int:
        """The address of @block's K (kv=0) or V (kv=1) chunk of @layer."""
        if not self.layer_addrs[0]:
            raise ValueError("kvtier: memory mapped by the caller: "
                             "addresses are the caller's")
        return (self.layer_addrs[layer] + block * self.block_stride +
                kv * self.kv_stride)

    def layer_offset(self, layer: int) -> int:
        """Byte offset of @layer's block 0 inside .buffer."""
        return self.layer_addrs[layer] - self.layer_addrs[0]

    def free(self) -> None:
        """Unregister (the daemon cancels jobs on it and unmaps it)."""
        h, self._h = self._h, None
        cl, self._client = self._client, None
        if h is not None and cl is not None:
            with cl._using() as ch:
                # a closed client has freed (or is freeing) the C handle
                if ch is not None:
                    cl._forget(self)
                    lib.kvt_client_mem_free(h)
        self._release_map()

    def _orphan(self) -> None:  # the client closed: it freed the handle
        self._h = None
        self._client = None
        self._release_map()

    def _release_map(self) -> None:
        if self._map is not None:
            if self.buffer is not None:
                self.buffer.release()
            self.buffer = None
            try:
                self._map.close()
            except BufferError:
                pass  # still exported (a numpy view): freed with it
            self._map = None

    close = free


class ClientEvent(_Closable):
    """An IPC event registered with the daemon (Client.event())."""

    def __init__(self, client: Client, h: int) -> None:
        self._client: Optional[Client] = client
        self._h: Optional[int] = h
        self.id = lib.kvt_client_event_id(h)

    def record(self, stream: Any) -> None:
        """Record on @stream (a kvtier.device.Stream of its device)."""
        if self._h is None:
            raise ValueError("kvtier: the event is closed")
        _check(lib.kvt_client_event_record(self._h, stream.handle),
               "record an event")

    def close(self) -> None:
        h, self._h = self._h, None
        cl, self._client = self._client, None
        if h is not None and cl is not None and cl._h is not None:
            lib.kvt_client_event_free(h)


class Job(_Closable):
    """An asynchronous load or store.

    Progress comes through memory the daemon writes, so wait_layer() and
    poll() cost no round trip. Failed blocks are not exceptions: wait()
    returns them, for the engine to recompute. A daemon that went away
    fails every block of the job (result -ECONNRESET); the client's next
    request raises ConnectionLost.
    """

    def __init__(self, client: Client, h: int, blocks: List[int],
                 layers: int) -> None:
        self._client: Optional[Client] = client
        self._h: Optional[int] = h
        self.blocks = blocks
        self._layers = layers
        self._failed: Optional[List[int]] = None
        self.result: Optional[int] = None
        self._orphaned = False
        self.device = _lib.DEVICE_HOST  # its memory's device

    def _jcall(self, fn: Any, *args: Any) -> Optional[int]:
        """fn(job handle, *args) while the job and its client are open;
        None once the client is closed (every block failed). A closed
        job raises."""
        cl = self._client
        if self._orphaned:
            return None  # the client's close freed it
        if self._h is None or cl is None:
            raise ValueError("kvtier: the job is closed")
        with cl._using() as ch:
            h = self._h
            if ch is None or h is None:
                return None
            rc = fn(h, *args)
            return 0 if rc is None else int(rc)

    def wait_layer(self, layer: int, timeout: Optional[float] = None) -> bool:
        """Block until @layer of every block is in place and verified.
        True: it is (blocks that fail excepted: see wait()); False: every
        block failed at or before this layer (nothing to use), or the
        client was closed. TimeoutError after @timeout."""
        if not 0 <= layer < self._layers:
            raise IndexError(f"kvtier: layer {layer} of {self._layers}")
        rc = self._jcall(lib.kvt_client_job_wait_layer, layer,
                         _timeout_ns(timeout))
        if rc is None:
            return not self._closed_done()
        if rc == 0:
            return True
        if rc in _BLOCK_FAILURES:
            return False
        _raise(rc, "wait for layer", request=False)
        return False

    def stream_wait(self, layer: int, stream: Any) -> None:
        """Enqueue on @stream (a kvtier.device.Stream of the job's device,
        e.g. Device.wrap_stream(torch stream)) a wait until @layer of every
        block is in place and verified, or the job is over (then check
        its failed blocks before using them): work the engine enqueues
        after it (that layer's attention) starts then, without the CPU
        (cuStreamWaitValue32 on the client's wait word for the job). A
        daemon that dies meanwhile releases the wait: the job then fails
        with every block (result -ECONNRESET)."""
        if not 0 <= layer < self._layers:
            raise IndexError(f"kvtier: layer {layer} of {self._layers}")
        rc = self._jcall(lib.kvt_client_job_stream_wait, layer,
                         stream.handle)
        if rc is not None:  # the client closed: nothing to wait for
            _check(rc, "stream wait for a layer")

    def wait(self, timeout: Optional[float] = None) -> List[int]:
        """Block until the job is done. Returns the block ids whose copy
        failed ([] when every block succeeded), in request order; every
        block when the daemon went away or the client was closed (then
        the daemon has let go of them). TimeoutError after @timeout (the
        job runs on)."""
        rc = self._jcall(lib.kvt_client_job_wait, _timeout_ns(timeout))
        return self._closed_done() if rc is None else self._done(rc)

    def poll(self) -> bool:
        """True once the job is done (then wait() does not block)."""
        rc = self._jcall(lib.kvt_client_job_poll)
        if rc == -errno.EINPROGRESS:
            return False
        if rc is None:
            self._closed_done()
        else:
            self._done(rc)
        return True

    def _closed_done(self) -> List[int]:
        """The client was closed under the job: what it had, else every
        block failed (the close returned once the daemon let go)."""
        if self.result is None:
            self.result = -errno.ECONNRESET
        if self._failed is None:
            self._failed = list(self.blocks)
        return list(self._failed)

    def _done(self, rc: int) -> List[int]:
        if rc == -errno.ETIMEDOUT:
            _raise(rc, "wait for job", request=False)
        self.result = rc
        if rc in _GONE and self._failed is None:
            self._failed = list(self.blocks)  # no daemon to ask: all failed
        return self.failed

    @property
    def failed(self) -> List[int]:
        """The failed block ids, once done."""
        if self._failed is None:
            n = len(self.blocks)
            arr = (c_uint32 * max(n, 1))()
            got = self._jcall(lib.kvt_client_job_failed, arr, n)
            if got is None:  # the client closed under it
                return self._closed_done()
            if got == -errno.EINPROGRESS:
                raise RuntimeError("kvtier: the job is still running")
            if got in _GONE:  # lost with the daemon before it was done
                if self.result is None:
                    self.result = int(got)
                self._failed = list(self.blocks)
                return list(self._failed)
            _check(int(got), "failed blocks")
            self._failed = [int(arr[i]) for i in range(min(got, n))]
        return list(self._failed)

    def cancel(self) -> bool:
        """Stop the job (blocks not complete go on the failed list; a
        cancelled store commits nothing). False if it was already done."""
        rc = self._jcall(lib.kvt_client_job_cancel)
        if rc is None or rc == -errno.EALREADY:
            return False
        _check(rc, "cancel")
        return True

    def stat(self) -> JobStat:
        """What the job did (once done); all zero for a job whose client
        was closed."""
        st = _lib.JobStat()
        self._jcall(lib.kvt_client_job_stat_get, byref(st))
        return JobStat(st.pages, st.copied, st.skipped, st.failed,
                       st.verified, st.bytes, st.wait_s, st.layer0_s,
                       st.total_s, dict(zip(TIER_NAMES, st.from_)))

    def fileno(self) -> int:
        """The client's eventfd (see Client.fileno())."""
        if self._client is None:
            raise ValueError("kvtier: the job is closed")
        return self._client.fileno()

    def close(self) -> None:
        """Free the handle (a running job is cancelled first, and waited
        for: at most the daemon's lease and the client's timeout)."""
        h, self._h = self._h, None
        cl, self._client = self._client, None
        self._orphaned = False  # closed by its owner: calls now raise
        if h is not None and cl is not None:
            with cl._using() as ch:
                # a closed client has freed (or is freeing) the C job: a
                # Client and its Job collected in one pass must not both
                if ch is not None:
                    cl._forget(self)
                    lib.kvt_client_job_free(h)

    def _orphan(self) -> None:
        self._h = None
        self._client = None
        self._orphaned = True

