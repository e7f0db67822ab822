"""STAND-IN for SGLang python/sglang/srt/mem_cache/hicache_storage.py in the
generation of sglang/__init__.py (v0.5.6.post2 at 5c8bd8b51b53; current at
001067fffe33): reproduces only the storage-backend interface
(HiCacheStorage and its abstract methods, the zero-copy batch_get_v1 /
batch_set_v1 — returning None in v0.5.6.post2's base, raising
NotImplementedError in current's, whose docstring says why: a None kills
the never-restarted prefetch thread —, batch_exists as the leading run;
current's batch_*_v2 and register_mem_host_pool_v2 as unimplemented
stubs), HiCacheStorageConfig (current adds pp / attn_cp / dp ranks,
enable_storage_metrics, tp_lcm_size, should_split_heads),
HiCacheStorageExtraInfo and the chained page hash get_hash_str(); not
SGLang. Written for the kvtier tests from reading the upstream file; no
upstream code.

Differences from upstream, on purpose: the type of a tensor is not checked
(numpy arrays and lists stand in for torch tensors); HiCacheFile and the
other built-in backends are absent.
"""
from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, List, Optional

from sglang import GENERATION as _GEN

if TYPE_CHECKING:   # the annotations name them, as upstream's do
    import torch
    from sglang.srt.mem_cache.memory_pool_host import \
        HostKVCache  # noqa: F401


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


if _GEN == "v0.5.6.post2":
    @dataclass
    class HiCacheStorageConfig:
        """What the cache controller tells a backend at creation."""
        tp_rank: int
        tp_size: int
        is_mla_model: bool
        is_page_first_layout: bool
        model_name: Optional[str]
        extra_config: Optional[dict] = None
else:
    @dataclass
    class HiCacheStorageConfig:  # type: ignore[no-redef]
        """What the cache controller tells a backend at creation."""
        tp_rank: int
        tp_size: int
        pp_rank: int
        pp_size: int
        attn_cp_rank: int
        attn_cp_size: int
        is_mla_model: bool
        enable_storage_metrics: bool
        is_page_first_layout: bool
        model_name: Optional[str]
        dp_rank: int = 0
        dp_size: int = 1
        tp_lcm_size: Optional[int] = None
        should_split_heads: bool = False
        extra_config: Optional[dict] = None


def make_storage_config(**kw: Any) -> "HiCacheStorageConfig":
    """NOT UPSTREAM: the config as the controller of this generation fills
    it (current: pp / cp / dp ranks 0 of 1, storage metrics on)."""
    if _GEN != "v0.5.6.post2":
        for k, v in (("pp_rank", 0), ("pp_size", 1), ("attn_cp_rank", 0),
                     ("attn_cp_size", 1), ("enable_storage_metrics", True)):
            kw.setdefault(k, v)
    return HiCacheStorageConfig(**kw)


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

    def register_mem_pool_host(self, mem_pool_host: HostKVCache) -> None:
        self.mem_pool_host = mem_pool_host

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None
                     ) -> List[bool]:
        """Zero copy: load the pages of @keys into the host pool at
        @host_indices (token slots, page_size per key); per-key success."""
        if _GEN == "v0.5.6.post2":
            return None  # type: ignore[return-value]
        raise NotImplementedError()

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None
                     ) -> List[bool]:
        """Zero copy: store the host pool's pages at @host_indices under
        @keys; per-key success."""
        if _GEN == "v0.5.6.post2":
            return None  # type: ignore[return-value]
        raise NotImplementedError()

    if _GEN != "v0.5.6.post2":
        def register_mem_host_pool_v2(self, host_pool: Any,
                                      host_pool_name: Any) -> None:
            if not hasattr(self, "registered_pools"):
                self.registered_pools = {}
            self.registered_pools[host_pool_name] = host_pool

        def batch_exists_v2(self, keys: List[str],
                            pool_transfers: Optional[List[Any]] = None,
                            extra_info: Optional[HiCacheStorageExtraInfo]
                            = None) -> Any:
            raise NotImplementedError()

        def batch_get_v2(self, transfers: List[Any],
                         extra_info: Optional[HiCacheStorageExtraInfo] = None
                         ) -> dict:
            raise NotImplementedError()

        def batch_set_v2(self, transfers: List[Any],
                         extra_info: Optional[HiCacheStorageExtraInfo] = None
                         ) -> dict:
            raise NotImplementedError()

    @abstractmethod
    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> torch.Tensor | None:
        ...

    @abstractmethod
    def batch_get(self, keys: List[str],
                  target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None
                  ) -> List[torch.Tensor | None] | int:
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
