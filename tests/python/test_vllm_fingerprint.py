"""Engines whose block hashes can never match are noticed (issue 21,
finding 11): vLLM seeds its block-hash chain with PYTHONHASHSEED, so two
vLLMs with different seeds sharing a daemon silently got 0 hits. The
connector now publishes a fingerprint of what determines its hashes
(kvtier.vllm_compat.hash_fingerprint: NONE_HASH, the hash algorithm, the
block size, the model; never the seed) per tenant, and the second engine
warns once; the daemon counts the conflict (fingerprint_conflicts).

Real processes (tests/python/vllm_engine.py: the vLLM stand-ins with
KvtierConnector) against a real daemon."""
from __future__ import annotations

import os
import subprocess
import sys
import types

import numpy as np

import kvtier
import kvtier.vllm_compat as compat
import kvt_testutil
import tinymodel

P = 4
HERE = os.path.dirname(os.path.abspath(__file__))
ENGINE = os.path.join(HERE, "vllm_engine.py")
WARNING = "published a different block-hash fingerprint"


def run_engine(sock, tokens, out, seed):
    env = dict(os.environ, PYTHONHASHSEED=str(seed))
    r = subprocess.run([sys.executable, ENGINE, "--socket", sock,
                        "--tokens", ",".join(map(str, tokens)),
                        "--out", out], capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return int(np.load(out)["cached"]), r.stderr


def conflicts(sock, tenant=0):
    g = kvtier.Geometry.from_config(tinymodel.CONFIG, page_tokens=P)
    with kvtier.Client(g, socket=sock, tenant=tenant) as cl:
        ts = [t for t in cl.stats()["tenants"] if t["id"] is not None]
    return {t["name"]: t["fingerprint_conflicts"] for t in ts}


def test_engines_with_other_hash_seeds_warn(workdir):
    rng = np.random.default_rng(3)
    prompt = [int(t) for t in rng.integers(0, 256, 6 * P + 1)]
    with kvt_testutil.daemon(workdir, tinymodel.CONFIG,
                             page_tokens=P) as sock:
        out = os.path.join(workdir, "o.npz")
        cached, err = run_engine(sock, prompt, out, seed=11)
        assert cached == 0 and WARNING not in err, err
        # same seed: hits, no warning
        cached, err = run_engine(sock, prompt, out, seed=11)
        assert cached == 6 * P and WARNING not in err, err
        assert conflicts(sock) == {"default": 0}
        # another seed: 0 hits (the silent symptom before) and one warning
        cached, err = run_engine(sock, prompt, out, seed=12)
        assert cached == 0
        assert err.count(WARNING) == 1, err
        assert "PYTHONHASHSEED" in err
        assert conflicts(sock) == {"default": 1}
        # a third engine agreeing with the first still hits and is told
        # of the other fingerprint; the conflict is counted once
        cached, err = run_engine(sock, prompt, out, seed=11)
        assert cached == 6 * P and err.count(WARNING) == 1, err
        assert conflicts(sock) == {"default": 1}
    with open(os.path.join(workdir, "kvtierd.log"), encoding="utf-8") as f:
        log = f.read()
    assert log.count("differs from the one its engines published") == 1, log


def test_fingerprints_are_per_tenant(workdir):
    """Another tenant cannot make this one's engines warn: the daemon keeps
    fingerprints per tenant (root may act as either here)."""
    fp = bytes(range(32))
    with kvt_testutil.daemon(workdir, tinymodel.CONFIG, page_tokens=P,
                             args=["--tenants",
                                   "a:1,uid=0;b:2,uid=0"]) as sock:
        g = kvtier.Geometry.from_config(tinymodel.CONFIG, page_tokens=P)
        with kvtier.Client(g, socket=sock, tenant=2) as b:
            for i in range(20):   # bounded: 8 kept, the rest answered
                others, _ = b.publish_fingerprint(1, bytes([i]) * 32)
            assert others == 8
        with kvtier.Client(g, socket=sock, tenant=1) as a:
            assert a.publish_fingerprint(1, fp) == (0, 0)
            assert a.publish_fingerprint(1, fp) == (0, 0)
            # another scheme (SGLang's) is another namespace of hashes
            assert a.publish_fingerprint(2, bytes(32)) == (0, 0)
            assert a.publish_fingerprint(1, bytes(32)) == (1, 1)
            for bad in (0, 256):
                try:
                    a.publish_fingerprint(bad, fp)
                except kvtier.KvtierError:
                    pass
                else:
                    raise AssertionError(f"scheme {bad} accepted")
            assert a.publish_fingerprint(1, fp) == (1, 1)  # still usable
        assert conflicts(sock, tenant=1) == {"a": 1, "b": 19}


def test_fingerprint_follows_what_the_hashes_depend_on():
    from vllm.v1.core import kv_cache_utils as kcu

    def fp(algo="sha256", block=16, model="m", seed_hash=None):
        old = kcu.NONE_HASH
        if seed_hash is not None:
            kcu.NONE_HASH = seed_hash
        try:
            cc = types.SimpleNamespace(block_size=block,
                                       prefix_caching_hash_algo=algo)
            return compat.hash_fingerprint(cc, model)
        finally:
            kcu.NONE_HASH = old
    base = fp()
    assert len(base) == 32 and base == fp()
    assert len({base, fp(algo="xxhash"), fp(block=32), fp(model="n"),
                fp(seed_hash=kcu.sha256("1"))}) == 5
    assert fp(seed_hash=b"") is None          # not seeded yet: later


def test_an_unseeded_engine_is_said_once(workdir, monkeypatch, caplog):
    """A vLLM whose NONE_HASH is never seeded (a renamed global): the
    connector stops trying after 100 lookups and says so once."""
    import vllm_engine as ve
    from vllm.v1.core import kv_cache_utils as kcu
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    with kvt_testutil.daemon(workdir, tinymodel.CONFIG,
                             page_tokens=P) as sock:
        eng = ve.Engine({"socket": sock})
        monkeypatch.setattr(kcu, "NONE_HASH", b"")
        with caplog.at_level("WARNING", logger="kvtier.vllm"):
            for _ in range(150):
                eng.sched_conn._check_fingerprint()
        eng.shutdown()
        assert conflicts(sock) == {"default": 0}
    said = [r for r in caplog.records if "NONE_HASH" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in caplog.records]
