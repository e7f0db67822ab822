# STAND-IN for vLLM vllm/v1/core/kv_cache_manager.py (and block_pool.py),
# both generations: reproduces only KVCacheBlocks.get_block_ids(), and a
# block pool with vLLM's prefix caching: full blocks cached by block hash,
# kept after free until their block is reused; get_computed_blocks never
# covers the last prompt token; allocate_slots as upstream calls it (the
# request's computed, new local, external and new tokens must fit, blocks
# cached at allocation unless delay_cache_blocks, None when the pool is
# short); get_blocks (all of a request's blocks). KVCacheManager: one KV
# cache group, no lookahead slots, no sliding window.
# HybridKVCacheManager: vLLM's hybrid memory allocator as the connector sees
# it (kv_cache_coordinator.py and single_type_kv_cache_manager.py; their
# behaviour as the scheduler at 00f4240ee6458263d76cf51ca7901ce1350bb4d1
# calls them, the managers read from copies of upstream's text, not at that
# commit): several KV cache groups over ONE block pool (a block id belongs
# to one group of one request at a time), block 0 the null block, never
# handed out; per group a block table of the request's pages; a
# sliding-window group's pages that left the window (token t needs tokens
# t - window + 1 .. t, so max(0, n - window + 1) of n computed tokens are
# skipped) become the null block and are freed — at every allocate_slots
# before allocating (remove_skipped_blocks on the tokens computed so far,
# external ones included) and by the scheduler before request_finished;
# pages allocated for external tokens already out of the window are null
# from the start. No local prefix caching under it (get_computed_blocks
# finds nothing): not vLLM's hybrid prefix-cache hit.
# A mamba group in mamba_cache_mode "align" (window STATE), as
# MambaManager allocates it (vllm/v1/core/single_type_kv_cache_manager.py;
# read from a copy of upstream's text close to, not at, 00f4240ee645):
# a table of cdiv(tokens, block_size) entries, all null but the block of
# the running state (the last entry) and, for a request whose first
# allocation covers external tokens, the block at the hit's last boundary
# (entry tokens / block_size - 1: the state the connector loads); the
# running state's block, once a step ends on a block boundary, holds the
# state at that boundary and stays in the table while the next step
# starts from it; at every allocate_slots blocks of entries below
# (computed - 1) // block_size are freed (MambaManager's skipped tokens:
# computed - 1; upstream's last_state_block_idx frees the same one here,
# no speculative blocks). Not vLLM.
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Dict, List, Optional, Sequence, Tuple


class KVCacheBlocks:
    """A request's blocks, one list per KV cache group (a list: one
    group)."""

    def __init__(self, block_ids: Any) -> None:
        if block_ids and isinstance(block_ids[0], (list, tuple)):
            self._groups = tuple(list(g) for g in block_ids)
        else:
            self._groups = (list(block_ids),)

    def get_block_ids(self, allow_none: bool = False
                      ) -> Optional[Tuple[List[int], ...]]:
        if allow_none and not any(self._groups):
            return None
        return tuple(list(g) for g in self._groups)

    def __add__(self, other: "KVCacheBlocks") -> "KVCacheBlocks":
        assert len(self._groups) == len(other._groups)
        return KVCacheBlocks([a + b for a, b in
                              zip(self._groups, other._groups)])


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


NULL_BLOCK = 0   # upstream's BlockPool.null_block: the pool's block 0
STATE = -1       # a group's "window": a mamba group in "align" mode


class HybridKVCacheManager:
    """Several KV cache groups over one pool (module comment). @windows:
    per group its sliding window in tokens, 0 for full attention."""

    def __init__(self, num_blocks: int, block_size: int,
                 windows: Sequence[int]) -> None:
        self.block_size = block_size
        self.windows = list(windows)
        self.enable_caching = False
        self.free_ids: "OrderedDict[int, None]" = OrderedDict(
            (i, None) for i in range(1, num_blocks))
        self.req_blocks: Dict[str, List[List[int]]] = {}
        self.empty_kv_cache_blocks = KVCacheBlocks([[] for _ in windows])
        self.has_state = STATE in self.windows

    def new_step_starts(self) -> None:
        return

    def get_computed_blocks(self, request) -> Tuple[KVCacheBlocks, int]:
        return self.empty_kv_cache_blocks, 0

    def _skipped(self, g: int, num_computed_tokens: int) -> int:
        """Leading pages of group @g out of the window once
        @num_computed_tokens are computed."""
        w = self.windows[g]
        if w == STATE:
            return max(0, num_computed_tokens - 1) // self.block_size
        if not w:
            return 0
        return max(0, num_computed_tokens - w + 1) // self.block_size

    def remove_skipped_blocks(self, request_id: str,
                              total_computed_tokens: int) -> None:
        groups = self.req_blocks.get(request_id)
        if groups is None:
            return
        for g, blocks in enumerate(groups):
            n = min(self._skipped(g, total_computed_tokens), len(blocks))
            for i in range(n - 1, -1, -1):
                if blocks[i] == NULL_BLOCK:
                    break
                self.free_ids[blocks[i]] = None
                blocks[i] = NULL_BLOCK

    def allocate_slots(self, request, num_new_tokens: int,
                       num_new_computed_tokens: int = 0,
                       new_computed_blocks: Optional[KVCacheBlocks] = None,
                       num_lookahead_tokens: int = 0,
                       num_external_computed_tokens: int = 0,
                       delay_cache_blocks: bool = False
                       ) -> Optional[KVCacheBlocks]:
        rid = request.request_id
        computed = (request.num_computed_tokens + num_new_computed_tokens +
                    num_external_computed_tokens)
        self.remove_skipped_blocks(rid, computed)
        have = self.req_blocks.get(rid) or [[] for _ in self.windows]
        total = computed + num_new_tokens + num_lookahead_tokens
        want = -(-total // self.block_size)
        plan = []
        need = 0
        for g, blocks in enumerate(have):
            skip = self._skipped(g, computed)
            new = [i for i in range(len(blocks), want)]
            if self.windows[g] == STATE:    # running state, hit's state
                hit = computed // self.block_size - 1 \
                    if computed % self.block_size == 0 else -1
                real = [i for i in new if i in (want - 1, hit)]
            else:
                real = [i for i in new if i >= skip]
            plan.append((new, set(real)))
            need += len(real)
        if need > len(self.free_ids):
            return None
        out: List[List[int]] = []
        for blocks, (new, real) in zip(have, plan):
            got = [self.free_ids.popitem(last=False)[0] if i in real
                   else NULL_BLOCK for i in new]
            blocks += got
            out.append(got)
        self.req_blocks[rid] = have
        return KVCacheBlocks(out)

    def cache_blocks(self, request, num_computed_tokens: int) -> None:
        return

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return KVCacheBlocks(self.req_blocks.get(
            request_id, [[] for _ in self.windows]))

    def get_block_ids(self, request_id: str) -> Tuple[List[int], ...]:
        return self.get_blocks(request_id).get_block_ids()

    def free(self, request) -> None:
        for blocks in self.req_blocks.pop(request.request_id, []):
            for b in reversed(blocks):
                if b != NULL_BLOCK:
                    self.free_ids[b] = None
