"""kvtier.vllm.KvtierConnector driven by the vLLM v0.12.0 stand-ins
(tests/python/shims/vllm: scheduler, KV cache manager with prefix caching,
worker runner) against a real daemon: several requests with partial hits
(local prefix cache + kvtier), cache_salt, preemption with stores in
flight, an abort while loading, pages in flight (ask later), a failed load
reported as failed blocks and recomputed, delay_free while saving, bad
configurations. The "model" writes, per layer, K = h(prefix) + layer and
V = -h(prefix) for each position and samples a token from the K it reads
back, so a wrong restored block changes the output."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

import kvtier
import kvtier.layout as kv_layout
import kvtier.vllm as kv_vllm
import kvt_testutil
import tinymodel
import vllm_engine as ve
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.request import RequestStatus

P = ve.P
L = tinymodel.CONFIG["num_hidden_layers"]


@pytest.fixture(autouse=True)
def hash_seed(monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "0")


@pytest.fixture
def sock(workdir):
    with kvt_testutil.daemon(workdir, tinymodel.CONFIG, page_tokens=P) as s:
        yield s


def prefix_h(tokens):
    out, h = [], 0
    for t in tokens:
        h = (h * 131 + t + 1) % 1000003
        out.append(h)
    return out


def fake_forward(engine, layer=None):
    """K/V from the prefix; the sampled token sums K over every position
    (restored ones included). @layer(l): layer l's (K, V) views
    [blocks, P, H, D] (default engine.layer: NumPy)."""
    bs = engine.block_size

    def forward(rid, tokens, block_ids, c, wait, save):
        hs = prefix_h(tokens)
        total = 0
        for l in range(L):
            if wait:
                wait(l)
            k, v = (layer or engine.layer)(l)
            for pos in range(c, len(tokens)):
                b, t = block_ids[pos // bs], pos % bs
                k[b, t] = hs[pos] + l
                v[b, t] = -hs[pos]
            if save:
                save(l)
            total += int(sum(int(k[block_ids[p // bs], p % bs, 0, 0])
                             for p in range(len(tokens))))
        return total % 256, None
    return forward


def reference(tokens):
    hs = prefix_h(tokens)
    return sum(h + l for l in range(L) for h in hs) % 256


def tokens(seed, n):
    return [int(t) for t in np.random.default_rng(seed).integers(0, 256, n)]


def outputs(engine, reqs, max_tokens=1, salt=None):
    got = {}
    for rid, toks in reqs.items():
        got[rid] = engine.add(rid, toks, max_tokens, cache_salt=salt)
    engine.run(fake_forward(engine))
    return {rid: r.output_token_ids for rid, r in got.items()}


def store(sock, toks):
    """A first engine serves @toks (its pages stored through kvtier)."""
    e = ve.Engine({"socket": sock})
    outputs(e, {"a": toks})
    e.shutdown()


def expect(reqs, max_tokens=1):
    out = {}
    for rid, toks in reqs.items():
        t = list(toks)
        o = []
        for _ in range(max_tokens):
            o.append(reference(t))
            t.append(o[-1])
        out[rid] = o
    return out


def all_free(engine):
    kvm = engine.kvm
    return not kvm.req_blocks and not engine.scheduler.delayed_free


def test_requests_partial_hits_and_salt(sock):
    a = tokens(1, 6 * P + 2)
    e1 = ve.Engine({"socket": sock})
    assert outputs(e1, {"a": a}, max_tokens=3) == expect({"a": a}, 3)
    assert e1.stats["store_pages"] >= 7      # prompt pages and a decoded one
    assert all_free(e1)
    e1.shutdown()

    e2 = ve.Engine({"socket": sock})
    reqs = {"b": a[:4 * P] + tokens(2, 3 * P),   # 4 pages from kvtier
            "c": tokens(3, 5 * P + 1),           # nothing
            "d": list(a)}                        # 6 pages (not the last token)
    assert outputs(e2, reqs) == expect(reqs)
    assert e2.stats["loads"] == 2
    assert e2.stats["load_pages"] == 4 + 6
    assert e2.invalid == []
    assert all_free(e2)
    # the same tokens under another cache_salt share nothing
    before = e2.stats["loads"]
    assert outputs(e2, {"s": list(a)}, salt="tenant-x") == expect({"s": a})
    assert e2.stats["loads"] == before
    e2.shutdown()


def test_local_hit_then_kvtier(sock):
    a = tokens(11, 8 * P + 1)
    store(sock, a)
    e2 = ve.Engine({"socket": sock, "save": False})
    # e0 keeps 3 of a's pages in vLLM's prefix cache while "b" arrives
    e0 = e2.add("e0", a[:3 * P] + [7], 20)
    while e0.status != RequestStatus.RUNNING:    # its own load first
        e2.step(fake_forward(e2))
    e2.add("b", a, 1)
    e2.run(fake_forward(e2))
    assert e2.scheduler.requests == {}
    assert e2.invalid == []
    # b took 3 pages from vLLM's prefix cache, pages 3..7 from kvtier
    # (e0 itself loaded its 3 pages from kvtier first)
    assert e2.stats["loads"] == 2 and e2.stats["load_pages"] == 3 + 5
    e2.shutdown()


def test_preempt_while_storing_then_resume(sock):
    e = ve.Engine({"socket": sock})
    a = tokens(21, 5 * P + 1)
    req = e.add("a", a, 4)
    f = fake_forward(e)
    e.step(f)                       # prefill: stores submitted, not waited
    assert e.worker_conn._store_jobs.get("a") is not None
    e.scheduler.preempt("a")
    so = e.scheduler.schedule()     # preempted: blocks back to the pool
    assert so.preempted_req_ids == {"a"}
    assert so.kv_connector_metadata.preempted == {"a"}
    mro = e.runner.execute_model(so, f, lambda r: a)
    # handle_preemptions stopped its stores before the blocks are reused
    assert "a" not in e.worker_conn._store_jobs
    e.scheduler.update_from_output(so, mro)
    assert req.status == RequestStatus.PREEMPTED
    e.run(f)                        # resumed (from kvtier what was stored)
    assert req.output_token_ids == expect({"a": a}, 4)["a"]
    assert all_free(e)
    e.shutdown()


def test_abort_while_loading(sock):
    a = tokens(31, 6 * P + 1)
    store(sock, a)
    e = ve.Engine({"socket": sock})
    e.add("b", a, 1)
    so = e.scheduler.schedule()      # b waits for its load
    assert e.scheduler.requests["b"].status == \
        RequestStatus.WAITING_FOR_REMOTE_KVS
    e.scheduler.finish_requests("b")          # aborted before the step ran
    assert "b" in e.scheduler.delayed_free    # the load may still write
    mro = e.runner.execute_model(so, fake_forward(e),
                                 lambda r: a)
    e.scheduler.update_from_output(so, mro)
    e.run(fake_forward(e))
    assert all_free(e)
    assert not e.worker_conn._load_jobs and not e.worker_conn._finishing
    e.shutdown()


@pytest.mark.parametrize("mode", ["async", "layerwise"])
def test_failed_load_is_recomputed(sock, monkeypatch, mode):
    a = tokens(41, 7 * P + 1)
    store(sock, a[:4 * P + 1])                  # 4 pages stored
    e = ve.Engine({"socket": sock, "load_mode": mode})
    cl = e.sched_conn._client
    real = cl.lookup

    def lying_lookup(keys, touch=True):         # evicted after the lookup
        r = real(keys, touch)
        return kvtier.LookupResult(min(r.pages + 2, len(keys)),
                                   r.tier_pages, 0)
    monkeypatch.setattr(cl, "lookup", lying_lookup)
    assert outputs(e, {"b": a}) == expect({"b": a})
    assert len(e.invalid) == 2, e.invalid       # pages 4 and 5's blocks
    assert e.stats["load_failed_blocks"] == 2
    assert all_free(e)
    e.shutdown()
    # what B stored is right: pages 4.. were stored only once recomputed
    # (in layerwise mode, the step that ran past the failed blocks wrote
    # wrong K/V into page 6: it must not have been stored)
    c = ve.Engine({"socket": sock, "save": False})
    assert outputs(c, {"c": a}) == expect({"c": a})
    assert (c.stats["load_pages"], c.invalid) == (7, [])
    c.shutdown()


def test_pages_in_flight_ask_later(sock, monkeypatch):
    e = ve.Engine({"socket": sock, "inflight_wait_s": 0.2})
    cl = e.sched_conn._client
    monkeypatch.setattr(cl, "lookup", lambda keys, touch=True:
                        kvtier.LookupResult(0, {}, 2))
    req = e.add("a", tokens(51, 3 * P + 1), 1)
    e.step(fake_forward(e))
    assert req.status == RequestStatus.WAITING    # (None, False): later
    assert req.num_computed_tokens == 0
    e.run(fake_forward(e))      # gives up waiting for the pages in time
    assert req.output_token_ids == expect({"a": req.prompt_token_ids})["a"]
    e.shutdown()


def test_delay_free_while_saving(sock):
    e = ve.Engine({"socket": sock})
    a = tokens(61, 4 * P + 1)
    e.add("a", a, 1)
    done = e.step(fake_forward(e))
    assert done == ["a"]
    # finished, its store may still read the blocks: not freed yet
    assert "a" in e.scheduler.delayed_free
    assert e.kvm.req_blocks.get("a")
    e.run(fake_forward(e))       # finished_sending once the store is done
    assert all_free(e)
    with kvtier.Client(kvtier.Geometry.from_config(tinymodel.CONFIG, P),
                       socket=sock) as cl:
        keys = kvtier.keys_from_hashes(
            ve.Request("x", a, 1, None, e.hasher).block_hashes,
            b"vllm|0|default|tiny-llama|")
        assert cl.lookup(keys).pages == 4
    e.shutdown()


def test_bad_config(sock, workdir, monkeypatch):
    for extra, msg in [({"socket": sock, "bogus": 1}, "unknown"),
                       ({"socket": sock, "tenant": -1}, "tenant"),
                       ({"socket": sock, "load_mode": "eager"}, "load_mode")]:
        with pytest.raises(ValueError, match=msg):
            ve.Engine(extra)
    monkeypatch.delenv("PYTHONHASHSEED")
    with pytest.raises(ValueError, match="PYTHONHASHSEED"):
        ve.Engine({"socket": sock})
    ve.Engine({"socket": sock, "require_hash_seed": False}).shutdown()
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    # vLLM's block size is not the daemon's page
    with pytest.raises(kvtier.KvtierError, match="page-tokens"):
        ve.Engine({"socket": sock}, block_size=8)
    with pytest.raises(kvtier.KvtierError):
        ve.Engine({"socket": os.path.join(workdir, "none.sock"),
                   "timeout_ms": 500})
    # KV caches the daemon cannot map, or of the wrong shape
    cfg = ve.vllm_config({"socket": sock}, tinymodel.CONFIG)
    w = kv_vllm.KvtierConnector(cfg, KVConnectorRole.WORKER)
    shape = (2, 8, P, 2, 16)
    with pytest.raises(ValueError, match="host_kv_buffer"):
        w.register_kv_caches({f"l{i}": np.zeros(shape, np.float32)
                              for i in range(L)})
    buf = kv_vllm.host_kv_buffer(L * 4 * 2 * 8 * P * 2 * 8)
    with pytest.raises(ValueError, match="expected"):
        w.register_kv_caches({f"l{i}": np.ndarray(
            (2, 8, P, 2, 8), np.float32, buf, i * 4 * 2 * 8 * P * 2 * 8)
            for i in range(L)})
    with pytest.raises(ValueError, match="layers"):
        w.register_kv_caches({})
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        # tensors on a device that is not CUDA are refused ...
        dev = {f"l{i}": torch.zeros(shape, device="meta") for i in range(L)}
        with pytest.raises(ValueError, match="CUDA"):
            w.register_kv_caches(dev)
        assert w._staging is None and w._mem is None
        # ... unless staged, which is only ever asked for, never a fallback
        cfg = ve.vllm_config({"socket": sock, "staging": True},
                             tinymodel.CONFIG)
        w2 = kv_vllm.KvtierConnector(cfg, KVConnectorRole.WORKER)
        w2.register_kv_caches(dev)
        assert w2._staging is not None and w2._mem is None
        w2.shutdown()
    w.shutdown()
    for bad in ({"staging": "maybe"}, {"staging_blocks": -1}):
        with pytest.raises(ValueError, match="staging"):
            kv_vllm.KvtierConnector(ve.vllm_config(dict(bad, socket=sock),
                                                   tinymodel.CONFIG),
                                    KVConnectorRole.WORKER)


def until(fn, timeout=10.0):
    """fn() until it is truthy (1 ms apart), at most @timeout s."""
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.001)


def test_tp_ranks_keep_their_own_pages(workdir):
    """TP 2: each worker registers its own heads (1 of 2 KV heads) and
    the daemon keeps the ranks' pages apart under the same vLLM hashes."""
    import vllm.distributed as vd
    with kvt_testutil.daemon(workdir, tinymodel.CONFIG, page_tokens=P,
                             args=("--tp", "2")) as s:
        cfg = ve.vllm_config({"socket": s}, tinymodel.CONFIG)
        cfg.parallel_config.tensor_parallel_size = 2
        keys = kvtier.keys_from_hashes([b"h0", b"h1"], b"x")
        workers = []
        for rank in (0, 1):
            vd.set_tensor_model_parallel(rank, 2)
            w = kv_vllm.KvtierConnector(cfg, KVConnectorRole.WORKER)
            shape = (2, 4, P, 1, 16)
            per = int(np.prod(shape)) * 4
            buf = kv_vllm.host_kv_buffer(per * L)
            caches = {f"l{i}": np.ndarray(shape, np.float32, buf, i * per)
                      for i in range(L)}
            w.register_kv_caches(caches)
            for c in caches.values():
                c[:, :2] = rank + 1.0                   # this rank's KV
            workers.append((w, caches))
        vd.set_tensor_model_parallel(0, 1)

        def step(w, meta, finished=()):
            w.bind_connector_metadata(meta)
            w.start_load_kv(None)
            w.wait_for_save()
            out = w.get_finished(set(finished))
            w.clear_connector_metadata()
            return out
        for w, _ in workers:
            step(w, kv_vllm.KvtierConnectorMetadata(
                saves=[kv_vllm.SaveSpec("r", keys, 0, [0, 1])]))
            metas = [kv_vllm.KvtierConnectorMetadata(delayed={"r"})]
            assert until(lambda: step(w, metas.pop() if metas else
                                      kv_vllm.KvtierConnectorMetadata(),
                                      {"r"})[0]) == {"r"}
        for rank, (w, caches) in enumerate(workers):
            metas = [kv_vllm.KvtierConnectorMetadata(
                loads=[kv_vllm.LoadSpec("q", keys, 0, [2, 3])])]
            assert until(lambda: step(w, metas.pop() if metas else
                                      kv_vllm.KvtierConnectorMetadata())[1]
                         ) == {"q"}
            assert w.get_block_ids_with_load_errors() == set()
            for c in caches.values():
                assert (c[:, 2:4] == rank + 1.0).all(), rank
            w.shutdown()


def test_daemon_restart(workdir, monkeypatch):
    """The daemon dies under a serving engine: requests are still served
    (recomputed; stores fail and are counted), nothing raises into vLLM;
    a daemon started again on the socket is used again by both sides
    (reconnect and re-registration)."""
    import kvtier.vllm as kv_vllm
    import kvtier.vllm_register
    monkeypatch.setattr(kv_vllm, "_RECONNECT_S", 0.05)
    monkeypatch.setattr(kvtier.vllm_register, "_RECONNECT_S", 0.05)
    path = os.path.join(kvt_testutil.tmpdir("kvr"), "d.sock")
    a, b, c = tokens(31, 6 * P + 1), tokens(32, 5 * P + 2), tokens(33, 4 * P + 3)
    with kvt_testutil.daemon(workdir, tinymodel.CONFIG, page_tokens=P,
                             socket=path) as d:
        e = ve.Engine({"socket": path})
        assert outputs(e, {"a": a}) == expect({"a": a})
        d.kill()
        assert outputs(e, {"b": b, "a2": a}) == expect({"b": b, "a2": a})
        assert all_free(e)
    with kvt_testutil.daemon(workdir, tinymodel.CONFIG, page_tokens=P,
                             socket=path):
        time.sleep(0.1)
        assert outputs(e, {"c": c}) == expect({"c": c})   # reconnects
        assert all_free(e)
        e.shutdown()
        # e stored c's pages in the new daemon: another engine restores them
        geo = kvtier.Geometry.from_config(tinymodel.CONFIG, page_tokens=P)
        with kvtier.Client(geo, socket=path) as cl:
            assert cl.stats()["cache"]["store_pages"] == 4
        e2 = ve.Engine({"socket": path})
        assert outputs(e2, {"c2": c}) == expect({"c2": c})
        assert e2.stats["load_pages"] == 4
        e2.shutdown()


# -- every KV layout the pinned vLLM hands a connector -------------------------

# (attention backend, cache layout, --kv-cache-dtype, model)
LAYOUTS = [
    ("FLASH_ATTN", "NHD", "auto", "llama"),
    ("FLASH_ATTN", "HND", "auto", "llama"),
    ("FLASHINFER", "NHD", "auto", "llama"),
    ("FLASHINFER", "HND", "auto", "llama"),
    ("CPU_ATTN", "NHD", "auto", "llama"),
    ("FLASH_ATTN", "NHD", "fp8", "llama"),
    ("FLASHINFER", "HND", "fp8", "llama"),
    ("MLA", "NHD", "auto", "mla"),
    ("MLA", "NHD", "fp8", "mla"),
]


def pattern(hs, pos, layer, kv, shape, dtype):
    """A value for every (head, dim) of a position's K (kv 0) or V (1) of
    @layer: distinct per element, so a permuted head, token or dim shows."""
    h, d = shape
    base = (hs[pos] * 7 + layer * 13 + kv * 5) % 251
    vals = (base + np.arange(h * d).reshape(h, d) * 3) % 251
    return vals.astype(dtype)


def pattern_forward(engine):
    """Writes pattern() into the engine's blocks (through its logical
    [blocks, P, H, D] views, whatever the layout) and samples a token
    that hashes every element read back for every position."""
    def forward(rid, tokens, block_ids, c, wait, save):
        hs = prefix_h(tokens)
        total = 0
        for l in range(engine.model_config["num_hidden_layers"]):
            if wait:
                wait(l)
            k, v = engine.layer(l)
            shape, dt = k.shape[2:], k.dtype
            for pos in range(c, len(tokens)):
                b, t = block_ids[pos // P], pos % P
                k[b, t] = pattern(hs, pos, l, 0, shape, dt)
                if v is not k:
                    v[b, t] = pattern(hs, pos, l, 1, shape, dt)
            if save:
                save(l)
            w = np.arange(1, shape[0] * shape[1] + 1).reshape(shape)
            for p in range(len(tokens)):
                b, t = block_ids[p // P], p % P
                total += int((k[b, t].astype(np.int64) * w).sum())
                if v is not k:
                    total += int((v[b, t].astype(np.int64) * w * 3).sum())
        return total % 256, None
    return forward


def pattern_reference(tokens, layers, shape, mla):
    hs = prefix_h(tokens)
    w = np.arange(1, shape[0] * shape[1] + 1).reshape(shape)
    total = 0
    for l in range(layers):
        for p in range(len(tokens)):
            # MLA keeps one latent (written as K)
            k = pattern(hs, p, l, 0, shape, np.int64)
            total += int((k * w).sum())
            if not mla:
                total += int((pattern(hs, p, l, 1, shape, np.int64) * w *
                              3).sum())
    return total % 256


@pytest.mark.parametrize("i", range(len(LAYOUTS)),
                         ids=["-".join(x) for x in LAYOUTS])
def test_layouts_round_trip(workdir, i):
    """Engine A in layout LAYOUTS[i] stores a prompt; engine B in the next
    layout of the same model and dtype restores it from the daemon: every
    element of every restored page is where B's layout wants it (B's
    output hashes all of them), and B loaded every page it could."""
    backend, layout, kvd, model = LAYOUTS[i]
    same = [x for x in LAYOUTS if x[2:] == (kvd, model)]
    nb_, nl, _, _ = same[(same.index(LAYOUTS[i]) + 1) % len(same)]
    cfg = tinymodel.MLA_CONFIG if model == "mla" else tinymodel.CONFIG
    args = ("--kv-dtype", "fp8") if kvd == "fp8" else ()
    mla = model == "mla"
    with kvt_testutil.daemon(workdir, cfg, page_tokens=P, args=args) as s:
        a = tokens(71 + i, 5 * P + 2)
        ea = ve.Engine({"socket": s}, model_config=cfg, backend=backend,
                       kv_layout=layout, cache_dtype=kvd)
        shape = ea.layer(0)[0].shape[2:]
        L_ = cfg["num_hidden_layers"]
        ea.add("a", a, 1)
        ea.run(pattern_forward(ea))
        assert ea.stats["store_pages"] == 5
        ea.shutdown()
        eb = ve.Engine({"socket": s, "save": False}, model_config=cfg,
                       backend=nb_, kv_layout=nl, cache_dtype=kvd)
        req = eb.add("b", a + [1, 2, 3], 1)
        eb.run(pattern_forward(eb))
        assert eb.stats["load_pages"] == 5 and eb.invalid == []
        want = [pattern_reference(a + [1, 2, 3], L_, shape, mla)]
        assert req.output_token_ids == want, (backend, layout, nb_, nl)
        eb.shutdown()
        # the device path (the emulated device, registered by handle as a
        # GPU's): layouts whose chunks are packed load there the same;
        # layouts in rows are refused, saying why and what to do
        info = kv_layout.derive([kv_layout.describe(t) for t in
                                 eb.kv.values()], eb.roles, P, shape[0],
                                shape[1], 1 if mla else 2)
        ext = {"socket": s, "save": False, "device": "emu"}
        if info.rows:
            with pytest.raises(kvtier.KvtierError, match="rows") as ei:
                ve.Engine(ext, model_config=cfg, backend=nb_, kv_layout=nl,
                          cache_dtype=kvd, emu=True)
            assert ei.value.name == "KVT_ENOTBUILT" and \
                "staging" in str(ei.value)
            return
        ed = ve.Engine(ext, model_config=cfg, backend=nb_, kv_layout=nl,
                       cache_dtype=kvd, emu=True)
        req = ed.add("d", a + [1, 2, 3], 1)
        ed.run(pattern_forward(ed))
        assert ed.stats["load_pages"] == 5 and ed.invalid == []
        assert req.output_token_ids == want, ("emu", nb_, nl)
        ed.shutdown()


@pytest.mark.skipif(os.environ.get("KVT_VLLM_GEN", "current") != "current",
                    reason="current vLLM's worker order")
@pytest.mark.parametrize("mode", ["async", "layerwise"])
def test_current_worker_order_and_transfer_results(sock, monkeypatch, mode):
    """Current vLLM (workers at 00f4240ee645) starts async loads AFTER the
    forward, sync (layerwise) ones before it, and asks
    get_transfer_results(): the connector's answer is upstream's class,
    with a failed load in finished_recving and its blocks in the invalid
    blocks, never in failed_recving (which would recompute the whole
    request); output still right. requires_kv_delivery is False (a
    best-effort cache)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import \
        KVConnectorTransferResults
    a = tokens(43, 6 * P + 1)
    store(sock, a[:3 * P + 1])                  # 3 pages stored
    e = ve.Engine({"socket": sock, "load_mode": mode})
    w = e.worker_conn
    assert w.requires_kv_delivery is False
    assert e.sched_conn.requires_kv_delivery is False
    # layer-by-layer waits need PIECEWISE CUDA graphs (vLLM asks the class)
    assert kv_vllm.KvtierConnector.requires_piecewise_for_cudagraph(
        {"load_mode": mode}) is (mode == "layerwise")
    assert kv_vllm.KvtierConnector.requires_piecewise_for_cudagraph(
        {}) is False
    cl = e.sched_conn._client
    real = cl.lookup

    def lying_lookup(keys, touch=True):         # one page evicted after it
        r = real(keys, touch)
        return kvtier.LookupResult(min(r.pages + 1, len(keys)),
                                   r.tier_pages, 0)
    monkeypatch.setattr(cl, "lookup", lying_lookup)
    calls, results = [], []
    for name in ("start_load_kv", "wait_for_layer_load", "finish_forward",
                 "get_transfer_results"):
        fn = getattr(w, name)

        def rec(*args, _fn=fn, _name=name, **kw):
            calls.append(_name)
            r = _fn(*args, **kw)
            if _name == "get_transfer_results":
                results.append(r)
            return r
        monkeypatch.setattr(w, name, rec)
    assert outputs(e, {"b": a}) == expect({"b": a})
    assert len(e.invalid) == 1 and e.stats["load_failed_blocks"] == 1
    assert results and all(isinstance(r, KVConnectorTransferResults)
                           and not r.failed_recving for r in results)
    # the first step (it carries the load): where start_load_kv came
    step = calls[:calls.index("get_transfer_results") + 1]
    if mode == "async":
        assert any(r.finished_recving == {"b"} for r in results)
        assert step.index("finish_forward") < step.index("start_load_kv")
    else:
        loaded = [i for i, c in enumerate(calls) if c == "start_load_kv"]
        assert any(calls[i + 1] == "wait_for_layer_load" for i in loaded), \
            calls[:12]
    assert all_free(e)
    e.shutdown()


def test_layerwise_cuda_graph_warning(sock, caplog):
    """Layerwise loads wait per layer in the forward, which a full CUDA
    graph skips at replay: vLLM with requires_piecewise_for_cudagraph is
    told (v0.26, current); v0.12 has no such hook, so the connector warns
    at start, saying what to run instead."""
    import logging
    import vllm
    with caplog.at_level(logging.WARNING, logger="kvtier.vllm"):
        e = ve.Engine({"socket": sock, "load_mode": "layerwise"})
        e.shutdown()
    warned = any("cudagraph_mode" in r.getMessage() for r in caplog.records)
    assert warned is (vllm.GENERATION == "v0.12")


def test_chunked_prefill_and_budget(sock):
    """A token budget below the prompt: vLLM prefills it in chunks over
    several steps; the connector stores pages as each chunk completes
    them, and a second engine (budget too) restores them all."""
    a = tokens(81, 9 * P + 1)
    e = ve.Engine({"socket": sock}, token_budget=2 * P + 1)
    req = e.add("a", a, 2)
    steps = 0
    f = fake_forward(e)
    while e.scheduler.has_requests():
        e.step(f)
        steps += 1
    assert steps >= 5                       # 37 tokens at 9 a step
    assert req.output_token_ids == expect({"a": a}, 2)["a"]
    e.run(f)                                # the delayed frees
    assert all_free(e) and e.stats["store_pages"] >= 9
    e.shutdown()
    e2 = ve.Engine({"socket": sock, "save": False}, token_budget=2 * P + 1)
    assert outputs(e2, {"b": a}) == expect({"b": a})
    assert e2.stats["load_pages"] == 9
    e2.shutdown()


def test_preempted_when_blocks_run_out(sock):
    """Preemption as upstream schedules it: two requests decoding in a
    pool too small for both; the later is preempted (its stores stopped
    before its blocks go to the other), resumes, and both outputs are
    right."""
    e = ve.Engine({"socket": sock}, num_blocks=11)
    a, b = tokens(91, 4 * P + 1), tokens(92, 4 * P + 1)
    ra, rb = e.add("a", a, 3 * P), e.add("b", b, 3 * P)
    f = fake_forward(e)
    preempted = False
    while e.scheduler.has_requests():
        so = e.scheduler.schedule()
        if so.preempted_req_ids:
            preempted = True
        mro = e.runner.execute_model(so, f, lambda r: e.scheduler
                                     .requests[r].all_token_ids)
        for rid in so.preempted_req_ids:
            assert rid not in e.worker_conn._store_jobs
        e.scheduler.update_from_output(so, mro)
    assert preempted
    assert ra.output_token_ids == expect({"a": a}, 3 * P)["a"]
    assert rb.output_token_ids == expect({"b": b}, 3 * P)["b"]
    e.run(f)
    assert all_free(e)
    e.shutdown()


def test_stepping_stops_with_only_delayed_frees(sock):
    """Upstream's engine loop stops when only delayed frees remain: v0.12
    vLLM keeps the blocks until the next step (a new request); later
    releases ask has_pending_push_work() and step on until the workers
    report the stores done."""
    import vllm
    e = ve.Engine({"socket": sock})
    e.add("a", tokens(95, 4 * P + 1), 1)
    f = fake_forward(e)
    e.run(f, drain=False)
    if vllm.GENERATION == "v0.12":
        e.scheduler.connector = None   # v0.12's loop does not ask
        e.run(f, drain=False)
        # held, or already freed if the store beat the last step
        e.scheduler.connector = e.sched_conn
    else:
        assert not e.scheduler.delayed_free
    e.run(f)                           # the next request's steps free them
    assert all_free(e)
    e.shutdown()
