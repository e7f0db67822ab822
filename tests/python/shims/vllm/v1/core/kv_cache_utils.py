# STAND-IN for vLLM v0.12.0 vllm/v1/core/kv_cache_utils.py: reproduces only
# the block hash chain (hash of (parent hash, the block's token ids, extra
# keys) with SHA-256 over a pickle; the first block's extra keys carry the
# request's cache_salt; the chain's seed NONE_HASH derives from
# PYTHONHASHSEED, else is random per process) and the request block hasher;
# not vLLM.
from __future__ import annotations

import hashlib
import os
import pickle
from typing import Any, Callable, List, Optional, Sequence, Tuple

BlockHash = bytes
NONE_HASH: BlockHash = b""


def sha256(obj: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=5)).digest()


def init_none_hash(hash_fn: Callable[[Any], bytes] = sha256) -> None:
    global NONE_HASH
    seed = os.getenv("PYTHONHASHSEED")
    NONE_HASH = os.urandom(32) if seed is None else hash_fn(seed)


def hash_block_tokens(hash_fn: Callable[[Any], bytes],
                      parent: Optional[BlockHash], tokens: Sequence[int],
                      extra_keys: Optional[Tuple[Any, ...]] = None
                      ) -> BlockHash:
    if not parent:
        parent = NONE_HASH
    return hash_fn((parent, tuple(tokens), extra_keys))


def get_request_block_hasher(block_size: int,
                             hash_fn: Callable[[Any], bytes] = sha256
                             ) -> Callable[[Any], List[BlockHash]]:
    """The new full blocks' hashes of a request (called as it grows)."""
    def hasher(request: Any) -> List[BlockHash]:
        start = len(request.block_hashes) * block_size
        prev = request.block_hashes[-1] if request.block_hashes else None
        out: List[BlockHash] = []
        toks = request.all_token_ids
        while start + block_size <= len(toks):
            extra = (request.cache_salt,) if start == 0 and \
                request.cache_salt else None
            prev = hash_block_tokens(hash_fn, prev,
                                     toks[start:start + block_size], extra)
            out.append(prev)
            start += block_size
        return out
    return hasher


init_none_hash()
