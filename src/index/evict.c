/*
 * evict.c — eviction, demotion and the write policies.
 *
 * One page at a time, always the same way (so a model can follow it):
 *
 *   evict one page from tier t:
 *     n = top of t's heap (an unpinned node with nothing below it in t,
 *         least recently / least often used); p = n's last page in t
 *     p has another copy          -> free p's slot in t
 *     p's only copy, tier u below -> make room for one page in u (the
 *                                    same rule, one level down), take a
 *                                    slot, mover.copy(t -> u), free t's
 *     no tier below, or u full    -> free t's slot: the page is gone
 *                                    (the tree keeps it, empty, only while
 *                                    pages below it remain)
 *
 *   hbm --demote--> fabric --demote--> dram --> ssd --> remote --> gone
 *
 * While one node stays on top of the heap its pages go tail first from a
 * cursor, so evicting a whole long edge costs O(pages), not O(pages^2):
 * pages after the cursor cannot regain a copy in t during an eviction
 * (eviction only adds copies below t).
 *
 * Copies go out through mover.copy as they are decided; mover.flush (if
 * any) runs once when the call ends, so an asynchronous mover waits once
 * per call. Slots freed here may be handed out again within the call;
 * nobody writes bytes into them before it returns.
 *
 * Write policies copy a page down *before* it is evicted: after an insert
 * or a touch, each page of the prefix whose only copy has a tier below it,
 * and whose hits reach copy_hits (1: write-through, N: selective), gets a
 * copy in the next tier, room made the same way. The caller pins the
 * prefix meanwhile, so making room never takes a page it is working on.
 */
#include "index/index_impl.h"

#include <errno.h>

uint64_t kvti_pool_free(kvt_index *x, int t)
{
	return kvt_pool_slots(x->pool[t]) - kvt_pool_used(x->pool[t]);
}

static int take_slot(kvt_index *x, int t, uint32_t *slot)
{
	return kvt_pool_alloc(x->pool[t], slot);
}

/* Copy page j of n (its only copy is in tier t) into tier u = t + 1.
 * Returns 1 if the copy is recorded. */
static int copy_page(kvt_index *x, struct knode *n, uint32_t j, int t,
		     int reason)
{
	int u = t + 1;
	uint32_t d, *s = nslot(x, n, j, 0);
	kvt_move mv;

	if (u >= x->nt ||
	    (n->ta->quota[u] && kvti_quota_room(x, n->ta, u, 1)) ||
	    kvti_make_room(x, u, 1) || take_slot(x, u, &d))
		return 0;
	if (x->mover.copy) {
		mv.src = (kvt_tier_kind)x->kind[t];
		mv.dst = (kvt_tier_kind)x->kind[u];
		mv.src_slot = s[t];
		mv.dst_slot = d;
		mv.reason = reason;
		x->issued = 1;
		if (x->mover.copy(x->mover.arg, &mv) < 0) {
			x->move_failed++;
			kvti_warn("index: moving a page %s -> %s failed",
				  kvt_tier_kind_name(mv.src),
				  kvt_tier_kind_name(mv.dst));
			kvt_pool_free(x->pool[u], d);
			return 0;
		}
	}
	s[u] = d;
	kvti_rev_set(x, u, d, n, j);
	kvti_set_mask(x, n, j, nmask(x, n)[j] | (uint8_t)(1u << u));
	kvti_res_delta(x, n, u, 1);
	return 1;
}

/* Page j of n gives up its copy in tier t (slot freed); a page left with
 * no copy is gone. */
static void leave_tier(kvt_index *x, struct knode *n, uint32_t j, int t)
{
	uint8_t m = nmask(x, n)[j] & (uint8_t)~(1u << t);
	uint32_t *s = nslot(x, n, j, t);

	kvti_set_mask(x, n, j, m);
	kvti_release(x, t, *s);
	*s = KVT_SLOT_NONE;
	x->evicted[t]++;
	n->ta->evicted[t]++;
	kvti_res_delta(x, n, t, -1);
	if (!m) {
		x->dropped++;
		kvti_prune(x, n);
	}
}

/* Evict page j of n from tier t, as the comment on top says. */
static void evict_page(kvt_index *x, struct knode *n, uint32_t j, int t)
{
	uint8_t bit = (uint8_t)(1u << t);

	if (nmask(x, n)[j] == bit && copy_page(x, n, j, t, KVT_MOVE_DEMOTE))
		x->demoted[t + 1]++;
	leave_tier(x, n, j, t);
}

/* The node to evict from next in tier t: the top of @only's heap, or
 * (@only NULL) the least valuable top among the tenants over their quota
 * in t, else among all tenants. NULL: nothing can go. */
static struct knode *evict_pick(kvt_index *x, int t, struct tacct *only)
{
	struct knode *best = NULL;
	int over = 0;

	if (x->nten == 1) /* the common case: one tenant */
		only = x->ten[0].root->ta;
	if (only)
		return only->hn[t] ? only->heap[t][0] : NULL;
	for (size_t i = 0; i < x->nten; i++) {
		struct tacct *ta = x->ten[i].root->ta;
		struct knode *n;
		int o;

		if (!ta->hn[t])
			continue;
		n = ta->heap[t][0];
		o = kvti_quota_over(ta, t);
		if (!best || o > over ||
		    (o == over && kvti_key_less(x, n, best))) {
			best = n;
			over = o;
		}
	}
	return best;
}

/* Evict up to @want pages from tier t, picked by evict_pick(). */
static uint64_t evict_loop(kvt_index *x, int t, struct tacct *only,
			   uint64_t want)
{
	struct knode *prev = NULL, *n;
	uint64_t done = 0;
	uint32_t cur = 0;

	while (done < want && (n = evict_pick(x, t, only))) {
		const uint8_t *mk = nmask(x, n);
		uint32_t j = n == prev ? cur : n->npages;

		while (j && !(mk[j - 1] & (1u << t)))
			j--;
		/* the heap holds only nodes with a page in t */
		if (KVT_UNLIKELY(!j))
			break;
		prev = n;
		cur = j - 1;
		if (only)
			only->qevicted[t]++;
		evict_page(x, n, j - 1, t);
		done++;
	}
	return done;
}

uint64_t kvti_evict_n(kvt_index *x, int t, uint64_t want)
{
	return evict_loop(x, t, NULL, want);
}

/* Evict up to @want of @ta's own pages from tier t (its quota). */
uint64_t kvti_evict_own(kvt_index *x, struct tacct *ta, int t, uint64_t want)
{
	return evict_loop(x, t, ta, want);
}

int kvti_make_room(kvt_index *x, int t, uint64_t n)
{
	uint64_t free = kvti_pool_free(x, t);

	if (free >= n)
		return 0;
	kvti_evict_n(x, t, n - free);
	return kvti_pool_free(x, t) >= n ? 0 : KVT_EFULL;
}

/* The write policy for page j of n: copy it down if its only copy has a
 * tier below and the node has been hit often enough. */
void kvti_copy_down(kvt_index *x, struct knode *n, uint32_t j)
{
	uint8_t m = nmask(x, n)[j];

	if (!x->copy_hits || n->hits < x->copy_hits || !mask_needs_copy(x, m))
		return;
	if (copy_page(x, n, j, __builtin_ctz(m), KVT_MOVE_COPY))
		x->copied[__builtin_ctz(m) + 1]++;
}

/* ---- entering and leaving index calls; watermarks --------------------- */

void kvti_enter(kvt_index *x)
{
	x->busy++;
}

/* The end of an index call: serve the watermark calls that waited, then
 * let the mover finish the copies issued. */
void kvti_leave(kvt_index *x)
{
	if (x->busy > 1) {
		x->busy--;
		return;
	}
	for (int t = 0; t < x->nt; t++) {
		uint64_t want = x->pending[t];
		x->pending[t] = 0;
		if (want)
			kvti_evict_n(x, t, want);
	}
	if (x->issued && x->mover.flush)
		x->mover.flush(x->mover.arg);
	x->issued = 0;
	x->busy--;
}

/* A pool asks for room (above its high watermark, or empty). Inside an
 * index call the request waits until the call is done. */
void kvti_wm_evict(kvt_pool *p, uint64_t want, void *arg)
{
	kvt_index *x = arg;
	int t;

	for (t = 0; t < x->nt && x->pool[t] != p; t++)
		;
	if (t == x->nt)
		return;
	if (x->busy) {
		if (want > x->pending[t])
			x->pending[t] = want;
		return;
	}
	kvti_enter(x);
	kvti_evict_n(x, t, want);
	kvti_leave(x);
}

/* ---- public ----------------------------------------------------------- */

int kvt_index_evict_pages(kvt_index *x, kvt_tier_kind tier, uint64_t pages,
			  uint64_t *freed)
{
	int t = (unsigned)tier < KVT_TIER_COUNT ? x->ti[tier] : -1;
	uint64_t done;

	kvti_errclear();
	if (freed)
		*freed = 0;
	if (t < 0)
		return kvti_fail(KVT_ENOTFOUND, "tier %d (%s) is not managed "
				 "by this index", (int)tier,
				 (unsigned)tier < KVT_TIER_COUNT ?
				 kvt_tier_kind_name(tier) : "?");
	kvti_enter(x);
	done = kvti_evict_n(x, t, pages);
	kvti_leave(x);
	if (freed)
		*freed = done;
	if (done < pages)
		return kvti_fail(KVT_EBUSY, "tier %s: freed %llu of %llu pages; "
				 "the rest are pinned, have pages below them, "
				 "or do not exist", kvt_tier_kind_name(tier),
				 (unsigned long long)done,
				 (unsigned long long)pages);
	return 0;
}

int kvt_index_evict(kvt_index *x, kvt_tier_kind tier, uint64_t bytes,
		    uint64_t *freed)
{
	int t = (unsigned)tier < KVT_TIER_COUNT ? x->ti[tier] : -1;
	uint64_t pages, done = 0;
	int err;

	if (t < 0) {
		if (freed)
			*freed = 0;
		return kvt_index_evict_pages(x, tier, 0, NULL);
	}
	pages = bytes / x->slot_bytes[t] + (bytes % x->slot_bytes[t] != 0);
	err = kvt_index_evict_pages(x, tier, pages, &done);
	if (freed)
		*freed = done * x->slot_bytes[t];
	return err;
}

int kvt_index_drop_copy(kvt_index *x, kvt_tier_kind tier, uint32_t slot)
{
	int t = (unsigned)tier < KVT_TIER_COUNT ? x->ti[tier] : -1;
	struct knode *n;
	uint32_t j;
	uint8_t m, bit;

	kvti_errclear();
	if (t < 0)
		return kvti_fail(KVT_ENOTFOUND, "drop copy: tier %d (%s) is "
				 "not managed by this index", (int)tier,
				 (unsigned)tier < KVT_TIER_COUNT ?
				 kvt_tier_kind_name(tier) : "?");
	if (!x->rev)
		return kvti_fail(-EINVAL, "drop copy: an index without a mover "
				 "keeps no slot -> page map");
	if (slot >= kvt_pool_slots(x->pool[t]) || !(n = x->rev->n[t][slot]))
		return kvti_fail(KVT_ENOTFOUND, "drop copy: %s slot %u holds no "
				 "page", kvt_tier_kind_name(tier), slot);
	j = x->rev->j[t][slot];
	bit = (uint8_t)(1u << t);
	m = nmask(x, n)[j] & (uint8_t)~bit;
	if (!m && n->pins)
		return kvti_fail(KVT_EBUSY, "drop copy: %s slot %u is the only "
				 "copy of a leased page", kvt_tier_kind_name(tier),
				 slot);
	kvti_enter(x);
	leave_tier(x, n, j, t);
	kvti_leave(x);
	return 0;
}
