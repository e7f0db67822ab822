"""kvtier.staging: engine KV the daemon cannot map (a GPU's) moved through
staging blocks, against a real daemon. The engine arrays here are plain
host arrays the daemon has not mapped — the path a GPU engine takes, with
host copies in place of the device copies (torch on CPU when installed)."""
from __future__ import annotations

import numpy as np
import pytest

import kvtier
import kvtier.staging as staging
import kvt_testutil
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


def full_warnings(caplog):
    return [r for r in caplog.records
            if "staging pool" in r.getMessage() and "full" in r.getMessage()]


def test_full_pool_warns_and_counts(tiny_daemon, caplog, monkeypatch):
    """Pages that find the pool full are counted (per pool and for the
    process) and logged at warning level, at most once every WARN_EVERY_S
    with the count since (issue 21, finding 10: nothing said so)."""
    caplog.set_level("WARNING", logger="kvtier.staging")
    g, a = engine_kv(8, seed=5)
    before = dict(staging.counters)
    with kvtier.Client(g, socket=tiny_daemon) as cl:
        pool = StagingPool(cl, a, nblocks=2)
        keys = cl.hash_tokens(list(range(100, 100 + 5 * P)))
        st = pool.store(keys, [0, 1, 2, 3, 4])
        st.copy_all()
        st.submit()
        assert st.wait() == [] and st.dropped == 3
        w = full_warnings(caplog)
        assert len(w) == 1 and w[0].levelname == "WARNING"
        assert "3 pages not staged" in w[0].getMessage()
        ld = pool.load(keys[:3], [5, 6, 7])  # 2 staged, 1 not: counted
        ld.wait(timeout=10)
        assert len(full_warnings(caplog)) == 1
        assert pool.stats["unstaged_store_pages"] == 3
        assert pool.stats["unstaged_load_pages"] == 1
        monkeypatch.setattr(staging, "WARN_EVERY_S", 0.0)
        ld = pool.load(keys[:3], [5, 6, 7])
        ld.wait(timeout=10)
        w = full_warnings(caplog)
        assert len(w) == 2 and "2 pages not staged" in w[1].getMessage()
        pool.close()
    assert staging.counters["unstaged_store_pages"] == \
        before["unstaged_store_pages"] + 3
    assert staging.counters["unstaged_load_pages"] == \
        before["unstaged_load_pages"] + 2


@pytest.mark.parametrize("code", [0, 2])
def test_pin_fallback_warns_and_counts(tiny_daemon, caplog, monkeypatch,
                                       code):
    """Staging memory for a CUDA engine that cannot be page-locked works
    pageable: a warning and a count, never silent (it was logged at
    info level, uncounted). CUDA is faked (cudaHostRegister answers
    @code); engine KV on a device that is not CUDA is not pinned at all,
    and says why."""
    torch = pytest.importorskip("torch")
    rt = kvt_testutil.FakeCudart(code)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: rt)
    caplog.set_level("WARNING", logger="kvtier.staging")
    g, a = engine_kv(8, seed=6, torch_mod=torch)
    before = staging.counters["pin_fallbacks"]
    with kvtier.Client(g, socket=tiny_daemon) as cl:
        pool = StagingPool(cl, a, nblocks=2)  # CPU tensors: no pin
        assert pool.pinned == "pageable (engine KV on cpu)"
        assert rt.calls == [] and pool.stats["pin_fallbacks"] == 0
        pool.close()
        pool = StagingPool(cl, a, nblocks=2)
        got = staging.pin_memory(pool.mem)  # what a CUDA engine's pool does
        assert rt.calls[0][0] == "register"
        assert rt.calls[0][2] == pool.mem.buffer.nbytes
        w = [r for r in caplog.records if "pageable" in r.getMessage()]
        if code:
            assert got == "pageable (cudaHostRegister: 2)"
            assert len(w) == 1 and w[0].levelname == "WARNING"
            assert staging.counters["pin_fallbacks"] == before + 1
        else:
            assert got == "pinned" and w == []
            assert staging.counters["pin_fallbacks"] == before
            staging.unpin_memory(pool.mem)
            assert rt.calls[-1][0] == "unregister"
        pool.close()
