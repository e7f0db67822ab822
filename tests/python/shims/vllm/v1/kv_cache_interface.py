# STAND-IN for vLLM vllm/v1/kv_cache_interface.py (both generations):
# reproduces only the KVCacheConfig a connector is constructed with
# (num_blocks, kv_cache_tensors, kv_cache_groups of KVCacheGroupSpec with
# layer_names and a kv_cache_spec) and the spec classes' names and
# fields (FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec,
# MambaSpec); not vLLM.
from __future__ import annotations

import dataclasses
from typing import Any, List, Optional


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: Any = None


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
