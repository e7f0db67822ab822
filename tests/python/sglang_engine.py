"""A stand-in SGLang engine process for the kvtier tests: tinymodel's KV in
an SGLang host KV pool (the stand-in under tests/python/shims/sglang),
with kvtier.sglang.KvtierStorage as its dynamic storage backend, driven
through the stand-in cache controller in SGLang's call order.

As a program (one engine process of the numerical proof):

  sglang_engine.py store --socket S --layout L --tokens 1,2,3...
      prefill the prompt in the host pool, back its pages up to storage
  sglang_engine.py load --socket S --layout L --tokens ... --out F.npz
      prefetch what storage has of the prompt (batch_exists, then
      batch_get_v1 into the host pool), prefill only the rest; writes
      the logits of the computed positions and the cached token count

There is no GPU here: the model reads and writes the host pool directly
(SGLang would compute in its device pool and copy to and from the host
pool; the storage backend sees the host pool either way).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "shims"))

import tinymodel  # noqa: E402
from sglang.srt.managers.cache_controller import (HiCacheController,  # noqa: E402
                                                  page_hashes)
from sglang.srt.mem_cache.memory_pool_host import (  # noqa: E402
    DevicePoolInfo, MHATokenToKVPoolHost, MLADevicePoolInfo,
    MLATokenToKVPoolHost)

P = 4  # SGLang's --page-size here; the daemon's --page-tokens
MODEL = "tiny-llama"


def make_pool(layout: str, pages: int, config: Optional[dict] = None,
              dtype: Any = np.float32) -> MHATokenToKVPoolHost:
    """A host pool of @pages pages (plus the one upstream adds)."""
    c = config or tinymodel.CONFIG
    dev = DevicePoolInfo(head_num=c["num_key_value_heads"],
                         head_dim=c["head_dim"],
                         layer_num=c["num_hidden_layers"], size=P,
                         store_dtype=dtype)
    return MHATokenToKVPoolHost(dev, host_to_device_ratio=pages, host_size=0,
                                page_size=P, layout=layout)


def make_mla_pool(layout: str, pages: int, config: Optional[dict] = None,
                  dtype: Any = np.float32, **pool_kw: Any
                  ) -> MLATokenToKVPoolHost:
    """An MLA host pool (one latent per token) of @pages pages; @pool_kw
    go to the pool (override_kv_cache_dim, dcp_size)."""
    c = config or tinymodel.MLA_CONFIG
    dev = MLADevicePoolInfo(kv_lora_rank=c["kv_lora_rank"],
                            qk_rope_head_dim=c["qk_rope_head_dim"],
                            layer_num=c["num_hidden_layers"], size=P,
                            store_dtype=dtype)
    return MLATokenToKVPoolHost(dev, host_to_device_ratio=pages, host_size=0,
                                page_size=P, layout=layout, **pool_kw)


def extra_config(socket: str, **over: Any) -> Dict[str, Any]:
    """The backend's extra config. "decide" is false unless @over says
    otherwise: these tests check the data path on tinymodel, whose prefill
    any GPU's cost model prices at nothing (every hit would be recomputed;
    test_decide.py tests the decision)."""
    cfg: Dict[str, Any] = {"backend_name": "kvtier",
                           "module_path": "kvtier.sglang",
                           "class_name": "KvtierStorage", "interface_v1": 1,
                           "socket": socket, "decide": False}
    cfg.update(over)
    return {k: v for k, v in cfg.items() if v is not None}


def make_controller(pool: Any, socket: str, tp_rank: int = 0,
                    tp_size: int = 1, **extra: Any) -> HiCacheController:
    """SGLang's controller with kvtier as its dynamic backend."""
    return HiCacheController(pool, P, storage_backend="dynamic",
                             model_name=MODEL,
                             storage_backend_extra_config=extra_config(
                                 socket, **extra),
                             tp_rank=tp_rank, tp_size=tp_size,
                             is_mla_model=hasattr(pool, "kv_lora_rank"),
                             prefetch_threshold=P)


def kv_view(pool: Any) -> tinymodel.PagedKV:
    """tinymodel's paged K/V views [pages, P, H, D] per layer over the host
    pool, whatever its layout (MLA: the latent [pages, P, 1, Dk] as K and
    as V)."""
    from kvtier.layout import sglang_roles
    buf = pool.kv_buffer
    if hasattr(buf, "numpy"):  # a torch CPU tensor: a view of its memory
        buf = buf.numpy()
    mla = hasattr(pool, "kv_lora_rank")
    roles = list(sglang_roles(pool.layout, mla))
    if "slot" in roles:        # token slots: pages x P
        i = roles.index("slot")
        buf = buf.reshape(buf.shape[:i] + (pool.page_num, P) +
                          buf.shape[i + 1:])
        roles[i:i + 1] = ["block", "token"]
    want = ["layer", "block", "token", "head", "dim"]
    if mla:
        a = buf.transpose([roles.index(r) for r in want])
        return tinymodel.PagedKV([a[l] for l in range(pool.layer_num)],
                                 [a[l] for l in range(pool.layer_num)])
    a = buf.transpose([roles.index(r) for r in ["kv"] + want])
    return tinymodel.PagedKV([a[0, l] for l in range(pool.layer_num)],
                             [a[1, l] for l in range(pool.layer_num)])


def store(model: tinymodel.TinyModel, ctl: HiCacheController,
          tokens: List[int]) -> Tuple[List[int], List[str]]:
    """Prefill @tokens from nothing into fresh host pages, then back the
    whole pages up (write_storage + the backup thread's batches).
    Returns the host slots and the page keys."""
    n = len(tokens) - len(tokens) % P
    slots = ctl.mem_pool_host.alloc((len(tokens) + P - 1) // P * P)
    table = [int(slots[i]) // P for i in range(0, len(slots), P)]
    model.prefill(tokens, kv_view(ctl.mem_pool_host), table, 0)
    keys = page_hashes(tokens, P)
    op = ctl.write_storage(slots[:n], tokens[:n], hash_value=keys,
                           prefix_keys=None)
    done = ctl.backup(op)
    if done != n:
        raise RuntimeError(f"backup stored {done} of {n} tokens")
    return [int(x) for x in slots], keys


def load(model: tinymodel.TinyModel, ctl: HiCacheController,
         tokens: List[int]) -> Tuple[int, np.ndarray]:
    """A request with nothing local: prefetch from storage what it has of
    @tokens (the whole pages, minus the last token: one must be computed),
    prefill the rest. Returns (cached tokens, logits of the rest)."""
    fetchable = (len(tokens) - 1) // P * P
    slots = ctl.mem_pool_host.alloc(fetchable)
    op = ctl.prefetch("req", slots, tokens[:fetchable], last_hash=None,
                      prefix_keys=None)
    cached = ctl.run_prefetch(op)
    for r in ctl.released:  # upstream: the host-memory release queue
        ctl.mem_pool_host.free(r)
    ctl.released.clear()
    table = [int(slots[i]) // P for i in range(0, cached, P)]
    rest = ctl.mem_pool_host.alloc((len(tokens) - cached + P - 1) // P * P)
    table += [int(rest[i]) // P for i in range(0, len(rest), P)]
    logits = model.prefill(tokens, kv_view(ctl.mem_pool_host), table, cached)
    return cached, logits


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("role", choices=["store", "load"])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--layout", default="page_first_direct")
    ap.add_argument("--tokens", required=True, help="comma-separated ids")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", help="load: .npz for the logits")
    ap.add_argument("--mla", action="store_true",
                    help="tinymodel's MLA variant in an MLA host pool")
    a = ap.parse_args(argv)
    tokens = [int(t) for t in a.tokens.split(",")]
    pages = 2 * (len(tokens) // P) + 4
    if a.mla:
        model: tinymodel.TinyModel = tinymodel.TinyMLAModel(seed=a.seed)
        pool: Any = make_mla_pool(a.layout, pages)
    else:
        model = tinymodel.TinyModel(seed=a.seed)
        pool = make_pool(a.layout, pages)
    ctl = make_controller(pool, a.socket)
    try:
        if a.role == "store":
            _, keys = store(model, ctl, tokens)
            print(json.dumps({"pages": len(keys)}))
        else:
            cached, logits = load(model, ctl, tokens)
            np.savez(a.out, logits=logits, cached=cached)
            print(json.dumps({"cached": cached}))
    finally:
        ctl.stop()
        ctl.storage_backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
