# STAND-IN for vLLM vllm/v1/attention/backends/utils.py: reproduces only
# get_kv_cache_layout() (NHD by default; HND when the test sets it, as
# VLLM_KV_CACHE_LAYOUT or a connector's required layout does upstream) and
# the 5-dimensional stride order FlashAttention and FlashInfer share; not
# vLLM.
from __future__ import annotations

import os


def get_kv_cache_layout() -> str:
    return os.environ.get("VLLM_KV_CACHE_LAYOUT", "NHD")


def nhd_hnd_stride_order():
    """(0, 1, 2, 3, 4) for NHD, tokens and heads swapped for HND."""
    layout = get_kv_cache_layout()
    if layout == "NHD":
        return (0, 1, 2, 3, 4)
    if layout == "HND":
        return (0, 1, 3, 2, 4)
    raise ValueError(f"Unknown cache layout format {layout}.")
