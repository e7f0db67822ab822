# STAND-IN for vLLM vllm/v1/kv_cache_interface.py (both generations):
# reproduces only the KVCacheConfig a connector is constructed with
# (num_blocks, kv_cache_tensors, kv_cache_groups of KVCacheGroupSpec with
# layer_names and a kv_cache_spec) and the spec classes' names and
# fields (FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec,
# MambaSpec), and page_size_bytes: one block of one layer (attention: K
# and V, float32 unless dtype says; mamba: page_size_padded, to which
# vLLM pads the state page so it equals the attention page, else its
# shapes' float32 bytes). MambaSpec.mamba_cache_mode is CacheConfig's
# ("none" by default, as upstream). Not vLLM.
from __future__ import annotations

import dataclasses
from typing import Any, List, Optional


def _itemsize(dtype: Any) -> int:
    return int(getattr(dtype, "itemsize", 0) or 4)


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: Any = None

    @property
    def page_size_bytes(self) -> int:
        return (2 * self.block_size * self.num_kv_heads * self.head_size *
                _itemsize(self.dtype))


@dataclasses.dataclass(frozen=True)
class FullAttentionSpec(AttentionSpec):
    sliding_window: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class MLAAttentionSpec(FullAttentionSpec):
    cache_dtype_str: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class SlidingWindowSpec(AttentionSpec):
    sliding_window: int = 0


@dataclasses.dataclass(frozen=True)
class MambaSpec:
    block_size: int
    shapes: tuple = ()
    mamba_cache_mode: str = "none"
    page_size_padded: Optional[int] = None

    @property
    def page_size_bytes(self) -> int:
        if self.page_size_padded is not None:
            return self.page_size_padded
        n = 0
        for shp in self.shapes:
            k = 1
            for d in shp:
                k *= d
            n += 4 * k
        return n


@dataclasses.dataclass
class KVCacheTensor:
    size: int
    shared_by: List[str]


@dataclasses.dataclass
class KVCacheGroupSpec:
    layer_names: List[str]
    kv_cache_spec: Any


@dataclasses.dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: List[KVCacheTensor]
    kv_cache_groups: List[KVCacheGroupSpec]
