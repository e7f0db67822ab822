"""kvtier's vLLM connector for hybrid models under vLLM's hybrid memory
allocator (HMA): sliding-window or mamba / linear-attention (state)
layers beside full attention. A mixin of
kvtier.vllm.KvtierConnector (its scheduler- and worker-side calls branch
here when the KV cache config has several groups), and the plan of the
groups.

THE PICTURE (vLLM's interface at 00f4240ee6458263d76cf51ca7901ce1350bb4d1:
base.py SupportsHMA, v1/core/sched/scheduler.py)
  vLLM groups a hybrid model's attention layers into KV cache groups of
  the same number of layers: full-attention layers in one group (or more),
  sliding-window layers in others. Every group draws blocks from ONE pool,
  and the k-th layer of every group views one tensor (KVCacheTensor
  shared_by): block b of tensor k is group g's layer k of whichever page
  of whichever request holds b in group g. Each request has a block table
  per group (KVCacheBlocks.get_block_ids(): a list per group; the
  scheduler output's block ids likewise). A sliding-window group's pages
  that left the window hold the null block (block 0) and their blocks are
  back in the pool: vLLM frees them at every allocate_slots and before
  request_finished_all_groups.

  kvtier stores ONE DAEMON PAGE PER (GROUP, PREFIX PAGE). The daemon's
  geometry is one group's layers (its --model a config whose
  num_hidden_layers is the layers per group), a page one block of those
  layers; keys are salted by the group. As group g's k-th layer is tensor
  k, one registration of tensors 0..Lg-1 serves every group: group g's
  page p goes to or from group g's block of page p.
    * full-attention group: a chained prefix, as one-group models store
      (pages from page 0, parents first);
    * sliding-window group: every page a one-page prefix of its own
      (KVT_CACHE_IO_EACH, KVT_LOOKUP_EACH, as SGLang's pages): its early
      pages leave vLLM's memory once out of the window, so they cannot be
      parents; vLLM's block hash is chained, so one key still names its
      whole prefix.
    * state group (MambaSpec, mamba_cache_mode "align"): vLLM keeps a
      request's state at a block boundary in the block of the table entry
      before it (entry k - 1: the state after k pages) where a step ends
      on that boundary (the scheduler's _mamba_block_aligned_split ends
      prefill chunks there), every other entry the null block. That
      block is stored as one more group page, a one-page prefix of its
      own (the state after page k depends on every token before it, and
      vLLM's chained block hash names them all); for a hit of n pages
      only the state after page n - 1 is loaded, into the block vLLM
      allocates at entry n - 1 for external tokens. Under vLLM's layout
      this is bytes like any page: vLLM pads the mamba page to the
      attention page (mamba_page_size_padded) and lays attention blocks
      out as whole pages beside mamba layers, so block b of tensor k is
      the same bytes in every group (checked at start and registration).
  A hit of n pages needs from a sliding-window group of window W only the
  pages in the window at its end, [max(0, n*P - W + 1) // P, n) (token
  n*P, the first vLLM computes, attends to the W - 1 before it). The hit
  reported is the largest every group can serve: the full-attention
  groups' leading hit, lowered below any gap in a sliding group's window
  and to the last boundary a state group holds a state at.

INVARIANTS
  * Loads are asynchronous: with several groups vLLM raises on
    block-level load failures (scheduler.py _handle_invalid_blocks at
    00f4240ee645: block ids are unique only within a group), so a failed
    load fails its whole request (KVConnectorTransferResults
    .failed_recving: vLLM recomputes it), which vLLM takes only for
    requests waiting for remote KV. "load_mode": "layerwise" (synchronous
    loads, whose failures have no other way back) is refused.
  * A sliding-window block (or a state block: vLLM frees the state of
    a boundary once the next one is computed) vLLM frees may be reused by
    the next forward:
    the scheduler side names the requests whose freed blocks have a store
    issued in an earlier step (metadata sw_wait) and the workers wait for
    those stores in handle_preemptions(), before the forward (vLLM's base
    class: "preempted requests or request evicted blocks BEFORE they are
    overwritten").
  * A store reads only pages the step completes: never out of the window
    yet (their first token is past the step's first).
  * A state block is stored only for a boundary the step ends on (the
    table's non-null entries of the pages it completes): it is read after
    the forward wrote it, and vLLM writes the next state into another
    block.

REFUSED AT START, with the reason: state groups in mamba_cache_mode other
than "align" ("none" keeps one running state; others not built) or with
prefix caching off, of page bytes unlike the attention page or another
block size; a model of state groups only; groups of other kinds, groups
of unequal layer counts or shapes, vLLM without KVConnectorTransferResults
(scheduler.py at 00024d314514 unpacks exactly one group in
_update_waiting_for_remote_kv and _update_requests_with_invalid_blocks),
layerwise loads, the staging pool.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import KvtierError, keys_from_hashes
from . import vllm_compat as _compat
from .vllm_meta import LoadSpec, SaveSpec

__all__ = ["NULL_BLOCK", "Group", "Plan", "plan_of", "group_config"]

log = logging.getLogger("kvtier.vllm")

NULL_BLOCK = 0      # vLLM's BlockPool.null_block: out-of-window pages

_STATE = ("Mamba", "Linear", "ShortConv", "GatedDeltaNet")


@dataclasses.dataclass(frozen=True)
class Group:
    """One KV cache group: its index in vLLM's KVCacheConfig, its sliding
    window in tokens (0: full attention) and its layers' names."""
    index: int
    window: int
    layers: Tuple[str, ...]
    state: bool = False     # a mamba / linear-attention group ("align")


@dataclasses.dataclass(frozen=True)
class Plan:
    """The KV cache groups of a hybrid model and how kvtier maps them."""
    groups: Tuple[Group, ...]
    page_tokens: int

    @property
    def layers(self) -> int:
        """Layers per group: the daemon's geometry."""
        return len(self.groups[0].layers)

    @property
    def ref(self) -> int:
        """The first full-attention group (its keys are the connector's
        own: lookups, decisions)."""
        return next(g.index for g in self.groups
                    if not g.window and not g.state)

    def skipped(self, g: int, tokens: int) -> int:
        """Leading pages of group @g out of the window once @tokens are
        computed (vLLM frees their blocks; a state group keeps only the
        state at the last boundary, MambaManager's skipped tokens being
        tokens - 1)."""
        if self.groups[g].state:
            return max(0, tokens - 1) // self.page_tokens
        w = self.groups[g].window
        return max(0, tokens - w + 1) // self.page_tokens if w else 0

    def pages(self, g: int, start: int, n: int) -> range:
        """The pages of a hit of @n pages group @g needs loaded, vLLM
        holding pages < @start itself (a state group: the state at the
        hit's boundary, page n - 1, whatever vLLM holds before it)."""
        if self.groups[g].state:
            return range(n - 1, n) if n > start else range(n, n)
        return range(max(start, self.skipped(g, n * self.page_tokens)), n)

    def each(self, g: int) -> bool:
        """Whether group @g's pages are one-page prefixes of their own."""
        return bool(self.groups[g].window or self.groups[g].state)

    def salt(self, base: bytes, g: int) -> bytes:
        gr = self.groups[g]
        kind = "s" if gr.state else f"w{gr.window}"
        return base + f"|hma|g{g}|{kind}".encode()


def _refuse(why: str) -> ValueError:
    return ValueError(f"kvtier.vllm: hybrid model (several KV cache groups "
                      f"under vLLM's hybrid memory allocator): {why}")


def _spec_name(group: Any) -> str:
    spec = getattr(group, "kv_cache_spec", None)
    return type(spec).__name__ if spec is not None else "?"


def _page_bytes(spec: Any) -> Optional[int]:
    """The bytes of one block of one layer (vLLM's page_size_bytes; a
    mamba spec's is its page_size_padded)."""
    v = getattr(spec, "page_size_bytes", None)
    return int(v) if v is not None else None


def _state_checks(i: int, spec: Any, cache_config: Any) -> None:
    """What vLLM's layout forbids for a state group at start, with the
    reason (module doc)."""
    mode = getattr(spec, "mamba_cache_mode", None) or \
        getattr(cache_config, "mamba_cache_mode", None) or "none"
    if mode != "align":
        raise _refuse(
            f"group {i} is {type(spec).__name__} with mamba_cache_mode "
            f"\"{mode}\": only \"align\" keeps a request's state at block "
            f"boundaries in blocks of the block table (MambaManager, "
            f"vllm/v1/core/single_type_kv_cache_manager.py); \"none\" keeps "
            f"one running state a later request cannot start from; other "
            f"modes are not built. Start vLLM with --mamba-cache-mode align")
    if cache_config is not None and \
            not getattr(cache_config, "enable_prefix_caching", True):
        raise _refuse(
            f"group {i} is {type(spec).__name__} and prefix caching is off: "
            f"vLLM then computes no block hashes to key the states by and "
            f"does not split prefills at block boundaries; start vLLM "
            f"with --enable-prefix-caching")


def plan_of(kv_cache_config: Any, block_size: int, load_mode: str,
            staging: Any, has_failed_recving: bool,
            cache_config: Any = None) -> Optional[Plan]:
    """The plan of @kv_cache_config's groups; None for one group of
    attention (the
    connector's ordinary path) or no config (v0.11-era constructors).
    @cache_config: vLLM's CacheConfig (prefix caching, mamba_cache_mode).
    ValueError, saying why, for what kvtier cannot store."""
    groups = getattr(kv_cache_config, "kv_cache_groups", None)
    if not groups:
        return None
    kinds = ", ".join(_spec_name(g) for g in groups)
    is_state = [any(s in _spec_name(g) for s in _STATE) for g in groups]
    if len(groups) == 1 and not is_state[0]:
        return None
    if all(is_state):
        raise _refuse(
            f"{kinds}: only state caches (mamba / linear attention), no "
            f"full-attention group to key the prefixes by and check hits "
            f"against: not built")
    out: List[Group] = []
    for i, g in enumerate(groups):
        spec, name = g.kv_cache_spec, _spec_name(g)
        state = is_state[i]
        if state:
            _state_checks(i, spec, cache_config)
            window = 0
        elif "SlidingWindow" in name:
            window = int(spec.sliding_window)
            if window <= 0:
                raise _refuse(f"group {i}: sliding window {window}")
        elif name in ("FullAttentionSpec", "MLAAttentionSpec") and \
                not getattr(spec, "sliding_window", None):
            window = 0
        else:
            raise _refuse(f"group {i} is {name} ({kinds}): kvtier stores "
                          f"full-attention, sliding-window and mamba "
                          f"(\"align\") groups only")
        out.append(Group(i, window, tuple(g.layer_names), state))
    if not has_failed_recving:
        raise _refuse(
            f"{kinds}: this vLLM's connector interface has no "
            f"KVConnectorTransferResults.failed_recving, and its scheduler "
            f"(vllm/v1/core/sched/scheduler.py as read at 00024d314514) "
            f"takes exactly one group where a connector's loads end "
            f"(_update_waiting_for_remote_kv, "
            f"_update_requests_with_invalid_blocks unpack one block table): "
            f"a load could neither finish nor fail there. Run with "
            f"--disable-hybrid-kv-cache-manager (one group) or a vLLM of "
            f"the current interface")
    if load_mode != "async":
        raise _refuse(
            f"\"load_mode\": \"{load_mode}\": synchronous loads cannot fail "
            f"under several KV cache groups (vLLM raises on block-level "
            f"failures there, scheduler.py _handle_invalid_blocks at "
            f"00f4240ee645, and failed_recving is for asynchronous loads "
            f"only): use \"async\"")
    if staging is True:
        raise _refuse("\"staging\": true is not built for several KV cache "
                      "groups (KVT_ENOTBUILT): leave it unset")
    if not any(not g.window and not g.state for g in out):
        raise _refuse(f"{kinds}: no full-attention group")
    sizes = {len(g.layers) for g in out}
    if len(sizes) != 1:
        raise _refuse(f"groups of {sorted(sizes)} layers: kvtier's daemon "
                      f"serves one geometry, so every group must have as "
                      f"many layers")
    attn = [g for g, st in zip(groups, is_state) if not st]
    shapes = {(getattr(g.kv_cache_spec, "block_size", None),
               getattr(g.kv_cache_spec, "num_kv_heads", None),
               getattr(g.kv_cache_spec, "head_size", None),
               str(getattr(g.kv_cache_spec, "dtype", None))) for g in attn}
    if len(shapes) != 1:
        raise _refuse(f"groups of different KV shapes {sorted(shapes)}: "
                      f"kvtier's daemon serves one geometry")
    bs = next(iter(shapes))[0]
    if bs is not None and int(bs) != block_size:
        raise _refuse(f"group block size {bs}, vLLM's --block-size "
                      f"{block_size}")
    if any(is_state):
        pages = [_page_bytes(g.kv_cache_spec) for g in groups]
        sbs = {getattr(g.kv_cache_spec, "block_size", None)
               for g, st in zip(groups, is_state) if st}
        if None in pages or len(set(pages)) != 1:
            raise _refuse(
                f"page bytes per layer {pages} ({kinds}): a mamba group's "
                f"block is stored as one daemon page of the attention "
                f"groups' geometry, so every group's page must have the same "
                f"bytes (vLLM pads the mamba page to the attention page, "
                f"mamba_page_size_padded, unless told otherwise)")
        if sbs != {block_size}:
            raise _refuse(
                f"mamba block size {sorted(sbs, key=str)}, vLLM's "
                f"--block-size {block_size}: in \"align\" mode a state is "
                f"kept per attention block (mamba_block_size = block_size)")
    return Plan(tuple(out), block_size)


def group_config(cfg: Any, layers: int) -> Dict[str, Any]:
    """The model config (path, text or dict) with @layers layers: the
    geometry of one KV cache group, which the daemon must serve."""
    cfg = _compat.load_config(cfg)
    if isinstance(cfg.get("text_config"), dict):
        cfg["text_config"] = dict(cfg["text_config"],
                                  num_hidden_layers=layers)
    cfg["num_hidden_layers"] = layers
    return cfg


def _state_views(name: str, g: int, views: Any, ref: Any) -> None:
    """Check that mamba layer @name's state views (conv, ssm: a list, as
    vLLM hands them) are blocks of whole pages inside the memory of the
    attention layer @ref describes, and that @ref's blocks are whole pages
    too (vLLM lays attention block-outermost beside mamba layers,
    _update_hybrid_attention_mamba_layout): then a state block is the
    bytes of the same block id of @ref. ValueError otherwise."""
    from . import layout
    views = list(views) if isinstance(views, (list, tuple)) else [views]
    for v in views:
        d = layout.describe(v)
        page = d.strides[0] if d.strides else 0
        if max(ref.strides) != page:
            raise ValueError(
                f"kvtier.vllm: mamba layer {name} (group {g}): its state "
                f"blocks are {page} bytes apart, the attention layer's "
                f"largest stride is {max(ref.strides)}: kvtier stores a state "
                f"block as the same block id of the attention layer sharing "
                f"its tensor, which needs attention blocks of whole pages "
                f"(K and V inside the block, as vLLM lays them beside mamba "
                f"layers)")
        if not ref.addr <= d.addr < ref.addr + page:
            raise ValueError(
                f"kvtier.vllm: mamba layer {name} (group {g}) does not view "
                f"the memory of the attention layer it should share a "
                f"tensor with (KVCacheTensor shared_by)")


class _JobSet:
    """One request's load jobs (a job per group), as one job."""

    def __init__(self, jobs: Sequence[Any]) -> None:
        self.jobs = list(jobs)
        self.blocks = [b for j in self.jobs for b in j.blocks]

    def poll(self) -> bool:
        return all([j.poll() for j in self.jobs])

    def wait(self, timeout: Optional[float] = None) -> List[int]:
        return [b for j in self.jobs for b in j.wait(timeout=timeout)]

    @property
    def failed(self) -> List[int]:
        return [b for j in self.jobs for b in j.failed]

    def wait_layer(self, layer: int, timeout: Optional[float] = None) -> bool:
        return all([j.wait_layer(layer, timeout) for j in self.jobs])

    def cancel(self) -> bool:
        return any([j.cancel() for j in self.jobs])

    def close(self) -> None:
        for j in self.jobs:
            j.close()


class _Hybrid:
    """The connector's calls under several KV cache groups (module doc).
    Uses KvtierConnector's state: _hplan, _reqs, _pending_load,
    _loads_to_send, _loading, _ever_saved, _salt_base, _hkeys, _sw_pending,
    and on the worker side _store_jobs, _failed_recving, _stats."""

    _hplan: Optional[Plan]

    # -- keys -----------------------------------------------------------------

    def _gkeys(self, request: Any, g: int) -> List[bytes]:
        """Group @g's keys of @request (the reference group's are
        _keys())."""
        if g == self._hplan.ref:
            return self._keys(request)
        hashes = request.block_hashes
        k = (request.request_id, g)
        have = self._hkeys.get(k, [])
        if len(have) < len(hashes):
            have = have + keys_from_hashes(
                hashes[len(have):], self._hplan.salt(self._salt_base, g))
            self._hkeys[k] = have
        return have

    def _forget_keys(self, rid: str) -> None:
        for g in range(len(self._hplan.groups)):
            self._hkeys.pop((rid, g), None)

    # -- scheduler side ------------------------------------------------------

    def _hyb_fit(self, request: Any, n: int, start: int) -> int:
        """The largest hit <= @n pages (from page 0; pages < @start are
        vLLM's) every group can serve; @start when none is longer."""
        hp = self._hplan
        try:
            for g in hp.groups:
                if hp.each(g.index) or g.index == hp.ref or n <= start:
                    continue
                keys = self._gkeys(request, g.index)[:n]
                n = min(n, self._client.lookup(keys, touch=False).pages)
            for _ in range(64):     # each pass lowers n below a gap
                if n <= start:
                    return start
                short = None
                for g in hp.groups:
                    if g.state:     # the state at the hit's boundary
                        m = self._state_hit(request, g.index, n, start)
                        if m < n:
                            short = m if short is None else min(short, m)
                        continue
                    if not g.window:
                        continue
                    pages = hp.pages(g.index, start, n)
                    keys = self._gkeys(request, g.index)[pages.start:n]
                    run = self._client.lookup(keys, touch=False,
                                              each=True).pages
                    if run < len(keys):
                        gap = pages.start + run
                        short = gap if short is None else min(short, gap)
                if short is None:
                    return n
                n = short
        except KvtierError as e:
            self._note_down(e)
            log.warning("kvtier.vllm: request %s: lookup of a KV cache "
                        "group failed (%s): no hit", request.request_id, e)
        return start

    def _state_hit(self, request: Any, g: int, n: int, start: int) -> int:
        """The largest m in (@start, @n] whose state (page m - 1 of state
        group @g, the state after m pages) the daemon has; @start if
        none. vLLM keeps a state only where a step ended, so they are
        sparse: one lookup per boundary, from the longest down."""
        keys = self._gkeys(request, g)
        for m in range(n, start, -1):
            if self._client.lookup([keys[m - 1]], touch=False,
                                   each=True).pages:
                return m
        return start

    def _hyb_after_alloc(self, request: Any, blocks: Any,
                         num_external_tokens: int) -> None:
        """update_state_after_alloc with a block table per group: the
        load of each group's pages into its blocks."""
        rid = request.request_id
        ids = [list(x) for x in blocks.get_block_ids()]
        st = self._reqs.get(rid)
        if st is None:
            from .vllm import _SchedReq
            self._reqs[rid] = st = _SchedReq(request, ids[self._hplan.ref])
        st.gblocks = ids
        st.block_ids = ids[self._hplan.ref]
        plan = self._pending_load.pop(rid, None)
        if self._decider is not None:
            self._produce(st, len(plan[0]) if plan and num_external_tokens
                          else request.num_computed_tokens // self._block_size)
        if num_external_tokens == 0 or plan is None:
            return
        keys, start = plan
        n = len(keys)
        for g in self._hplan.groups:
            table = ids[g.index]
            if len(table) < n:
                raise RuntimeError(f"kvtier.vllm: request {rid}: group "
                                   f"{g.index} has {len(table)} blocks for "
                                   f"{n} pages")
            pages = self._hplan.pages(g.index, start, n)
            bl = [table[p] for p in pages]
            if NULL_BLOCK in bl:
                raise RuntimeError(f"kvtier.vllm: request {rid}: vLLM gave "
                                   f"group {g.index} the null block inside "
                                   f"its window (pages {pages})")
            gk = self._gkeys(request, g.index)
            if self._hplan.each(g.index):
                self._loads_to_send.append(LoadSpec(
                    rid, gk[pages.start:n], 0, bl, True, g.index, True))
            else:
                self._loads_to_send.append(LoadSpec(
                    rid, gk[:n], start, bl, True, g.index))
        self._loading.add(rid)
        st.saved = max(st.saved, n)

    def _hyb_plan_saves(self, meta: Any, scheduler_output: Any) -> None:
        """build_connector_meta's stores with a block table per group, and
        the requests whose freed sliding-window blocks a store may still
        read (meta.sw_wait)."""
        for rid, new, replace, computed, n in \
                _compat.scheduled_reqs(scheduler_output):
            st = self._reqs.get(rid)
            if st is None:
                continue
            if replace or st.gblocks is None:
                st.gblocks = [list(x) for x in new] if new else \
                    [[] for _ in self._hplan.groups]
            elif new:
                for have, add in zip(st.gblocks, new):
                    have += list(add)
            self._hyb_step(meta, rid, st, computed, n)
        meta.sw_wait |= self._sw_pending
        self._sw_pending = set()
        self._stats.data["sw_wait_requests"] += len(meta.sw_wait)

    def _hyb_guard(self, st: Any, computed: int) -> bool:
        """Whether vLLM, having computed @computed tokens of @st, freed
        sliding-window blocks of pages a store of an earlier step reads."""
        hp = self._hplan
        freed = max(hp.skipped(g.index, computed) for g in hp.groups)
        upto = min(freed, st.saved)
        if upto > st.sw_guard:
            st.sw_guard = upto
            return True
        return False

    def _hyb_step(self, meta: Any, rid: str, st: Any, computed: int,
                  scheduled: int) -> None:
        if self._hyb_guard(st, computed):
            meta.sw_wait.add(rid)
        st.block_ids = st.gblocks[self._hplan.ref]
        if not self._save:
            return
        upto = min((computed + scheduled) // self._block_size,
                   len(st.request.block_hashes),
                   min(len(t) for t in st.gblocks))
        upto = _compat.publishable_blocks(st.request, upto)
        if upto <= st.saved:
            return
        for g in self._hplan.groups:
            keys = self._gkeys(st.request, g.index)
            table = st.gblocks[g.index]
            if not self._hplan.each(g.index):
                meta.saves.append(SaveSpec(rid, keys[:upto], st.saved,
                                           table[:upto], g.index))
                continue
            pages = [p for p in range(st.saved, upto)
                     if table[p] != NULL_BLOCK]
            if pages:
                meta.saves.append(SaveSpec(
                    rid, [keys[p] for p in pages], 0,
                    [table[p] for p in pages], g.index, True))
        st.saved = upto
        self._ever_saved.add(rid)

    def request_finished_all_groups(
            self, request: Any, block_ids: Tuple[List[int], ...]
    ) -> Tuple[bool, Optional[Dict[str, Any]]]:
        """vLLM (SupportsHMA) calls this instead of request_finished,
        having freed the request's out-of-window blocks: those a store of
        this request may still read are waited for by the workers before
        the next forward; otherwise request_finished's answer."""
        if self._hplan is not None:
            st = self._reqs.get(request.request_id)
            if st is not None and self._hyb_guard(
                    st, int(getattr(request, "num_computed_tokens", 0))):
                self._sw_pending.add(request.request_id)
            self._forget_keys(request.request_id)
        return self.request_finished(request,
                                     list(block_ids[0]) if block_ids else [])

    # -- worker side ---------------------------------------------------------

    def _hyb_layers(self, kv_caches: Dict[str, Any]) -> Dict[str, Any]:
        """The reference group's layer caches, the registration of every
        group: checks that the k-th layer of each group views the same
        memory (vLLM's KVCacheTensor.shared_by), else ValueError."""
        from . import layout
        hp = self._hplan
        missing = [n for g in hp.groups for n in g.layers
                   if n not in kv_caches]
        if missing:
            raise ValueError(f"kvtier.vllm: no KV cache for layers "
                             f"{missing[:4]} of the KV cache groups")
        ref = hp.groups[hp.ref].layers
        for g in hp.groups:
            for k, name in enumerate(g.layers):
                if g.state:
                    _state_views(name, g.index, kv_caches[name],
                                 layout.describe(kv_caches[ref[k]]))
                    continue
                a = layout.describe(kv_caches[name])
                b = layout.describe(kv_caches[ref[k]])
                if (a.addr, a.shape, a.strides) != (b.addr, b.shape,
                                                    b.strides):
                    raise ValueError(
                        f"kvtier.vllm: layer {name} (group {g.index}, "
                        f"#{k}) does not view the memory of {ref[k]} "
                        f"(group {hp.ref}, #{k}): kvtier registers one "
                        f"group's layers for all, as vLLM's hybrid "
                        f"allocator lays them out (one tensor per k shared "
                        f"by the groups)")
        return {n: kv_caches[n] for n in ref}

    def _hyb_wait_stores(self, meta: Any) -> None:
        """Before the forward: finish the stores reading sliding-window
        blocks vLLM freed in this step's schedule (meta.sw_wait)."""
        for rid in getattr(meta, "sw_wait", None) or ():
            for j in self._store_jobs.get(rid, []):
                try:
                    j.wait(timeout=self._stop_s())
                    self._stats.data["store_waits"] += 1
                except TimeoutError:
                    self._stop_timeout(rid)
                except KvtierError as e:
                    self._note_down(e)
