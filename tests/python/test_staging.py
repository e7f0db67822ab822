"""kvtier.staging: engine KV the daemon cannot map (a GPU's) moved through
staging blocks, against a real daemon. The engine arrays here are plain
host arrays the daemon has not mapped — the path a GPU engine takes, with
host copies in place of the device copies (torch on CPU when installed)."""
from __future__ import annotations

import numpy as np
import pytest

import kvtier
import tinymodel
from kvtier.staging import StagingPool

P = 4


def engine_kv(nblocks: int, seed: int, torch_mod=None):
    g = kvtier.Geometry.from_config(tinymodel.CONFIG, page_tokens=P)
    rng = np.random.default_rng(seed)
    arrs = [rng.standard_normal((2, nblocks, P, g.kv_heads, g.head_dim))
            .astype(np.float32) for _ in range(g.layers)]
    if torch_mod is not None:
        arrs = [torch_mod.from_numpy(a) for a in arrs]
    return g, arrs


def np_of(a):
    return a.numpy() if hasattr(a, "numpy") else a


def check_roundtrip(sock, torch_mod=None):
    g, a = engine_kv(16, seed=1, torch_mod=torch_mod)
    _, b = engine_kv(12, seed=2, torch_mod=torch_mod)
    toks = list(range(40, 40 + 6 * P))
    with kvtier.Client(g, socket=sock) as ca, kvtier.Client(g, socket=sock) as cb:
        sa = StagingPool(ca, a, nblocks=4)
        sb = StagingPool(cb, b, nblocks=8)
        keys = ca.hash_tokens(toks)
        src = [5, 1, 9, 14, 0, 7]
        # pages 0..3 first (the pool holds 4), then 4..5
        st = sa.store(keys[:4], src[:4])
        for l in range(g.layers):
            st.copy_layer(l)
        st.submit()
        assert st.wait() == [] and st.dropped == 0
        assert sa.free_blocks == 4
        st = sa.store(keys, src[4:], first=4)
        st.copy_all()
        st.submit()
        assert st.wait() == []
        dst = [11, 3, 0, 8, 2, 6]
        ld = sb.load(keys, dst)
        for l in range(g.layers):
            assert ld.wait_layer(l, timeout=10)
        assert ld.wait() == [] and sb.free_blocks == 8
        for l in range(g.layers):
            assert np.array_equal(np_of(a[l])[:, src], np_of(b[l])[:, dst])
        sa.close()
        sb.close()


def test_staged_roundtrip_numpy(tiny_daemon):
    check_roundtrip(tiny_daemon)


def test_staged_roundtrip_torch(tiny_daemon):
    torch = pytest.importorskip("torch")
    check_roundtrip(tiny_daemon, torch)


def test_staging_exhausted_and_absent(tiny_daemon):
    g, a = engine_kv(8, seed=3)
    _, b = engine_kv(8, seed=4)
    before = [x.copy() for x in b]
    with kvtier.Client(g, socket=tiny_daemon) as cl:
        pool = StagingPool(cl, a, nblocks=2)
        keys = cl.hash_tokens(list(range(5 * P)))
        # a store of 5 pages through 2 staging blocks: 3 dropped
        st = pool.store(keys, [0, 1, 2, 3, 4])
        st.copy_all()
        st.submit()
        assert st.wait() == [] and st.dropped == 3
        assert cl.lookup(keys).pages == 2
        pool.close()
        pool = StagingPool(cl, b, nblocks=3)
        # load 5: pages 2..4 are absent -> failed; 2 that fit load
        held = pool._take(1)  # one staging block busy elsewhere
        ld = pool.load(keys, [7, 6, 5, 4, 3])
        failed = ld.wait(timeout=10)
        assert sorted(failed) == [3, 4, 5]
        for l in range(g.layers):
            assert np.array_equal(b[l][:, [7, 6]], a[l][:, [0, 1]])
            assert np.array_equal(b[l][:, [4, 3]], before[l][:, [4, 3]])
        pool._give(held)
        assert pool.free_blocks == 3
        # nothing cached: every block fails, wait_layer says so
        other = cl.hash_tokens(list(range(1000, 1000 + 2 * P)))
        ld = pool.load(other, [0, 1])
        assert ld.wait_layer(0, timeout=10) is False
        assert sorted(ld.wait()) == [0, 1]
        with pytest.raises(ValueError, match="shape"):
            StagingPool(cl, [x[:, :, :2] for x in b], 2)
        with pytest.raises(ValueError, match="blocks for"):
            pool.load(keys, [0])
        pool.close()
