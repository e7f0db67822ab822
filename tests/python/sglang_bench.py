"""What kvtier.sglang's one-page-per-prefix mapping costs: batch_exists,
batch_set_v1 and batch_get_v1 of N pages through the backend (one daemon
request per page), against the same pages as ONE chained prefix through
the client directly (one lookup, one job). Not a test: run by hand

  KVTIER_LIB=build/libkvtier.so KVTIER_BIN=build/kvtier \\
  PYTHONPATH=python:tests/python/shims:tests/python \\
  /usr/bin/python3 tests/python/sglang_bench.py [--pages 128] [--page 16]
      [--model llama-3.1-8b-like|tiny] [--reps 5]

Prints one JSON line per repetition with milliseconds per call.
"""
from __future__ import annotations

import argparse
import json
import shutil
import time

import numpy as np

import kvt_testutil
import sglang_engine as eng
import tinymodel
from sglang.srt.managers.cache_controller import page_hashes

# Llama-3.1-8B's KV shape on one rank (32 layers, 8 KV heads of 128), fp16
LLAMA8B = dict(tinymodel.CONFIG, num_hidden_layers=32, num_key_value_heads=8,
               num_attention_heads=32, head_dim=128, hidden_size=4096,
               torch_dtype="float16")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", type=int, default=128)
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--model", choices=["llama-3.1-8b-like", "tiny"],
                    default="llama-3.1-8b-like")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    cfg = LLAMA8B if a.model != "tiny" else tinymodel.CONFIG
    dtype = np.float16 if cfg["torch_dtype"] == "float16" else np.float32
    eng.P = a.page
    n = a.pages
    mib = n * 2 * cfg["num_hidden_layers"] * a.page * \
        cfg["num_key_value_heads"] * cfg["head_dim"] * np.dtype(dtype).itemsize
    tiers = f"dram:{(3 * mib) // (1 << 20) + 16}M"
    work = kvt_testutil.tmpdir()
    try:
        with kvt_testutil.daemon(work, cfg, page_tokens=a.page,
                                 tiers=tiers) as sock:
            pool = eng.make_pool("page_first_direct", 2 * n, cfg, dtype)
            ctl = eng.make_controller(pool, sock)
            be = ctl.storage_backend
            pool.kv_buffer[...] = 1
            for rep in range(a.reps):
                toks = [(rep * 7919 + i) % 50000 for i in range(n * a.page)]
                keys = page_hashes(toks, a.page)
                src = pool.alloc(n * a.page)
                dst = pool.alloc(n * a.page)
                r = {"rep": rep, "pages": n, "page_tokens": a.page,
                     "mib": round(mib / (1 << 20), 1)}
                t = time.perf_counter()
                assert all(be.batch_set_v1(keys, src))
                r["set_ms"] = (time.perf_counter() - t) * 1e3
                t = time.perf_counter()
                assert be.batch_exists(keys) == n
                r["exists_ms"] = (time.perf_counter() - t) * 1e3
                t = time.perf_counter()
                assert all(be.batch_get_v1(keys, dst))
                r["get_ms"] = (time.perf_counter() - t) * 1e3
                # the same bytes as one chained prefix, through the client
                ck = be.client.hash_tokens(toks)
                blocks = [int(src[i]) // a.page
                          for i in range(0, len(src), a.page)]
                dblocks = [int(dst[i]) // a.page
                           for i in range(0, len(dst), a.page)]
                t = time.perf_counter()
                with be.client.store(be.mem, ck, blocks) as j:
                    assert j.wait() == []
                r["chain_set_ms"] = (time.perf_counter() - t) * 1e3
                t = time.perf_counter()
                assert be.client.lookup(ck).pages == n
                r["chain_exists_ms"] = (time.perf_counter() - t) * 1e3
                t = time.perf_counter()
                with be.client.load(be.mem, ck, dblocks) as j:
                    assert j.wait() == []
                r["chain_get_ms"] = (time.perf_counter() - t) * 1e3
                print(json.dumps({k: round(v, 2) if isinstance(v, float)
                                  else v for k, v in r.items()}), flush=True)
                pool.free(src)
                pool.free(dst)
            be.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
