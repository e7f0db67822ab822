# STAND-IN for vLLM vllm/v1/core/kv_cache_manager.py (and block_pool.py),
# both generations: reproduces only KVCacheBlocks.get_block_ids(), and a
# block pool with vLLM's prefix caching: full blocks cached by block hash,
# kept after free until their block is reused; get_computed_blocks never
# covers the last prompt token; allocate_slots as upstream calls it (the
# request's computed, new local, external and new tokens must fit, blocks
# cached at allocation unless delay_cache_blocks, None when the pool is
# short); get_blocks (all of a request's blocks). One KV cache group, no
# lookahead slots, no sliding window; not vLLM.
from __future__ import annotations

from collections import OrderedDict
from typing import Dict, List, Optional, Tuple


class KVCacheBlocks:

    def __init__(self, block_ids: List[int]) -> None:
        self._ids = list(block_ids)

    def get_block_ids(self, allow_none: bool = False
                      ) -> Optional[Tuple[List[int], ...]]:
        if allow_none and not self._ids:
            return None
        return (list(self._ids),)

    def __add__(self, other: "KVCacheBlocks") -> "KVCacheBlocks":
        return KVCacheBlocks(self._ids + other._ids)


class KVCacheManager:

    def __init__(self, num_blocks: int, block_size: int,
                 enable_caching: bool = True) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.num_blocks = num_blocks
        self.free_ids: "OrderedDict[int, None]" = OrderedDict(
            (i, None) for i in range(num_blocks))
        self.ref: Dict[int, int] = {}
        self.hash_to_block: Dict[bytes, int] = {}
        self.block_hash: Dict[int, bytes] = {}
        self.req_blocks: Dict[str, List[int]] = {}
        self.empty_kv_cache_blocks = KVCacheBlocks([])

    def new_step_starts(self) -> None:
        return

    def get_computed_blocks(self, request) -> Tuple[KVCacheBlocks, int]:
        if not self.enable_caching:
            return KVCacheBlocks([]), 0
        out: List[int] = []
        limit = (request.num_tokens - 1) // self.block_size
        for h in request.block_hashes[:limit]:
            b = self.hash_to_block.get(h)
            if b is None:
                break
            out.append(b)
        return KVCacheBlocks(out), len(out) * self.block_size

    def _take(self) -> int:
        b, _ = self.free_ids.popitem(last=False)
        h = self.block_hash.pop(b, None)
        if h is not None and self.hash_to_block.get(h) == b:
            del self.hash_to_block[h]
        return b

    def allocate_slots(self, request, num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_blocks: Optional[KVCacheBlocks] = None,
                       num_lookahead_tokens: int = 0,
                       num_external_computed_tokens: int = 0,
                       delay_cache_blocks: bool = False
                       ) -> Optional[KVCacheBlocks]:
        have = self.req_blocks.get(request.request_id, [])
        computed = (new_computed_blocks.get_block_ids()[0]
                    if new_computed_blocks else [])
        total = (request.num_computed_tokens + num_new_computed_tokens +
                 num_external_computed_tokens + num_new_tokens +
                 num_lookahead_tokens)
        need = -(-total // self.block_size) - len(have) - len(computed)
        # blocks in the prefix cache that are free count as free, once
        reuse = sum(1 for b in computed if self.ref.get(b, 0) == 0)
        if need > len(self.free_ids) - reuse:
            return None
        for b in computed:
            if self.ref.get(b, 0) == 0:
                self.free_ids.pop(b, None)
            self.ref[b] = self.ref.get(b, 0) + 1
        new = [self._take() for _ in range(max(need, 0))]
        for b in new:
            self.ref[b] = 1
        self.req_blocks[request.request_id] = have + computed + new
        if self.enable_caching and not delay_cache_blocks:
            self.cache_blocks(request, min(
                request.num_computed_tokens + num_new_computed_tokens +
                num_external_computed_tokens + num_new_tokens,
                request.num_tokens))
        return KVCacheBlocks(new)

    def cache_blocks(self, request, num_computed_tokens: int) -> None:
        if not self.enable_caching:
            return
        ids = self.req_blocks.get(request.request_id, [])
        n = min(num_computed_tokens // self.block_size,
                len(request.block_hashes), len(ids))
        for i in range(n):
            h = request.block_hashes[i]
            if h not in self.hash_to_block:
                self.hash_to_block[h] = ids[i]
                self.block_hash[ids[i]] = h

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return KVCacheBlocks(self.req_blocks.get(request_id, []))

    def get_block_ids(self, request_id: str) -> Tuple[List[int], ...]:
        return (list(self.req_blocks.get(request_id, [])),)

    def free(self, request) -> None:
        for b in reversed(self.req_blocks.pop(request.request_id, [])):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free_ids[b] = None
