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
import logging
import os
from typing import Any, Iterable, Iterator, List, Optional, Set, Tuple

from . import KvtierError

log = logging.getLogger("kvtier.vllm")

__all__ = ["preempted_ids", "resumed_ids",
           "block_ids", "publishable_blocks", "require_hash_seed",
           "hash_fingerprint", "load_config", "scheduled_reqs",
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


def load_config(cfg: Any) -> dict:
    """A model config given as a path, JSON text or a dict, as a new
    dict."""
    import json
    if isinstance(cfg, (str, os.PathLike)) and not str(cfg).lstrip() \
            .startswith("{"):
        with open(cfg, encoding="utf-8") as f:
            return dict(json.load(f))
    if isinstance(cfg, str):
        return dict(json.loads(cfg))
    return dict(cfg)


def scheduled_reqs(so: Any) -> Iterator[Tuple[str, Any, bool, int, int]]:
    """The requests a step's SchedulerOutput @so schedules: (id, the block
    ids it adds per group or None, whether those replace the request's
    blocks (a new or resumed request), tokens computed before the step,
    tokens scheduled in it)."""
    sched = so.num_scheduled_tokens
    for nr in so.scheduled_new_reqs:
        yield (nr.req_id, nr.block_ids, True, nr.num_computed_tokens,
               sched.get(nr.req_id, 0))
    cr = so.scheduled_cached_reqs
    resumed = resumed_ids(cr)
    for i, rid in enumerate(cr.req_ids):
        yield (rid, cr.new_block_ids[i], rid in resumed,
               cr.num_computed_tokens[i], sched.get(rid, 0))


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
    cfg = load_config(cfg)
    if "text_config" in cfg and isinstance(cfg["text_config"], dict):
        cfg["text_config"] = dict(cfg["text_config"], torch_dtype=kvd)
    cfg["torch_dtype"] = kvd
    cfg.pop("dtype", None)
    return cfg


class _Fingerprint:
    """KvtierConnector's publication of its hash_fingerprint() (a mixin:
    the scheduler side's state _fp_*, _client, _tenant, _ns, _model)."""

    def _check_fingerprint(self) -> None:  # noqa: C901
        """Once per connection, at a lookup: publish the fingerprint of
        what determines this engine's block hashes (PYTHONHASHSEED through
        NONE_HASH, the hash algorithm, block size, model:
        vllm_compat.hash_fingerprint) and warn once when other engines of
        this tenant published different ones: their pages and this one's
        never match. Counted by the daemon
        (kvtier_fingerprint_conflicts_total) and in self.hash_conflicts."""
        if self._fp_sent or self._fp_off or self._down_since is not None:
            return
        fp = hash_fingerprint(self._vllm_config.cache_config, self._model)
        if fp is None:  # the engine core has not seeded its hashes yet
            self._fp_tries += 1
            if self._fp_tries >= 100:
                self._fp_off = True
                log.warning("kvtier.vllm: this vLLM has no seeded "
                            "vllm.v1.core.kv_cache_utils.NONE_HASH after "
                            "100 lookups: engines with different hash "
                            "seeds sharing the daemon will not be noticed")
            return
        self._fp_sent = True
        try:
            others, _ = self._client.publish_fingerprint(
                self._client.FP_VLLM, fp)
        except KvtierError as e:
            # a daemon that predates FPRINT: never again on this connector
            self._fp_off = True
            self._note_down(e)
            log.warning("kvtier.vllm: could not publish the block-hash "
                        "fingerprint (an older daemon?): engines with "
                        "different hash seeds will not be noticed: %s", e)
            return
        self.hash_conflicts = others
        if others and not self._fp_warned:
            self._fp_warned = True
            log.warning(
                "kvtier.vllm: %d other engine(s) of tenant %s in namespace "
                "%r published a different block-hash fingerprint: their "
                "pages and this engine's never match (0 hits between "
                "them). vLLM's block hashes depend on PYTHONHASHSEED "
                "(here: %s), the prefix-caching hash algorithm (here: %s), "
                "the block size (%d) and the model (%s): give every engine "
                "sharing the daemon the same (kvtier_fingerprint_conflicts_"
                "total counts this)", others, self._tenant, self._ns,
                "set" if os.environ.get("PYTHONHASHSEED") is not None
                else "unset, random per process",
                getattr(self._vllm_config.cache_config,
                        "prefix_caching_hash_algo", "sha256"),
                self._block_size, self._model)
