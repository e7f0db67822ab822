# STAND-IN for vLLM vllm/v1/attention/backends/flash_attn.py (read at
# 0084b783bcda6d7ee15c337b1062cbee9985c954, the v0.12-era shape; later
# releases moved FlashAttention to FlashInfer's block-outer shape, which
# kvtier derives the same way): reproduces only get_kv_cache_shape (K/V
# outer: (2, num_blocks, block_size, num_kv_heads, head_size)) and
# get_kv_cache_stride_order (NHD: as the shape; HND: heads before tokens,
# (0, 1, 3, 2, 4)); not vLLM.
from __future__ import annotations

from typing import Tuple

from .utils import nhd_hnd_stride_order


class FlashAttentionBackend:
    @staticmethod
    def get_name() -> str:
        return "FLASH_ATTN"

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int,
                           num_kv_heads: int, head_size: int,
                           cache_dtype_str: str = "auto") -> Tuple[int, ...]:
        if block_size % 16 != 0 and block_size not in (1, 2, 4, 8):
            raise ValueError("Block size must be a multiple of 16.")
        return (2, num_blocks, block_size, num_kv_heads, head_size)

    @staticmethod
    def get_kv_cache_stride_order() -> Tuple[int, ...]:
        return nhd_hnd_stride_order()
