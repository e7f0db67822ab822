"""kvtier.vllm.KvtierConnector under vLLM's hybrid memory allocator: a
model with sliding-window layers beside full attention (tinymodel's
SWA_CONFIG: layers 0, 2 slide over 9 tokens, 1, 3 attend to everything;
vLLM's allocator makes two KV cache groups of two layers), driven by the
stand-ins (tests/python/shims/vllm: HybridKVCacheManager, the scheduler's
SupportsHMA path as at 00f4240ee645) through a real daemon serving one
group's geometry (kvtier.vllm_hybrid).

- the numerical proof: engine A prefills and stores, engine B restores
  and computes the rest: logits bitwise those of a full recompute, each
  group's loaded pages bitwise A's, the sliding-window group given only
  the pages in its window (the null block never written);
- a hit every group can serve: the full-attention group holds more pages
  than the sliding-window one: B's hit is lowered below the gap;
- a failed load (a page corrupted in the daemon's ssd) fails the whole
  request (failed_recving, never block ids: vLLM raises on those under
  several groups) and vLLM recomputes it, logits still exact;
- sliding-window blocks vLLM frees while a store reads them (at the finish,
  at each chunk of a chunked prefill): the store is waited for before the
  next forward;
- a request preempted and resumed restores its own pages and decodes as a
  full recompute does; the emulated device's memory (the GPU path) too;
- what is refused, with the reason: a model of state (mamba) groups
  only, the older interface, layerwise loads, staging, uneven groups, groups that do not
  share memory.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

import kvtier
import kvtier.vllm as kv_vllm
import kvtier.vllm_hybrid as kv_hybrid
import kvt_testutil
import tinymodel
import vllm
import vllm_engine as ve
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,
                                        KVCacheGroupSpec, MambaSpec,
                                        SlidingWindowSpec)

P = ve.P
CFG = tinymodel.SWA_CONFIG
GROUP_CFG = kv_hybrid.group_config(CFG, 2)    # what the daemon serves
SEED = 7
CURRENT = vllm.GENERATION == "current"
needs_hma = pytest.mark.skipif(not CURRENT, reason="the hybrid path needs "
                               "the current interface (failed_recving)")


@pytest.fixture(autouse=True)
def hash_seed(monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "0")


@pytest.fixture(scope="module")
def model():
    return tinymodel.TinyModel(seed=SEED, config=CFG)


toks, serve = ve.toks, ve.serve


def engine(sock, device="host", **kw):
    return ve.hybrid_engine(sock, CFG, device, **kw)


def pages_of(e, rid_blocks, group, pages):
    """Group @group's K and V of @pages (block table @rid_blocks), every
    layer of the group, as bytes."""
    out = []
    for layer in e.groups[group][1]:
        k, v = e.layer(layer)
        out += [k[rid_blocks[p]].tobytes() + v[rid_blocks[p]].tobytes()
                for p in pages]
    return out


@needs_hma
@pytest.mark.parametrize("device", ["host", "emu"])
def test_round_trip_bit_exact(workdir, model, device):
    prompt = toks(1, 11 * P + 1)           # 11 whole pages, 1 to compute
    ref = model.logits(prompt)
    with kvt_testutil.daemon(workdir, GROUP_CFG, page_tokens=P) as sock:
        a = engine(sock, device)
        tables = {}
        orig = a.sched_conn.update_state_after_alloc

        def spy(request, blocks, n):        # A's block tables, per group
            tables["a"] = [list(g) for g in blocks.get_block_ids()]
            return orig(request, blocks, n)
        a.sched_conn.update_state_after_alloc = spy
        waited = []
        hp = a.worker_conn.handle_preemptions

        def spy_pre(meta):      # before the forward: no such store runs
            hp(meta)
            for rid in meta.sw_wait:
                jobs = a.worker_conn._store_jobs.get(rid, [])
                assert all(j.poll() for j in jobs)
                waited.append(rid)
        a.worker_conn.handle_preemptions = spy_pre
        start, lg = serve(a, model, prompt)
        assert start == 0 and np.array_equal(lg, ref)
        # both groups stored every page; the sliding-window blocks vLLM
        # freed at the finish (out of the window) were named to the
        # workers, whose stores of them ended before the next forward
        assert a.stats["store_pages"] == 2 * 11
        assert waited == ["r"] and a.stats["sw_wait_requests"] == 1
        a_sw = pages_of(a, tables["a"][0], 0, range(9, 11))
        a_full = pages_of(a, tables["a"][1], 1, range(11))
        a.shutdown()

        b = engine(sock, device)
        orig_b = b.sched_conn.update_state_after_alloc

        def spy_b(request, blocks, n):
            if n:
                tables["b"] = [list(g) for g in blocks.get_block_ids()]
            return orig_b(request, blocks, n)
        b.sched_conn.update_state_after_alloc = spy_b
        start, lg = serve(b, model, prompt)
        # the whole prefix restored; the exact logits of a full recompute
        assert start == 11 * P and np.array_equal(lg, ref[start:])
        assert b.invalid == [] and b.stats.get("failed_requests", 0) == 0
        # full attention: all 11 pages; sliding window (9 tokens): the
        # pages of the window before token 44 (36..43: pages 9, 10);
        # pages 0..8 are vLLM's null block, which nothing wrote
        sw, full = tables["b"]
        assert sw[:9] == [0] * 9 and 0 not in sw[9:11] and 0 not in full
        assert b.stats["load_pages"] == 11 + 2
        assert pages_of(b, sw, 0, range(9, 11)) == a_sw
        assert pages_of(b, full, 1, range(11)) == a_full
        for layer in range(4):
            k, v = b.layer(layer)
            assert not k[0].any() and not v[0].any()
        b.shutdown()


@needs_hma
def test_chunked_prefill_frees_while_storing(workdir, model):
    """A prompt prefilled in chunks of 2 pages: at each chunk's allocation
    vLLM frees the sliding-window blocks that left the window, which the
    previous chunk's stores read — each such request is named to the
    workers, whose stores end before the forward; B restores exactly."""
    prompt = toks(5, 10 * P + 1)
    ref = model.logits(prompt)
    with kvt_testutil.daemon(workdir, GROUP_CFG, page_tokens=P) as sock:
        a = engine(sock, token_budget=2 * P)
        named = []
        hp = a.worker_conn.handle_preemptions

        def spy_pre(meta):
            hp(meta)
            for rid in meta.sw_wait:
                assert all(j.poll()
                           for j in a.worker_conn._store_jobs.get(rid, []))
                named.append(rid)
        a.worker_conn.handle_preemptions = spy_pre
        start, lg = serve(a, model, prompt)
        # its last chunk: token 40
        assert start == 10 * P and np.array_equal(lg, ref[start:])
        # the allocations at 16, 24, 32 and 40 computed tokens free the
        # sliding pages 0..1, 0..3, 0..5, 0..7 (token t's window starts at
        # t - 8), which earlier chunks stored; at 8 none has left, and the
        # finish (41 tokens) frees none more
        assert named == ["r"] * 4, named
        assert a.stats["store_pages"] == 2 * 10
        a.shutdown()
        b = engine(sock)
        start, lg = serve(b, model, prompt)
        assert start == 10 * P and np.array_equal(lg, ref[start:])
        b.shutdown()


@needs_hma
def test_with_the_decision(workdir, model):
    """kvtier's load-or-recompute decision on (the default): it prices
    tinymodel's prefill at about nothing, so B recomputes — the reference
    group's lookup feeding it, the hit still fitted to every group — and
    the logits are exact."""
    prompt = toks(7, 6 * P + 1)
    ref = model.logits(prompt)
    with kvt_testutil.daemon(workdir, GROUP_CFG, page_tokens=P) as sock:
        for _ in ("a", "b"):
            e = ve.Engine({"socket": sock, "decide": True}, num_blocks=32,
                          model_config=CFG)
            start, lg = serve(e, model, prompt)
            assert np.array_equal(lg, ref[start:])
            assert e.stats["decisions"] >= 1
            e.shutdown()


@needs_hma
def test_preempted_then_resumed(workdir, model):
    """A request preempted after its prefill (its stores stopped, its
    blocks freed in every group) resumes: it restores its own pages and
    decodes the tokens an engine without kvtier decodes."""
    prompt = toks(6, 9 * P + 2)
    with kvt_testutil.daemon(workdir, GROUP_CFG, page_tokens=P) as sock:
        a = engine(sock)
        req = a.add("r", prompt, 4)
        f = ve.tiny_forward(a, model)
        a.step(f)                           # the prefill
        a.wait_stores()                     # stored: the resume restores
        a.scheduler.preempt("r")
        a.run(f)
        assert req.num_preemptions == 1
        # one load per group: full attention 9 pages, the window 2
        assert a.stats["loads"] == 2 and a.stats["load_pages"] == 9 + 2
        got = list(req.output_token_ids)
        a.shutdown()
    assert got == model.greedy(prompt, 4)


@needs_hma
def test_hit_is_what_every_group_serves(workdir, model):
    """The full-attention group holds 12 pages, the sliding-window group
    8: a hit of 12 would need the sliding pages 10, 11 (absent), one of
    10 pages 8, 9 (absent): the hit is 8 pages."""
    short = toks(2, 8 * P + 1)
    longer = short[:8 * P] + toks(3, 4 * P + 1)
    ref = model.logits(longer)
    with kvt_testutil.daemon(workdir, GROUP_CFG, page_tokens=P) as sock:
        a = engine(sock)
        serve(a, model, short)
        a.shutdown()
        # the full-attention group's pages 0..11 of the longer prompt (8..11
        # of junk: never loaded, or the logits would show it)
        b = engine(sock)
        req = ve.Request("x", longer, 1, None, b.hasher)
        keys = kvtier.keys_from_hashes(req.block_hashes, b.sched_conn._salt)
        geo = kvtier.Geometry.from_config(GROUP_CFG, page_tokens=P)
        with kvtier.Client(geo, socket=sock) as cl:
            mem = cl.alloc(nblocks=12)
            np.frombuffer(mem.buffer, np.uint8)[:] = 0x3f
            with cl.store(mem, keys[:12], list(range(12))) as job:
                assert job.wait() == []
            assert cl.lookup(keys[:12], touch=False).pages == 12
        start, lg = serve(b, model, longer)
        assert start == 8 * P and np.array_equal(lg, ref[start:])
        b.shutdown()


@needs_hma
def test_failed_load_fails_the_request(workdir, model):
    """A page of the sliding-window group corrupted in the daemon's ssd:
    the load fails, reported as the request (failed_recving), never as
    block ids; vLLM starts it over, the connector answering no hit for it
    then (a load that failed would fail again: a request that looped
    between failed loads and lookups would never finish), and the logits
    are still exact."""
    prompt = toks(4, 11 * P + 1)
    ref = model.logits(prompt)
    ssd = os.path.join(workdir, "ssd")
    with kvt_testutil.daemon(workdir, GROUP_CFG, page_tokens=P,
                             tiers=f"ssd:{ssd},4M") as sock:
        a = engine(sock)
        tables = {}
        orig = a.sched_conn.update_state_after_alloc

        def spy(request, blocks, n):
            tables["a"] = [list(g) for g in blocks.get_block_ids()]
            return orig(request, blocks, n)
        a.sched_conn.update_state_after_alloc = spy
        serve(a, model, prompt)
        k, _ = a.layer(2)               # sliding-window group, page 10
        needle = k[tables["a"][0][10]].tobytes()
        a.shutdown()
        assert kvt_testutil.corrupt_page(ssd, needle) == 1
        b = engine(sock)
        start, lg = serve(b, model, prompt)
        assert b.stats["failed_requests"] == 1 and b.invalid == []
        assert start == 0 and np.array_equal(lg, ref)
        assert b.stats["load_pages"] == 11 + 2      # the one load
        b.shutdown()


def test_refused_with_the_reason(workdir):
    cfg = ve.vllm_config({"socket": "/nonexistent"}, CFG)
    assert kv_hybrid.plan_of(None, P, "async", "auto", True) is None

    def conf(*groups):
        return KVCacheConfig(64, [], [KVCacheGroupSpec(list(n), s)
                                      for n, s in groups])
    full = (["l1", "l3"], FullAttentionSpec(P, 2, 16))
    sw = (["l0", "l2"], SlidingWindowSpec(P, 2, 16, sliding_window=9))

    def refused(kvc, match, extra=None):
        c = ve.vllm_config({"socket": "/nonexistent", **(extra or {})}, CFG)
        with pytest.raises(ValueError, match=match):
            kv_vllm.KvtierConnector(c, KVConnectorRole.SCHEDULER, kvc)
    # state caches, alone or beside attention
    refused(conf((["l0"], MambaSpec(P))), "mamba")
    # (mamba beside attention: test_vllm_mamba.py)
    if not CURRENT:
        # v0.12 / v0.26: no failed_recving, a scheduler of one group
        refused(conf(sw, full), "00024d314514.*disable-hybrid-kv-cache")
        return
    refused(conf(sw, full), "_handle_invalid_blocks",
            {"load_mode": "layerwise"})
    refused(conf(sw, full), "staging", {"staging": True})
    refused(conf(sw, (["l1", "l3", "l4"], FullAttentionSpec(P, 2, 16))),
            "as\\s+many layers")
    refused(conf(sw, (["l1", "l3"], FullAttentionSpec(P, 1, 16))),
            "KV shapes")
    refused(conf(sw, (["l1", "l3"], SlidingWindowSpec(P, 2, 16,
                                                      sliding_window=5))),
            "no full-attention group")
    # a daemon serving the whole model: the error says what to serve
    with kvt_testutil.daemon(workdir, CFG, page_tokens=P) as sock:
        with pytest.raises(kvtier.KvtierError,
                           match="num_hidden_layers is 2"):
            ve.Engine({"socket": sock}, num_blocks=32, model_config=CFG)
    assert cfg.kv_transfer_config is not None


@needs_hma
def test_groups_must_share_memory(workdir):
    """vLLM's allocator gives the k-th layer of every group one tensor;
    caches laid out otherwise are refused at registration."""
    with kvt_testutil.daemon(workdir, GROUP_CFG, page_tokens=P) as sock:
        c = ve.vllm_config({"socket": sock}, CFG)
        kvc = ve.kv_cache_config(CFG, 32, P, [f"model.layers.{i}.self_attn"
                                              f".attn" for i in range(4)])
        conn = kv_vllm.KvtierConnector(c, KVConnectorRole.WORKER, kvc)
        buf = kv_vllm.host_kv_buffer(4 * 2 * 32 * P * 2 * 16 * 4)
        kv = {f"model.layers.{i}.self_attn.attn": np.ndarray(
            (2, 32, P, 2, 16), np.float32, buffer=buf,
            offset=i * 2 * 32 * P * 2 * 16 * 4) for i in range(4)}
        with pytest.raises(ValueError, match="does not view the memory"):
            conn.register_kv_caches(kv)
        conn.shutdown()
