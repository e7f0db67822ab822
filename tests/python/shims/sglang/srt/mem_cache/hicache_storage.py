"""STAND-IN for SGLang v0.5.6.post2 (commit 5c8bd8b51b53)
python/sglang/srt/mem_cache/hicache_storage.py: reproduces only the
storage-backend interface (HiCacheStorage and its abstract methods, the
zero-copy batch_get_v1 / batch_set_v1, batch_exists as the leading run),
HiCacheStorageConfig, HiCacheStorageExtraInfo and the chained page hash
get_hash_str(); not SGLang. Written for the kvtier tests from reading the
upstream file; no upstream code.

Differences from upstream, on purpose: the type of a tensor is not checked
(numpy arrays and lists stand in for torch tensors); HiCacheFile and the
other built-in backends are absent.
"""
from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, List, Optional


def get_hash_str(token_ids: List[int], prior_hash: Optional[str] = None) -> str:
    """SGLang's page key: SHA-256 over the previous page's key (its 32 raw
    bytes, when there is one) then every token id as 4 little-endian
    unsigned bytes; the hex digest. Page i's key so stands for pages 0..i."""
    h = hashlib.sha256()
    if prior_hash:
        h.update(bytes.fromhex(prior_hash))
    for t in token_ids:
        h.update(int(t).to_bytes(4, byteorder="little", signed=False))
    return h.hexdigest()


@dataclass
class HiCacheStorageConfig:
    """What the cache controller tells a backend at creation (v0.5.6.post2
    fields: later versions add pp/cp/dp ranks)."""
    tp_rank: int
    tp_size: int
    is_mla_model: bool
    is_page_first_layout: bool
    model_name: Optional[str]
    extra_config: Optional[dict] = None


@dataclass
class HiCacheStorageExtraInfo:
    """Passed with every batch call. prefix_keys: the keys of the pages
    before the call's first key, only when the server was started with
    "hicache_storage_pass_prefix_keys": true in the extra config (else
    None). (Upstream's default is the tuple (None,), a typo; the controller
    always passes the field explicitly.)"""
    prefix_keys: Optional[List[str]] = None
    extra_info: Optional[dict] = None


class HiCacheStorage(ABC):
    """The third-level (storage) backend of SGLang's hierarchical cache."""

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        self.mem_pool_host = mem_pool_host

    def batch_get_v1(self, keys: List[str], host_indices: Any,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None
                     ) -> List[bool]:
        """Zero copy: load the pages of @keys into the host pool at
        @host_indices (token slots, page_size per key); per-key success.
        (Upstream's base returns None.)"""
        return None  # type: ignore[return-value]

    def batch_set_v1(self, keys: List[str], host_indices: Any,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None
                     ) -> List[bool]:
        """Zero copy: store the host pool's pages at @host_indices under
        @keys; per-key success. (Upstream's base returns None.)"""
        return None  # type: ignore[return-value]

    @abstractmethod
    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> Any:
        ...

    @abstractmethod
    def batch_get(self, keys: List[str],
                  target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> Any:
        ...

    @abstractmethod
    def set(self, key: str, value: Optional[Any] = None,
            target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        ...

    @abstractmethod
    def batch_set(self, keys: List[str], values: Optional[Any] = None,
                  target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        ...

    @abstractmethod
    def exists(self, key: str) -> bool:
        ...

    def batch_exists(self, keys: List[str],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None
                     ) -> int:
        """How many of @keys, from the first, exist (the leading run)."""
        for i, k in enumerate(keys):
            if not self.exists(k):
                return i
        return len(keys)

    def clear(self) -> None:
        pass

    def get_stats(self) -> Any:
        return None
