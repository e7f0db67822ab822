"""STAND-IN for SGLang python/sglang/launch_server.py (`python -m
sglang.launch_server`): not SGLang. Reproduces only the server arguments
kvtier's docs give (--model-path, --page-size, --tp-size,
--enable-hierarchical-cache, --hicache-write-policy, --hicache-mem-layout,
--hicache-io-backend, --hicache-size, --hicache-storage-backend,
--hicache-storage-backend-extra-config; parsed with argparse as
server_args.py does, the extra config as JSON), so
tests/python/test_user_flags.py can run the documented command line
unchanged. Instead of serving HTTP it runs one request ($KVT_STANDIN_TOKENS)
through the stand-in host pool (of --hicache-mem-layout) and cache
controller with the storage backend the flags name: $KVT_STANDIN_ROLE
"store" prefills and backs the pages up, "load" prefetches them; the
counters go to $KVT_STANDIN_OUT.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="sglang.launch_server")
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--served-model-name", default=None)
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--tp-size", type=int, default=1)
    ap.add_argument("--enable-hierarchical-cache", action="store_true")
    ap.add_argument("--hicache-write-policy", default="write_through",
                    choices=["write_back", "write_through",
                             "write_through_selective"])
    ap.add_argument("--hicache-mem-layout", default="layer_first",
                    choices=["layer_first", "page_first",
                             "page_first_direct", "page_head",
                             "page_first_kv_split"])
    ap.add_argument("--hicache-io-backend", default="kernel",
                    choices=["direct", "kernel", "kernel_ascend"])
    ap.add_argument("--hicache-size", type=int, default=0)
    ap.add_argument("--hicache-storage-backend", default=None)
    ap.add_argument("--hicache-storage-backend-extra-config", default=None)
    a = ap.parse_args(argv)
    if a.hicache_storage_backend and not a.enable_hierarchical_cache:
        ap.error("--hicache-storage-backend needs "
                 "--enable-hierarchical-cache")
    import numpy as np
    import sglang_engine as se
    import tinymodel
    from sglang.srt.managers.cache_controller import HiCacheController
    with open(os.path.join(a.model_path, "config.json"),
              encoding="utf-8") as f:
        cfg = json.load(f)
    toks = [int(t) for t in os.environ["KVT_STANDIN_TOKENS"].split(",")]
    P = a.page_size
    se.P = P
    pool = se.make_pool(a.hicache_mem_layout, pages=2 * (len(toks) // P) + 4,
                        config=cfg)
    ctl = HiCacheController(
        pool, P, storage_backend=a.hicache_storage_backend,
        model_name=a.served_model_name or a.model_path,
        storage_backend_extra_config=json.loads(
            a.hicache_storage_backend_extra_config or "{}"),
        tp_rank=0, tp_size=a.tp_size, prefetch_threshold=P)
    model = tinymodel.TinyModel(seed=7, config=cfg)
    out = {}
    try:
        if os.environ.get("KVT_STANDIN_ROLE") == "store":
            _, keys = se.store(model, ctl, toks)
            out["stored_pages"] = len(keys)
        else:
            cached, logits = se.load(model, ctl, toks)
            out["cached"] = cached
            out["logits_first"] = float(np.asarray(logits)[0, 0])
    finally:
        ctl.stop()
        ctl.storage_backend.close()
    with open(os.environ["KVT_STANDIN_OUT"], "w", encoding="utf-8") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
