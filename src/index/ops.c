/*
 * ops.c — the index's operations: match, inspect, insert (by tier or by
 * room), restore, pin and unpin; the transient marks (queue, start,
 * cancel) are in mark.c, over the path helpers this file shares.
 *
 * Every change runs in the same order, so a failure leaves the cached
 * contents as they were:
 *
 *   1. read:     walk the prefix, count what is there;
 *   2. shape:    split edges where node-level fields must differ, allocate
 *                new nodes and table/heap room (may fail: -ENOMEM; splits
 *                done so far hold the same pages, so nothing is lost);
 *   3. change:   attach, take slots, set bits, marks, pins (cannot fail,
 *                except an insert that finds no room: it is undone);
 *   4. policy:   copies down by the write policy; pending watermark calls.
 *
 * A change that may evict pins its own prefix first (pins are node-level,
 * so the prefix's nodes leave the heaps for the while).
 */
#include "index/index_impl.h"

#include <errno.h>
#include <string.h>

#define TBIT(t) ((uint8_t)(1u << (t)))

/* Split so that the first @np pages of the prefix end on an edge boundary.
 * The pages must be in the tree. */
int kvti_split_at(kvt_index *x, struct pk *k, size_t np)
{
	struct walker w;
	struct knode *h;

	kvti_walk_init(k, &w);
	while (kvti_walk_next(x, k, &w, np))
		;
	if (w.i != np || w.j == w.n->npages)
		return 0;
	return kvti_split(x, w.n, w.j, &h);
}

/* Walk the first @np pages (on edge boundaries) and apply @fn to each
 * node, root side first. */
void kvti_for_path(kvt_index *x, struct pk *k, size_t np,
		   void (*fn)(kvt_index *x, struct knode *n, void *arg),
		   void *arg)
{
	struct walker w;

	kvti_walk_init(k, &w);
	while (kvti_walk_next(x, k, &w, np))
		fn(x, w.n, arg);
}

static void pin_fn(kvt_index *x, struct knode *n, void *arg)
{
	kvti_pin_delta(x, n, *(int *)arg);
}

static void touch_fn(kvt_index *x, struct knode *n, void *arg)
{
	(void)arg;
	kvti_touch(x, n);
}

static void copy_fn(kvt_index *x, struct knode *n, void *arg)
{
	(void)arg;
	if (!x->copy_hits || n->hits < x->copy_hits || !n->nneed)
		return;
	for (uint32_t j = 0; j < n->npages; j++)
		kvti_copy_down(x, n, j);
}

/* The write policy over the prefix's first np pages (pinned by the
 * caller). */
static void policy(kvt_index *x, struct pk *k, size_t np)
{
	if (x->copy_hits)
		kvti_for_path(x, k, np, copy_fn, NULL);
}

/* ---- match and inspect ------------------------------------------------ */

static void loc_none(kvt_page_loc *l)
{
	l->slot = KVT_SLOT_NONE;
	l->src_slot = KVT_SLOT_NONE;
	l->tier = KVT_TIER_COUNT;
	l->src_tier = KVT_TIER_COUNT;
	l->state = KVT_PAGE_NONE;
	l->fresh = 0;
}

/* Count pages [0, m) of n into @r; returns how many count (the walk stops
 * at an empty page). */
static uint32_t match_run(kvt_index *x, struct knode *n, uint32_t m,
			  size_t base, kvt_match *r, uint64_t *tc,
			  kvt_page_loc *locs, size_t nlocs)
{
	const uint8_t *mk = nmask(x, n);
	uint32_t j;

	for (j = 0; j < m; j++) {
		uint8_t b = mk[j];
		int st;

		if (page_transient(n, b)) {
			st = n->tstate;
			r->ticket = n->ticket;
			if (st == KVT_PAGE_INFLIGHT) {
				r->inflight_tokens += x->P;
				if (n->ready > r->ready_ns)
					r->ready_ns = n->ready;
			} else {
				r->queued_tokens += x->P;
			}
		} else if (b) {
			st = KVT_PAGE_RESIDENT;
			tc[__builtin_ctz(b)]++;
		} else {
			break;
		}
		if (base + j < nlocs) {
			kvt_page_loc *l = &locs[base + j];
			loc_none(l);
			l->state = (uint8_t)st;
			if (b) {
				int t = __builtin_ctz(b);
				l->tier = (uint8_t)x->kind[t];
				l->slot = *nslot(x, n, j, t);
			}
		}
	}
	return j;
}

int kvt_index_match(kvt_index *x, const kvt_prefix *px, unsigned flags,
		    uint64_t now, kvt_match *m, kvt_page_loc *locs, size_t nlocs)
{
	uint64_t tc[KVT_TIER_COUNT] = { 0 };
	struct walker w;
	struct pk k;
	kvt_match r;
	uint32_t got;
	int err, one = 1, minus = -1;

	kvti_errclear();
	if (!locs)
		nlocs = 0;
	if (!m)
		return kvti_fail(-EINVAL, "no kvt_match to fill");
	if ((err = kvti_px_open(x, px, 0, &k)))
		return err;
	memset(&r, 0, sizeof(r));
	r.tokens = k.ntokens;
	kvti_walk_init(&k, &w);
	while ((got = kvti_walk_next(x, &k, &w, k.n))) {
		uint32_t c = match_run(x, w.n, got, w.i - got, &r, tc, locs,
				       nlocs);
		r.pages += c;
		if (c < got)
			break;
	}
	for (int t = 0; t < x->nt; t++)
		r.tier_tokens[x->kind[t]] = tc[t] * x->P;
	r.compute_tokens = r.tokens - r.pages * x->P;
	if ((flags & KVT_MATCH_TOUCH) && r.pages) {
		if ((err = kvti_split_at(x, &k, r.pages)))
			return err;
		kvti_set_clock(x, now);
		kvti_enter(x);
		kvti_for_path(x, &k, r.pages, touch_fn, NULL);
		if (x->copy_hits) {
			kvti_for_path(x, &k, r.pages, pin_fn, &one);
			policy(x, &k, r.pages);
			kvti_for_path(x, &k, r.pages, pin_fn, &minus);
		}
		kvti_leave(x);
	}
	x->matches++;
	*m = r;
	return 0;
}

int kvt_index_inspect(kvt_index *x, const kvt_prefix *px, kvt_page_info *info,
		      size_t max, size_t *found)
{
	struct walker w;
	struct pk k;
	uint32_t got;
	size_t n = 0;
	int err;

	kvti_errclear();
	if (!info)
		max = 0;
	if ((err = kvti_px_open(x, px, 0, &k)))
		return err;
	kvti_walk_init(&k, &w);
	while ((got = kvti_walk_next(x, &k, &w, k.n))) {
		struct knode *nd = w.n;
		for (uint32_t j = 0; j < got; j++, n++) {
			uint8_t b = nmask(x, nd)[j];
			kvt_page_info *pi;
			if (n >= max)
				continue;
			pi = &info[n];
			memset(pi, 0, sizeof(*pi));
			for (int t = 0; t < KVT_TIER_COUNT; t++)
				pi->slot[t] = KVT_SLOT_NONE;
			for (int t = 0; t < x->nt; t++)
				if (b & (1u << t)) {
					pi->resident |= 1u << x->kind[t];
					pi->slot[x->kind[t]] = *nslot(x, nd, j, t);
				}
			pi->state = page_transient(nd, b) ? nd->tstate :
				    b ? KVT_PAGE_RESIDENT : KVT_PAGE_EMPTY;
			pi->pins = nd->pins;
			pi->hits = nd->hits;
			pi->atime = nd->atime;
			if (nd->tstate && page_transient(nd, b)) {
				pi->ticket = nd->ticket;
				pi->ready_ns = nd->ready;
			}
		}
	}
	if (found)
		*found = n;
	return 0;
}

/* ---- insert ----------------------------------------------------------- */

static int tier_of(kvt_index *x, kvt_tier_kind tier)
{
	int t = (unsigned)tier < KVT_TIER_COUNT ? x->ti[tier] : -1;

	if (t < 0)
		kvti_fail(KVT_ENOTFOUND, "tier %d (%s) is not managed by this "
			  "index", (int)tier, (unsigned)tier < KVT_TIER_COUNT ?
			  kvt_tier_kind_name(tier) : "?");
	return t;
}

/* A node for prefix pages [from, from + cnt), no copies, not attached. */
static struct knode *node_for(kvt_index *x, struct pk *k, size_t from,
			      uint32_t cnt)
{
	struct knode *n = kvti_node_new(x, cnt);

	if (!n)
		return NULL;
	n->npages = cnt;
	for (uint32_t j = 0; j < cnt; j++)
		memcpy(nkeys(x, n) + (size_t)j * x->ksize,
		       kvti_pk_key(k, from + j), x->ksize);
	n->fp = kvti_fp(x, k->ten->salt, nkey(x, n, 0));
	n->atime = x->clock;
	return n;
}

/* A node for the prefix's pages from @have on (the tree lacks them), with
 * table and heap room for it. */
int kvti_new_tail(kvt_index *x, struct pk *k, size_t have,
		  struct knode **nn)
{
	int err = kvti_reserve(x, 1);

	if (err)
		return err;
	*nn = node_for(x, k, have, (uint32_t)(k->n - have));
	return *nn ? 0 : -ENOMEM;
}

/* Walk the whole prefix in the tree: returns the pages the tree holds and
 * leaves the walker at the end. */
size_t kvti_walk_all(kvt_index *x, struct pk *k, struct walker *w)
{
	kvti_walk_init(k, w);
	while (kvti_walk_next(x, k, w, k->n))
		;
	return w->i;
}

/* Pages past the end of an insert's own (pinned) path may have emptied
 * while it made room: prune from the deepest node of the prefix. */
static void prune_path(kvt_index *x, struct pk *k)
{
	struct walker w;

	kvti_walk_all(x, k, &w);
	kvti_prune(x, w.n);
}

/* Give the prefix's first np pages a copy in tier t (slots free: checked
 * by the caller); fill locs. Returns pages that got a fresh slot. */
static uint64_t take_slots(kvt_index *x, struct pk *k, size_t np, int t,
			   uint64_t need, kvt_page_loc *locs, size_t nlocs)
{
	struct walker w;
	uint32_t got, buf[256], nb = 0, used = 0;
	uint64_t fresh = 0;

	kvti_walk_init(k, &w);
	while ((got = kvti_walk_next(x, k, &w, np))) {
		struct knode *n = w.n;
		size_t base = w.i - got;
		int add = 0;

		for (uint32_t j = 0; j < got; j++) {
			uint8_t b = nmask(x, n)[j];
			uint32_t *s = nslot(x, n, j, 0);
			kvt_page_loc *l = base + j < nlocs ? &locs[base + j] :
				NULL;

			if (l) {
				loc_none(l);
				l->state = KVT_PAGE_RESIDENT;
				l->tier = (uint8_t)x->kind[t];
			}
			if (!(b & (1u << t))) {
				if (used == nb) {
					nb = (uint32_t)KVT_MIN(
						(uint64_t)KVT_ARRAY_SIZE(buf),
						need);
					need -= nb;
					used = 0;
					/* room was made; cannot fail here */
					if (kvt_pool_alloc_n(x->pool[t], buf,
							     nb))
						nb = 0;
				}
				s[t] = buf[used++];
				kvti_rev_set(x, t, s[t], n, j);
				kvti_set_mask(x, n, j, b | (uint8_t)(1u << t));
				add++;
				if (l) {
					l->fresh = 1;
					if (b) {
						int f = __builtin_ctz(b);
						l->src_tier = (uint8_t)x->kind[f];
						l->src_slot = s[f];
					}
				}
			}
			if (l)
				l->slot = s[t];
		}
		if (add)
			kvti_res_delta(x, n, t, add);
		fresh += (uint64_t)add;
	}
	while (used < nb)
		kvt_pool_free(x->pool[t], buf[used++]);
	return fresh;
}

/* Pages among the first np of the prefix without a copy in any tier of
 * @want (a residency mask); *@cut: the place of the (avail+1)-th of them,
 * np when there are no more. */
static uint64_t count_missing(kvt_index *x, struct pk *k, size_t np,
			      uint8_t want, size_t *cut, uint64_t avail)
{
	struct walker w;
	uint32_t got;
	uint64_t miss = 0;

	*cut = np;
	kvti_walk_init(k, &w);
	while ((got = kvti_walk_next(x, k, &w, np))) {
		const uint8_t *mk = nmask(x, w.n);
		for (uint32_t j = 0; j < got; j++) {
			if (mk[j] & want)
				continue;
			if (miss == avail && *cut == np)
				*cut = w.i - got + j;
			miss++;
		}
	}
	return miss;
}

/* Steps 1 and 2 of an insert or a restore: open the prefix and the tier,
 * set the clock, put an edge boundary where the tree's part of the prefix
 * ends (*@have pages) and make a node for the rest (*@nn, not attached;
 * NULL when the tree holds it all). */
static int shape_prefix(kvt_index *x, const kvt_prefix *px, kvt_tier_kind tier,
			uint64_t now, struct pk *k, int *t, size_t *have,
			struct knode **nn)
{
	struct walker w;
	int err;

	*nn = NULL;
	if ((err = kvti_px_open(x, px, 1, k)))
		return err;
	if ((*t = tier_of(x, tier)) < 0)
		return KVT_ENOTFOUND;
	kvti_set_clock(x, now);
	*have = kvti_walk_all(x, k, &w);
	if ((err = kvti_split_at(x, k, *have)))
		return err;
	if (*have < k->n && (err = kvti_new_tail(x, k, *have, nn)))
		return err;
	return 0;
}

/* End @n's transient mark if its pages are in the fastest tier (@arg
 * non-NULL: if they have a copy anywhere, KVT_INSERT_SPILL). */
static void clear_mark_fn(kvt_index *x, struct knode *n, void *arg)
{
	if (n->tstate && (arg || n->cnt[0] == n->npages)) {
		x->transient -= n->npages;
		n->tstate = 0;
		n->ticket = 0;
		n->ready = 0;
	}
}

/* Steps 1 to 3 of every insert: shape the prefix, enter the call, hang
 * the new node (if any) in the tree and pin the whole path, so making room
 * never takes a page of it. */
static int insert_begin(kvt_index *x, const kvt_prefix *px,
			kvt_tier_kind tier, uint64_t now, struct pk *k, int *t,
			size_t *have, struct knode **nn)
{
	struct walker w;
	int err, one = 1;

	if ((err = shape_prefix(x, px, tier, now, k, t, have, nn)))
		return err;
	kvti_enter(x);
	if (*nn) {
		kvti_walk_all(x, k, &w);
		kvti_attach(x, w.n, *nn);
	}
	kvti_for_path(x, k, k->n, pin_fn, &one);
	return 0;
}

/* An insert that found no room: unpin, take the new node out, prune, end
 * the call (the eviction it did stays). */
static void insert_undo(kvt_index *x, struct pk *k, struct knode *nn)
{
	int minus = -1;

	kvti_for_path(x, k, k->n, pin_fn, &minus);
	if (nn)
		kvti_detach(x, nn);
	prune_path(x, k);
	kvti_leave(x);
}

/* Step 4 of an insert that kept the first @cut pages: the marks of pages
 * now in the fastest tier end; the write policy and the end of the pin
 * over the first @np pages (or, KVT_INSERT_PIN, the pin stays: the
 * caller's lease); prune; end the call. */
static void insert_end(kvt_index *x, struct pk *k, int t, unsigned flags,
		       size_t cut, size_t np, uint64_t fresh,
		       kvt_insert_result *res)
{
	int minus = -1;

	if (t == 0)
		kvti_for_path(x, k, cut, clear_mark_fn,
			      flags & KVT_INSERT_SPILL ? k : NULL);
	if (!(flags & KVT_INSERT_PIN)) {
		policy(x, k, np);
		kvti_for_path(x, k, np, pin_fn, &minus);
	}
	prune_path(x, k);
	x->inserts++;
	kvti_leave(x);
	if (res) {
		res->pages = cut;
		res->fresh = fresh;
	}
}

/* ---- insert by room (KVT_INSERT_SPILL) ---------------------------------- */

/* Give each page among the prefix's first np that has no copy in t0 or a
 * tier below a slot: the first got[t0] of them in tier t0, the next
 * got[t0 + 1] in t0 + 1, ... (room made by the caller; a copy in a faster
 * tier stays); locs: every page's fastest copy from t0 down. Returns the
 * pages that got a fresh slot. */
static uint64_t spill_slots(kvt_index *x, struct pk *k, size_t np, int t0,
			    const uint64_t *got, kvt_page_loc *locs,
			    size_t nlocs)
{
	uint64_t fresh = 0, left[KVT_TIER_COUNT];
	uint32_t run, buf[256], nb = 0, used = 0;
	const uint8_t want = (uint8_t)(((1u << x->nt) - 1) & ~(TBIT(t0) - 1));
	struct walker w;
	int t = t0;

	memcpy(left, got, sizeof(left));
	kvti_walk_init(k, &w);
	while ((run = kvti_walk_next(x, k, &w, np))) {
		struct knode *n = w.n;
		size_t base = w.i - run;
		int add[KVT_TIER_COUNT] = { 0 };

		for (uint32_t j = 0; j < run; j++) {
			uint8_t b = nmask(x, n)[j], have = b & want;
			uint32_t *s = nslot(x, n, j, 0);
			kvt_page_loc *l = base + j < nlocs ? &locs[base + j] :
				NULL;
			int f = have ? __builtin_ctz(have) : -1;

			if (!have) {
				while (t < x->nt && !left[t])
					t++;
				if (KVT_UNLIKELY(t == x->nt))
					break; /* counted by the caller */
				if (used == nb) {
					nb = (uint32_t)KVT_MIN(
						(uint64_t)KVT_ARRAY_SIZE(buf),
						left[t]);
					used = 0;
					/* room was made; cannot fail here */
					if (kvt_pool_alloc_n(x->pool[t], buf,
							     nb))
						break;
				}
				s[t] = buf[used++];
				kvti_rev_set(x, t, s[t], n, j);
				left[t]--;
				kvti_set_mask(x, n, j, b | TBIT(t));
				add[t]++;
				fresh++;
				f = t;
			}
			if (l) {
				loc_none(l);
				l->state = KVT_PAGE_RESIDENT;
				l->tier = (uint8_t)x->kind[f];
				l->slot = s[f];
				l->fresh = !have;
			}
		}
		for (int u = 0; u < x->nt; u++)
			if (add[u])
				kvti_res_delta(x, n, u, add[u]);
	}
	return fresh;
}

/* kvt_index_insert() with KVT_INSERT_SPILL: the same steps, each page with
 * no copy from @tier down placed in the fastest tier from @tier down that
 * has room. */
static int insert_spill(kvt_index *x, const kvt_prefix *px,
			kvt_tier_kind tier, unsigned flags, uint64_t now,
			kvt_insert_result *res, kvt_page_loc *locs,
			size_t nlocs)
{
	uint64_t miss, placed = 0, fresh, got[KVT_TIER_COUNT] = { 0 };
	uint8_t all;
	struct knode *nn = NULL;
	struct tacct *ta;
	struct pk k;
	size_t have, cut;
	int t, err, one = 1, minus = -1;

	/* 1, 2. read and shape; 3. change: the prefix in the tree, pinned */
	if ((err = insert_begin(x, px, tier, now, &k, &t, &have, &nn)))
		return err;
	all = (uint8_t)(((1u << x->nt) - 1) & ~(TBIT(t) - 1)); /* t and below */
	miss = count_missing(x, &k, k.n, all, &cut, UINT64_MAX);
	/* tier by tier: the tenant's quota (its own pages), then the tier's
	 * room, for what is still to place */
	ta = k.ten->root->ta;
	for (int u = t; u < x->nt && placed < miss; u++) {
		uint64_t want = miss - placed, avail;

		kvti_quota_room(x, ta, u, want); /* (no quota: a no-op) */
		avail = KVT_MIN(want, kvti_quota_free(ta, u));
		if (avail)
			kvti_make_room(x, u, avail);
		got[u] = KVT_MIN(avail, kvti_pool_free(x, u));
		placed += got[u];
	}
	cut = k.n;
	if (placed < miss)
		count_missing(x, &k, k.n, all, &cut, placed);
	err = placed < miss && (!(flags & KVT_INSERT_PARTIAL) || !cut) ?
	      KVT_EFULL : 0;
	/* the pages past the cut keep no lease: an edge ends there */
	if (!err && cut < k.n && !(err = kvti_split_at(x, &k, cut))) {
		kvti_for_path(x, &k, k.n, pin_fn, &minus);
		kvti_for_path(x, &k, cut, pin_fn, &one);
		nn = NULL; /* it may be split; what is past the cut is pruned */
	}
	if (err) {
		insert_undo(x, &k, nn);
		if (err != KVT_EFULL)
			return err;
		return kvti_fail(KVT_EFULL, "tiers %s and below: %llu pages to "
				 "place, %llu fit after eviction (the rest "
				 "pinned, in use by this prefix or over tenant "
				 "%u's quotas)", kvt_tier_kind_name(tier),
				 (unsigned long long)miss,
				 (unsigned long long)placed, px->tenant);
	}
	fresh = spill_slots(x, &k, cut, t, got, locs, nlocs);
	kvti_for_path(x, &k, cut, touch_fn, NULL);
	insert_end(x, &k, t, flags, cut, cut, fresh, res);
	return 0;
}

int kvt_index_insert(kvt_index *x, const kvt_prefix *px, kvt_tier_kind tier,
		     unsigned flags, uint64_t now, kvt_insert_result *res,
		     kvt_page_loc *locs, size_t nlocs)
{
	struct knode *nn = NULL;
	struct tacct *ta;
	struct pk k;
	size_t have, cut, have_cut;
	uint64_t miss, fresh, avail;
	int t, err, quota_short;

	kvti_errclear();
	if (!locs)
		nlocs = 0;
	if (flags & ~(KVT_INSERT_PARTIAL | KVT_INSERT_PIN | KVT_INSERT_SPILL))
		return kvti_fail(-EINVAL, "insert: unknown flags 0x%x", flags);
	if (flags & KVT_INSERT_SPILL)
		return insert_spill(x, px, tier, flags, now, res, locs, nlocs);
	if ((flags & KVT_INSERT_PIN) && (flags & KVT_INSERT_PARTIAL))
		return kvti_fail(-EINVAL, "insert: KVT_INSERT_PIN and "
				 "KVT_INSERT_PARTIAL do not go together "
				 "(but with KVT_INSERT_SPILL)");
	/* 1, 2. read and shape; 3. change: the prefix in the tree, pinned */
	if ((err = insert_begin(x, px, tier, now, &k, &t, &have, &nn)))
		return err;
	miss = count_missing(x, &k, k.n, TBIT(t), &cut, UINT64_MAX);
	/* the tenant's quota first (its own pages), then the tier's room */
	ta = k.ten->root->ta;
	if ((flags & KVT_INSERT_PARTIAL) || miss <= ta->quota[t])
		kvti_quota_room(x, ta, t, miss); /* (no quota: a no-op) */
	avail = KVT_MIN(miss, kvti_quota_free(ta, t));
	quota_short = avail < miss;
	/* room in the tier for what the quota lets in; none for an insert
	 * that fails anyway */
	if (avail && (!quota_short || (flags & KVT_INSERT_PARTIAL)))
		kvti_make_room(x, t, avail);
	avail = KVT_MIN(avail, kvti_pool_free(x, t));
	if (avail < miss) {
		count_missing(x, &k, k.n, TBIT(t), &cut, avail);
		if (!(flags & KVT_INSERT_PARTIAL) || !cut) {
			insert_undo(x, &k, nn);
			if (quota_short)
				return kvti_fail(KVT_EFULL, "tier %s: %llu "
						 "pages to place, tenant %u may "
						 "take %llu under its quota of "
						 "%llu (the rest of its pages "
						 "pinned or in use by this "
						 "prefix)",
						 kvt_tier_kind_name(tier),
						 (unsigned long long)miss,
						 px->tenant,
						 (unsigned long long)avail,
						 (unsigned long long)ta->quota[t]);
			return kvti_fail(KVT_EFULL, "tier %s: %llu pages to "
					 "place, %llu free after eviction (the "
					 "rest pinned or in use by this prefix)",
					 kvt_tier_kind_name(tier),
					 (unsigned long long)miss,
					 (unsigned long long)avail);
		}
	}
	if (cut < k.n)
		miss = count_missing(x, &k, cut, TBIT(t), &have_cut,
				     UINT64_MAX);
	fresh = take_slots(x, &k, cut, t, miss, locs, nlocs);
	if (nn && cut < k.n) {
		/* the new node keeps only the pages that got a slot */
		kvti_pin_delta(x, nn, -1);
		if (cut <= have) {
			kvti_detach(x, nn);
		} else {
			x->pages -= nn->npages - (cut - have);
			nn->npages = (uint32_t)(cut - have);
			kvti_pin_delta(x, nn, 1);
		}
	}
	kvti_for_path(x, &k, k.n, touch_fn, NULL);
	insert_end(x, &k, t, flags, cut, k.n, fresh, res);
	return 0;
}

/* ---- restore (after a restart) ------------------------------------------- */

/* Recency without a hit: a restored page was not used by anyone. */
static void restore_touch_fn(kvt_index *x, struct knode *n, void *arg)
{
	(void)arg;
	n->atime = x->clock;
	n->ord = ++x->tick;
	kvti_heap_rekey(x, n);
}

/* Take slots[i] of tier t for every page of the prefix that has no copy
 * there (the tree holds the first @have pages). All or none: 0, or an
 * error with the slots taken so far given back. */
static int restore_reserve(kvt_index *x, struct pk *k, int t, size_t have,
			   const uint32_t *slots, uint64_t *taken)
{
	struct walker w;
	uint32_t got;
	size_t i;
	int err = 0;

	*taken = 0;
	kvti_walk_init(k, &w);
	while (!err && (got = kvti_walk_next(x, k, &w, have))) {
		for (uint32_t j = 0; j < got && !err; j++) {
			uint32_t s = *nslot(x, w.n, j, t);

			i = w.i - got + j;
			if (!(nmask(x, w.n)[j] & (1u << t)))
				err = kvt_pool_reserve(x->pool[t], slots[i]);
			else if (s != slots[i])
				err = kvti_fail(-EEXIST, "restore: page %zu "
						"already has slot %u in tier %s, "
						"not %u", i, s,
						kvt_tier_kind_name(
							(kvt_tier_kind)x->kind[t]),
						slots[i]);
			else
				continue;
			if (!err)
				(*taken)++;
			else if (err != -EEXIST)
				goto refused;
		}
	}
	for (i = have; !err && i < k->n; i++) {
		if ((err = kvt_pool_reserve(x->pool[t], slots[i])))
			goto refused;
		(*taken)++;
	}
	return err;
refused:
	err = kvti_fail(err == KVT_EBUSY ? KVT_EBUSY : -EINVAL, "restore: "
			"slot %u of tier %s (page %zu) is %s", slots[i],
			kvt_tier_kind_name((kvt_tier_kind)x->kind[t]), i,
			err == KVT_EBUSY ? "already in use" : "out of range");
	return err;
}

/* Give back the slots restore_reserve() took (a failed restore). */
static void restore_unreserve(kvt_index *x, struct pk *k, int t, size_t have,
			      const uint32_t *slots, uint64_t taken)
{
	struct walker w;
	uint32_t got;

	kvti_walk_init(k, &w);
	while (taken && (got = kvti_walk_next(x, k, &w, have)))
		for (uint32_t j = 0; j < got && taken; j++)
			if (!(nmask(x, w.n)[j] & (1u << t))) {
				kvt_pool_free(x->pool[t], slots[w.i - got + j]);
				taken--;
			}
	for (size_t i = have; taken && i < k->n; i++, taken--)
		kvt_pool_free(x->pool[t], slots[i]);
}

int kvt_index_restore(kvt_index *x, const kvt_prefix *px, kvt_tier_kind tier,
		      const uint32_t *slots, uint64_t now, uint64_t *added)
{
	struct knode *nn = NULL;
	struct walker w;
	struct pk k;
	size_t have;
	uint64_t taken = 0;
	uint32_t got;
	int t, err;

	kvti_errclear();
	if (added)
		*added = 0;
	if (!slots)
		return kvti_fail(-EINVAL, "restore: no slots");
	/* shape first (may fail, holds the same pages), then the slots */
	if ((err = shape_prefix(x, px, tier, now, &k, &t, &have, &nn)))
		return err;
	if ((err = restore_reserve(x, &k, t, have, slots, &taken))) {
		restore_unreserve(x, &k, t, have, slots, taken);
		kvti_node_free(x, nn);
		return err;
	}

	kvti_enter(x);
	if (nn) {
		kvti_walk_all(x, &k, &w);
		kvti_attach(x, w.n, nn);
	}
	kvti_walk_init(&k, &w);
	while ((got = kvti_walk_next(x, &k, &w, k.n))) {
		struct knode *n = w.n;
		int add = 0;

		for (uint32_t j = 0; j < got; j++) {
			uint8_t b = nmask(x, n)[j];

			if (b & (1u << t))
				continue;
			*nslot(x, n, j, t) = slots[w.i - got + j];
			kvti_rev_set(x, t, slots[w.i - got + j], n, j);
			kvti_set_mask(x, n, j, b | (uint8_t)(1u << t));
			add++;
		}
		if (add)
			kvti_res_delta(x, n, t, add);
	}
	kvti_for_path(x, &k, k.n, restore_touch_fn, NULL);
	if (t == 0)
		kvti_for_path(x, &k, k.n, clear_mark_fn, NULL);
	kvti_leave(x);
	if (added)
		*added = taken;
	return 0;
}

/* ---- pins ------------------------------------------------------------- */

int kvt_index_pin(kvt_index *x, const kvt_prefix *px)
{
	struct walker w;
	struct pk k;
	uint32_t got;
	int err, one = 1;

	kvti_errclear();
	if ((err = kvti_px_open(x, px, 1, &k)))
		return err;
	kvti_walk_init(&k, &w);
	while ((got = kvti_walk_next(x, &k, &w, k.n))) {
		const uint8_t *mk = nmask(x, w.n);
		for (uint32_t j = 0; j < got; j++)
			if (!mk[j])
				return kvti_fail(KVT_ENOTFOUND, "cannot pin: "
						 "page %zu of the prefix has no "
						 "copy", w.i - got + j);
	}
	if (w.i < k.n)
		return kvti_fail(KVT_ENOTFOUND, "cannot pin: page %zu of the "
				 "prefix is not cached", w.i);
	if ((err = kvti_split_at(x, &k, k.n)))
		return err;
	kvti_for_path(x, &k, k.n, pin_fn, &one);
	return 0;
}

int kvt_index_unpin(kvt_index *x, const kvt_prefix *px)
{
	struct walker w;
	struct pk k;
	uint32_t got;
	int err, minus = -1;

	kvti_errclear();
	if ((err = kvti_px_open(x, px, 1, &k)))
		return err;
	kvti_walk_init(&k, &w);
	while ((got = kvti_walk_next(x, &k, &w, k.n)))
		if (!w.n->pins)
			return kvti_fail(-EINVAL, "cannot unpin: page %zu of "
					 "the prefix is not pinned", w.i - got);
	if (w.i < k.n)
		return kvti_fail(-EINVAL, "cannot unpin: page %zu of the "
				 "prefix is not cached", w.i);
	/* a lease must end here: not only pass through to a longer one */
	if (w.j < w.n->npages || w.n->pins <= w.n->kpins)
		return kvti_fail(-EINVAL, "cannot unpin: no pin ends at page "
				 "%zu (its pins belong to longer prefixes)",
				 k.n - 1);
	kvti_enter(x);
	/* the copies an insert with KVT_INSERT_PIN deferred, made while the
	 * pages are still held (as an insert makes them) */
	policy(x, &k, k.n);
	kvti_for_path(x, &k, k.n, pin_fn, &minus);
	kvti_leave(x);
	return 0;
}
