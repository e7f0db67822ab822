"""Host memory the kvtier daemon can map, for vLLM's KV caches (part of
kvtier.vllm): host_kv_buffer() (a sealed memfd mapped here) for NumPy
caches, and the re-homing of CPU torch caches into it.

A daemon maps only a sealed memfd, so a worker's CPU KV caches must live in
one: NumPy arrays are allocated in host_kv_buffer() memory by the engine
(the stand-ins do), torch tensors allocated by vLLM are moved there in
place before any KV is in them (_rehome_torch: each distinct storage copied
once, every tensor viewing it re-pointed with Tensor.set_, strides kept —
permuted layouts such as HND stay as they were). emu_kv_buffer() is the
emulated device's memory for "device": "emu" (CI's stand-in for a GPU:
registered by handle). CUDA tensors are registered by handle (the
connector's device path, kvtier.torch_dev).
"""
from __future__ import annotations

import ctypes
import dataclasses
import mmap
from typing import Any, Dict, List, Optional

from .client import shared_memfd

__all__ = ["emu_kv_buffer", "host_kv_buffer"]


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
    mem = _emu_device().alloc(nbytes)
    _EMU[1].append(mem)
    return memoryview((ctypes.c_char * nbytes).from_address(mem.ptr)
                      ).cast("B")


def _emu_device() -> Any:
    """The process's emulated device (kvtier.Device("emu"))."""
    if not _EMU:
        from .device import Device
        _EMU.extend([Device("emu"), []])
    return _EMU[0]


def _emu_memory() -> List[Any]:
    """The DeviceMemory allocations emu_kv_buffer() made."""
    return list(_EMU[1]) if _EMU else []


def _buffer_of(addr: int, end: int) -> Optional[_HostBuffer]:
    for b in _BUFFERS:
        if b.base <= addr and end <= b.base + b.size:
            return b
    return None


# -- tensors, without depending on torch or numpy ------------------------------

def _is_torch(t: Any) -> bool:
    return type(t).__module__.startswith("torch")


def _rehome_torch(caches: Dict[str, Any]) -> None:
    """Move CPU torch tensors into one host_kv_buffer(), in place: each
    distinct storage is copied once into memory the daemon can map and
    every tensor viewing it is re-pointed there (Tensor.set_, same offset,
    sizes and strides: permuted layouts such as HND stay as they were)."""
    import torch
    storages: Dict[int, Any] = {}
    for t in caches.values():
        st = t.untyped_storage() if hasattr(t, "untyped_storage") \
            else t.storage()
        storages.setdefault(st.data_ptr(), (st, t))
    total = 0
    place: Dict[int, int] = {}
    for ptr, (st, _) in storages.items():
        place[ptr] = total
        total += (st.nbytes() + 4095) // 4096 * 4096
    buf = host_kv_buffer(total)
    new_of: Dict[int, Any] = {}
    for ptr, (st, t) in storages.items():
        n = st.nbytes()
        raw = torch.frombuffer(buf, dtype=torch.uint8, count=n,
                               offset=place[ptr])
        raw.copy_(torch.frombuffer(
            (ctypes.c_char * n).from_address(ptr), dtype=torch.uint8,
            count=n))
        new_of[ptr] = raw
    for t in caches.values():
        st = t.untyped_storage() if hasattr(t, "untyped_storage") \
            else t.storage()
        raw = new_of[st.data_ptr()]
        view = raw.view(t.dtype) if t.element_size() != 1 else raw
        t.set_(view.untyped_storage() if hasattr(view, "untyped_storage")
               else view.storage(), t.storage_offset(), t.size(),
               t.stride())
