# STAND-IN for vLLM vllm/v1/attention/backends/flashinfer.py (current and
# v0.12; upstream at 5314c90d9f16e7c14523f496b0b8f883693951d4 holds the same
# shape): reproduces only get_kv_cache_shape (block outer: (num_blocks, 2,
# block_size, num_kv_heads, head_size)) and get_kv_cache_stride_order (NHD
# as the shape, HND (0, 1, 3, 2, 4)); not vLLM.
from __future__ import annotations

from typing import Tuple

from .utils import nhd_hnd_stride_order


class FlashInferBackend:
    @staticmethod
    def get_name() -> str:
        return "FLASHINFER"

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int,
                           num_kv_heads: int, head_size: int,
                           cache_dtype_str: str = "auto") -> Tuple[int, ...]:
        return (num_blocks, 2, block_size, num_kv_heads, head_size)

    @staticmethod
    def get_kv_cache_stride_order() -> Tuple[int, ...]:
        return nhd_hnd_stride_order()
