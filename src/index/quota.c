/*
 * quota.c — per-tenant capacity quotas per tier: the tenant's own
 * eviction heaps and counters (struct tacct), the room a tenant may still
 * take in a tier, and the public calls.
 *
 * What a tenant uses in tier i is its root's sub[i]: the pages of its tree
 * with a copy in tier i, kept exact by every change that adds or drops a
 * copy (kvti_res_delta, attach), so insert, eviction, demotion (one page
 * leaves tier t and enters t + 1), write-policy copies (a page in two
 * tiers counts in both) and rollbacks need no bookkeeping of their own.
 *
 * Where a quota acts (each tenant's pages are always its own tree):
 *
 *   insert of T into tier t     quota room first: evict T's own pages in
 *                               t (its heap, by the policy) until
 *                               used + new <= quota; then the tier's room
 *                               (global, over-quota tenants first)
 *   copy of T's page into t     the same, one page (demotion, write
 *   (demotion, write policy)    policy): a cascade stays within T
 *   eviction for a full tier    tenants over their quota in t go first
 *   (insert, watermark, evict)  (evict_pick in evict.c)
 *   kvt_index_tenant_quota()    evicts T's pages down to the new limit
 */
#include "index/index_impl.h"

#include <errno.h>
#include <string.h>

struct tacct *kvti_tacct_new(kvt_index *x)
{
	struct tacct *ta = kvt_calloc(1, sizeof(*ta));

	if (ta)
		x->mem += sizeof(*ta);
	return ta;
}

void kvti_tacct_free(kvt_index *x, struct tacct *ta)
{
	if (!ta)
		return;
	for (int t = 0; t < KVT_TIER_COUNT; t++)
		kvt_free(ta->heap[t]);
	x->mem -= sizeof(*ta) + ta->hcap * sizeof(struct knode *) *
		  (size_t)x->nt;
	kvt_free(ta);
}

/* Heap room for @nodes more nodes of @ta (a node is in each tier's heap
 * at most once). */
int kvti_tacct_reserve(kvt_index *x, struct tacct *ta, uint64_t nodes)
{
	size_t cap = ta->hcap ? ta->hcap : 16;

	while (cap < ta->nodes + nodes)
		cap *= 2;
	if (cap == ta->hcap)
		return 0;
	for (int t = 0; t < x->nt; t++) {
		struct knode **h = kvt_realloc(ta->heap[t], cap * sizeof(*h));
		if (!h) {
			/* shrink nothing back; the smaller capacity holds */
			return -ENOMEM;
		}
		ta->heap[t] = h;
	}
	x->mem += (cap - ta->hcap) * sizeof(struct knode *) * (size_t)x->nt;
	ta->hcap = cap;
	return 0;
}

/* Pages @ta may still place in tier t (UINT64_MAX: no quota). */
uint64_t kvti_quota_free(const struct tacct *ta, int t)
{
	uint64_t used = kvti_quota_used(ta, t);

	if (!ta->quota[t])
		return UINT64_MAX;
	return used >= ta->quota[t] ? 0 : ta->quota[t] - used;
}

/* Make room under @ta's quota for @n more pages in tier t by evicting its
 * own pages there. 0 when they fit, KVT_EFULL when they do not (what could
 * go went). */
int kvti_quota_room(kvt_index *x, struct tacct *ta, int t, uint64_t n)
{
	uint64_t used = kvti_quota_used(ta, t);

	if (!ta->quota[t] || used + n <= ta->quota[t])
		return 0;
	kvti_evict_own(x, ta, t, used + n - ta->quota[t]);
	return kvti_quota_free(ta, t) >= n ? 0 : KVT_EFULL;
}

/* ---- public ----------------------------------------------------------- */

static int quota_args(kvt_index *x, uint32_t tenant, kvt_tier_kind tier,
		      struct tacct **ta, int *t)
{
	struct tenant *ten = kvti_tenant(x, tenant);

	*t = (unsigned)tier < KVT_TIER_COUNT ? x->ti[tier] : -1;
	if (!ten)
		return kvti_fail(KVT_ENOTFOUND, "tenant %u is not registered",
				 tenant);
	if (*t < 0)
		return kvti_fail(KVT_ENOTFOUND, "tier %d (%s) is not managed "
				 "by this index", (int)tier,
				 (unsigned)tier < KVT_TIER_COUNT ?
				 kvt_tier_kind_name(tier) : "?");
	*ta = ten->root->ta;
	return 0;
}

int kvt_index_tenant_quota(kvt_index *x, uint32_t tenant, kvt_tier_kind tier,
			   uint64_t max_pages)
{
	struct tacct *ta = NULL;
	int t = -1, err;

	kvti_errclear();
	if ((err = quota_args(x, tenant, tier, &ta, &t)))
		return err;
	ta->quota[t] = max_pages;
	if (kvti_quota_over(ta, t)) {
		kvti_enter(x);
		kvti_evict_own(x, ta, t, kvti_quota_used(ta, t) - max_pages);
		kvti_leave(x);
	}
	return 0;
}

int kvt_index_tenant_usage(kvt_index *x, uint32_t tenant,
			   kvt_tenant_usage *u)
{
	struct tenant *ten;

	kvti_errclear();
	if (!u)
		return kvti_fail(-EINVAL, "no kvt_tenant_usage to fill");
	ten = kvti_tenant(x, tenant);
	if (!ten)
		return kvti_fail(KVT_ENOTFOUND, "tenant %u is not registered",
				 tenant);
	memset(u, 0, sizeof(*u));
	for (int t = 0; t < x->nt; t++) {
		const struct tacct *ta = ten->root->ta;
		int k = x->kind[t];

		u->pages[k] = kvti_quota_used(ta, t);
		u->quota[k] = ta->quota[t];
		u->evicted[k] = ta->evicted[t];
		u->quota_evicted[k] = ta->qevicted[t];
	}
	return 0;
}
