/*
 * kvtier/index.h — the hierarchy-aware radix index. Included by <kvtier.h>.
 *
 * The index is kvtier's control-plane memory. For any prompt it says at once
 * how much of its prefix is cached, in which tier each page lives, what is
 * already on its way, and what to evict when a tier fills. It decides and
 * records; it moves no bytes. Slots come from the tiers' page pools
 * (kvt_pool, one per tier it manages); copies between tiers go out through a
 * small "mover" interface given at creation (tests pass none).
 *
 * KEYS
 *
 * A prompt is cut into pages of P tokens; only whole pages are cached. Two
 * key modes, fixed at creation:
 *
 *   KVT_KEY_TOKENS  the tree is keyed by the token ids themselves (exact:
 *                   pages compare token by token).
 *   KVT_KEY_HASH    each page is keyed by a 128-bit value. Either the caller
 *                   gives the keys (an engine's block hashes, or a trace's
 *                   hash ids), or it gives tokens and the index chains
 *                   XXH3-128 over (parent key, page tokens) seeded with the
 *                   tenant's salt (kvt_index_hash_tokens()).
 *
 * Every key lives under its tenant's root, and the tenant's salt seeds every
 * fingerprint: a prompt of tenant A never matches pages of tenant B, even
 * with identical tokens. Tenant 0 (salt 0) exists from creation; others are
 * added with kvt_index_tenant_add(); an unknown tenant is an error. A
 * tenant may have a page quota per tier (kvt_index_tenant_quota()): at its
 * quota it evicts its own pages, not another tenant's.
 *
 * PAGES AND TIERS
 *
 * Per page the index records: a copy in any subset of the managed tiers
 * (a residency mask and one 32-bit slot per tier), a pin count (leases), a
 * hit count and the time of the last access. One last-access time serves all
 * of a page's copies: a copy in a lower tier ages with the page's real use,
 * so every tier evicts by true recency (LRU) or use count (LFU).
 *
 *   hbm -> fabric -> dram -> ssd -> remote -> gone      (absent tiers skipped)
 *
 * Eviction from a tier takes pages *leaves first*: a page leaves tier t only
 * when no page below it in the tree has a copy in t, it is not pinned, and
 * (so) no page below it is pinned. Among those it takes the least recently
 * used page (KVT_EVICT_LRU) or the least used, then least recent
 * (KVT_EVICT_LFU); pages of tenants over their quota in the tier first,
 * and only the tenant's own pages when it makes room under its quota. A
 * page with another copy just gives up its slot; a page with no other
 * copy is demoted: the index makes room in the next tier below
 * (evicting there the same way), takes a slot and asks the mover to copy;
 * below the last tier, or when the tier below cannot take it, the page is
 * gone. A page whose last copy goes stays in the tree (empty) only while
 * pages below it remain; the walk of a match stops at it.
 *
 * Write policies say when a page gets a copy below before it is evicted:
 *
 *   KVT_WRITE_BACK       never: copy down on eviction only (the default)
 *   KVT_WRITE_THROUGH    at every insert or touch, a page whose only copy is
 *                        its fastest one is copied to the next tier below
 *   KVT_WRITE_SELECTIVE  the same, once the page has been hit N times
 *                        (cfg.selective_hits), so one-off prompts never
 *                        cost a copy
 *
 * TRANSIENT PAGES
 *
 * Context that a queued request will compute is *in queue*; context being
 * computed or loaded right now is *in flight*, with the caller's ticket and
 * the time it is expected to be ready. kvt_index_queue() and
 * kvt_index_start() mark the pages of a prefix that are not in the fastest
 * tier (creating placeholders for pages the tree lacks); kvt_index_insert()
 * into the fastest tier ends the mark; kvt_index_cancel() withdraws it. A
 * match reports transient pages apart from resident ones, so a second
 * request can wait for them instead of computing the same context twice.
 *
 *   queue(A)              start(A, ready=t1)        insert(A, hbm)
 *   [cached][queued...] -> [cached][in flight...] -> [cached][cached.....]
 *                      \-> cancel(A): the marks go, placeholders are removed
 *
 * TIME
 *
 * The index never reads a clock. Calls that record an access take the
 * caller's time @now in nanoseconds (wall clock or a simulator's virtual
 * clock). Time never runs backwards inside the index: a @now smaller than
 * one seen before is taken as the latest seen. Ties are broken by the order
 * of the calls, so the same calls always give the same result.
 *
 * THREADS
 *
 * An index is used by one thread at a time (the caller serializes). With
 * watermarks hooked (cfg.high > 0), the pools call the index back from the
 * thread that allocates: only that same thread may allocate from a managed
 * pool. The index assumes it is the only user of the pools it is given
 * (kvt_index_check() verifies that occupancy equals resident pages).
 *
 * ERRORS
 *
 * As everywhere in kvtier: 0 or a negative code, kvt_errdetail() says what
 * was wrong (the page, the tenant, the length). A failed call leaves the
 * cached contents as they were; the only side effect a failing call may
 * keep is eviction it did to make room (said per call), and the tree's
 * internal shape (an edge split in two holds the same pages).
 */
#ifndef KVTIER_INDEX_H
#define KVTIER_INDEX_H

#include <kvtier.h>
#include <kvtier/trace.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvt_index kvt_index;

/** Key modes (cfg.key_mode). */
enum kvt_key_mode {
	KVT_KEY_TOKENS = 0,
	KVT_KEY_HASH = 1,
};

/** Eviction order (cfg.evict). */
enum kvt_evict_policy {
	KVT_EVICT_LRU = 0,
	KVT_EVICT_LFU = 1,
};

/** Write policies (cfg.write). */
enum kvt_write_policy {
	KVT_WRITE_BACK = 0,
	KVT_WRITE_THROUGH = 1,
	KVT_WRITE_SELECTIVE = 2,
};

/** A page's state as a match or an inspection reports it. */
enum kvt_page_state {
	KVT_PAGE_NONE = 0,     /* not in the tree */
	KVT_PAGE_EMPTY = 1,    /* in the tree with no copy left (a match stops) */
	KVT_PAGE_RESIDENT = 2, /* a copy in at least one tier */
	KVT_PAGE_QUEUED = 3,   /* a queued request will compute it */
	KVT_PAGE_INFLIGHT = 4, /* being computed or loaded; ready at ready_ns */
};

/** A 128-bit page key (KVT_KEY_HASH). A plain value. */
typedef struct kvt_page_key {
	uint64_t lo, hi;
} kvt_page_key;

/**
 * struct kvt_prefix - what a call is about: a tenant and a sequence.
 * @tenant:  a registered tenant (0 always is, unless removed).
 * @tokens:  token ids, @ntokens of them. Required in KVT_KEY_TOKENS mode;
 *           in KVT_KEY_HASH mode the index chains their hashes itself.
 * @keys:    KVT_KEY_HASH only: the page keys, @nkeys of them, instead of
 *           tokens (each key stands for one page of P tokens).
 * Give exactly one of @tokens and @keys. Calls that *read* (match, inspect,
 * queue, start, cancel) use the whole pages and ignore a partial last page;
 * calls that *store or lease* (insert, pin, unpin) refuse a length that is
 * not whole pages. At most KVT_INDEX_MAX_PAGES pages per call.
 * The arrays are read during the call only.
 */
typedef struct kvt_prefix {
	uint32_t tenant;
	const uint32_t *tokens;
	size_t ntokens;
	const kvt_page_key *keys;
	size_t nkeys;
} kvt_prefix;

#define KVT_INDEX_MAX_PAGES (1u << 24)

/**
 * struct kvt_move - one page copy the index asks the mover for.
 * @reason: KVT_MOVE_DEMOTE (eviction moves the only copy down) or
 *          KVT_MOVE_COPY (write-through / selective copy; the source stays).
 */
typedef struct kvt_move {
	kvt_tier_kind src, dst;
	uint32_t src_slot, dst_slot;
	int reason;
} kvt_move;

enum { KVT_MOVE_DEMOTE = 1, KVT_MOVE_COPY = 2 };

/**
 * struct kvt_index_mover - how the index gets bytes moved (optional).
 * @copy:    copy the page at (src, src_slot) to (dst, dst_slot). The copy
 *           may be issued asynchronously: it must be complete when @flush
 *           returns (or, without @flush, when @copy returns), unless the
 *           mover itself keeps every reader and writer of the two slots
 *           waiting until it is (the node cache runs its copies after the
 *           call, behind per-slot fences: src/cache/mover.c). The index
 *           records the destination at once and frees a demoted page's
 *           source slot to its pool; that slot can be handed out again in
 *           the same call (as a fresh slot of an insert), but nobody
 *           writes bytes into it before the call returns. A negative
 *           return cancels the move: the destination slot is freed, and a
 *           demoted page is dropped (kvt_index_stat.move_failed). May be
 *           NULL: no bytes (tests, the simulator, accounting-only pools).
 * @flush:   optional: called once at the end of every index call (and
 *           watermark eviction) that issued copies, before it returns:
 *           wait for them all (one synchronization per call, not per
 *           page). Errors found only here cannot be undone by the index;
 *           the mover reports them its own way.
 * @release: a slot of tier @tier no longer holds a page of the index (it
 *           has been freed to its pool). May be NULL.
 * Callbacks run in the calling thread, inside index calls; they must not
 * call back into the index.
 */
typedef struct kvt_index_mover {
	int (*copy)(void *arg, const kvt_move *mv);
	void (*release)(void *arg, kvt_tier_kind tier, uint32_t slot);
	void *arg;
	void (*flush)(void *arg);
} kvt_index_mover;

/**
 * struct kvt_index_config - how to build an index (zero = defaults).
 * @page_tokens:    P, tokens per page, 1..65536 (required).
 * @key_mode:       enum kvt_key_mode.
 * @evict:          enum kvt_evict_policy.
 * @write:          enum kvt_write_policy.
 * @selective_hits: N for KVT_WRITE_SELECTIVE (0: 2).
 * @pools:          one pool per managed tier, indexed by kvt_tier_kind; NULL
 *                  for an absent tier. At least one; each tier its own
 *                  pool. The pools must outlive
 *                  the index; the index owns the slots it takes and gives
 *                  them all back at destroy.
 * @mover:          see above; zeroed = no bytes.
 * @high, @low:     if @high > 0, hook every pool's watermarks
 *                  (kvt_pool_set_watermarks(pool, high, low, ...)): a pool
 *                  filling above @high asks the index to evict down to @low.
 *                  0 < low <= high <= 1. Unhooked at destroy.
 */
typedef struct kvt_index_config {
	uint32_t page_tokens;
	int key_mode;
	int evict;
	int write;
	uint32_t selective_hits;
	kvt_pool *pools[KVT_TIER_COUNT];
	kvt_index_mover mover;
	double high, low;
} kvt_index_config;

/**
 * kvt_index_create() - an empty index with tenant 0.
 * Returns 0 and *@out, -EINVAL for a bad config (kvt_errdetail() names the
 * field: P out of range, unknown mode or policy, no pool, bad watermarks),
 * -ENOMEM. Free with kvt_index_destroy().
 */
KVT_API int kvt_index_create(kvt_index **out, const kvt_index_config *cfg);

/** Give every slot back to its pool (calling mover.release), unhook the
 *  watermarks, free everything. NULL is fine. */
KVT_API void kvt_index_destroy(kvt_index *idx);

/* ------------------------------------------------------------------------
 * Tenants
 * ------------------------------------------------------------------------ */

/** Register @tenant with @salt. 0, -EEXIST, -ENOMEM. */
KVT_API int kvt_index_tenant_add(kvt_index *idx, uint32_t tenant,
				 uint64_t salt);
/** Forget @tenant and everything it cached (slots freed, marks dropped).
 *  0, KVT_ENOTFOUND for an unknown tenant, KVT_EBUSY if any of its pages
 *  is pinned (then nothing changes), -ENOMEM. */
KVT_API int kvt_index_tenant_remove(kvt_index *idx, uint32_t tenant);

/**
 * kvt_index_tenant_quota() - at most @max_pages pages of @tenant in tier
 * @tier (0: no limit, the default). A page counts in every tier that holds
 * a copy of it (write-through: in two). Each tenant has its own eviction
 * order per tier, so the limit acts on its own pages only:
 *
 *   - an insert of @tenant into @tier first makes room under the quota by
 *     evicting (demoting) the tenant's own least valuable pages there, by
 *     the eviction policy and the leaves-first rule, never another
 *     tenant's; if they cannot go (pinned, or part of the prefix), the
 *     insert fails with KVT_EFULL as for a full tier (KVT_INSERT_PARTIAL:
 *     keeps the leading pages that fit under the quota); an insert of
 *     more missing pages than the quota fails at once;
 *   - a demotion or write-policy copy of the tenant's page into @tier
 *     makes room the same way, so a cascade down the tiers stays within
 *     the tenant's own pages; a page that still does not fit is not
 *     copied (a demoted page is then gone, as below the last tier);
 *   - when the tier itself is full (its pool), room is made as before,
 *     across tenants, but pages of tenants over their quota in the tier
 *     go first (a tenant is over only while pinned pages keep it there);
 *   - lowering the quota below what the tenant holds evicts its excess at
 *     once (pinned pages stay, and count).
 * Quotas go with the tenant (kvt_index_tenant_remove()); a quota larger
 * than the tier changes nothing. Returns 0, KVT_ENOTFOUND for an unknown
 * tenant or a tier the index does not manage.
 */
KVT_API int kvt_index_tenant_quota(kvt_index *idx, uint32_t tenant,
				   kvt_tier_kind tier, uint64_t max_pages);

/** What a tenant holds, per kvt_tier_kind (0 for tiers not managed). */
typedef struct kvt_tenant_usage {
	uint64_t pages[KVT_TIER_COUNT];  /* its pages with a copy in tier t */
	uint64_t quota[KVT_TIER_COUNT];  /* its quota there; 0: no limit */
	uint64_t evicted[KVT_TIER_COUNT]; /* its pages that left tier t
					    (any reason), since it was added */
	uint64_t quota_evicted[KVT_TIER_COUNT]; /* of which, to make room
						  under its own quota */
} kvt_tenant_usage;

/** kvt_index_tenant_usage() - fill @u for @tenant. 0, KVT_ENOTFOUND for
 *  an unknown tenant, -EINVAL for a NULL @u. Read-only, O(tiers). */
KVT_API int kvt_index_tenant_usage(kvt_index *idx, uint32_t tenant,
				   kvt_tenant_usage *u);

/**
 * kvt_index_hash_tokens() - the chained page keys of @tokens for @tenant:
 * key[i] = XXH3-128(key[i-1] || tokens of page i; seed = tenant salt),
 * key[-1] = 0. Writes @ntokens / P keys to @out (a partial last page is
 * ignored). 0, KVT_ENOTFOUND (tenant), -EINVAL (NULL tokens).
 */
KVT_API int kvt_index_hash_tokens(kvt_index *idx, uint32_t tenant,
				  const uint32_t *tokens, size_t ntokens,
				  kvt_page_key *out);

/* ------------------------------------------------------------------------
 * Lookups
 * ------------------------------------------------------------------------ */

/**
 * struct kvt_match - what one walk found, in tokens (pages * P).
 * The walk goes down the prefix while pages are resident or transient and
 * stops at the first page that is neither. Each page found is counted once:
 * as transient if marked (even if a lower tier also holds it), else under
 * the fastest tier that holds it.
 */
typedef struct kvt_match {
	uint64_t tokens;                      /* the prefix's length */
	uint64_t pages;                       /* leading pages found */
	uint64_t tier_tokens[KVT_TIER_COUNT]; /* resident, by fastest copy */
	uint64_t queued_tokens;               /* in queue */
	uint64_t inflight_tokens;             /* in flight */
	uint64_t ticket;       /* ticket of the last transient page, 0: none */
	uint64_t ready_ns;     /* latest ready time of in-flight pages, 0 */
	uint64_t compute_tokens; /* tokens - pages * P: still to compute */
} kvt_match;

/**
 * struct kvt_page_loc - one page of a match or an insert.
 * match:  @tier/@slot: the fastest copy (KVT_TIER_COUNT / KVT_SLOT_NONE if
 *         the page is transient with no copy); @state: RESIDENT, QUEUED or
 *         INFLIGHT; @src_*: unused (KVT_TIER_COUNT / KVT_SLOT_NONE).
 * insert: @tier/@slot: the page's slot in the insert's tier; @state:
 *         RESIDENT; @fresh: 1 if that slot was just taken, so the caller
 *         must write the page's bytes there; @src_tier/@src_slot: for a
 *         fresh slot, the fastest other copy to load it from
 *         (KVT_TIER_COUNT / KVT_SLOT_NONE: none, compute it).
 */
typedef struct kvt_page_loc {
	uint32_t slot;
	uint32_t src_slot;
	uint8_t tier;
	uint8_t src_tier;
	uint8_t state;
	uint8_t fresh;
} kvt_page_loc;

/** kvt_index_match() flags. */
enum {
	/* Count the matched pages as used: a hit each, last access = now
	 * (and, by the write policy, copies down). Without it the call only
	 * reads: call it as often as you like (every scheduler step). */
	KVT_MATCH_TOUCH = 1u << 0,
};

/**
 * kvt_index_match() - how much of @px is cached, where, and what is coming.
 * @m:     filled on success (required).
 * @locs:  optional: the first min(m->pages, @nlocs) pages, in order (the
 *         slots to load, ready for the transfer engine).
 * @now:   used with KVT_MATCH_TOUCH only.
 * Cost: one hash lookup per tree edge plus a compare of the prefix; no
 * allocation unless TOUCH has to split an edge where the match ends.
 * Returns 0; KVT_ENOTFOUND for an unknown tenant; -EINVAL for a bad prefix
 * (both tokens and keys, a NULL array with a length, keys in token mode)
 * or a NULL @m; -E2BIG past KVT_INDEX_MAX_PAGES; with TOUCH also -ENOMEM
 * (nothing touched).
 */
KVT_API int kvt_index_match(kvt_index *idx, const kvt_prefix *px,
			    unsigned flags, uint64_t now, kvt_match *m,
			    kvt_page_loc *locs, size_t nlocs);

/**
 * struct kvt_page_info - everything the index records about one page.
 * @resident:  bit (1 << kind) set for each tier holding a copy.
 * @slot:      per kvt_tier_kind, KVT_SLOT_NONE where no copy.
 * @state:     enum kvt_page_state.
 */
typedef struct kvt_page_info {
	uint32_t slot[KVT_TIER_COUNT];
	uint32_t resident;
	uint32_t state;
	uint32_t pins;
	uint32_t hits;
	uint64_t atime;    /* last access (the caller's @now) */
	uint64_t ticket;   /* transient pages */
	uint64_t ready_ns; /* in-flight pages */
} kvt_page_info;

/**
 * kvt_index_inspect() - per-page records along @px (debugging, tests,
 * `kvtier stat`). Walks while pages are in the tree (empty ones too) and
 * writes the first min(found, @max) records; *@found receives how many
 * leading pages of @px the tree holds. Read-only. Errors as match.
 */
KVT_API int kvt_index_inspect(kvt_index *idx, const kvt_prefix *px,
			      kvt_page_info *info, size_t max, size_t *found);

/* ------------------------------------------------------------------------
 * Changes
 * ------------------------------------------------------------------------ */

/** kvt_index_insert() flags. */
enum {
	/* When the tier cannot hold every page, keep the leading pages that
	 * fit instead of failing (res->pages says how many). */
	KVT_INSERT_PARTIAL = 1u << 0,
	/* Lease the pages in the same call, as kvt_index_pin() would: no
	 * eviction (the watermark evictions that run as the call ends
	 * included) can take a fresh page before the caller has written its
	 * bytes, and the write policy's copies of the prefix wait until the
	 * lease ends (kvt_index_unpin() applies them): nothing is copied down
	 * before it is written. End it with kvt_index_unpin(). Not with
	 * KVT_INSERT_PARTIAL, unless with KVT_INSERT_SPILL. */
	KVT_INSERT_PIN = 1u << 1,
	/* Place by room: a page of @px with no copy in @tier or a tier below
	 * it goes into @tier, or, when @tier has no room for it after
	 * eviction (quotas included), into the next managed tier below that
	 * has, the leading missing pages in the faster tiers; a page with a
	 * copy in @tier or below keeps it and gets none in @tier (nothing is
	 * promoted); a copy in a tier faster than @tier (hbm, storing into
	 * the offload tiers) neither counts nor moves. locs[i] gives each
	 * page's fastest copy from @tier down (@fresh: a new slot, write its
	 * bytes there; @src_*: unused).
	 * What fits in no tier fails the call (KVT_EFULL), or with
	 * KVT_INSERT_PARTIAL cuts the prefix at the first page that fits
	 * nowhere; KVT_INSERT_PIN then leases the pages kept. Into the
	 * fastest tier it ends the transient marks of every page kept, in
	 * whichever tier it landed. */
	KVT_INSERT_SPILL = 1u << 2,
};

typedef struct kvt_insert_result {
	uint64_t pages;    /* leading pages of the prefix now in the tier */
	uint64_t fresh;    /* of which got a new slot (write their bytes) */
} kvt_insert_result;

/**
 * kvt_index_insert() - the pages of @px are (about to be) in tier @tier.
 * Every page of @px gets a copy in @tier: pages already there keep their
 * slot; others get a fresh slot from the tier's pool (making room by
 * eviction, never evicting a page of @px). All pages of @px count as used
 * (a hit, last access = @now); the write policy may copy some down. Into
 * the fastest managed tier, an insert also ends the transient marks of
 * those pages: their bytes are there.
 *
 * @res, @locs: optional; @locs gets the first min(res->pages, @nlocs) pages.
 *
 * Returns 0; -EINVAL for a prefix that is empty or not whole pages, or a
 * bad prefix as in match; KVT_ENOTFOUND for an unknown tenant or a tier the
 * index does not manage; -E2BIG; -ENOMEM (nothing changed); KVT_EFULL when
 * the tier cannot hold every page even after eviction (everything else
 * pinned or part of @px) — nothing is inserted, but the eviction it did
 * stays — unless KVT_INSERT_PARTIAL, which then keeps the leading pages
 * that fit (KVT_EFULL still if not even the first page fits).
 * With KVT_INSERT_PARTIAL, pages past the cut keep their transient marks.
 */
KVT_API int kvt_index_insert(kvt_index *idx, const kvt_prefix *px,
			     kvt_tier_kind tier, unsigned flags, uint64_t now,
			     kvt_insert_result *res, kvt_page_loc *locs,
			     size_t nlocs);

/**
 * kvt_index_restore() - put back pages that survived a restart: every page
 * of @px gets a copy in @tier at slots[i] (one slot per page of @px, in
 * prefix order), taken from the tier's pool with kvt_pool_reserve(). Pages
 * already there must be at the same slot. Unlike insert it never evicts,
 * applies no write policy, takes no lease, counts no hit (the pages are
 * the most recent in call order) and ignores quotas (a tenant's quota set
 * afterwards evicts its pages down to it). For rebuilding an index from
 * records (the node cache's persistent ssd tier); call it root side first
 * or with whole prefixes.
 * @added: optional; the pages that got their copy in this call.
 * Returns 0; -EINVAL / -E2BIG / KVT_ENOTFOUND as insert (slots NULL, a
 * slot out of range); -EEXIST when a page has another slot in @tier;
 * KVT_EBUSY when a slot is already in use; -ENOMEM. On error no slot is
 * taken and no page added (the tree may keep a split edge).
 */
KVT_API int kvt_index_restore(kvt_index *idx, const kvt_prefix *px,
			      kvt_tier_kind tier, const uint32_t *slots,
			      uint64_t now, uint64_t *added);

/**
 * kvt_index_pin() / kvt_index_unpin() - lease the pages of @px (all of
 * them, whole pages only) so no tier evicts them while the caller reads or
 * writes their slots; each pin is undone by one unpin of the same prefix.
 * Leases nest: pinning a prefix holds every page above its end too.
 * Pin returns 0, KVT_ENOTFOUND naming the first page of @px that has no
 * copy (nothing pinned), -EINVAL / -E2BIG for a bad prefix, -ENOMEM.
 * Unpin returns 0, or -EINVAL (nothing unpinned) naming the first page
 * that is not pinned, or saying that no lease ends where @px ends (its
 * pages are held by longer pinned prefixes only). Unpin never allocates
 * heap memory; it applies the write policy to @px (the copies an insert
 * with KVT_INSERT_PIN deferred), which may take slots in lower tiers and
 * evict there.
 */
KVT_API int kvt_index_pin(kvt_index *idx, const kvt_prefix *px);
KVT_API int kvt_index_unpin(kvt_index *idx, const kvt_prefix *px);

/**
 * kvt_index_queue() - a queued request will compute @px: mark its pages
 * that are neither in the fastest tier nor already marked as in queue under
 * @ticket (creating placeholders for pages the tree lacks).
 * kvt_index_start() - computing or loading @px has started, ready at
 * @ready_ns: mark its pages that are not in the fastest tier as in flight
 * under @ticket (taking over queued marks of any ticket; pages in flight
 * under another ticket keep theirs; calling it again updates @ready_ns).
 * kvt_index_cancel() - withdraw @ticket's marks on @px; placeholders that
 * no longer stand for anything are removed.
 *
 * @ticket: the caller's id (request or transfer job), non-zero.
 * @marked: optional; pages whose mark this call set or cleared.
 * Returns 0, -EINVAL for ticket 0 or a bad prefix, KVT_ENOTFOUND (tenant),
 * -E2BIG, -ENOMEM (nothing changed).
 */
KVT_API int kvt_index_queue(kvt_index *idx, const kvt_prefix *px,
			    uint64_t ticket, uint64_t now, uint64_t *marked);
KVT_API int kvt_index_start(kvt_index *idx, const kvt_prefix *px,
			    uint64_t ticket, uint64_t ready_ns, uint64_t now,
			    uint64_t *marked);
KVT_API int kvt_index_cancel(kvt_index *idx, const kvt_prefix *px,
			     uint64_t ticket, uint64_t *marked);

/**
 * kvt_index_evict() - free at least @bytes of tier @tier (whole pages,
 * rounded up), leaves first, by the eviction policy, demoting as described
 * above. kvt_index_evict_pages() counts in pages.
 * @freed: optional; bytes (pages) actually freed in @tier.
 * Returns 0 when enough was freed; KVT_EBUSY when every remaining page of
 * the tier is pinned or has a pinned or resident page below it (what could
 * be freed was; *@freed says how much); KVT_ENOTFOUND for a tier the index
 * does not manage.
 */
KVT_API int kvt_index_evict(kvt_index *idx, kvt_tier_kind tier,
			    uint64_t bytes, uint64_t *freed);
KVT_API int kvt_index_evict_pages(kvt_index *idx, kvt_tier_kind tier,
				  uint64_t pages, uint64_t *freed);

/**
 * kvt_index_drop_copy() - the copy in tier @tier at @slot is no good (its
 * bytes never landed, or do not match what was stored): the page holding
 * that slot loses this copy at once and the slot goes back to its pool
 * (mover.release is called), so it neither counts as the page's copy nor
 * takes room. A page left with no copy is gone, as by eviction (pages below
 * it stay until they are evicted). Kept for indexes with a mover (a slot ->
 * page map of 12 bytes per slot of every managed tier).
 * Returns 0; KVT_ENOTFOUND for a slot no page holds (already evicted) or a
 * tier not managed; KVT_EBUSY when it is the only copy of a leased page
 * (nothing changes: drop it once the lease ends); -EINVAL without a mover.
 */
KVT_API int kvt_index_drop_copy(kvt_index *idx, kvt_tier_kind tier,
				uint32_t slot);

/* ------------------------------------------------------------------------
 * Accounting and checking
 * ------------------------------------------------------------------------ */

typedef struct kvt_index_stat {
	uint64_t nodes;     /* tree nodes (edges), tenant roots excluded */
	uint64_t pages;     /* pages in the tree */
	uint64_t resident[KVT_TIER_COUNT]; /* pages with a copy in tier t */
	uint64_t transient; /* pages in queue or in flight */
	uint64_t pinned;    /* pages with pins */
	uint64_t tenants;
	uint64_t mem_bytes; /* bytes the index holds (nodes, tables, heaps);
			       no KV data, no allocator overhead */
	/* counters since creation */
	uint64_t matches, inserts;
	uint64_t evicted[KVT_TIER_COUNT]; /* pages that left tier t */
	uint64_t demoted[KVT_TIER_COUNT]; /* pages moved into tier t */
	uint64_t copied[KVT_TIER_COUNT];  /* write-policy copies into tier t */
	uint64_t dropped;     /* pages whose last copy went */
	uint64_t move_failed; /* mover errors */
	uint64_t splits;      /* edges split */
} kvt_index_stat;

KVT_API void kvt_index_stat_get(kvt_index *idx, kvt_index_stat *st);

/**
 * kvt_index_check() - walk the whole index and verify every invariant:
 * the child table and the parent links, page and node counts, per-tier
 * resident counts up the tree, slots unique and allocated in their pools,
 * pool occupancy equal to resident pages, pins (an ancestor holds at least
 * its descendants' pins; pinned pages have a copy), the slot -> page map
 * of an index with a mover, transient marks,
 * placeholders not left behind, each tenant's eviction heap per tier
 * (exactly its evictable nodes, in LRU/LFU order), and each tenant's
 * per-tier usage (kvt_index_tenant_usage()) against a recount.
 * O(nodes * depth); for tests and debug builds. Returns 0, KVT_ECORRUPT with kvt_errdetail() naming the first
 * broken rule, -ENOMEM.
 */
KVT_API int kvt_index_check(kvt_index *idx);

/* ------------------------------------------------------------------------
 * Trace replay (kvtier trace replay, the simulator's warm-up)
 * ------------------------------------------------------------------------ */

typedef struct kvt_replay_result {
	uint64_t capacity;   /* blocks asked for (0: unbounded) */
	uint64_t slots;      /* blocks the tier held (capacity, or the
				trace's distinct blocks if fewer/unbounded) */
	uint64_t requests;
	uint64_t blocks;     /* blocks requested, all requests */
	uint64_t hit_blocks; /* leading blocks found cached */
	double hit_rate;     /* hit_blocks / blocks */
	uint64_t evicted;    /* blocks evicted */
	uint64_t mem_bytes;  /* index memory at the end */
} kvt_replay_result;

/**
 * kvt_index_replay() - replay @t through an index of one tier (hbm) of
 * @capacity blocks, keyed by the trace's hash ids (KVT_KEY_HASH, tenant
 * 0, the trace's timestamps as the clock). In file order, each request
 * first counts its leading blocks already cached (a prefix hit stops at
 * the first miss), then inserts or touches all of its blocks (keeping the
 * leading ones that fit when a request is larger than the tier).
 * @policy: KVT_EVICT_LRU or KVT_EVICT_LFU.
 * Returns 0, -EINVAL (policy), -E2BIG for a capacity over
 * KVT_POOL_MAX_SLOTS, -ENOMEM. Deterministic: the same trace, capacity and
 * policy always give the same result.
 */
KVT_API int kvt_index_replay(const kvt_trace *t, uint64_t capacity,
			     int policy, kvt_replay_result *res);

/** Names for messages and JSON: "lru", "lfu"; "write-back", ... */
KVT_API const char *kvt_evict_policy_name(int policy);
KVT_API const char *kvt_write_policy_name(int policy);
KVT_API const char *kvt_page_state_name(int state);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_INDEX_H */
