"""Where vLLM's connector interface differs between the pinned releases,
decided in one place by what vLLM actually passes (never by a version
string): kvtier.vllm calls these.

Generations (docs/ENGINES.md "Pinned versions"; the method tables are in
tests/python/conformance/vllm.json):

  v0.12   vLLM v0.12.0 .. about v0.15: handle_preemptions(preempted_req_ids:
          set[str]), called by the worker only in steps that preempted,
          before the metadata is bound; CachedRequestData.resumed_req_ids
          (a set) with resumed_from_preemption kept as a deprecated
          per-request list; kv_cache_config optional in the constructor;
          update_state_after_alloc gets the local-hit blocks plus the new
          ones.
  current later releases: handle_preemptions(kv_connector_metadata), called
          every step; resumed_req_ids only; kv_cache_config required;
          update_state_after_alloc gets all the request's blocks;
          request.num_publishable_block_hashes bounds what may be stored.

Older still (v0.11): resumed_from_preemption only, and the factory may
construct a connector with (vllm_config, role): both are handled too.
"""
from __future__ import annotations

import hashlib
import os
from typing import Any, Iterable, List, Optional, Set

__all__ = ["preempted_ids", "resumed_ids", "check_kv_cache_config",
           "block_ids", "publishable_blocks", "require_hash_seed",
           "hash_fingerprint",
           "kv_dtype_config"]


def preempted_ids(arg: Any) -> Set[str]:
    """The request ids handle_preemptions() was called for: a set (or any
    collection) of ids in v0.12-era vLLM, the step's connector metadata
    (its .preempted) later. None: nothing."""
    if arg is None:
        return set()
    if isinstance(arg, (set, frozenset, list, tuple)):
        bad = [x for x in arg if not isinstance(x, str)]
        if bad:
            raise TypeError(f"kvtier.vllm: handle_preemptions got non-id "
                            f"items {bad[:3]!r}")
        return set(arg)
    pre = getattr(arg, "preempted", None)
    if pre is None:
        raise TypeError(f"kvtier.vllm: handle_preemptions got "
                        f"{type(arg).__name__}: neither request ids nor "
                        f"kvtier's connector metadata")
    return set(pre)


def resumed_ids(cached: Any) -> Set[str]:
    """Requests of CachedRequestData @cached that resume after preemption
    (their new_block_ids replace their blocks): resumed_req_ids (a set,
    v0.11.2 on), else the per-request resumed_from_preemption list."""
    ids = getattr(cached, "resumed_req_ids", None)
    if ids is not None:
        return set(ids)
    flags = getattr(cached, "resumed_from_preemption", None)
    if flags is None:
        return set()
    return {rid for rid, f in zip(cached.req_ids, flags) if f}


def _spec_name(group: Any) -> str:
    spec = getattr(group, "kv_cache_spec", None)
    return type(spec).__name__ if spec is not None else "?"


def check_kv_cache_config(kv_cache_config: Any) -> None:
    """Refuse, at start, what the connector cannot serve: several KV cache
    groups (a hybrid model — sliding-window or mamba layers beside full
    attention — under vLLM's hybrid memory allocator) or a non-attention
    group. None (v0.11-era constructors): nothing to check here."""
    if kv_cache_config is None:
        return
    groups = getattr(kv_cache_config, "kv_cache_groups", None)
    if groups is None:
        return
    if len(groups) != 1:
        kinds = ", ".join(_spec_name(g) for g in groups)
        raise ValueError(
            f"kvtier.vllm: {len(groups)} KV cache groups ({kinds}): a "
            f"hybrid model under vLLM's hybrid memory allocator. vLLM's "
            f"interface allows a connector there (SupportsHMA: "
            f"request_finished_all_groups, a block table per group), but "
            f"kvtier stores a page as all of the model's layers, and here "
            f"the groups' layers live in different blocks: a sliding-window "
            f"group frees a page's blocks once the page left the window "
            f"while the full-attention group keeps it, so most pages are "
            f"never whole (and a mamba group holds per-request state, not "
            f"pages). Not supported: models with sliding-window layers run "
            f"with --disable-hybrid-kv-cache-manager (one group; vLLM then "
            f"keeps every layer's full KV); models with mamba layers are "
            f"not supported")
    name = _spec_name(groups[0])
    if "Mamba" in name or "Linear" in name:
        raise ValueError(f"kvtier.vllm: KV cache group of {name}: state "
                         f"caches (mamba / linear attention) are not KV "
                         f"pages this connector can store")


def block_ids(blocks: Any) -> List[int]:
    """The block ids of KVCacheBlocks @blocks (one group)."""
    ids = blocks.get_block_ids()
    return list(ids[0]) if ids else []


def publishable_blocks(request: Any, n: int) -> int:
    """How many of a request's first @n blocks may be stored by hash:
    later vLLM says so in request.num_publishable_block_hashes (blocks
    whose hash must not be shared, e.g. under speculative decoding, are
    not); earlier releases publish every full block."""
    k = getattr(request, "num_publishable_block_hashes", None)
    return n if k is None else min(n, int(k))


def require_hash_seed(extra: dict, role_is_scheduler: bool) -> None:
    """vLLM seeds its block hash chain with PYTHONHASHSEED (random per
    process without it): refuse to start the scheduler side without one
    unless the user opted out."""
    if role_is_scheduler and extra.get("require_hash_seed", True) and \
            os.environ.get("PYTHONHASHSEED") is None:
        raise ValueError(
            "kvtier.vllm: PYTHONHASHSEED is not set: vLLM then seeds its "
            "block hashes at random per process and no other process (or "
            "restart) can hit this cache. Set the same PYTHONHASHSEED for "
            "every vLLM sharing the daemon, or set "
            "\"require_hash_seed\": false")


def hash_fingerprint(cache_config: Any, model: str) -> Optional[bytes]:
    """A 32-byte fingerprint of what determines this vLLM's block hashes,
    or None when the engine's chain seed is not set yet (vLLM sets it
    when its engine core starts, after the scheduler and its connector).

    vLLM names block i hash_fn((hash of block i-1, block i's tokens,
    extra keys)), the chain rooted at NONE_HASH = hash_fn(PYTHONHASHSEED)
    (vllm/v1/core/kv_cache_utils.py, init_none_hash: os.urandom(32)
    without the variable), hash_fn chosen by --prefix-caching-hash-algo.
    So two engines give the same hashes for the same tokens exactly when
    NONE_HASH, the algorithm and the block size agree; kvtier's keys add
    the model (the connector's salt). The fingerprint is keyed BLAKE2b of
    those: it names no seed (NONE_HASH is itself a hash of it), and the
    same inputs give the same fingerprint in every process."""
    try:
        from vllm.v1.core import kv_cache_utils
        seed_hash = getattr(kv_cache_utils, "NONE_HASH", None)
    except ImportError:
        return None
    if seed_hash is None or seed_hash in (b"", 0):
        return None
    from .keys import _hash_bytes
    algo = str(getattr(cache_config, "prefix_caching_hash_algo", "sha256"))
    h = hashlib.blake2b(digest_size=32, key=b"kvtier vllm block hashes v1")
    for part in (algo.encode(), _hash_bytes(seed_hash),
                 str(int(cache_config.block_size)).encode(),
                 model.encode()):
        h.update(len(part).to_bytes(4, "little") + part)
    return h.digest()


def ids_of(x: Optional[Iterable[str]]) -> Set[str]:
    """A possibly-None collection of request ids as a set."""
    return set(x) if x else set()


_FP8 = {"fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn",
        "fp8_e5m2": "float8_e5m2", "fp8_inc": "float8_e4m3fn",
        "fp8_ds_mla": "float8_e4m3fn"}


def kv_dtype_config(cfg: Any, cache_dtype: str) -> Any:
    """The model config with the KV cache's element type: vLLM's
    --kv-cache-dtype fp8* stores 1-byte elements whatever the model's
    dtype (the daemon must serve the same: `kvtier serve --kv-dtype`)."""
    kvd = _FP8.get(str(cache_dtype or "auto"))
    if kvd is None:
        if str(cache_dtype or "auto") not in ("auto", "bfloat16", "float16",
                                             "half", "float32", "float"):
            raise ValueError(f"kvtier.vllm: --kv-cache-dtype {cache_dtype} "
                             f"is not supported")
        if str(cache_dtype or "auto") == "auto":
            return cfg
        kvd = {"half": "float16", "float": "float32"}.get(
            str(cache_dtype), str(cache_dtype))
    if isinstance(cfg, (str, os.PathLike)) and not str(cfg).lstrip() \
            .startswith("{"):
        with open(cfg, encoding="utf-8") as f:
            import json
            cfg = json.load(f)
    elif isinstance(cfg, str):
        import json
        cfg = json.loads(cfg)
    cfg = dict(cfg)
    if "text_config" in cfg and isinstance(cfg["text_config"], dict):
        cfg["text_config"] = dict(cfg["text_config"], torch_dtype=kvd)
    cfg["torch_dtype"] = kvd
    cfg.pop("dtype", None)
    return cfg
