# STAND-IN for vLLM vllm/v1/attention/backends/mla/common.py (MLACommonBackend,
# upstream at 37fa5c0940ef6770b265fe3a99581fec91f9cf2d): reproduces only
# get_kv_cache_shape (num_blocks, block_size, head_size) with head_size =
# kv_lora_rank + qk_rope_head_dim and num_kv_heads 1, one latent per token;
# not vLLM.
from __future__ import annotations

from typing import Tuple


class MLACommonBackend:
    @staticmethod
    def get_name() -> str:
        return "MLA"

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int,
                           num_kv_heads: int, head_size: int,
                           cache_dtype_str: str = "auto") -> Tuple[int, ...]:
        assert num_kv_heads == 1
        return (num_blocks, block_size, head_size)

    @staticmethod
    def get_kv_cache_stride_order() -> Tuple[int, ...]:
        return (0, 1, 2)
