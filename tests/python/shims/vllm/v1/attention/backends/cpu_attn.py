# STAND-IN for vLLM vllm/v1/attention/backends/cpu_attn.py (read at
# 00358600ed52e00c3c99b35e54aa916f900c4c15): reproduces only
# CPUAttentionBackend.get_kv_cache_shape (2, num_blocks, num_kv_heads,
# block_size, head_size) — heads before tokens, no stride order, no fp8
# (upstream raises for a quantized KV cache); not vLLM.
from __future__ import annotations

from typing import Tuple


class CPUAttentionBackend:
    @staticmethod
    def get_name() -> str:
        return "CPU_ATTN"

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int,
                           num_kv_heads: int, head_size: int,
                           cache_dtype_str: str = "auto") -> Tuple[int, ...]:
        return 2, num_blocks, num_kv_heads, block_size, head_size

    @staticmethod
    def get_kv_cache_stride_order() -> Tuple[int, ...]:
        return (0, 1, 2, 3, 4)
