"""kvtier.layout (a KV tensor's registration from its own strides) and
kvtier.vllm_compat (vLLM's interface generations) on their own: every
derivation the connectors rely on, the refusals with their reasons, and
both forms of every call that differs between vLLM releases (the v0.11
form of resumed requests included, which no stand-in generation has)."""
from __future__ import annotations

import types

import numpy as np
import pytest

from kvtier import layout as kl
from kvtier import vllm_compat as vc

P, H, D, N = 4, 2, 8, 6


def fa(order=(0, 1, 2, 3, 4), dtype=np.float32):
    """A FlashAttention-shaped (2, N, P, H, D) array in the physical order
    @order (vLLM's stride order)."""
    shape = (2, N, P, H, D)
    phys = tuple(shape[i] for i in order)
    inv = tuple(order.index(i) for i in range(5))
    return np.zeros(phys, dtype).transpose(inv)


def test_derive_packed_and_rows():
    s = 4
    lay = kl.derive([kl.describe(fa())], kl.VLLM_SHAPES["flash_attn"], P, H,
                    D, 2)
    assert (lay.block_stride, lay.kv_stride, lay.token_stride,
            lay.head_stride, lay.rows) == (P * H * D * s, N * P * H * D * s,
                                           H * D * s, D * s, False)
    hnd = kl.derive([kl.describe(fa((0, 1, 3, 2, 4)))],
                    kl.VLLM_SHAPES["flash_attn"], P, H, D, 2)
    assert (hnd.token_stride, hnd.head_stride, hnd.rows) == \
        (D * s, P * D * s, True)
    assert hnd.span == 2 * N * P * H * D * s    # the whole tensor
    # SGLang page_first: a slot dimension, layers between tokens
    buf = np.zeros((2, N * P, 3, H, D), np.float16)
    sg = kl.derive([kl.describe(buf)], kl.sglang_roles("page_first", False),
                   P, H, D, 2, layers=3)
    assert sg.token_stride == 3 * H * D * 2 and sg.rows
    assert sg.addrs[1] - sg.addrs[0] == H * D * 2


def test_refusals_say_why():
    with pytest.raises(kl.LayoutError, match="not contiguous"):
        kl.derive([kl.describe(fa((0, 1, 2, 4, 3)))],
                  kl.VLLM_SHAPES["flash_attn"], P, H, D, 2)
    with pytest.raises(kl.LayoutError, match="block size"):
        kl.derive([kl.describe(fa())], kl.VLLM_SHAPES["flash_attn"], 8, H,
                  D, 2)
    with pytest.raises(kl.LayoutError, match="KV heads"):
        kl.derive([kl.describe(fa())], kl.VLLM_SHAPES["flash_attn"], P, 4,
                  D, 2)
    a, b = fa(), fa((0, 1, 3, 2, 4))
    with pytest.raises(kl.LayoutError, match="layers differ"):
        kl.derive([kl.describe(a), kl.describe(b)],
                  kl.VLLM_SHAPES["flash_attn"], P, H, D, 2)
    with pytest.raises(kl.LayoutError, match="two buffers"):
        kl.sglang_roles("page_first_kv_split", True)
    with pytest.raises(kl.LayoutError, match="unknown"):
        kl.sglang_roles("page_sideways", False)


def test_roles_from_backend_or_shape():
    def fi(nb, bs, h, d, cache_dtype_str="auto"):
        return (nb, 2, bs, h, d)
    assert kl.vllm_roles((N, 2, P, H, D), P, H, D, False, fi) == \
        kl.VLLM_SHAPES["flashinfer"]
    # without a backend: by the known shapes
    assert kl.vllm_roles((2, N, H, P, D), P, H, D, False) == \
        kl.VLLM_SHAPES["cpu"]
    assert kl.vllm_roles((N, P, 24), P, 1, 24, True) == kl.VLLM_SHAPES["mla"]
    # H == P: FlashAttention's and the CPU backend's shapes coincide
    with pytest.raises(kl.LayoutError, match="several layouts"):
        kl.vllm_roles((2, N, 4, 4, D), 4, 4, D, False)
    with pytest.raises(kl.LayoutError, match="no layout kvtier knows"):
        kl.vllm_roles((3, N, P, H, D), P, H, D, False)


def test_vllm_compat_forms():
    # handle_preemptions: v0.12's set of ids, later the metadata
    assert vc.preempted_ids({"a", "b"}) == {"a", "b"}
    assert vc.preempted_ids(types.SimpleNamespace(preempted={"c"})) == {"c"}
    assert vc.preempted_ids(None) == set()
    with pytest.raises(TypeError, match="neither request ids"):
        vc.preempted_ids(object())
    # resumed requests: resumed_req_ids, or v0.11's per-request list
    new = types.SimpleNamespace(req_ids=["a", "b"], resumed_req_ids={"b"})
    old = types.SimpleNamespace(req_ids=["a", "b"],
                                resumed_from_preemption=[True, False])
    assert vc.resumed_ids(new) == {"b"} and vc.resumed_ids(old) == {"a"}
    # publishable hashes: bounded where vLLM says so
    r = types.SimpleNamespace(num_publishable_block_hashes=3)
    assert vc.publishable_blocks(r, 5) == 3
    assert vc.publishable_blocks(types.SimpleNamespace(), 5) == 5
