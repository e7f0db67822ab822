# STAND-IN for vLLM vllm/entrypoints/cli/main.py (the `vllm` command): not
# vLLM. Reproduces only `vllm serve MODEL` with the flags kvtier's docs give
# (--block-size, --kv-transfer-config, --kv-cache-dtype,
# --tensor-parallel-size, --gpu-memory-utilization accepted and unused),
# parsed as vLLM parses them (argparse; the JSON of --kv-transfer-config
# becomes a KVTransferConfig; the model directory's config.json its
# hf_config), so tests/python/test_user_flags.py can run the documented
# command line unchanged. Instead of serving HTTP it serves one request
# ($KVT_STANDIN_TOKENS, comma-separated ids) with the stand-in scheduler
# and worker and writes the connector's counters to $KVT_STANDIN_OUT.
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="vllm")
    subs = ap.add_subparsers(dest="cmd", required=True)
    sp = subs.add_parser("serve")
    sp.add_argument("model")
    sp.add_argument("--block-size", type=int, default=16)
    sp.add_argument("--kv-transfer-config", type=json.loads)
    sp.add_argument("--kv-cache-dtype", default="auto")
    sp.add_argument("--tensor-parallel-size", type=int, default=1)
    sp.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    a = ap.parse_args(argv)
    from vllm.config import KVTransferConfig
    import numpy as np
    import vllm_engine as ve
    import tinymodel
    with open(os.path.join(a.model, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    ktc = KVTransferConfig(**a.kv_transfer_config) \
        if a.kv_transfer_config else None
    toks = [int(t) for t in os.environ["KVT_STANDIN_TOKENS"].split(",")]
    e = ve.Engine(None if ktc is None else {}, model_config=cfg,
                  block_size=a.block_size, cache_dtype=a.kv_cache_dtype,
                  num_blocks=len(toks) // a.block_size + 4, ktc=ktc,
                  model=a.model)
    model = tinymodel.TinyModel(seed=7, config=cfg)
    e.add("r0", toks)
    e.run(ve.tiny_forward(e, model))
    e.shutdown()
    out = {k: int(v) for k, v in e.stats.items()}
    out["invalid"] = e.invalid
    out["logits_first"] = float(np.asarray(e.outputs["r0"][1])[0, 0])
    with open(os.environ["KVT_STANDIN_OUT"], "w", encoding="utf-8") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
