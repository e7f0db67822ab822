"""kvtier.sglang (SGLang HiCache storage backend) against a real daemon,
driven by the SGLang v0.5.6.post2 stand-ins (tests/python/shims/sglang) in
SGLang's call order: backend made by the dynamic factory, host pool
registered, backups after write-through, prefetch (batch_exists then
batch_get_v1), several requests, partial hits, both host layouts, failed
pages, bad configuration."""
from __future__ import annotations

import numpy as np
import pytest

import kvtier
import kvt_testutil
import sglang_engine as eng
import tinymodel
from sglang.srt.managers.cache_controller import as_indices, page_hashes
from sglang.srt.mem_cache.hicache_storage import (HiCacheStorageExtraInfo,
                                                  make_storage_config)
from sglang.srt.mem_cache.storage import StorageBackendFactory
from sglang.srt.metrics.collector import StorageMetrics

P = eng.P
LAYOUTS = ["layer_first", "page_first_direct"]


def fill_pages(pool, slots, seed):
    """Random K/V in the host pages of @slots (as a write-through would)."""
    kv, rng = eng.kv_view(pool), np.random.default_rng(seed)
    for b in {int(s) // P for s in slots}:
        for l in range(pool.layer_num):
            kv.k(l)[b] = rng.standard_normal(kv.k(l)[b].shape)
            kv.v(l)[b] = rng.standard_normal(kv.v(l)[b].shape)


def pages_of(pool, slots):
    """Each page's K/V of every layer: [pages][layers](k, v) copies."""
    kv = eng.kv_view(pool)
    blocks = [int(slots[i]) // P for i in range(0, len(slots), P)]
    return [[(kv.k(l)[b].copy(), kv.v(l)[b].copy())
             for l in range(pool.layer_num)] for b in blocks]


def same_pages(a, b):
    return len(a) == len(b) and all(
        np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1])
        for pa, pb in zip(a, b) for x, y in zip(pa, pb))


def backup(ctl, tokens, seed, prefix_keys=None):
    """A request's pages written through to the host pool, then backed up
    to storage. Returns (slots, keys)."""
    n = len(tokens) // P * P
    slots = ctl.mem_pool_host.alloc(n)
    fill_pages(ctl.mem_pool_host, slots, seed)
    keys = page_hashes(tokens, P)
    op = ctl.write_storage(slots, tokens[:n], hash_value=keys,
                           prefix_keys=prefix_keys)
    assert ctl.backup(op) == n
    return slots, keys


def prefetch(ctl, tokens):
    """A request with nothing local: prefetch its whole pages. Returns
    (tokens now in the host pool, the slots holding them)."""
    n = len(tokens) // P * P
    slots = ctl.mem_pool_host.alloc(n)
    op = ctl.prefetch("r", slots, tokens[:n])
    got = ctl.run_prefetch(op)
    for r in ctl.released:
        ctl.mem_pool_host.free(r)
    ctl.released.clear()
    return got, slots[:got]


@pytest.fixture
def sock(workdir):
    with kvt_testutil.daemon(workdir, tinymodel.CONFIG, page_tokens=P,
                             tiers="dram:8M") as s:
        yield s


@pytest.mark.parametrize("layout", LAYOUTS)
def test_requests_partial_hits_layouts(sock, layout):
    """Several requests in one engine and a second engine of the other
    layout: full and partial hits, bytes exact across layouts."""
    other = LAYOUTS[1 - LAYOUTS.index(layout)]
    a = eng.make_controller(eng.make_pool(layout, 64), sock)
    b = eng.make_controller(eng.make_pool(other, 64), sock)
    be = a.storage_backend
    assert type(be).__name__ == "KvtierStorage" and be.mem is not None
    # the pool now lives in the daemon-mapped memory
    assert a.mem_pool_host.kv_buffer.__array_interface__["data"][0] == \
        be.mem.layer_addrs[0]
    a.storage_batch_size = 3  # several batches per operation (upstream: 128)
    b.storage_batch_size = 3
    t1 = list(range(1, 1 + 7 * P))              # request 1: 7 pages
    s1, k1 = backup(a, t1, seed=1)
    assert be.batch_exists(k1) == 7
    # request 2 shares request 1's first 4 pages, then diverges
    t2 = t1[:4 * P] + list(range(200, 200 + 5 * P))
    k2 = page_hashes(t2, P)
    assert k2[:4] == k1[:4] and k2[4] != k1[4]
    assert be.batch_exists(k2) == 4             # leading run only
    got, slots = prefetch(b, t2)
    assert got == 4 * P
    assert same_pages(pages_of(b.mem_pool_host, slots),
                      pages_of(a.mem_pool_host, s1[:4 * P]))
    # request 2 computes and backs up its own pages: 4 present, 5 new
    s2, _ = backup(a, t2, seed=2)
    assert be.batch_exists(k2) == 9
    got, slots = prefetch(b, t2)
    assert got == 9 * P
    assert same_pages(pages_of(b.mem_pool_host, slots),
                      pages_of(a.mem_pool_host, s1[:4 * P]) +
                      pages_of(a.mem_pool_host, s2[4 * P:]))
    # request 3: a prompt nobody computed
    got, _ = prefetch(b, list(range(900, 900 + 3 * P)))
    assert got == 0
    m = be.get_stats()
    assert isinstance(m, StorageMetrics)
    assert sum(m.backup_pgs) == 7 + 9 and all(x > 0 for x in m.backup_bandwidth)
    assert b.storage_backend.get_stats().prefetch_pgs == [3, 1, 3, 3, 3]
    assert be.get_stats().backup_pgs == []   # drained by the last call
    a.storage_backend.close()
    b.storage_backend.close()


def test_failed_pages_are_false(sock):
    """Absent pages (and a daemon that went away) are False per page; the
    controller stops at the first and prefills from there."""
    ctl = eng.make_controller(eng.make_pool("page_first_direct", 32), sock)
    be = ctl.storage_backend
    toks = list(range(50, 50 + 5 * P))
    slots, keys = backup(ctl, toks, seed=3)
    dst = ctl.mem_pool_host.alloc(5 * P)
    bogus = page_hashes([7] * P, P)[0]
    res = be.batch_get_v1(keys[:2] + [bogus] + keys[3:], dst)
    assert res == [True, True, False, True, True]
    assert be.batch_exists(keys[:2] + [bogus] + keys[3:]) == 2
    assert be.exists(keys[0]) and not be.exists(bogus)
    # a page already stored is stored again without a copy: True
    assert be.batch_set_v1(keys[:2], slots[:2 * P]) == [True, True]
    # bad slot lists: every page False, logged and counted, never raised
    # (SGLang's I/O threads catch nothing and are never restarted)
    before = be.daemon_stats()["backend"]["errors"]
    assert be.batch_get_v1(keys[:2], dst[:P]) == [False, False]
    assert be.batch_get_v1(keys[:1], as_indices(range(1, 1 + P))) == [False]
    assert be.daemon_stats()["backend"]["errors"] == before + 2
    assert all(ctl.threads_alive().values())
    ctl.stop()
    ctl.storage_backend.close()


def test_daemon_gone(workdir):
    with kvt_testutil.daemon(workdir, tinymodel.CONFIG, page_tokens=P) as d:
        ctl = eng.make_controller(eng.make_pool("layer_first", 16), d)
        be = ctl.storage_backend
        slots, keys = backup(ctl, list(range(3 * P)), seed=4)
        d.kill()
        assert be.batch_get_v1(keys, slots) == [False] * 3
        assert be.batch_set_v1(keys, slots) == [False] * 3
        assert be.batch_exists(keys) == 0
        be.close()


def test_prefix_keys(sock):
    """prefix_keys (hicache_storage_pass_prefix_keys) change nothing: every
    page's chained key stands alone, whatever SGLang passes with it."""
    a = eng.make_controller(eng.make_pool("page_first_direct", 32), sock)
    toks = list(range(300, 300 + 6 * P))
    keys = page_hashes(toks, P)
    n = 6 * P
    slots = a.mem_pool_host.alloc(n)
    fill_pages(a.mem_pool_host, slots, 5)
    # a radix node of pages 3..5 backed up with its ancestors' keys
    op = a.write_storage(slots[3 * P:], toks[3 * P:n], hash_value=keys[3:],
                         prefix_keys=keys[:3])
    assert a.backup(op) == 3 * P
    be = a.storage_backend
    assert be.batch_exists(keys) == 0           # pages 0..2 not stored
    assert be.batch_exists(keys[3:],
                           HiCacheStorageExtraInfo(prefix_keys=keys[:3])) == 3
    op = a.write_storage(slots[:3 * P], toks[:3 * P], hash_value=keys[:3],
                         prefix_keys=[])
    assert a.backup(op) == 3 * P
    assert be.batch_exists(keys) == 6
    # another salt ("salt" in the extra config): other keys, no hits
    b = eng.make_controller(eng.make_pool("page_first_direct", 32), sock,
                            salt="tenant-b")
    assert b.storage_backend.batch_exists(keys) == 0
    for c in (a, b):
        c.storage_backend.close()


def test_tp_ranks(workdir):
    """Two TP ranks (each half the KV heads) back up the same prompt: each
    gets its own pages back, never the other rank's."""
    half = dict(tinymodel.CONFIG, num_key_value_heads=1)  # per rank
    with kvt_testutil.daemon(workdir, tinymodel.CONFIG, page_tokens=P,
                             args=("--tp", "2")) as d:
        ranks = [eng.make_controller(eng.make_pool("layer_first", 16, half),
                                     d, tp_rank=r, tp_size=2)
                 for r in (0, 1)]
        toks = list(range(40, 40 + 3 * P))
        keys = page_hashes(toks, P)
        assert ranks[0].storage_backend.salt != ranks[1].storage_backend.salt
        s0, _ = backup(ranks[0], toks, seed=10)
        assert ranks[1].storage_backend.batch_exists(keys) == 0
        s1, _ = backup(ranks[1], toks, seed=11)
        for r, src in zip(ranks, (s0, s1)):
            got, slots = prefetch(r, toks)
            assert got == 3 * P
            assert same_pages(pages_of(r.mem_pool_host, slots),
                              pages_of(r.mem_pool_host, src))
        for r in ranks:
            r.storage_backend.close()


def cfg(sock, **over):
    return make_storage_config(tp_rank=0, tp_size=1, is_mla_model=False,
                               is_page_first_layout=False,
                               model_name=eng.MODEL,
                               extra_config=eng.extra_config(sock, **over))


def make(sock, layout="page_first_direct", **over):
    c = cfg(sock, **over)
    if layout == "page_first":
        c.is_page_first_layout = True
    be = StorageBackendFactory.create_backend("dynamic", c, None)
    be.register_mem_pool_host(eng.make_pool(layout, 8))
    return be


def test_bad_config(sock, workdir):
    with pytest.raises(ValueError, match="interface_v1"):
        make(sock, interface_v1=None)
    with pytest.raises(ValueError, match=r"unknown extra-config key.*'sokcet'"):
        make(sock, sokcet="/x")
    with pytest.raises(ValueError, match="page_first_kv_split.*two buffers"):
        be = StorageBackendFactory.create_backend("dynamic", cfg(sock), None)
        be.register_mem_pool_host(eng.make_mla_pool("page_first_kv_split", 8))
    be.close()
    with pytest.raises(ValueError, match="io_timeout_s"):
        make(sock, io_timeout_s=0)
    with pytest.raises(ValueError, match="tenant"):
        make(sock, tenant="x")
    with pytest.raises(ConnectionError, match="no kvtier daemon at /nonexistent"):
        make("/nonexistent/k.sock", wait_daemon_s=0.2)
    with pytest.raises(ImportError, match="kvtier.nosuch"):
        make(sock, module_path="kvtier.nosuch")
    with pytest.raises(AttributeError, match="NoClass"):
        make(sock, class_name="NoClass")
    c = cfg(sock)
    c.should_split_heads = True
    with pytest.raises(NotImplementedError, match="should_split_heads"):
        StorageBackendFactory.create_backend("dynamic", c, None)
    # a page size other than the daemon's: refused, naming the cause
    be = StorageBackendFactory.create_backend("dynamic", cfg(sock), None)
    pool = eng.make_pool("layer_first", 8)
    pool.page_size = 8  # as if --page-size 8 (the daemon has 4)
    pool.page_num, pool.size = 4, 32
    pool.kv_buffer = pool.init_kv_buffer()
    with pytest.raises(ValueError, match="--page-size.*--page-tokens") as e:
        be.register_mem_pool_host(pool)
    assert e.value.__cause__.code == kvtier.KVT_EGEOM
    # the copying interface and clear(): not implemented, and said so
    be = make(sock)
    for call in (lambda: be.get("k"), lambda: be.set("k", 1),
                 lambda: be.batch_get(["k"]), lambda: be.batch_set(["k"], [1])):
        with pytest.raises(NotImplementedError, match="interface_v1"):
            call()
    with pytest.raises(NotImplementedError, match="shared by every engine"):
        be.clear()
    with pytest.raises(RuntimeError, match="already registered"):
        be.register_mem_pool_host(eng.make_pool("layer_first", 8))
    be.close()


def test_torch_pool_rehomed(sock):
    """A host pool whose buffer is a torch CPU tensor (as SGLang's is, with
    its per-layer pointer tables): re-homed with torch.frombuffer, pointer
    tables rebuilt, pages exchanged with a NumPy pool. Skipped without
    torch (Debian's python3-torch; not installed by scripts/bootstrap)."""
    torch = pytest.importorskip("torch")
    pool = eng.make_pool("layer_first", 16)
    pool.kv_buffer = torch.zeros(pool.kv_buffer.shape, dtype=torch.float32)
    old = pool.kv_buffer.data_ptr()
    pool.k_data_refs = [pool.k_buffer[i] for i in range(pool.layer_num)]
    pool.v_data_refs = [pool.v_buffer[i] for i in range(pool.layer_num)]
    pool.k_data_ptrs = torch.tensor([x.data_ptr() for x in pool.k_data_refs],
                                    dtype=torch.int64)
    pool.v_data_ptrs = torch.tensor([x.data_ptr() for x in pool.v_data_refs],
                                    dtype=torch.int64)
    a = eng.make_controller(pool, sock)
    be = a.storage_backend
    base = be.mem.layer_addrs[0]
    assert pool.kv_buffer.data_ptr() == base != old
    assert isinstance(pool.kv_buffer, torch.Tensor)
    assert pool.k_data_ptrs.tolist() == [
        base + l * pool.size * pool.head_num * pool.head_dim * 4
        for l in range(pool.layer_num)]
    assert pool.v_data_ptrs[0].item() == base + be.mem.kv_stride
    toks = list(range(70, 70 + 3 * P))
    src, keys = backup(a, toks, seed=12)
    b = eng.make_controller(eng.make_pool("page_first_direct", 16), sock)
    got, slots = prefetch(b, toks)
    assert got == 3 * P
    assert same_pages(pages_of(b.mem_pool_host, slots), pages_of(pool, src))
    # the tensor itself sees the bytes the daemon copied out of it
    assert pool.kv_buffer[0, 1, int(src[0])].abs().sum().item() > 0
    a.storage_backend.close()
    b.storage_backend.close()


def torch_pinned_pool():
    torch = pytest.importorskip("torch")
    pool = eng.make_pool("layer_first", 16)
    pool.kv_buffer = torch.zeros(pool.kv_buffer.shape, dtype=torch.float32)
    pool.pin_memory = True
    return pool


@pytest.mark.parametrize("code", [0, 2])
def test_pinned_pool_repinned_or_warned(sock, monkeypatch, caplog, code):
    """A pinned host pool is pinned again once re-homed; when CUDA refuses
    (issue 21, finding 10: the result was ignored, the pool went pageable
    silently) the fallback is a warning and counted. CUDA is faked: the
    torch here has none."""
    import torch
    pool = torch_pinned_pool()
    old = pool.kv_buffer.data_ptr()
    rt = kvt_testutil.FakeCudart(code)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: rt)
    caplog.set_level("WARNING", logger="kvtier.sglang")
    a = eng.make_controller(pool, sock)
    be = a.storage_backend
    assert rt.calls[0] == ("unregister", old)
    assert rt.calls[1][:2] == ("register", pool.kv_buffer.data_ptr())
    warned = [r for r in caplog.records if "could not be" in r.getMessage()]
    assert be.daemon_stats()["backend"]["pin_fallbacks"] == (code != 0)
    assert len(warned) == (code != 0)
    if code:
        assert warned[0].levelname == "WARNING"
        assert "cudaHostRegister: 2" in warned[0].getMessage()
    be.close()


def test_aborted_prefetch(sock):
    """A request aborted while its prefetch runs (terminate_prefetch between
    two batches): the batch in progress completes in the backend, later
    batches are never asked for, the slots are released, and the next
    request prefetches normally."""
    a = eng.make_controller(eng.make_pool("layer_first", 32), sock)
    toks = list(range(500, 500 + 6 * P))
    backup(a, toks, seed=6)
    b = eng.make_controller(eng.make_pool("page_first_direct", 32), sock)
    b.storage_batch_size = 2
    be = b.storage_backend
    calls, real = [], be.batch_get_v1
    n = 6 * P
    slots = b.mem_pool_host.alloc(n)
    op = b.prefetch("aborted", slots, toks[:n])

    def get_then_abort(keys, idx, extra=None):
        calls.append(len(keys))
        res = real(keys, idx, extra)
        b.terminate_prefetch(op)      # the scheduler aborts the request
        return res

    be.batch_get_v1 = get_then_abort
    assert b.run_prefetch(op) == 0   # the batch finished after the abort
    assert calls == [2]
    assert sum(len(r) for r in b.released) == n
    be.batch_get_v1 = real
    got, _ = prefetch(b, toks)
    assert got == n
    a.storage_backend.close()
    be.close()


MHA_LAYOUTS = ["layer_first", "page_first", "page_first_direct", "page_head"]
MLA_LAYOUTS = ["layer_first", "page_first", "page_first_direct"]


@pytest.mark.parametrize("layout", MHA_LAYOUTS)
def test_every_layout_exchanges_pages(sock, layout):
    """Pages backed up from a pool of each SGLang layout load byte for byte
    into a pool of the next layout (rows: page_first, page_head)."""
    other = MHA_LAYOUTS[(MHA_LAYOUTS.index(layout) + 1) % len(MHA_LAYOUTS)]
    exchange(eng.make_pool(layout, 16), eng.make_pool(other, 16), sock,
             list(range(300, 300 + 5 * P)), 31)


def exchange(pool_a, pool_b, sock, toks, seed):
    """A backs @toks' pages up from @pool_a, B prefetches them into
    @pool_b: every page arrives, byte for byte."""
    a = eng.make_controller(pool_a, sock)
    b = eng.make_controller(pool_b, sock)
    src, _ = backup(a, toks, seed=seed)
    got, slots = prefetch(b, toks)
    assert got == len(toks) // P * P
    assert same_pages(pages_of(b.mem_pool_host, slots),
                      pages_of(a.mem_pool_host, src))
    for c in (a, b):
        c.stop()
        c.storage_backend.close()


@pytest.mark.parametrize("layout", MLA_LAYOUTS)
def test_mla_pools(workdir, layout):
    """MLA host pools (one latent per token and layer) in each layout:
    pages move byte for byte into the next layout's pool."""
    other = MLA_LAYOUTS[(MLA_LAYOUTS.index(layout) + 1) % len(MLA_LAYOUTS)]
    with kvt_testutil.daemon(workdir, tinymodel.MLA_CONFIG, page_tokens=P,
                             tiers="dram:8M") as s:
        exchange(eng.make_mla_pool(layout, 16), eng.make_mla_pool(other, 16),
                 s, list(range(400, 400 + 4 * P)), 41)


def mla_backend(sock):
    c = cfg(sock)
    c.is_mla_model = True
    return StorageBackendFactory.create_backend("dynamic", c, None)


@pytest.mark.parametrize("layout", MLA_LAYOUTS)
def test_mla_meta_and_pointer_tables(workdir, layout):
    """The MLA pool as SGLang 01c0ede38cc9 has it: its zero-copy pointers
    (get_page_buffer_meta: per page one pointer per layer, or one for all
    layers) checked against the registered layout, and its per-layer
    pointer table (data_ptrs, what SGLang's GPU copy kernels read) rebuilt
    over the re-homed buffer; a pool whose pointers disagree is refused."""
    with kvt_testutil.daemon(workdir, tinymodel.MLA_CONFIG, page_tokens=P,
                             tiers="dram:8M") as s:
        pool = eng.make_mla_pool(layout, 16)
        old = [int(x) for x in pool.data_ptrs]
        be = mla_backend(s)
        be.register_mem_pool_host(pool)
        buf = pool.kv_buffer
        want = [(buf.swapaxes(0, 1) if layout == "page_first" else buf)[l]
                .__array_interface__["data"][0]
                for l in range(pool.layer_num)]
        assert [int(x) for x in pool.data_ptrs] == want != old
        assert want[0] == be.mem.layer_addrs[0] - be.mem.layer_offset(0)
        ptrs, _ = pool.get_page_buffer_meta(as_indices(range(P)))
        assert ptrs[0] == want[0]
        be.close()
        # negative control: a pool whose page pointers are not the layout's
        pool = eng.make_mla_pool(layout, 16)
        real = pool.get_page_buffer_meta
        pool.get_page_buffer_meta = lambda i: (
            [p + 64 for p in real(i)[0]], real(i)[1])
        be = mla_backend(s)
        with pytest.raises(RuntimeError, match="get_page_buffer_meta"):
            be.register_mem_pool_host(pool)
        be.close()


def test_mla_wider_row_and_refusals(workdir):
    """An MLA pool whose latent row is SGLang's override_kv_cache_dim
    (wider than kv_lora_rank + qk_rope_head_dim) registers with that row
    and moves pages byte for byte; a pool split over decode-context-
    parallel ranks and a dummy (bufferless) pool are refused, saying why."""
    c = dict(tinymodel.MLA_CONFIG)
    wide = c["kv_lora_rank"] + c["qk_rope_head_dim"] + 8
    daemon_cfg = dict(c, kv_lora_rank=wide - c["qk_rope_head_dim"])
    with kvt_testutil.daemon(workdir, daemon_cfg, page_tokens=P,
                             tiers="dram:8M") as s:
        a = eng.make_mla_pool("page_first", 16, override_kv_cache_dim=wide)
        b = eng.make_mla_pool("layer_first", 16, override_kv_cache_dim=wide)
        assert a.kv_buffer.shape[-1] == wide
        exchange(a, b, s, list(range(500, 500 + 3 * P)), 43)
        be = mla_backend(s)
        with pytest.raises(NotImplementedError, match="dcp_size == 1"):
            be.register_mem_pool_host(eng.make_mla_pool(
                "layer_first", 16, dcp_size=2, override_kv_cache_dim=wide))
        dummy = eng.make_mla_pool("layer_first", 16,
                                  override_kv_cache_dim=wide)
        dummy.kv_buffer = None
        with pytest.raises(NotImplementedError, match="dummy pool"):
            be.register_mem_pool_host(dummy)
        be.close()


def _hwm_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def _rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def test_rehome_without_doubling(workdir):
    """Re-homing a large host pool moves it in slices, giving each copied
    slice of the old buffer back at once: the peak resident memory rises
    by about one slice, not by the pool's size, and every byte arrives."""
    import kvtier.sglang as ks
    cfg = dict(tinymodel.CONFIG, num_hidden_layers=8, head_dim=64)
    with kvt_testutil.daemon(workdir, cfg, page_tokens=P,
                             tiers="dram:16M") as s:
        pool = eng.make_pool("layer_first", 8192, config=cfg)  # ~268 MB
        nbytes = pool.kv_buffer.nbytes
        bound = 3 * ks._SLICE      # one slice in flight, and slack
        assert nbytes > 4 * ks._SLICE
        pool.kv_buffer[...] = np.random.default_rng(5).standard_normal(
            pool.kv_buffer.shape[-1]).astype(np.float32)   # resident, known
        want = pool.kv_buffer[1, 7, 1234].copy()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")          # reset the peak (VmHWM) to now
        except OSError:
            pytest.skip("cannot reset VmHWM here")
        before = _rss_kib()
        ctl = eng.make_controller(pool, s)
        grew = _hwm_kib() - before
        assert grew * 1024 < bound, (grew, nbytes)
        assert np.array_equal(pool.kv_buffer[1, 7, 1234], want)
        assert pool.kv_buffer.__array_interface__["data"][0] == \
            ctl.storage_backend.mem.layer_addrs[0]
        ctl.stop()
        ctl.storage_backend.close()


@pytest.mark.filterwarnings(
    "ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_threads_survive_failures(workdir):
    """SGLang's backup, prefetch and prefetch-I/O threads catch nothing and
    are never restarted (the stand-in runs them so): kvtier never raises
    into them — a daemon gone, bad host slots — so they keep serving; a
    backend that did raise would end the I/O thread for good (control)."""
    with kvt_testutil.daemon(workdir, tinymodel.CONFIG, page_tokens=P,
                             tiers="dram:8M") as s:
        ctl = eng.make_controller(eng.make_pool("page_first", 16), s)
        toks = list(range(600, 600 + 3 * P))
        backup(ctl, toks, seed=61)
        be = ctl.storage_backend
        real = be._run_batch

        def broken(what, keys, idx):
            raise ValueError("host slots out of range")
        be._run_batch = broken
        got, _ = prefetch(ctl, toks)          # every page False: recompute
        assert got == 0 and all(ctl.threads_alive().values())
        be._run_batch = real
        got, _ = prefetch(ctl, toks)
        assert got == 3 * P
        # the control: a backend raising in batch_get_v1 kills the thread
        be.batch_get_v1 = lambda *a, **k: (_ for _ in ()).throw(
            RuntimeError("a backend that raises"))
        n = 3 * P
        op = ctl.prefetch("dies", ctl.mem_pool_host.alloc(n), toks[:n])
        with pytest.raises(RuntimeError, match="not done"):
            ctl.run_prefetch(op, timeout=2)
        # the thread dies once it has taken the operation: under load that
        # may be after the 2 s above (it failed once so at load ~10)
        ctl.prefetch_io_aux_thread.join(timeout=20)
        assert ctl.threads_alive()["prefetch_io"] is False
        ctl.stop()
        be.close()
