"""The vLLM connector's worker-side registration of vLLM's KV caches with
the daemon: a mixin of kvtier.vllm.KvtierConnector, in its own file so
each file does one thing (kvtier/vllm.py: the connector's scheduler and
worker calls; this one: which memory the daemon reads and writes).

Three paths, chosen by where the caches live and the extra config:
  * host memory (NumPy views of host_kv_buffer(), torch CPU tensors
    re-homed into daemon-mappable memory): registered by fd, in whatever
    layout the attention backend chose (kvtier.layout derives the strides);
  * device memory (torch CUDA tensors by IPC handle; NumPy views of
    emu_kv_buffer() on the emulated device): the daemon's device copies,
    packed layouts only;
  * "staging": true — a pool of host blocks (kvtier.staging), its cost
    logged at warning level at start, never chosen silently.

Every method here runs on the worker side and sets the connector's
_register, _mem, _layer_index (and _dev, _kv_list, _staging) that the
worker calls in kvtier/vllm.py use; _worker_reconnect() registers the same
caches with a daemon that came back (the old connection retired once its
jobs are reported, _close_retired()). Hybrid models register one group's
layers (kvtier.vllm_hybrid: the k-th layer of every group is one tensor).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Optional, Tuple

from . import KVT_ENOTBUILT, Client, KvtierError, Memory
from . import layout as _layout
from .staging import StagingPool
from .vllm_host import (_buffer_of, _emu_device, _emu_memory, _is_torch,
                        _rehome_torch)

# a side that lost its daemon tries again this often (seconds)
_RECONNECT_S = 5.0

# host memory for staging GPU KV (when staging_blocks is not given): 2 GiB
_STAGING_BYTES = 2 << 30

log = logging.getLogger("kvtier.vllm")


class _Registration:
    """register_kv_caches() and its helpers (see the module docstring)."""

    def register_kv_caches(self, kv_caches: Dict[str, Any]) -> None:
        """Register vLLM's per-layer KV caches with the daemon, in whatever
        layout the attention backend chose (kvtier.layout: FlashAttention
        NHD / HND, FlashInfer, the CPU backend, MLA; fp8 caches are 1-byte
        elements); CPU torch tensors are re-homed into daemon-mappable
        memory first, GPU tensors registered by handle (or staged through
        host blocks with "staging": true, kvtier.staging). A hybrid
        model's are one group's layers (kvtier.vllm_hybrid)."""
        if self._hplan is not None:
            kv_caches = self._hyb_layers(kv_caches)
        g = self._geom
        if len(kv_caches) != g.layers:
            raise ValueError(f"kvtier.vllm: {len(kv_caches)} KV cache layers "
                             f"for a model of {g.layers} layers")
        roles = self._roles(kv_caches)
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
            self._register_staging(kv_caches, roles)
            return
        if on_gpu or self._device_mode == "emu":
            self._register_device(kv_caches, roles, on_gpu)
            return
        infos = [_layout.describe(t) for t in kv_caches.values()]
        if any(_is_torch(t) for t in kv_caches.values()) and \
                not all(_buffer_of(i.addr, i.addr + 1) for i in infos):
            _rehome_torch(kv_caches)
            infos = [_layout.describe(t) for t in kv_caches.values()]
        lay = self._derive(infos, roles)
        lo, hi = lay.extent()
        buf = _buffer_of(lo, hi)
        if buf is None:
            raise ValueError(
                "kvtier.vllm: the KV caches are not in memory the daemon can "
                "map: NumPy arrays must be views of kvtier.vllm."
                "host_kv_buffer() (torch CPU tensors are re-homed)")
        self._register = (buf.fd, lay.offsets(buf.base), lay.nblocks,
                          lay.block_stride, lay.kv_stride, lay.token_stride,
                          lay.head_stride)
        self._mem = self._register_mem(self._client)
        self._layer_index = {n: i for i, n in enumerate(kv_caches)}
        log.info("kvtier.vllm: %d KV cache layers registered (%s, roles %s)",
                 g.layers, "rows" if lay.rows else "packed", roles)

    def _register_mem(self, cl: Client) -> Memory:
        fd, offs, nb, bs, ks, ts, hs = self._register
        return cl.register_fd(fd, offs, nb, bs, ks, ts, head_stride=hs)

    def _derive(self, infos: List[Any], roles: Tuple[str, ...]
                ) -> "_layout.Layout":
        """The registered layout of the layer caches described by
        @infos, or ValueError saying what does not fit."""
        g = self._geom
        try:
            lay = _layout.derive(infos, roles, g.page_tokens, g.kv_heads,
                                 g.head_dim, g.kv, layers=g.layers)
        except _layout.LayoutError as e:
            raise ValueError(f"{e} (block size = the daemon's --page-tokens, "
                             f"heads per TP rank)") from None
        if lay.itemsize != g.dtype_bytes:
            raise ValueError(f"kvtier.vllm: {lay.itemsize}-byte KV cache "
                             f"elements ({lay.dtype}), the daemon's model "
                             f"has {g.dtype_bytes}: start the daemon with "
                             f"--kv-dtype matching vLLM's --kv-cache-dtype")
        return lay

    def _roles(self, kv_caches: Dict[str, Any]) -> Tuple[str, ...]:
        """Which dimension of the layer caches is which: the attention
        backend's get_kv_cache_shape when vLLM lets it be asked (its
        layers in the static forward context), else the shapes kvtier
        knows ("kv_shape" in the extra config picks one)."""
        g = self._geom
        name, t = next(iter(kv_caches.items()))
        shape = tuple(t.shape)
        if self._kv_shape:
            return _layout.VLLM_SHAPES[self._kv_shape]
        shape_fn = None
        cc = getattr(self._vllm_config, "compilation_config", None)
        layer = (getattr(cc, "static_forward_context", None) or {}).get(name)
        if layer is not None:
            backend = layer.get_attn_backend() if hasattr(
                layer, "get_attn_backend") else getattr(layer, "attn_backend",
                                                        None)
            shape_fn = getattr(backend, "get_kv_cache_shape", None)
        try:
            return _layout.vllm_roles(shape, g.page_tokens, g.kv_heads,
                                      g.head_dim, g.mla, shape_fn)
        except _layout.LayoutError as e:
            raise ValueError(f"{e}; set kv_connector_extra_config "
                             f"\"kv_shape\" to one of "
                             f"{sorted(_layout.VLLM_SHAPES)}") from None

    def _register_device(self, kv_caches: Dict[str, Any],
                         roles: Tuple[str, ...], on_gpu: bool) -> None:
        """Device memory by handle: torch CUDA tensors (their IPC
        handles), or NumPy views of emu_kv_buffer() memory. The daemon's
        device lane moves packed chunks: a layout in rows is refused."""
        tensors = list(kv_caches.values())
        lay = self._derive([_layout.describe(t) for t in tensors], roles)
        if lay.rows:
            raise KvtierError(
                KVT_ENOTBUILT, "kvtier.vllm: register KV caches",
                f"this attention backend's KV layout (dimensions {roles}) "
                f"keeps a page's tokens in rows (head stride "
                f"{lay.head_stride}, token stride {lay.token_stride} bytes); "
                f"the daemon's device copies move packed chunks (a token's "
                f"heads contiguous) only: use an NHD layout "
                f"(VLLM_KV_CACHE_LAYOUT=NHD) or set \"staging\": true")
        self._layer_index = {n: i for i, n in enumerate(kv_caches)}
        self._kv_list = tensors
        if on_gpu:
            from .device import Device
            self._torch_dev = True
            self._dev = Device(tensors[0].device.index or 0)
            self._register = ("torch", lay)
            self._mem = self._client.register_torch(tensors, layout=lay)
            log.info("kvtier.vllm: GPU KV caches registered with the daemon "
                     "by IPC handle on %s: loads and stores are the "
                     "daemon's device copies, verified on the GPU",
                     self._dev.name)
            return
        mems = _emu_memory()
        if not all(any(m.ptr <= a < m.ptr + m.nbytes for m in mems)
                   for a in lay.addrs):
            raise ValueError("kvtier.vllm: \"device\": \"emu\" takes KV "
                             "caches in emu_kv_buffer() memory")
        self._dev = _emu_device()
        self._register = ("emu", list(lay.addrs), lay.nblocks,
                          lay.block_stride, lay.kv_stride, lay.token_stride)
        self._mem = self._client.register_device(self._dev, *self._register[1:])

    def _store_event(self) -> Any:
        """Device path: an IPC event recorded now on the compute stream,
        after the step's KV writes (the daemon's store copies wait for
        it). The emulated device takes the same path with a stream of its
        own standing in for the compute stream (the emulated engine's
        writes are CPU writes, done by now)."""
        if self._dev is None:
            return None
        if not self._torch_dev:
            if self._ipc_event is None:
                self._ipc_event = (self._client.event(self._dev),
                                   self._dev.stream())
            ev, stream = self._ipc_event
            ev.record(stream)
            return ev
        import torch
        from .torch_dev import ipc_event
        if self._ipc_event is None:
            self._ipc_event = ipc_event(self._client)
        self._ipc_event[0].record(torch.cuda.current_stream())
        return self._ipc_event[1]

    def _register_staging(self, kv_caches: Dict[str, Any],
                          roles: Tuple[str, ...]) -> None:
        """"staging": true — move pages through a pool of host blocks the
        daemon maps (kvtier.staging), at a cost said at start."""
        g = self._geom
        nblocks = tuple(next(iter(kv_caches.values())).shape)[
            roles.index("block")]
        n = self._staging_blocks or min(
            nblocks, max(64, _STAGING_BYTES // g.page_bytes))
        self._staging = StagingPool(self._client, list(kv_caches.values()),
                                    n, roles=roles)
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
                                      self._staging.nblocks,
                                      roles=self._staging.roles)
            elif self._register[0] == "torch":
                mem = cl.register_torch(self._kv_list,
                                        layout=self._register[1])
            elif self._register[0] == "emu":
                mem = cl.register_device(self._dev, *self._register[1:])
            else:
                mem = self._register_mem(cl)
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
