"""STAND-IN for SGLang python/sglang/srt/mem_cache/memory_pool_host.py
(v0.5.6.post2 at 5c8bd8b51b53; in current SGLang split into
mem_cache/pool_host/{base,mha,mla}.py, read at 0047d999bb3a (mha) and
01c0ede38cc9 (mla)): reproduces only the host KV pools' buffer shapes
per layout — MHA: layer_first (2, L, N, H, D), page_first (2, N, L, H,
D), page_first_direct (2, pages, L, P, H, D), page_head (2, pages, H, P,
L, D); MLA (one latent of kv_lora_rank + qk_rope_head_dim per token):
layer_first (L, N, 1, Dk), page_first (N, L, 1, Dk), page_first_direct
(pages, L, P, 1, Dk), page_first_kv_split (Ascend: the latent and the rope
part in two buffers) —, the token-slot allocator (alloc/free in page
multiples), get_data_page() and both pools' get_page_buffer_meta()
(the pointer and size of every page, as the zero-copy storage backends
get them); not SGLang. NumPy arrays stand in for the pinned torch tensors;
there is no device, so load_to_device_per_layer /
backup_from_device_all_layer (the GPU<->host copies) are absent: the tests
compute KV straight into the host pool.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import numpy as np


@dataclass
class DevicePoolInfo:
    """NOT UPSTREAM: the few fields of SGLang's device pool
    (MHATokenToKVPool) that the host pool reads."""
    head_num: int
    head_dim: int
    layer_num: int
    size: int                       # device pool tokens
    store_dtype: Any = np.float32
    start_layer: int = 0
    device: str = "cpu"

    @property
    def end_layer(self) -> int:
        return self.start_layer + self.layer_num - 1


class HostKVCache:
    """Token slots of host memory for KV, allocated page by page."""

    def __init__(self, device_pool: DevicePoolInfo, host_to_device_ratio: float,
                 host_size: int, page_size: int, layout: str,
                 pin_memory: bool, device: str) -> None:
        self.device_pool = device_pool
        self.page_size = page_size
        self.layout = layout
        self.pin_memory = pin_memory
        self.device = device
        self.dtype = np.dtype(device_pool.store_dtype)
        self.size_per_token = self.get_size_per_token()
        if host_size > 0:
            self.size = int(host_size * 1e9 // self.size_per_token)
        else:
            self.size = int(device_pool.size * host_to_device_ratio)
        # upstream: one page more than fits, then size in whole pages
        self.page_num = self.size // self.page_size + 1
        self.size = self.page_num * self.page_size
        self.start_layer = device_pool.start_layer
        self.end_layer = device_pool.end_layer
        if self.size <= device_pool.size:
            raise AssertionError("The host memory should be larger than the "
                                 "device memory with the current protocol")
        self.kv_buffer = self.init_kv_buffer()
        self.lock = threading.RLock()
        self.clear()

    def clear(self) -> None:
        with self.lock:
            self.mem_state = np.zeros((self.size,), dtype=np.uint8)
            self.free_slots = np.arange(self.size, dtype=np.int64)

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self, need_size: int) -> Optional[np.ndarray]:
        if need_size % self.page_size:
            raise AssertionError("The requested size should be a multiple of "
                                 "the page size.")
        with self.lock:
            if need_size > self.available_size():
                return None
            out = self.free_slots[:need_size]
            self.free_slots = self.free_slots[need_size:]
            return out

    def free(self, indices: np.ndarray) -> int:
        with self.lock:
            self.free_slots = np.concatenate([self.free_slots,
                                              np.asarray(indices, np.int64)])
            return len(indices)


class MHATokenToKVPoolHost(HostKVCache):
    """K and V of every layer for host token slots."""

    def __init__(self, device_pool: DevicePoolInfo, host_to_device_ratio: float,
                 host_size: int, page_size: int, layout: str,
                 pin_memory: bool = True, device: str = "cpu") -> None:
        super().__init__(device_pool, host_to_device_ratio, host_size,
                         page_size, layout, pin_memory, device)
        self.element_dim = self.head_num * self.head_dim

    def get_size_per_token(self) -> int:
        self.head_num = self.device_pool.head_num
        self.head_dim = self.device_pool.head_dim
        self.layer_num = self.device_pool.layer_num
        return (self.head_dim * self.head_num * self.layer_num *
                self.dtype.itemsize * 2)

    def get_ksize_per_token(self) -> int:
        return self.get_size_per_token() // 2

    def init_kv_buffer(self) -> np.ndarray:
        L, N, H, D = self.layer_num, self.size, self.head_num, self.head_dim
        if self.layout == "layer_first":
            dims: Tuple[int, ...] = (2, L, N, H, D)
        elif self.layout == "page_first":
            dims = (2, N, L, H, D)
        elif self.layout == "page_first_direct":
            dims = (2, self.page_num, L, self.page_size, H, D)
        elif self.layout == "page_head":
            dims = (2, self.page_num, H, self.page_size, L, D)
        else:
            raise ValueError(f"Unsupported layout: {self.layout}")
        self.token_stride_size = H * D * self.dtype.itemsize
        self.layout_dim = self.token_stride_size * L
        return np.zeros(dims, dtype=self.dtype)

    @property
    def k_buffer(self) -> np.ndarray:
        return self.kv_buffer[0]

    @property
    def v_buffer(self) -> np.ndarray:
        return self.kv_buffer[1]

    def get_data_page(self, index: int, flat: bool = True) -> np.ndarray:
        P = self.page_size
        if self.layout == "layer_first":
            page = self.kv_buffer[:, :, index:index + P]
        elif self.layout == "page_first":
            page = self.kv_buffer[:, index:index + P]
        else:   # page_first_direct, page_head: page-major
            page = self.kv_buffer[:, index // P:index // P + 1]
        return page.flatten() if flat else page

    def get_page_buffer_meta(self, indices: Any) -> Tuple[List[int], List[int]]:
        """Zero-copy metadata: for every page of @indices (token slots, page
        multiples), layer_first gives a (K, V) pointer pair per layer of
        page_size*H*D*s bytes each; the page-first layouts one (K, V) pair
        per page of layer_num*page_size*H*D*s bytes each."""
        if len(indices) % self.page_size:
            raise AssertionError("indices not in whole pages")
        if self.layout == "page_head":
            raise NotImplementedError("page_head: zero-copy page meta is "
                                      "not reproduced")
        idx = indices.tolist()
        buf = self.kv_buffer
        base = (buf.data_ptr() if hasattr(buf, "data_ptr")  # a torch tensor
                else buf.__array_interface__["data"][0])
        s = self.dtype.itemsize
        e = self.head_num * self.head_dim * s
        v_offset = self.layer_num * self.size * e
        ptrs: List[int] = []
        if self.layout == "layer_first":
            for i in range(0, len(idx), self.page_size):
                for layer in range(self.layer_num):
                    k = base + idx[i] * e + layer * self.size * e
                    ptrs += [k, k + v_offset]
            size = self.page_size * e
        else:
            for i in range(0, len(idx), self.page_size):
                k = base + idx[i] * self.layer_num * e
                ptrs += [k, k + v_offset]
            size = self.layer_num * self.page_size * e
        return ptrs, [size] * len(ptrs)


@dataclass
class MLADevicePoolInfo:
    """NOT UPSTREAM: the fields of SGLang's MLATokenToKVPool the MLA host
    pool reads."""
    kv_lora_rank: int
    qk_rope_head_dim: int
    layer_num: int
    size: int
    store_dtype: Any = np.float32
    start_layer: int = 0
    device: str = "cpu"
    index_head_dim: Optional[int] = None

    @property
    def end_layer(self) -> int:
        return self.start_layer + self.layer_num - 1


class MLATokenToKVPoolHost(HostKVCache):
    """One latent per token and layer (no separate V). As at 01c0ede38cc9
    also: override_kv_cache_dim (a latent row wider than kv_lora_rank +
    qk_rope_head_dim, e.g. FP8 DSA's packed row), dcp_size (the page split
    over decode-context-parallel ranks: page_size // dcp_size per rank),
    the per-layer views data_refs and their pointer table data_ptrs (the
    GPU copy kernels' host addresses; page_first's are transposed views)
    — a uint64 NumPy array here, a torch tensor upstream."""

    def __init__(self, device_pool: MLADevicePoolInfo,
                 host_to_device_ratio: float, host_size: int, page_size: int,
                 layout: str, pin_memory: bool = True,
                 device: str = "cpu",
                 override_kv_cache_dim: Optional[int] = None,
                 dcp_size: int = 1) -> None:
        self.override_kv_cache_dim = override_kv_cache_dim
        assert page_size % dcp_size == 0
        self.dcp_size = dcp_size
        super().__init__(device_pool, host_to_device_ratio, host_size,
                         page_size // dcp_size, layout, pin_memory, device)
        if self.layout in ("page_first", "page_first_kv_split"):
            t = self.kv_buffer.swapaxes(0, 1)
            self.data_refs = [t[i] for i in range(self.layer_num)]
        else:
            self.data_refs = [self.kv_buffer[i]
                              for i in range(self.layer_num)]
        self.data_ptrs = np.array(
            [x.__array_interface__["data"][0] for x in self.data_refs],
            dtype=np.uint64)

    def get_size_per_token(self) -> int:
        self.kv_lora_rank = self.device_pool.kv_lora_rank
        self.qk_rope_head_dim = self.device_pool.qk_rope_head_dim
        self.layer_num = self.device_pool.layer_num
        self.kv_cache_dim = self.override_kv_cache_dim or (
            self.kv_lora_rank + self.qk_rope_head_dim)
        return self.kv_cache_dim * self.dtype.itemsize * self.layer_num

    def get_page_buffer_meta(self, indices: Any) -> Tuple[List[int], List[int]]:
        """Zero-copy metadata as at 01c0ede38cc9: layer_first one pointer
        per page and layer (page_size * kv_cache_dim * s bytes at slot *
        kv_cache_dim * s + layer * size * kv_cache_dim * s); page_first and
        page_first_direct one per page (layer_num * page_size *
        kv_cache_dim * s bytes at slot * layer_num * kv_cache_dim * s);
        page_first_kv_split a latent and a rope pointer per page."""
        assert len(indices) % self.page_size == 0
        idx = indices.tolist()
        s = self.dtype.itemsize
        L, Dk, P = self.layer_num, self.kv_cache_dim, self.page_size
        pages = range(0, len(idx), P)
        if self.layout == "page_first_kv_split":
            kb = self.k_buffer.__array_interface__["data"][0]
            vb = self.v_buffer.__array_interface__["data"][0]
            kw, rw = self.kv_lora_rank, self.qk_rope_head_dim
            ptrs = [p for i in pages for p in
                    (kb + idx[i] * L * kw * s, vb + idx[i] * L * rw * s)]
            return ptrs, [L * s * P * w for _ in pages for w in (kw, rw)]
        base = self.kv_buffer.__array_interface__["data"][0]
        if self.layout == "layer_first":
            ptrs = [base + idx[i] * Dk * s + layer * self.size * Dk * s
                    for i in pages for layer in range(L)]
            return ptrs, [s * P * Dk] * len(ptrs)
        if self.layout in ("page_first", "page_first_direct"):
            ptrs = [base + idx[i] * L * Dk * s for i in pages]
            return ptrs, [L * s * P * Dk] * len(ptrs)
        raise ValueError(f"Unsupported layout: {self.layout}")

    def init_kv_buffer(self) -> np.ndarray:
        L, N, Dk, P = self.layer_num, self.size, self.kv_cache_dim, \
            self.page_size
        if self.layout == "layer_first":
            dims: Tuple[int, ...] = (L, N, 1, Dk)
        elif self.layout == "page_first":
            dims = (N, L, 1, Dk)
        elif self.layout == "page_first_direct":
            dims = (self.page_num, L, P, 1, Dk)
        elif self.layout == "page_first_kv_split":
            base = (self.page_num, L, P, 1)
            self.k_buffer = np.zeros(base + (self.kv_lora_rank,), self.dtype)
            self.v_buffer = np.zeros(base + (self.qk_rope_head_dim,),
                                     self.dtype)
            return self.k_buffer
        else:
            raise ValueError(f"Unsupported layout: {self.layout}")
        self.token_stride_size = Dk * self.dtype.itemsize
        self.layout_dim = self.token_stride_size * L
        return np.zeros(dims, dtype=self.dtype)
