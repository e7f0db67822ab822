"""kvtier.vllm.KvtierConnector beside mamba (state) groups under vLLM's
hybrid memory allocator, mamba_cache_mode "align": tinymodel's
MAMBA_CONFIG (layers 0, 2 a linear recurrence h_t = a * h_{t-1} + B x_t,
1, 3 full attention; vLLM's allocator makes a mamba group and a
full-attention group of two layers), driven by the stand-ins
(HybridKVCacheManager with a MambaManager-like group, the scheduler's
_mamba_block_aligned_split) through a real daemon serving one group's
geometry (kvtier.vllm_hybrid).

- the numerical proof: engine A computes and stores (the state group's
  block at each block boundary a step ends on, as one more group page),
  engine B restores at a boundary (the attention pages and the one state
  at the hit's boundary, into the block vLLM allocated for it) and
  computes the rest: logits bitwise those of a full recompute;
- states are sparse (only where a step ended): the hit is lowered to the
  last boundary with a state;
- a corrupted state page fails the request (failed_recving), which vLLM
  recomputes: never a wrong state;
- what vLLM's layout forbids is refused at start, with the reason.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import kvtier.vllm as kv_vllm
import kvtier.vllm_hybrid as kv_hybrid
import kvt_testutil
import tinymodel
import vllm
import vllm_engine as ve
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,
                                        KVCacheGroupSpec, MambaSpec)

P = ve.P
CFG = tinymodel.MAMBA_CONFIG
GROUP_CFG = kv_hybrid.group_config(CFG, 2)    # what the daemon serves
CURRENT = vllm.GENERATION == "current"
needs_hma = pytest.mark.skipif(not CURRENT, reason="the hybrid path needs "
                               "the current interface (failed_recving)")


@pytest.fixture(autouse=True)
def hash_seed(monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "0")


@pytest.fixture(scope="module")
def model():
    return tinymodel.TinyModel(seed=7, config=CFG)


toks, serve = ve.toks, ve.serve


def engine(sock, device="host", **kw):
    return ve.hybrid_engine(sock, CFG, device, **kw)


def spy_tables(e):
    """Each request's block tables, per group, as update_state_after_alloc
    is given them (the last call)."""
    tables = {}
    orig = e.sched_conn.update_state_after_alloc

    def spy(request, blocks, n):
        tables[request.request_id] = [list(g) for g in
                                      blocks.get_block_ids()]
        return orig(request, blocks, n)
    e.sched_conn.update_state_after_alloc = spy
    return tables


@needs_hma
@pytest.mark.parametrize("device", ["host", "emu"])
def test_round_trip_bit_exact(workdir, model, device):
    prompt = toks(1, 11 * P + 1)        # 11 whole pages, 1 to compute
    ref = model.logits(prompt)
    with kvt_testutil.daemon(workdir, GROUP_CFG, page_tokens=P) as sock:
        a = engine(sock, device)
        states = {}
        f = ve.tiny_forward(a, model)

        def forward(rid, tokens, block_ids, computed, wait, save):
            out = f(rid, tokens, block_ids, computed, wait, save)
            if len(tokens) == 11 * P:   # the state at 44 tokens, in A
                blk = block_ids[0][10]
                states["a"] = [a.state(l)[blk].copy() for l in (0, 2)]
            return out
        a.add("r", prompt)
        a.run(forward)
        start, lg = a.outputs["r"]
        # _mamba_block_aligned_split: 44 tokens (the prompt's last
        # boundary), then 1; the state at 44 is kept in entry 10
        assert start == 11 * P and np.array_equal(lg, ref[start:])
        # full attention: 11 pages; the state group: the one boundary a
        # step ended on (44)
        assert a.stats["store_pages"] == 11 + 1
        a.shutdown()

        b = engine(sock, device)
        tables = spy_tables(b)
        start, lg = serve(b, model, prompt)
        assert start == 11 * P and np.array_equal(lg, ref[start:])
        assert b.stats.get("failed_requests", 0) == 0 and b.invalid == []
        assert b.stats["load_pages"] == 11 + 1
        mamba, full = tables["r"]
        # vLLM allocated the hit's state block (entry 10) and nulls before
        # it; the state loaded there is A's, bit for bit
        assert mamba[:10] == [0] * 10 and mamba[10] != 0 and 0 not in full
        assert [b.state(l)[mamba[10]].tobytes() for l in (0, 2)] == \
            [s.tobytes() for s in states["a"]]
        b.shutdown()


@needs_hma
def test_states_are_sparse(workdir, model):
    """A prefilled in chunks of 2 pages keeps states at 8, 16, .. 40
    tokens only; B's prompt shares 7 pages: the full-attention group has
    all 7, the state group a state at 6 pages, not 7: the hit is 6 pages,
    and exact."""
    prompt = toks(5, 10 * P + 1)
    other = prompt[:7 * P] + toks(6, 3 * P + 1)
    ref = model.logits(other)
    with kvt_testutil.daemon(workdir, GROUP_CFG, page_tokens=P) as sock:
        a = engine(sock, token_budget=2 * P)
        named = []
        hp = a.worker_conn.handle_preemptions

        def spy_pre(meta):      # a freed state a store reads: waited for
            hp(meta)
            for rid in meta.sw_wait:
                assert all(j.poll()
                           for j in a.worker_conn._store_jobs.get(rid, []))
                named.append(rid)
        a.worker_conn.handle_preemptions = spy_pre
        start, lg = serve(a, model, prompt)
        # the allocations at 8, 16, .., 40 computed tokens and the finish
        # (41) free the state of the boundary before the last (MambaManager:
        # tokens - 1 skipped), which an earlier step's store read: named 6
        # times, those stores ended before the next forward
        assert named == ["r"] * 6, named
        assert np.array_equal(lg, model.logits(prompt)[start:])
        assert a.stats["store_pages"] == 10 + 5
        a.shutdown()
        b = engine(sock)
        first = []
        orig = b.sched_conn.update_state_after_alloc

        def spy(request, blocks, n):
            first.append(n)
            return orig(request, blocks, n)
        b.sched_conn.update_state_after_alloc = spy
        start, lg = serve(b, model, other)
        # 6 pages restored (24 tokens: 6 attention pages, 1 state), then
        # 24..40 (the last boundary) and 40..41 computed
        assert first[0] == 6 * P and b.stats["load_pages"] == 6 + 1
        assert start == 10 * P and np.array_equal(lg, ref[start:])
        b.shutdown()


@needs_hma
def test_corrupt_state_fails_the_request(workdir, model):
    """The state page corrupted in the daemon's ssd: the load fails, the
    request fails whole (failed_recving) and vLLM recomputes it from
    token 0; the logits are exact — a wrong state is never used."""
    prompt = toks(4, 11 * P + 1)
    ref = model.logits(prompt)
    ssd = os.path.join(workdir, "ssd")
    with kvt_testutil.daemon(workdir, GROUP_CFG, page_tokens=P,
                             tiers=f"ssd:{ssd},4M") as sock:
        a = engine(sock)
        blk = {}
        f = ve.tiny_forward(a, model)

        def forward(rid, tokens, block_ids, computed, wait, save):
            if len(tokens) == 11 * P:
                blk["s"] = block_ids[0][10]
            return f(rid, tokens, block_ids, computed, wait, save)
        a.add("r", prompt)
        a.run(forward)
        # the state page as the daemon stores it: the first chunk of block
        # blk of the attention layer sharing layer 0's tensor (layer 1)
        k, _ = a.layer(1)
        needle = k[blk["s"]].tobytes()
        assert a.state(0)[blk["s"]].tobytes() in needle
        a.shutdown()
        assert kvt_testutil.corrupt_page(ssd, needle) == 1
        b = engine(sock)
        start, lg = serve(b, model, prompt)
        assert b.stats["failed_requests"] == 1 and b.invalid == []
        # recomputed from token 0 (0..44, 44..45: the aligned split), the
        # one load only (the retry is answered no hit)
        assert b.stats["load_pages"] == 11 + 1
        assert start == 11 * P and np.array_equal(lg, ref[start:])
        b.shutdown()


def _process(sock, tokens, out):
    """One engine process (vllm_engine.py --mamba): its results."""
    env = dict(os.environ, PYTHONHASHSEED="0")   # vLLM's shared hash seed
    r = subprocess.run([sys.executable, ve.__file__, "--mamba", "--socket",
                        sock, "--seed", "7", "--tokens",
                        ",".join(map(str, tokens)), "--out", out],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return np.load(out)


@needs_hma
def test_two_processes(workdir, model):
    """Engine A's process computes and stores, engine B's (another
    process, another block pool) restores the attention pages and the
    state at 44 tokens and computes the rest: logits bitwise a full
    recompute's."""
    prompt = toks(8, 11 * P + 1)
    ref = model.logits(prompt)
    with kvt_testutil.daemon(workdir, GROUP_CFG, page_tokens=P) as sock:
        a = _process(sock, prompt, os.path.join(workdir, "a.npz"))
        assert int(a["store_pages"]) == 11 + 1 and int(a["load_pages"]) == 0
        b = _process(sock, prompt, os.path.join(workdir, "b.npz"))
        assert int(b["load_pages"]) == 11 + 1 and len(b["invalid"]) == 0
        assert int(b["cached"]) == 11 * P
        assert np.array_equal(b["logits"], ref[11 * P:])
        assert np.array_equal(a["logits"], b["logits"])


@needs_hma
def test_preempted_then_resumed(workdir, model):
    """Decoding across a block boundary keeps its state there (stored);
    preempted after its prefill, the request resumes from its own stored
    pages and state and decodes the tokens a full recompute does."""
    prompt = toks(6, 9 * P + 2)
    with kvt_testutil.daemon(workdir, GROUP_CFG, page_tokens=P) as sock:
        a = engine(sock)
        req = a.add("r", prompt, 4)
        f = ve.tiny_forward(a, model)
        a.step(f)                   # 0..36 (the prompt's last boundary)
        a.step(f)                   # 36..38, the first token
        a.wait_stores()
        a.scheduler.preempt("r")
        a.run(f)
        assert req.num_preemptions == 1
        # one load per group: 9 attention pages, the state at 36
        assert a.stats["loads"] == 2 and a.stats["load_pages"] == 9 + 1
        got = list(req.output_token_ids)
        a.shutdown()
    assert got == model.greedy(prompt, 4)


def _conf(*groups):
    return KVCacheConfig(64, [], [KVCacheGroupSpec(list(n), s)
                                  for n, s in groups])


PAGE = 2 * P * 2 * 16 * 4
FULL = (["l1", "l3"], FullAttentionSpec(P, 2, 16))


def _refused(kvc, match, **cache):
    c = ve.vllm_config({"socket": "/nonexistent"}, CFG)
    for k, v in cache.items():
        setattr(c.cache_config, k, v)
    with pytest.raises(ValueError, match=match):
        kv_vllm.KvtierConnector(c, KVConnectorRole.SCHEDULER, kvc)


def test_refused_with_the_reason():
    mamba = (["l0", "l2"], MambaSpec(P, ((32,),), "align", PAGE))
    _refused(_conf(mamba), "only state caches")
    if not CURRENT:
        _refused(_conf(mamba, FULL), "00024d314514")
        return
    _refused(_conf((["l0", "l2"], MambaSpec(P, ((32,),), "none", PAGE)),
                   FULL), "mamba_cache_mode \"none\".*--mamba-cache-mode "
             "align")
    _refused(_conf(mamba, FULL), "prefix caching is off.*"
             "--enable-prefix-caching", enable_prefix_caching=False)
    _refused(_conf((["l0", "l2"], MambaSpec(P, ((32,),), "align", None)),
                   FULL), "same\\s+bytes")
    _refused(_conf((["l0", "l2"], MambaSpec(2 * P, ((32,),), "align",
                                            PAGE)), FULL),
             "mamba block size")


@needs_hma
def test_attention_blocks_must_be_pages(workdir):
    """Beside mamba layers vLLM lays attention blocks out as whole pages;
    FlashAttention's usual (2, blocks, ...) layout, whose K and V of one
    block are far apart, is refused at registration."""
    with kvt_testutil.daemon(workdir, GROUP_CFG, page_tokens=P) as sock:
        c = ve.vllm_config({"socket": sock}, CFG)
        names = [f"model.layers.{i}.self_attn.attn" for i in range(4)]
        kvc = ve.kv_cache_config(CFG, 32, P, names)
        conn = kv_vllm.KvtierConnector(c, KVConnectorRole.WORKER, kvc)
        per = 2 * 32 * P * 2 * 16 * 4
        buf = kv_vllm.host_kv_buffer(2 * per)
        kv = {}
        for i, n in enumerate(names):
            k = 0 if i in (0, 1) else 1     # layers 0, 1 share a tensor
            if i in (0, 2):
                kv[n] = [np.ndarray((32, 32), np.float32, buffer=buf,
                                    offset=k * per, strides=(PAGE, 4))]
            else:
                kv[n] = np.ndarray((2, 32, P, 2, 16), np.float32,
                                   buffer=buf, offset=k * per)
        with pytest.raises(ValueError, match="whole pages"):
            conn.register_kv_caches(kv)
        conn.shutdown()
