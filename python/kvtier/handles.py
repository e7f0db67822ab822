"""What a kvtier Client hands out: Memory (engine KV memory the daemon has
mapped, freed with the client at the latest), ClientEvent (a device event
the daemon's copies wait on), and Job (one asynchronous load or store:
layer waits, the failed blocks, its JobStat).

Threads: as the client (kvtier.client's docstring): every handle may be
used from any thread, and a Client.close() racing a Job.wait() makes the
wait return with every block failed; a handle's C handle is freed only
through its client, once no call is inside the library (Client._using).
Re-exported by kvtier.client and kvtier.
"""
from __future__ import annotations

import ctypes
import errno
import mmap
from ctypes import byref, c_uint32
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from . import _lib
from ._base import (_BLOCK_FAILURES, _GONE, ConnectionLost, _check, _Closable,
                    _raise, _timeout_ns)
from ._lib import TIER_NAMES, lib

if TYPE_CHECKING:
    from .client import Client


@dataclass(frozen=True)
class JobStat:
    """What one job did and waited for (read once it is done).

    verified: for a load, the pages whose every layer's checksum matched
    where they landed; for a store 0 — a store takes the per-layer sums
    of what landed in the cache (every later load is checked against
    them), but has nothing to compare them with, so it verifies nothing.
    busy, absent: for a load, of the failed blocks, those whose page was
    being stored or moved when the load began (a load never waits for a
    store) and those with no copy then (evicted since the lookup); the
    other failed blocks were cancelled or could not be read right.
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
    busy: int = 0
    absent: int = 0


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
                       st.total_s, dict(zip(TIER_NAMES, st.from_)),
                       st.busy, st.absent)

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
