"""Staging: engine KV moved through host memory the daemon maps, when
asked for ("staging": true in kvtier.vllm; never a fallback).

GPU KV caches are normally registered with the daemon by CUDA IPC handle
(kvtier.torch_dev) and moved by its device copies. A staging pool is the
other way, at a cost: host blocks shared with the daemon, in the engine's
layout, page-locked for the copy engines when CUDA is there; it also takes
what the device path refuses (layouts in rows, devices that are not CUDA).

    load:   daemon tier --(daemon)--> staging blocks --(copy per layer)--> engine blocks
    store:  engine blocks --(copy per layer)--> staging blocks --(daemon)--> tier

A load copies layer l of every block as soon as the daemon reports layer
l ready, so the host-to-device copies overlap the rest of the load (and,
with torch on CUDA, the engine's compute: the copies are asynchronous on
the current stream). A store copies each layer out when the engine has
written it (save_kv_layer), then hands the pages to the daemon.

Engine KV is one array per layer in any layout kvtier.layout knows —
vLLM's FlashAttention (2, num_blocks, P, H, D), FlashInfer (num_blocks, 2,
P, H, D), the CPU backend's (2, num_blocks, H, P, D), MLA (num_blocks, P,
latent), NHD or HND strides — given by the roles of its dimensions, as
torch tensors (any device) or NumPy arrays. The staging blocks mirror the
engine's physical layout (same dimension order, fewer blocks), so a copy
is one index along the block dimension and the daemon registers them with
the same kind of strides.
The staging pool has a fixed number of blocks; a job gets as many as are
free and the pages that do not fit are reported failed (a load: the
engine recomputes them) or not stored (a store: counted in .dropped).

Failed blocks of a load: layer copies run before the job knows which
blocks failed, so a failed block may receive stale staging bytes; the
engine recomputes every failed block, which overwrites them.

Nothing degrades silently: staging blocks that could not be page-locked
for a CUDA engine (pageable: every copy synchronous and slower) and pages
that found the pool full are logged at warning level (a full pool at most
once every WARN_EVERY_S seconds, with the count since) and counted, per
pool in StagingPool.stats and for the process in kvtier.staging.counters.
"""
from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from typing import Any, List, Optional, Sequence

from . import layout as _layout
from .client import Client, Job, Memory, shared_memfd


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


logger = logging.getLogger(__name__)

#: seconds between two warnings of a full staging pool
WARN_EVERY_S = 10.0

#: the process's fallbacks, all pools together: staging memory a CUDA
#: engine got pageable (pin_fallbacks), pages that found no free staging
#: block (unstaged_load_pages, unstaged_store_pages)
counters = {"pin_fallbacks": 0, "unstaged_load_pages": 0,
            "unstaged_store_pages": 0}
_counters_lock = threading.Lock()


def _count(key: str, n: int = 1) -> None:
    with _counters_lock:
        counters[key] += n


def cuda_host_register(addr: int, nbytes: int) -> Optional[str]:
    """cudaHostRegister(@addr, @nbytes) through torch: None once the
    range is page-locked, else why not (never raises)."""
    try:
        import torch
        if not torch.cuda.is_available():
            return "no CUDA"
        err = torch.cuda.cudart().cudaHostRegister(addr, nbytes, 0)
        code = getattr(err, "value", err)
        return None if code == 0 else f"cudaHostRegister: {err}"
    except Exception as e:  # an older torch without cudart()
        return f"{type(e).__name__}: {e}"


def pin_memory(mem: Memory) -> str:
    """Page-lock @mem for CUDA copies (cudaHostRegister through torch).
    Returns "pinned", or "pageable (<why>)" — never raises: pageable
    memory works, only slower; that fallback is logged at warning level
    and counted (counters["pin_fallbacks"])."""
    why = "memory mapped by the caller"
    if mem.buffer is not None:
        addr = ctypes.addressof(ctypes.c_char.from_buffer(mem.buffer))
        why = cuda_host_register(addr, mem.buffer.nbytes) or ""
        if not why:
            mem._pinned_addr = addr  # type: ignore[attr-defined]
            return "pinned"
    _count("pin_fallbacks")
    logger.warning("kvtier.staging: %d bytes of staging memory for a CUDA "
                   "engine are pageable (%s): every copy to and from the "
                   "GPU is synchronous and slower", mem.buffer.nbytes
                   if mem.buffer is not None else 0, why)
    return f"pageable ({why})"


def _wants_pin(t: Any) -> bool:
    """Engine KV @t is a torch tensor on a CUDA device (the only copies
    page-locked memory speeds up)."""
    dev = getattr(t, "device", None)
    return _is_torch(t) and getattr(dev, "type", None) == "cuda"


def unpin_memory(mem: Memory) -> None:
    """Undo pin_memory() (before the memory is freed)."""
    addr = getattr(mem, "_pinned_addr", None)
    if addr is not None:
        import torch
        torch.cuda.cudart().cudaHostUnregister(addr)
        mem._pinned_addr = None  # type: ignore[attr-defined]


class StagingPool:
    """@nblocks host blocks shared with the daemon, for engine KV arrays
    @kv_caches (one per layer, dimensions with @roles: kvtier.layout;
    default vLLM FlashAttention's) it cannot map."""

    def __init__(self, client: Client, kv_caches: Sequence[Any],
                 nblocks: int, roles: Optional[Sequence[str]] = None) -> None:
        g = client.geometry
        if len(kv_caches) != g.layers:
            raise ValueError(f"kvtier.staging: {len(kv_caches)} KV arrays "
                             f"for a model of {g.layers} layers")
        if roles is None:
            roles = _layout.VLLM_SHAPES["mla" if g.mla else "flash_attn"]
        self.roles = tuple(roles)
        infos = [_layout.describe(t) for t in kv_caches]
        try:
            _layout.derive(infos, self.roles, g.page_tokens, g.kv_heads,
                           g.head_dim, g.kv, layers=g.layers)
        except _layout.LayoutError as e:
            raise ValueError(f"kvtier.staging: {e}") from None
        if nblocks <= 0:
            raise ValueError("kvtier.staging: need at least one block")
        self.client = client
        self.nblocks = nblocks
        self.kv = list(kv_caches)
        self.torch = _is_torch(self.kv[0])
        self.bdim = self.roles.index("block")
        self.mem, self.views = self._alloc(infos[0], nblocks)
        #: this pool's fallbacks (the keys of kvtier.staging.counters)
        self.stats = {k: 0 for k in counters}
        if not self.torch:
            self.pinned = "numpy"
        elif _wants_pin(self.kv[0]):
            self.pinned = pin_memory(self.mem)
            self.stats["pin_fallbacks"] = int(self.pinned != "pinned")
        else:
            self.pinned = f"pageable (engine KV on {self.kv[0].device})"
        self._free = list(range(nblocks - 1, -1, -1))
        self._lock = threading.Lock()
        self._warned = 0.0  # when a full pool was last logged
        self._unwarned = 0  # pages that found it full since

    def _full(self, what: str, n: int) -> None:
        """@n pages of a @what ("load" or "store") got no staging block:
        counted, and logged at most once every WARN_EVERY_S."""
        key = f"unstaged_{what}_pages"
        _count(key, n)
        with self._lock:
            self.stats[key] += n
            self._unwarned += n
            now = time.monotonic()
            if self._warned and now - self._warned < WARN_EVERY_S:
                return
            self._warned, k = now, self._unwarned
            self._unwarned = 0
        logger.warning("kvtier.staging: the staging pool (%d blocks) is "
                       "full: %d pages not staged since the last warning, "
                       "this one a %s (a load's are recomputed, a store's "
                       "not stored); a larger pool avoids it (kvtier.vllm: "
                       "\"staging_blocks\")", self.nblocks, k, what)

    def _alloc(self, info: "_layout.Tensor", n: int):
        """Host memory shared with the daemon for @n blocks per layer, in
        the engine tensor's own dimension order (outermost = largest
        stride), and per-layer views of it in the engine's logical
        order."""
        g = self.client.geometry
        order = sorted(range(len(info.shape)),
                       key=lambda d: (-info.strides[d], d))
        shape = list(info.shape)
        shape[self.bdim] = n
        phys = [shape[d] for d in order]
        per = info.itemsize
        for x in phys:
            per *= x
        per = (per + 4095) // 4096 * 4096
        inv = [order.index(d) for d in range(len(order))]
        views = []
        # the memory first (zeroed, shared), then views, then registration
        fd, mm = shared_memfd(per * g.layers, "kvtier-staging")
        try:
            for l in range(g.layers):
                t = self.kv[l]
                if self.torch:
                    import torch
                    cnt = per // info.itemsize
                    v = torch.frombuffer(mm, dtype=t.dtype, count=cnt,
                                         offset=l * per)
                    nel = 1
                    for x in phys:
                        nel *= x
                    views.append(v[:nel].view(phys).permute(*inv))
                else:
                    import numpy as np
                    views.append(np.ndarray(phys, dtype=t.dtype, buffer=mm,
                                            offset=l * per).transpose(inv))
            lay = _layout.derive([_layout.describe(v) for v in views],
                                 self.roles, g.page_tokens, g.kv_heads,
                                 g.head_dim, g.kv, layers=g.layers)
            base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
            mem = self.client.register_fd(
                fd, lay.offsets(base), lay.nblocks, lay.block_stride,
                lay.kv_stride, lay.token_stride, head_stride=lay.head_stride,
                _map=mm)
        except BaseException:
            views.clear()
            mm.close()
            raise
        finally:
            os.close(fd)
        return mem, views

    def _take(self, n: int) -> List[int]:
        with self._lock:
            k = min(n, len(self._free))
            got = [self._free.pop() for _ in range(k)]
        return got

    def _give(self, blocks: Sequence[int]) -> None:
        with self._lock:
            self._free.extend(reversed(blocks))

    @property
    def free_blocks(self) -> int:
        with self._lock:
            return len(self._free)

    def _copy(self, layer: int, src_blocks: Sequence[int], to_engine: bool,
              eng_blocks: Sequence[int]) -> None:
        """Layer @layer: staging -> engine (to_engine) or engine -> staging,
        block by block along the block dimension."""
        if not eng_blocks:
            return
        st, eng, bd = self.views[layer], self.kv[layer], self.bdim
        if self.torch:
            import torch
            si = torch.tensor(list(src_blocks), dtype=torch.long)
            ei = torch.tensor(list(eng_blocks), dtype=torch.long,
                              device=eng.device)
            nb = self.pinned == "pinned"
            if to_engine:
                eng.index_copy_(bd, ei, st.index_select(bd, si).to(
                    eng.device, non_blocking=nb))
            else:
                st.index_copy_(bd, si, eng.index_select(bd, ei).to(
                    "cpu", non_blocking=False))
        else:
            pre = (slice(None),) * bd
            if to_engine:
                eng[pre + (list(eng_blocks),)] = st[pre + (list(src_blocks),)]
            else:
                st[pre + (list(src_blocks),)] = eng[pre + (list(eng_blocks),)]

    def load(self, keys: Sequence[bytes], blocks: Sequence[int],
             first: int = 0) -> "StagedLoad":
        """Load pages first.. of the prefix @keys into engine @blocks
        through staging blocks. Pages that get no staging block fail."""
        n = len(keys) - first
        if len(blocks) != n:
            raise ValueError(f"kvtier.staging: {len(blocks)} blocks for "
                             f"pages {first}..{len(keys) - 1}")
        sb = self._take(n)
        if len(sb) < n:
            self._full("load", n - len(sb))
        job = None
        try:
            if sb:
                job = self.client.load(self.mem, keys[:first + len(sb)], sb,
                                       first)
        except BaseException:
            self._give(sb)
            raise
        return StagedLoad(self, job, sb, list(blocks))

    def store(self, keys: Sequence[bytes], blocks: Sequence[int],
              first: int = 0) -> "StagedStore":
        """Begin storing engine @blocks as pages first.. of @keys: copy
        each layer with copy_layer() (or all with copy_all()), then
        submit(). Pages past the free staging blocks are dropped."""
        n = len(keys) - first
        if len(blocks) != n:
            raise ValueError(f"kvtier.staging: {len(blocks)} blocks for "
                             f"pages {first}..{len(keys) - 1}")
        sb = self._take(n)
        if len(sb) < n:
            self._full("store", n - len(sb))
        return StagedStore(self, list(keys[:first + len(sb)]), first, sb,
                           list(blocks[:len(sb)]), n - len(sb))

    def close(self) -> None:
        """Free the staging memory (no job may be running on it)."""
        if self.torch:
            unpin_memory(self.mem)
        self.views = []
        self.mem.free()


class _Staged:
    """What a staged load and store share: the daemon's job (None when no
    staging block was free), and the Job-like calls over it."""
    job: Optional[Job]

    def wait(self, timeout: Optional[float] = None) -> List[int]:
        raise NotImplementedError

    def poll(self) -> bool:
        """True once the daemon's part is done (then wait() only copies
        and frees)."""
        return self.job is None or self.job.poll()

    @property
    def failed(self) -> List[int]:
        """The engine blocks that failed (waits for the job)."""
        return self.wait()

    def cancel(self) -> bool:
        return self.job.cancel() if self.job is not None else False


class StagedLoad(_Staged):
    """A load into engine blocks through staging (see StagingPool.load)."""

    def __init__(self, pool: StagingPool, job: Optional[Job],
                 sblocks: List[int], eng: List[int]) -> None:
        self.pool, self.job, self.sblocks, self.eng = pool, job, sblocks, eng
        self.copied = 0  # layers copied to the engine
        self._failed: Optional[List[int]] = None

    def wait_layer(self, layer: int, timeout: Optional[float] = None) -> bool:
        """Layers up to @layer are in the engine's blocks (failed blocks
        excepted). False when every block failed."""
        if self.job is None:
            return False
        while self.copied <= layer:
            if not self.job.wait_layer(self.copied, timeout):
                return False
            self.pool._copy(self.copied, self.sblocks, True,
                            self.eng[:len(self.sblocks)])
            self.copied += 1
        return True

    def wait(self, timeout: Optional[float] = None) -> List[int]:
        """Every layer copied; returns the engine blocks that failed
        (including those that got no staging block), and frees the staging
        blocks."""
        if self._failed is not None:
            return list(self._failed)
        failed: List[int] = []
        if self.job is not None:
            layers = self.pool.client.geometry.layers
            ok = self.wait_layer(layers - 1, timeout)
            bad = self.job.wait(timeout)
            if not ok:
                bad = list(self.sblocks)
            pos = {s: i for i, s in enumerate(self.sblocks)}
            failed = [self.eng[pos[s]] for s in bad]
            self.job.close()
        failed += self.eng[len(self.sblocks):]
        self.pool._give(self.sblocks)
        self._failed = failed
        return list(failed)

    def close(self) -> None:
        """Abandon: stop the daemon's part and free the staging blocks,
        copying nothing more into the engine's blocks (an aborted load)."""
        if self._failed is None:
            if self.job is not None:
                self.job.cancel()
                try:
                    self.job.wait()
                finally:
                    self.job.close()
            self.pool._give(self.sblocks)
            self._failed = list(self.eng)


class StagedStore(_Staged):
    """A store out of engine blocks through staging (StagingPool.store)."""

    def __init__(self, pool: StagingPool, keys: List[bytes], first: int,
                 sblocks: List[int], eng: List[int], dropped: int) -> None:
        self.pool, self.keys, self.first = pool, keys, first
        self.sblocks, self.eng, self.dropped = sblocks, eng, dropped
        self.job: Optional[Job] = None
        self._copied = set()  # type: set
        self._done: Optional[List[int]] = None

    def copy_layer(self, layer: int) -> None:
        """Copy layer @layer of the blocks out of the engine (once the
        engine has written it)."""
        if layer not in self._copied:
            self.pool._copy(layer, self.sblocks, False, self.eng)
            self._copied.add(layer)

    def copy_all(self) -> None:
        for l in range(self.pool.client.geometry.layers):
            self.copy_layer(l)

    def submit(self) -> None:
        """Hand the pages to the daemon (every layer must be copied)."""
        layers = self.pool.client.geometry.layers
        if len(self._copied) != layers:
            raise RuntimeError(f"kvtier.staging: submit after "
                               f"{len(self._copied)} of {layers} layers")
        if self.sblocks and self.job is None:
            try:
                self.job = self.pool.client.store(self.pool.mem, self.keys,
                                                  self.sblocks, self.first)
            except BaseException:
                self._release()
                raise

    def wait(self, timeout: Optional[float] = None) -> List[int]:
        """The engine blocks whose pages were not stored (failed or
        dropped for want of staging blocks); frees the staging blocks."""
        if self._done is None:
            bad: List[int] = []
            if self.job is not None:
                pos = {s: i for i, s in enumerate(self.sblocks)}
                bad = [self.eng[pos[s]] for s in self.job.wait(timeout)]
                self.job.close()
            self._release()
            self._done = bad
        return list(self._done)

    def close(self) -> None:
        self.wait()

    def _release(self) -> None:
        if self.sblocks:
            self.pool._give(self.sblocks)
            self.sblocks = []
