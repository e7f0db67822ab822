"""The numerical proof through the SGLang backend path (issue 13).

Process A (a stand-in SGLang engine, tests/python/sglang_engine.py)
prefills a prompt with tinymodel into its host KV pool and backs the pages
up through kvtier.sglang.KvtierStorage. Process B, another engine with a
longer prompt sharing that prefix, prefetches the prefix pages through
batch_exists + batch_get_v1 into its own host pool (the other layout),
prefills only the new tokens: its logits must equal a full recompute bit
for bit. Then one stored page is corrupted in the daemon's ssd slot file:
B's prefetch must stop at that page (batch_get_v1 False), B recomputes from
there, and its logits are still exact.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import kvtier
import kvt_testutil
import tinymodel

P = 4
HERE = os.path.dirname(os.path.abspath(__file__))
ENGINE = os.path.join(HERE, "sglang_engine.py")
SEED = 7


def engine(role, sock, layout, tokens, out=None, mla=False):
    cmd = [sys.executable, ENGINE, role, "--socket", sock, "--layout", layout,
           "--seed", str(SEED), "--tokens", ",".join(map(str, tokens))]
    if mla:
        cmd.append("--mla")
    if out:
        cmd += ["--out", out]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_b(sock, layout, tokens, workdir, ref, name, mla=False):
    out = os.path.join(workdir, name + ".npz")
    engine("load", sock, layout, tokens, out, mla)
    z = np.load(out)
    cached = int(z["cached"])
    logits = z["logits"]
    assert logits.shape == (len(tokens) - cached, ref.shape[1])
    assert np.array_equal(logits, ref[cached:]), \
        f"{name}: logits differ from the full recompute " \
        f"(max |d| {np.abs(logits - ref[cached:]).max()})"
    return cached


@pytest.mark.parametrize("layouts", [("page_first_direct", "layer_first")])
def test_restored_prefix_gives_exact_logits(workdir, layouts):
    t0 = time.monotonic()
    la, lb = layouts
    rng = np.random.default_rng(13)
    prompt = [int(t) for t in rng.integers(0, 256, 12 * P)]   # 12 pages
    longer = prompt + [int(t) for t in rng.integers(0, 256, 2 * P + 3)]
    model = tinymodel.TinyModel(seed=SEED)
    ref = model.logits(longer)                 # the reference: recompute all
    ssd = os.path.join(workdir, "ssd")
    with kvt_testutil.daemon(workdir, tinymodel.CONFIG, page_tokens=P,
                             tiers=f"ssd:{ssd},4M") as sock:
        # nothing stored yet: B computes everything
        assert run_b(sock, lb, longer, workdir, ref, "cold") == 0
        assert engine("store", sock, la, prompt) == {"pages": 12}
        # B restores the 12 prefix pages and computes the 11 new tokens
        assert run_b(sock, lb, longer, workdir, ref, "warm") == 12 * P
        # and so does an engine of A's layout
        assert run_b(sock, la, longer, workdir, ref, "warm2") == 12 * P

        # corrupt page 5 where the daemon keeps it
        kv = tinymodel.PagedKV.private(12, model.layers, P, model.kvh,
                                       model.d)
        model.prefill(prompt, kv, list(range(12)), 0)
        needle = kv.k(2)[5].tobytes()          # layer 2's K of page 5
        assert kvt_testutil.corrupt_page(ssd, needle) == 1
        with kvtier.Client(kvtier.Geometry.from_config(
                tinymodel.CONFIG, page_tokens=P), socket=sock) as cl:
            before = cl.stats()["cache"]["checksum_failures"]
        # B's prefetch stops at page 5; B recomputes pages 5.. exactly
        assert run_b(sock, lb, longer, workdir, ref, "corrupt") == 5 * P
        with kvtier.Client(kvtier.Geometry.from_config(
                tinymodel.CONFIG, page_tokens=P), socket=sock) as cl:
            assert cl.stats()["cache"]["checksum_failures"] > before
    assert time.monotonic() - t0 < 60


def test_every_layout_exact_logits(workdir):
    """The proof across SGLang's host-pool layouts: A backs a prompt up from
    a page_head pool (heads before tokens, layers between them: registered
    in rows); B restores it into page_first (layers interleaved per token)
    and layer_first pools: logits bitwise the full recompute's. MLA: the
    latent-attention tinymodel through MLA pools (page_first to
    page_first_direct and layer_first), bitwise too."""
    rng = np.random.default_rng(29)
    prompt = [int(t) for t in rng.integers(0, 256, 8 * P)]
    longer = prompt + [int(t) for t in rng.integers(0, 256, P + 1)]
    ref = tinymodel.TinyModel(seed=SEED).logits(longer)
    with kvt_testutil.daemon(workdir, tinymodel.CONFIG, page_tokens=P,
                             tiers="dram:8M") as sock:
        assert engine("store", sock, "page_head", prompt)["pages"] == 8
        for lb in ("page_first", "layer_first"):
            assert run_b(sock, lb, longer, workdir, ref,
                         "from-page_head-" + lb) == 8 * P
    ref = tinymodel.TinyMLAModel(seed=SEED).logits(longer)
    with kvt_testutil.daemon(workdir, tinymodel.MLA_CONFIG, page_tokens=P,
                             tiers="dram:8M") as sock:
        assert engine("store", sock, "page_first", prompt,
                      mla=True)["pages"] == 8
        for lb in ("page_first_direct", "layer_first"):
            assert run_b(sock, lb, longer, workdir, ref, "mla-" + lb,
                         mla=True) == 8 * P
