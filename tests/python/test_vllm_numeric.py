"""The numerical proof through the vLLM connector path (issue 13).

Process A (tests/python/vllm_engine.py: the vLLM stand-ins with
kvtier.vllm.KvtierConnector as SCHEDULER and WORKER) prefills a prompt
with tinymodel in its registered KV caches and stores the pages through
the connector. Process B gets a longer prompt sharing that prefix: the
scheduler side finds the prefix in the daemon, the worker side loads it
into B's own blocks, B prefills only the new tokens, and its logits must
equal a full recompute bit for bit (async and layerwise loads; NumPy and,
where python3-torch is installed, re-homed torch KV caches; KV caches the
daemon cannot map, moved through the connector's staging pool — the GPU
path — loads, stores, and a pool too small for the prefix). Then one
stored page is corrupted in the daemon's ssd slot file: B's load reports
that block as failed (get_block_ids_with_load_errors), vLLM's scheduler
recomputes from it, and the logits are still exact.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

import kvtier
import kvt_testutil
import tinymodel

P = 4
HERE = os.path.dirname(os.path.abspath(__file__))
ENGINE = os.path.join(HERE, "vllm_engine.py")
SEED = 7

try:
    import torch
    HAVE_TORCH = torch is not None
except ImportError:
    HAVE_TORCH = False


def engine(sock, tokens, out, *args):
    env = dict(os.environ, PYTHONHASHSEED="0")   # vLLM's shared hash seed
    cmd = [sys.executable, ENGINE, "--socket", sock, "--seed", str(SEED),
           "--tokens", ",".join(map(str, tokens)), "--out", out, *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                       env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return np.load(out)


def cl_keys(tokens):
    """The kvtier keys KvtierConnector gives @tokens' full pages (vLLM's
    block hashes under PYTHONHASHSEED=0, the connector's salt)."""
    code = ("import sys, json; sys.path[:0] = %r; "
            "from vllm.v1.core.kv_cache_utils import get_request_block_hasher;"
            "from vllm.v1.request import Request; import kvtier;"
            "r = Request('x', %r, 1, None, get_request_block_hasher(%d));"
            "print(json.dumps([k.hex() for k in kvtier.keys_from_hashes("
            "r.block_hashes, b'vllm|0|default|tiny-llama|')]))"
            % (sys.path, list(tokens), P))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, timeout=30,
                         env=dict(os.environ, PYTHONHASHSEED="0"))
    assert out.returncode == 0, out.stderr
    return [bytes.fromhex(k) for k in json.loads(out.stdout)]


def run_b(sock, tokens, workdir, ref, name, *args):
    """B serves @tokens; its logits (from the first computed position on)
    must be bitwise the full recompute's. Returns (restored tokens,
    blocks vLLM was told failed)."""
    z = engine(sock, tokens, os.path.join(workdir, name + ".npz"), *args)
    start = int(z["cached"])
    # assert_array_equal: same shape and every element equal (no tolerance)
    np.testing.assert_array_equal(z["logits"], ref[start:], err_msg=name,
                                  strict=True)
    return start, [int(b) for b in z["invalid"]]


def test_restored_prefix_gives_exact_logits(workdir):
    rng = np.random.default_rng(17)
    prompt = [int(t) for t in rng.integers(0, 256, 12 * P)]   # 12 pages
    longer = prompt + [int(t) for t in rng.integers(0, 256, 2 * P + 3)]
    model = tinymodel.TinyModel(seed=SEED)
    ref = model.logits(longer)
    ssd = os.path.join(workdir, "ssd")
    with kvt_testutil.daemon(workdir, tinymodel.CONFIG, page_tokens=P,
                             tiers=f"ssd:{ssd},4M") as sock:
        # nothing stored: B computes everything (and does not store)
        assert run_b(sock, longer, workdir, ref, "cold", "--no-save") == \
            (0, [])
        z = engine(sock, prompt, os.path.join(workdir, "a.npz"))
        assert int(z["store_pages"]) == 12
        # B restores the 12 pages and computes the 11 new tokens
        for mode in ("async", "layerwise"):
            assert run_b(sock, longer, workdir, ref, "warm-" + mode,
                         "--no-save", "--load-mode", mode) == (12 * P, [])
        if HAVE_TORCH:   # torch KV caches, re-homed by register_kv_caches
            assert run_b(sock, longer, workdir, ref, "warm-torch",
                         "--no-save", "--torch") == (12 * P, [])
        # KV caches in device memory (the emulated device: the GPU path,
        # registered by handle, loaded by the daemon's device copies and
        # verified on the device), async and layerwise
        for mode in ("async", "layerwise"):
            assert run_b(sock, longer, workdir, ref, "device-" + mode,
                         "--no-save", "--device", "emu", "--load-mode",
                         mode) == (12 * P, [])
        # KV caches the daemon cannot map (the GPU path), moved through the
        # connector's staging pool: loads (async, layerwise, torch) ...
        for mode in ("async", "layerwise"):
            assert run_b(sock, longer, workdir, ref, "staged-" + mode,
                         "--no-save", "--staging", "16", "--load-mode",
                         mode) == (12 * P, [])
        if HAVE_TORCH:
            assert run_b(sock, longer, workdir, ref, "staged-torch",
                         "--no-save", "--staging", "16", "--torch") == \
                (12 * P, [])
        # ... a pool too small for the prefix: the pages past it fail and
        # vLLM recomputes them ...
        cached, invalid = run_b(sock, longer, workdir, ref, "staged-small",
                                "--no-save", "--staging", "8")
        assert cached == 8 * P and len(invalid) == 4, (cached, invalid)
        # stores out of device memory: A'' stores a third prompt from the
        # emulated device's memory, B restores it into host memory exact
        third = [int(t) for t in rng.integers(0, 256, 5 * P)]
        third_longer = third + [int(t) for t in rng.integers(0, 256, 3)]
        z = engine(sock, third, os.path.join(workdir, "a-dev.npz"),
                   "--device", "emu")
        assert int(z["store_pages"]) == 5
        assert run_b(sock, third_longer, workdir, model.logits(third_longer),
                     "from-device", "--no-save") == (5 * P, [])
        # ... and stores: A' stages another prompt out, B restores it
        # from registered memory
        other = [int(t) for t in rng.integers(0, 256, 6 * P)]
        other_longer = other + [int(t) for t in rng.integers(0, 256, 5)]
        z = engine(sock, other, os.path.join(workdir, "a-staged.npz"),
                   "--staging", "16")
        assert int(z["store_pages"]) == 6 and int(z["store_dropped"]) == 0
        assert run_b(sock, other_longer, workdir, model.logits(other_longer),
                     "from-staged", "--no-save") == (6 * P, [])

        # corrupt page 5 (layer 2's K) where the daemon keeps it; once per
        # load mode (the first failure drops the page: A stores it again)
        kv = tinymodel.PagedKV.private(12, model.layers, P, model.kvh,
                                       model.d)
        model.prefill(prompt, kv, list(range(12)), 0)
        geo = kvtier.Geometry.from_config(tinymodel.CONFIG, page_tokens=P)
        for mode in ("async", "layerwise"):
            engine(sock, prompt, os.path.join(workdir, "a2.npz"))
            with kvtier.Client(geo, socket=sock) as cl:
                assert cl.lookup(cl_keys(prompt)).pages == 12
                before = cl.stats()["cache"]["checksum_failures"]
            assert kvt_testutil.corrupt_page(ssd, kv.k(2)[5].tobytes()) == 1
            cached, invalid = run_b(sock, longer, workdir, ref,
                                    "corrupt-" + mode, "--no-save",
                                    "--load-mode", mode)
            # page 5's block failed its checksum: vLLM was told, recomputed
            # from it, and the logits are still exact
            assert cached == 5 * P, (mode, cached)
            assert len(invalid) >= 1, mode
            with kvtier.Client(geo, socket=sock) as cl:
                assert cl.stats()["cache"]["checksum_failures"] > before


def test_layouts_exact_logits(workdir):
    """The proof across attention backends' layouts: A stores a prompt
    from a FlashInfer HND cache (block outer, heads before tokens); B
    restores it into the CPU backend's (2, blocks, H, P, D) cache: logits
    bitwise the full recompute's (the other layouts round-trip element for
    element in test_vllm_shim). MLA: tinymodel's latent-attention variant
    stores and restores its one latent per token (vLLM's MLA cache),
    bitwise too."""
    rng = np.random.default_rng(23)
    prompt = [int(t) for t in rng.integers(0, 256, 8 * P)]
    longer = prompt + [int(t) for t in rng.integers(0, 256, P + 2)]
    model = tinymodel.TinyModel(seed=SEED)
    ref = model.logits(longer)
    with kvt_testutil.daemon(workdir, tinymodel.CONFIG, page_tokens=P,
                             tiers="dram:8M") as sock:
        z = engine(sock, prompt, os.path.join(workdir, "fi.npz"),
                   "--backend", "FLASHINFER", "--kv-layout", "HND")
        assert int(z["store_pages"]) == 8
        for backend, layout in (("CPU_ATTN", "NHD"),):
            assert run_b(sock, longer, workdir, ref,
                         f"from-flashinfer-{backend}-{layout}", "--no-save",
                         "--backend", backend, "--kv-layout", layout) == \
                (8 * P, [])
    mla = tinymodel.TinyMLAModel(seed=SEED)
    ref = mla.logits(longer)
    with kvt_testutil.daemon(workdir, tinymodel.MLA_CONFIG, page_tokens=P,
                             tiers="dram:8M") as sock:
        z = engine(sock, prompt, os.path.join(workdir, "mla.npz"), "--mla")
        assert int(z["store_pages"]) == 8
        assert run_b(sock, longer, workdir, ref, "mla", "--no-save",
                     "--mla") == (8 * P, [])
