"""Load or recompute, wait or compute, through the engines' interfaces
(issue 22 item 6): the bindings of the daemon's tier runs and measured
rates (Client.lookup(runs=True), Client.rates()), kvtier.decide.Decider
(kvt_sched_decide(), the scheduler's own C code), and the vLLM connector's
get_num_new_matched_tokens and the SGLang backend's batch_exists on the
stand-ins, against a real daemon whose dram tier is small enough that a
prefix's tail is demoted to ssd.

The model is tinymodel's KV geometry (4 layers, 2 KV heads of 16) with an
8B-class body (hidden 4096, 14336 MLP, 128k vocabulary) so that the
modeled prefill costs what a real model's does; the measured rates the
decisions use are set by the test where it needs them (the daemon's own
measurement on this machine is whatever it is)."""
from __future__ import annotations

import os

import numpy as np
import pytest

import kvtier
import kvt_testutil
import tinymodel
from kvtier.client import LookupResult, Rate
from kvtier.decide import Decider

P = 16
CONFIG = dict(tinymodel.CONFIG, hidden_size=4096, intermediate_size=14336,
              vocab_size=128256, num_attention_heads=32)
TIERS = "dram:256K,ssd:{},16M"    # 16 pages of 16 KiB in dram


def geo():
    return kvtier.Geometry.from_config(CONFIG, page_tokens=P)


class Rates:
    """A stand-in for Client.rates(): loads from each tier at @gbps."""

    def __init__(self, **gbps):
        self.gbps = gbps

    def rates(self):
        return {(a, b): Rate(self.gbps.get(a, 0.0) if b == "hbm" else 0.0,
                             1, 1.0)
                for a in kvtier._lib.TIER_NAMES
                for b in kvtier._lib.TIER_NAMES}


@pytest.fixture
def sock(workdir):
    with kvt_testutil.daemon(workdir, CONFIG, page_tokens=P,
                             tiers=TIERS.format(workdir)) as s:
        yield s


def store_pages(cl, n, seed=1):
    """Store a prefix of @n pages through @cl; returns its keys."""
    keys = cl.hash_tokens([int(t) for t in np.random.default_rng(seed)
                           .integers(0, 1000, n * P + 1)])
    m = cl.alloc(n)
    with cl.store(m, keys, list(range(n))) as j:
        assert j.wait(10) == []
    m.free()
    return keys


def test_runs_and_rates(sock):
    with kvtier.Client(geo(), socket=sock) as cl:
        keys = store_pages(cl, 40)
        cl.quiesce()
        r = cl.lookup(keys, touch=False, runs=True)
        assert r.pages == 40
        assert sum(p for _, p in r.runs) == 40
        assert {t for t, _ in r.runs} == {"dram", "ssd"}
        assert r.runs[-1][0] == "ssd"       # leaves are demoted first
        for t in ("dram", "ssd"):
            assert sum(p for x, p in r.runs if x == t) == r.tier_pages[t]
        assert cl.lookup(keys, touch=False).runs == ()
        assert cl.lookup([], runs=True).runs == ()
        # a load measures the rates it ran at
        m = cl.alloc(40)
        with cl.load(m, keys, list(range(40))) as j:
            assert j.wait(10) == []
        rt = cl.rates()
        assert set(rt) == {(a, b) for a in kvtier._lib.TIER_NAMES
                           for b in kvtier._lib.TIER_NAMES}
        assert rt[("ssd", "hbm")].jobs + rt[("dram", "hbm")].jobs >= 1
        assert max(rt[("ssd", "hbm")].gbps, rt[("dram", "hbm")].gbps) > 0
        assert rt[("hbm", "dram")].gbps > 0     # the store
        # and a decision reads them: the rates it priced with are the
        # daemon's measurement
        d = Decider(geo(), rates_every_s=0)
        x = d.decide(cl, cl.lookup(keys, touch=False, runs=True), start=0,
                     prompt=41 * P)
        assert x.load + sum(x.recompute.values()) == 40
        want = {t: rt[(t, "hbm")].gbps for t in ("dram", "ssd")
                if rt[(t, "hbm")].gbps > 0}
        assert want and d._gbps == pytest.approx(want, rel=1e-3)
        d.close()
        m.free()


def hit(dram, ssd, inflight=0):
    runs = tuple(x for x in (("dram", dram), ("ssd", ssd)) if x[1])
    return LookupResult(dram + ssd, {"dram": dram, "ssd": ssd}, inflight,
                        runs)


def test_decider():
    d = Decider(geo(), rates_every_s=0)
    prompt = 130 * P
    decide = d.decide

    def counted(*a, **kw):
        x = decide(*a, **kw)
        d.count(x, x.wait)
        return x
    d.decide = counted
    # ssd slow, dram fast: dram's run loaded, ssd's recomputed
    x = d.decide(Rates(dram=10, ssd=1e-4), hit(64, 64), start=0,
                 prompt=prompt)
    assert (x.load, x.recompute, x.wait) == (64, {"ssd": 64}, False)
    assert x.load_s > 0 and x.compute_s > 0
    # the measured rate changes the answer
    x = d.decide(Rates(dram=10, ssd=10), hit(64, 64), start=0,
                 prompt=prompt)
    assert (x.load, x.recompute) == (128, {})
    # the rates, not the names: a slow dram run goes (with what follows)
    x = d.decide(Rates(dram=1e-4, ssd=10), hit(64, 64), start=0,
                 prompt=prompt)
    assert x.load == 0 and x.recompute == {"dram": 64, "ssd": 64}
    # pages the engine holds itself are not the cache's
    x = d.decide(Rates(dram=10, ssd=1e-4), hit(64, 64), start=32,
                 prompt=prompt)
    assert (x.load, x.recompute) == (32, {"ssd": 64})
    # pages in flight: wait when expected sooner than computing them
    x = d.decide(Rates(dram=10), hit(8, 0, inflight=100), start=0,
                 prompt=prompt)
    assert x.wait
    x = d.decide(Rates(dram=10), hit(8, 0), start=0, prompt=prompt,
                 transient=100, transient_ready=1e12)
    assert not x.wait
    # pages being stored: expected at the measured store rate — a slow
    # one makes waiting dearer than computing them
    class Slow(Rates):
        def rates(self):
            rt = super().rates()
            rt[("hbm", "dram")] = Rate(self.store, 1, 1.0)
            return rt
    slow = Slow(dram=10)
    slow.store = 1e-6
    x = d.decide(slow, hit(8, 0, inflight=100), start=0, prompt=prompt)
    assert not x.wait and x.wait_s > 1
    slow.store = 10
    x = d.decide(slow, hit(8, 0, inflight=100), start=0, prompt=prompt)
    assert x.wait and x.wait_s < 1e-3
    # a result without runs: its tiers fastest first
    x = d.decide(Rates(dram=10, ssd=1e-4),
                 LookupResult(128, {"dram": 64, "ssd": 64}, 0), start=0,
                 prompt=prompt)
    assert (x.load, x.recompute) == (64, {"ssd": 64})
    assert d.stats["decisions"] == 9
    assert d.stats["decided_waits"] == 2
    assert d.stats["decided_waits_declined"] == 2
    assert d.stats["decided_recompute_pages"] == 64 + 128 + 64 + 64
    assert d.stats["decided_recompute_ssd_pages"] == 64 + 64 + 64 + 64
    assert d.stats["decided_load_pages"] == 64 + 128 + 32 + 8 + 8 + 64
    d.close()


def test_decider_bad_config():
    with pytest.raises(kvtier.KvtierError) as e:
        Decider(geo(), profile="no-such-gpu")
    assert "decide_profile" in str(e.value)
    with pytest.raises(ValueError):
        Decider(geo(), rates_every_s=-1)
    # a geometry without the compute figures the cost model needs
    bare = kvtier.Geometry.from_preset("llama-3.1-8b", page_tokens=P)
    Decider(bare).close()


# -- vLLM: get_num_new_matched_tokens on the stand-ins ---------------------------

import vllm_engine as ve  # noqa: E402
import test_vllm_shim as vs  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402

PAGES = 130


@pytest.fixture
def hash_seed(monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "0")


def engine(sock, **extra):
    return ve.Engine({"socket": sock, "decide": True, **extra},
                     num_blocks=PAGES + 40, model_config=CONFIG,
                     block_size=P)


def served(sock, toks, **extra):
    """A fresh engine serves @toks: its counters."""
    e = engine(sock, **extra)
    got = e.add("r", toks, 1)
    e.run(vs.fake_forward(e))
    assert got.output_token_ids == [vs.reference(toks)]
    e.shutdown()
    return e.stats


@pytest.fixture
def stored(sock, hash_seed, monkeypatch):
    """@sock with a prefix of PAGES pages stored, its tail demoted to ssd:
    (socket, tokens, its LookupResult with runs)."""
    toks = vs.tokens(5, PAGES * P + 1)
    e = ve.Engine({"socket": sock}, num_blocks=PAGES + 40,
                  model_config=CONFIG, block_size=P)
    req = e.add("a", toks, 1)
    e.run(vs.fake_forward(e))
    cl = e.sched_conn._client
    cl.quiesce()
    r = cl.lookup(e.sched_conn._keys(req), touch=False, runs=True)
    e.shutdown()
    assert r.pages == PAGES
    assert r.runs[0][0] == "dram" and r.tier_pages["ssd"] >= 100, r.runs
    return sock, toks, r


def set_rates(monkeypatch, **gbps):
    monkeypatch.setattr(kvtier.Client, "rates",
                        lambda self: Rates(**gbps).rates())


def test_vllm_slow_tier_recomputed_fast_loaded(stored, monkeypatch):
    sock, toks, r = stored
    set_rates(monkeypatch, dram=10, ssd=1e-4)
    st = served(sock, toks)
    # the leading dram run loaded, the ssd run after it recomputed (and
    # whatever follows it: a loaded prefix is contiguous)
    assert st["load_pages"] == r.runs[0][1]
    assert st["decided_recompute_pages"] == PAGES - r.runs[0][1]
    assert st["decided_recompute_ssd_pages"] == r.tier_pages["ssd"]
    assert st["decisions"] >= 1 and st["decided_waits"] == 0


def test_vllm_measured_rate_changes_the_answer(stored, monkeypatch):
    sock, toks, _ = stored
    set_rates(monkeypatch, dram=10, ssd=10)
    st = served(sock, toks)
    # ssd's run is loaded now — but for the last few pages: a step that
    # computes 1 or 60 tokens of this model costs the same (the cost
    # model's roofline: weights-bound), so those are cheaper computed
    assert st["load_pages"] >= PAGES - 8
    assert st["load_pages"] + st["decided_recompute_pages"] == PAGES


def test_vllm_decision_off_loads_every_page(stored, monkeypatch):
    sock, toks, _ = stored
    set_rates(monkeypatch, dram=10, ssd=1e-4)
    st = served(sock, toks, decide=False)
    assert st["load_pages"] == PAGES
    assert st["decisions"] == 0


def test_vllm_bad_decide_config(sock, hash_seed):
    with pytest.raises(kvtier.KvtierError, match="decide_profile"):
        engine(sock, decide_profile="no-such-gpu")
    with pytest.raises(ValueError, match="decide"):
        engine(sock, decide="yes")
    with pytest.raises(ValueError, match="decide_rates_s"):
        engine(sock, decide_rates_s=-1)


def test_vllm_transient_prefix_defers_then_hits(stored, monkeypatch):
    sock, toks, _ = stored
    set_rates(monkeypatch, dram=10, ssd=10)
    e = engine(sock)
    cl = e.sched_conn._client
    real, calls = cl.lookup, []

    def storing_first(keys, touch=True, each=False, runs=False):
        calls.append(len(keys))     # first: every page still being stored
        if len(calls) == 1:
            return kvtier.LookupResult(0, {}, len(keys), ())
        return real(keys, touch, each, runs)
    monkeypatch.setattr(cl, "lookup", storing_first)
    req = e.add("b", toks, 1)
    e.step(vs.fake_forward(e))
    assert req.status == RequestStatus.WAITING      # (None, False): later
    assert req.num_computed_tokens == 0
    e.run(vs.fake_forward(e))
    assert req.output_token_ids == [vs.reference(toks)]
    e.shutdown()
    assert e.stats["decided_waits"] == 1
    assert e.stats["load_pages"] >= PAGES - 8       # then the hit


def test_vllm_wait_is_bounded(stored, monkeypatch):
    sock, toks, _ = stored
    set_rates(monkeypatch, dram=10, ssd=10)
    e = engine(sock, inflight_wait_s=0.05)
    monkeypatch.setattr(e.sched_conn._client, "lookup",
                        lambda keys, touch=True, each=False, runs=False:
                        kvtier.LookupResult(0, {}, len(keys), ()))
    req = e.add("b", toks, 1)
    e.run(vs.fake_forward(e))       # gives up waiting, computes it all
    assert req.output_token_ids == [vs.reference(toks)]
    e.shutdown()
    assert e.stats["decided_waits"] >= 1
    assert e.stats["decided_waits_declined"] >= 1
    assert e.stats["load_pages"] == 0


def test_vllm_requests_sharing_a_prefix(stored, monkeypatch):
    """Two requests on one uncached 40-page prefix in one engine, prefills
    chunked at 16 pages (long_prefill_token_threshold): the second is
    asked while the first has computed none of it and allocated only its
    first chunk, so the rest counts as in flight — and is not waited for,
    since the first must still compute all of it (the model's estimate);
    both answers are right."""
    sock, _, _ = stored
    set_rates(monkeypatch, dram=10, ssd=10)
    e = ve.Engine({"socket": sock, "decide": True}, num_blocks=2 * PAGES,
                  model_config=CONFIG, block_size=P)
    e.scheduler.long_prefill_token_threshold = 16 * P
    shared = vs.tokens(77, 40 * P)
    a, b = shared + vs.tokens(78, 3 * P), shared + vs.tokens(79, 3 * P)
    ra, rb = e.add("a", a, 1), e.add("b", b, 1)
    e.run(vs.fake_forward(e))
    assert ra.output_token_ids == [vs.reference(a)]
    assert rb.output_token_ids == [vs.reference(b)]
    e.shutdown()
    assert e.stats["decisions"] == 2
    assert e.stats["decided_waits_declined"] == 1
    assert e.stats["decided_waits"] == 0


# -- SGLang: batch_exists and the prefetch on the stand-ins --------------------

import sglang_engine as eng  # noqa: E402
import test_sglang_shim as ts  # noqa: E402
from sglang.srt.managers.cache_controller import page_hashes  # noqa: E402


@pytest.fixture
def sgl(sock, workdir, monkeypatch):
    """@sock with a prefix of PAGES SGLang pages backed up, its tail
    demoted to ssd: (socket, tokens, {tier: pages}, make), make(**extra)
    a controller of this model with 16-token pages."""
    monkeypatch.setattr(eng, "P", P)
    monkeypatch.setattr(ts, "P", P)

    model = os.path.join(workdir, "config.json")  # the daemon's model

    def make(**extra):
        if extra.get("decide"):
            extra.setdefault("decide_model", model)
        return eng.make_controller(eng.make_pool("page_first_direct",
                                                 PAGES + 8, CONFIG), sock,
                                   **extra)
    a = make()
    toks = vs.tokens(9, PAGES * P)
    # SGLang's pages are one-page prefixes, evicted page by page (LRU):
    # the tail backed up first, then the head, so the head stays in dram
    keys = page_hashes(toks, P)
    for lo, hi in ((10, PAGES), (0, 10)):
        slots = a.mem_pool_host.alloc((hi - lo) * P)
        ts.fill_pages(a.mem_pool_host, slots, lo)
        op = a.write_storage(slots, toks[lo * P:hi * P],
                             hash_value=keys[lo:hi])
        assert a.backup(op) == (hi - lo) * P
    be = a.storage_backend
    be.client.quiesce()
    r = be.client.lookup(be.kvtier_keys(keys), each=True, runs=True)
    assert r.pages == PAGES
    assert r.runs[0][0] == "dram" and r.runs[0][1] >= 8, r.runs
    return sock, toks, r.runs[0][1], make


def test_sglang_slow_tier_recomputed_fast_loaded(sgl, monkeypatch):
    sock, toks, head, make = sgl
    set_rates(monkeypatch, dram=10, ssd=1e-4)
    b = make(decide=True)
    got, _ = ts.prefetch(b, toks)
    assert got == head * P                  # the dram run, not ssd's
    st = b.storage_backend.daemon_stats()["backend"]["decide"]
    assert st["decided_load_pages"] == head     # one 128-page batch
    assert st["decided_recompute_pages"] == 128 - head
    assert st["decided_recompute_ssd_pages"] >= 100
    # the measured rate changes the answer (the last few pages of a
    # 128-page batch are cheaper computed: weights-bound, as for vLLM)
    set_rates(monkeypatch, dram=10, ssd=10)
    c = make(decide=True)
    got, _ = ts.prefetch(c, toks)
    assert got >= 120 * P
    # the decision off: every cached page
    set_rates(monkeypatch, dram=10, ssd=1e-4)
    d = make()
    got, _ = ts.prefetch(d, toks)
    assert got == PAGES * P


def test_sglang_transient_pages_waited_for(sgl, monkeypatch):
    sock, toks, _, make = sgl
    set_rates(monkeypatch, dram=10, ssd=10)
    b = make(decide=True)
    be = b.storage_backend
    real, calls = be.client.lookup, []

    def storing_first(keys, touch=True, each=False, runs=False):
        calls.append(len(keys))     # first: every page still being stored
        if len(calls) == 1:
            return kvtier.LookupResult(0, {}, len(keys), ())
        return real(keys, touch, each, runs)
    monkeypatch.setattr(be.client, "lookup", storing_first)
    got, _ = ts.prefetch(b, toks)
    assert got >= 120 * P
    st = be.daemon_stats()["backend"]["decide"]
    assert st["decided_waits"] == 1
    # never past inflight_wait_s: pages that stay in flight are computed
    c = make(decide=True, inflight_wait_s=0.05)
    monkeypatch.setattr(c.storage_backend.client, "lookup",
                        lambda keys, touch=True, each=False, runs=False:
                        kvtier.LookupResult(0, {}, len(keys), ()))
    got, _ = ts.prefetch(c, toks)
    assert got == 0
    st = c.storage_backend._decider.stats
    assert st["decided_waits"] >= 1 and st["decided_waits_declined"] == 1


def test_sglang_bad_decide_config(sock, workdir, monkeypatch):
    monkeypatch.setattr(eng, "P", P)
    with pytest.raises(ValueError):
        eng.make_controller(eng.make_pool("page_first_direct", 8, CONFIG),
                            sock, decide="yes")
    with pytest.raises(ValueError) as e:
        eng.make_controller(eng.make_pool("page_first_direct", 8, CONFIG),
                            sock, decide=True, decide_profile="nope",
                            decide_model=os.path.join(workdir,
                                                      "config.json"))
    assert "decide" in str(e.value)
    with pytest.raises(ValueError, match="decide_model"):
        eng.make_controller(eng.make_pool("page_first_direct", 8, CONFIG),
                            sock, decide=True, decide_model="/nonexistent")


def test_sglang_no_model_config_is_a_counted_fallback(sock, monkeypatch,
                                                       caplog):
    monkeypatch.setattr(eng, "P", P)
    c = eng.make_controller(eng.make_pool("page_first_direct", 8, CONFIG),
                            sock, decide=True)     # model "tiny-llama"
    be = c.storage_backend
    assert be._decider is None
    assert be.daemon_stats()["backend"]["decide_fallbacks"] == 1
    assert "decision is OFF" in caplog.text
