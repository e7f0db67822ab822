"""Devices as an engine process sees them (include/kvtier/dev.h).

An engine whose KV lives on a GPU registers it with the daemon by handle,
and the daemon moves pages straight between its page-locked tiers and that
memory on the device — no CPU copy of a page byte, verified on the device
(Client.register_torch(), Client.register_device()). This module is the
little of the device an engine needs beside its framework:

    dev = kvtier.Device("cuda:0")       # or "emu": the emulated device
    s = dev.wrap_stream(torch.cuda.current_stream().cuda_stream)
    job.stream_wait(layer, s)           # layer l's attention waits on it

On the emulated device (CI, machines without a GPU) it is the whole
device: alloc() gives shared memory (a memfd) this process reads and
writes at its address (DeviceMemory.array()), streams are threads, events
order work across processes — the same path through the daemon as a GPU's,
with the GPU's calls replaced (its copies are CPU copies, counted as the
device's).
"""
from __future__ import annotations

import ctypes
from ctypes import byref, c_int, c_void_p
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import _lib
from ._lib import lib


def _check(code: int, what: str) -> int:
    from .client import _check as check  # one error mapping for the package
    return check(code, what)


def device_id(name: Any) -> int:
    """A device id from "emu", "emu:N", "cuda:N", "N" or an int."""
    if isinstance(name, int):
        return name
    v = c_int()
    _check(lib.kvt_device_parse(str(name).encode(), byref(v)),
           f"device {name!r}")
    return v.value


class Device:
    """An open device: a CUDA GPU or the emulated device."""

    def __init__(self, name: Any = "emu") -> None:
        self.id = device_id(name)
        h = c_void_p()
        _check(lib.kvt_dev_open(self.id, byref(h)), f"open device {name!r}")
        self._h: Optional[int] = h.value
        self._wrapped: Dict[int, "Stream"] = {}

    def _handle(self) -> int:
        if self._h is None:
            raise ValueError("kvtier: the device is closed")
        return self._h

    @property
    def name(self) -> str:
        return lib.kvt_dev_name(self._handle()).decode()

    @property
    def emulated(self) -> bool:
        return bool(lib.kvt_dev_emulated(self._handle()))

    @property
    def uuid(self) -> bytes:
        """The GPU's UUID (zeros on the emulated device)."""
        b = (ctypes.c_uint8 * 16)()
        lib.kvt_dev_uuid(self._handle(), b)
        return bytes(b)

    def alloc(self, nbytes: int) -> "DeviceMemory":
        """@nbytes of device memory (zeroed on the emulated device)."""
        p = c_void_p()
        _check(lib.kvt_dev_alloc(self._handle(), nbytes, byref(p)),
               f"device alloc of {nbytes} bytes")
        mem = DeviceMemory(self, p.value, nbytes)
        if self.emulated:
            ctypes.memset(p.value, 0, nbytes)
        return mem

    def stream(self) -> "Stream":
        s = c_void_p()
        _check(lib.kvt_dev_stream_create(self._handle(), byref(s)),
               "device stream")
        return Stream(self, s.value)

    def wrap_stream(self, native: int) -> "Stream":
        """A stream the caller owns (CUDA: a cudaStream_t as an integer,
        e.g. torch.cuda.current_stream().cuda_stream), kept per native
        stream."""
        native = int(native)
        if native not in self._wrapped:
            s = c_void_p()
            _check(lib.kvt_dev_stream_wrap(self._handle(), native, byref(s)),
                   "wrap a stream")
            self._wrapped[native] = Stream(self, s.value)
        return self._wrapped[native]

    def event(self, ipc: bool = False) -> "Event":
        e = c_void_p()
        _check(lib.kvt_dev_event_create(self._handle(), int(ipc), byref(e)),
               "device event")
        return Event(self, e.value)

    def memcpy(self, dst: int, src: int, n: int) -> None:
        """A synchronous copy (device or host addresses)."""
        _check(lib.kvt_dev_memcpy(self._handle(), dst, src, n), "memcpy")

    def stat(self) -> Dict[str, int]:
        st = _lib.DevStat()
        lib.kvt_dev_stat_get(self._handle(), byref(st))
        return {n: getattr(st, n) for n, _ in _lib.DevStat._fields_}

    def set_delay(self, ns_per_mib: int) -> None:
        """Emulated device: every copy spends @ns_per_mib per MiB first."""
        lib.kvt_dev_set_delay(self._handle(), ns_per_mib)

    def close(self) -> None:
        for s in self._wrapped.values():
            s.close()
        self._wrapped = {}
        h, self._h = self._h, None
        if h is not None:
            lib.kvt_dev_close(h)

    def __enter__(self) -> "Device":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DeviceMemory:
    """An allocation of a Device. ptr: its device address."""

    def __init__(self, dev: Device, ptr: int, nbytes: int) -> None:
        self.device = dev
        self.ptr = ptr
        self.nbytes = nbytes

    def array(self, dtype: Any, shape: Tuple[int, ...], offset: int = 0
              ) -> Any:
        """A NumPy array over the memory (the emulated device only: its
        memory is this process's too)."""
        import numpy as np
        if not self.device.emulated:
            raise ValueError("kvtier: a GPU's memory is not host memory; "
                             "use the framework's tensors")
        dt = np.dtype(dtype)
        n = int(np.prod(shape)) * dt.itemsize
        if offset < 0 or offset + n > self.nbytes:
            raise ValueError("kvtier: array outside the allocation")
        buf = (ctypes.c_char * n).from_address(self.ptr + offset)
        return np.frombuffer(buf, dtype=dt).reshape(shape)

    def free(self) -> None:
        if self.ptr and self.device._h is not None:
            lib.kvt_dev_free(self.device._h, self.ptr)
        self.ptr = 0


class Stream:
    """A queue of device work."""

    def __init__(self, dev: Device, h: int) -> None:
        self.device = dev
        self._h: Optional[int] = h
        self._keep: List[Any] = []   # host functions not yet run

    @property
    def handle(self) -> int:
        if self._h is None:
            raise ValueError("kvtier: the stream is closed")
        return self._h

    def host_fn(self, fn: Callable[[], None]) -> None:
        """Run @fn() on a host thread when the stream reaches this point
        (the emulated device's "kernels")."""
        cb = _lib.HOST_FN(lambda _arg: fn())
        self._keep.append(cb)
        _check(lib.kvt_dev_stream_host_fn(self.handle, cb, None),
               "host function on a stream")

    def sync(self) -> None:
        _check(lib.kvt_dev_stream_sync(self.handle), "stream sync")
        self._keep = []

    def close(self) -> None:
        h, self._h = self._h, None
        if h is not None:
            lib.kvt_dev_stream_destroy(h)
        self._keep = []


class Event:
    """A device event (Device.event())."""

    def __init__(self, dev: Device, h: int) -> None:
        self.device = dev
        self._h: Optional[int] = h

    def record(self, stream: Stream) -> None:
        _check(lib.kvt_dev_event_record(self._h, stream.handle), "record")

    def query(self) -> bool:
        rc = lib.kvt_dev_event_query(self._h)
        if rc < 0:
            _check(rc, "event")
        return rc == 1

    def sync(self, timeout: Optional[float] = None) -> None:
        ns = -1 if timeout is None else int(timeout * 1e9)
        _check(lib.kvt_dev_event_sync(self._h, ns), "event sync")

    def close(self) -> None:
        h, self._h = self._h, None
        if h is not None:
            lib.kvt_dev_event_destroy(h)


__all__ = ["Device", "DeviceMemory", "Stream", "Event", "device_id"]
