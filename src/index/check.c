/*
 * check.c — kvt_index_check(): walk everything, verify every invariant
 * listed in index.c's header comment, name the first one broken.
 *
 * Nodes are gathered from the child table and the tenant roots into one
 * array sorted by address, so a node's parent is found by binary search;
 * per-node expected counts (children, subtree pages per tier) are summed
 * up each node's ancestor chain: O(nodes * depth), fine for tests.
 */
#include "index/index_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct chk {
	kvt_index *x;
	struct knode **all;
	size_t n;
	uint32_t *kids;
	uint64_t *kpins;
	uint64_t *sub;     /* [n][nt] */
	uint64_t *tnodes;  /* roots: nodes of the tenant's tree */
	uint8_t *seen[KVT_TIER_COUNT];
};

static int ptr_cmp(const void *a, const void *b)
{
	uintptr_t x = (uintptr_t)*(struct knode *const *)a;
	uintptr_t y = (uintptr_t)*(struct knode *const *)b;
	return x < y ? -1 : x > y;
}

static long find(struct chk *c, struct knode *n)
{
	struct knode **p = bsearch(&n, c->all, c->n, sizeof(*c->all), ptr_cmp);
	return p ? (long)(p - c->all) : -1;
}

#define BAD(...) kvti_fail(KVT_ECORRUPT, __VA_ARGS__)

static int check_table(struct chk *c)
{
	kvt_index *x = c->x;
	size_t m = x->tabcap - 1, count = 0;

	for (size_t i = 0; i < x->tabcap; i++) {
		struct knode *n = x->tab[i].n;
		size_t s;
		if (!n)
			continue;
		count++;
		if (!n->parent || n->is_root)
			return BAD("table slot %zu: node %llu has no parent", i,
				   (unsigned long long)n->id);
		if (x->tab[i].h != kvti_tab_hash(n->parent->id, n->fp))
			return BAD("node %llu: table hash is stale",
				   (unsigned long long)n->id);
		for (s = x->tab[i].h & m; s != i; s = (s + 1) & m)
			if (!x->tab[s].n)
				return BAD("node %llu: unreachable in the "
					   "table (hole before it)",
					   (unsigned long long)n->id);
		if (!n->npages || n->npages > n->cap)
			return BAD("node %llu: %u pages (cap %u)",
				   (unsigned long long)n->id, n->npages, n->cap);
		if (n->salt != n->parent->salt ||
		    n->fp != kvti_fp(x, n->salt, nkey(x, n, 0)))
			return BAD("node %llu: fingerprint does not match its "
				   "first page", (unsigned long long)n->id);
		/* no earlier sibling with the same first page */
		for (s = x->tab[i].h & m; s != i; s = (s + 1) & m) {
			struct knode *o = x->tab[s].n;
			if (o->parent == n->parent && o->fp == n->fp &&
			    !memcmp(nkey(x, o, 0), nkey(x, n, 0), x->ksize))
				return BAD("nodes %llu and %llu: same parent, "
					   "same first page",
					   (unsigned long long)o->id,
					   (unsigned long long)n->id);
		}
	}
	if (count != x->tabcount || count != x->nodes)
		return BAD("table holds %zu nodes, counted %zu, stat %llu",
			   count, x->tabcount, (unsigned long long)x->nodes);
	return 0;
}

static int gather(struct chk *c)
{
	kvt_index *x = c->x;
	size_t k = 0;

	c->n = x->tabcount + x->nten;
	c->all = kvt_calloc(c->n, sizeof(*c->all));
	c->kids = kvt_calloc(c->n, sizeof(*c->kids));
	c->kpins = kvt_calloc(c->n, sizeof(*c->kpins));
	c->sub = kvt_calloc(c->n * (size_t)x->nt, sizeof(*c->sub));
	c->tnodes = kvt_calloc(c->n, sizeof(*c->tnodes));
	if (!c->all || !c->kids || !c->kpins || !c->sub || !c->tnodes)
		return -ENOMEM;
	for (size_t i = 0; i < x->tabcap; i++)
		if (x->tab[i].n)
			c->all[k++] = x->tab[i].n;
	for (size_t i = 0; i < x->nten; i++) {
		struct knode *r = x->ten[i].root;
		if (!r->is_root || r->parent || r->npages ||
		    r->tenant != x->ten[i].id || r->salt != x->ten[i].salt ||
		    !r->ta || r->ta->root != r)
			return BAD("tenant %u: bad root", x->ten[i].id);
		if (i && x->ten[i - 1].id >= x->ten[i].id)
			return BAD("tenants out of order");
		c->all[k++] = r;
	}
	qsort(c->all, c->n, sizeof(*c->all), ptr_cmp);
	for (size_t i = 0; i < c->n; i++) {
		struct knode *n = c->all[i];
		long p;
		if (n->is_root)
			continue;
		p = find(c, n->parent);
		if (p < 0)
			return BAD("node %llu: parent is not in the tree",
				   (unsigned long long)n->id);
		c->kids[p]++;
		c->kpins[p] += n->pins;
		for (struct knode *a = n; a; a = a->parent) {
			long ai = find(c, a);
			if (ai < 0)
				return BAD("node %llu: ancestor outside the "
					   "tree", (unsigned long long)n->id);
			for (int t = 0; t < x->nt; t++)
				c->sub[(size_t)ai * x->nt + t] += n->cnt[t];
			if (a->is_root) {
				if (n->ta != a->ta)
					return BAD("node %llu: not in tenant "
						   "%u's accounts",
						   (unsigned long long)n->id,
						   a->tenant);
				c->tnodes[ai]++;
			}
		}
	}
	return 0;
}

static int check_pages(struct chk *c, struct knode *n, uint64_t *tot)
{
	kvt_index *x = c->x;
	const uint8_t *mk = nmask(x, n);
	uint32_t cnt[KVT_TIER_COUNT] = { 0 }, need = 0;

	for (uint32_t j = 0; j < n->npages; j++) {
		if (mk[j] >> x->nt)
			return BAD("node %llu page %u: mask %#x names an "
				   "absent tier", (unsigned long long)n->id, j,
				   mk[j]);
		if (n->pins && !mk[j])
			return BAD("node %llu page %u: pinned with no copy",
				   (unsigned long long)n->id, j);
		need += mask_needs_copy(x, mk[j]);
		for (int t = 0; t < x->nt; t++) {
			uint32_t s = *nslot(x, n, j, t);
			if (!(mk[j] & (1u << t))) {
				if (s != KVT_SLOT_NONE)
					return BAD("node %llu page %u: slot "
						   "%u in %s without a copy",
						   (unsigned long long)n->id, j,
						   s, kvt_tier_kind_name(
						   (kvt_tier_kind)x->kind[t]));
				continue;
			}
			cnt[t]++;
			if (s >= kvt_pool_slots(x->pool[t]) ||
			    !kvt_pool_is_used(x->pool[t], s))
				return BAD("node %llu page %u: %s slot %u is "
					   "not allocated in its pool",
					   (unsigned long long)n->id, j,
					   kvt_tier_kind_name(
					   (kvt_tier_kind)x->kind[t]), s);
			if (c->seen[t][s / 8] & (1u << (s % 8)))
				return BAD("%s slot %u held by two pages",
					   kvt_tier_kind_name(
					   (kvt_tier_kind)x->kind[t]), s);
			c->seen[t][s / 8] |= (uint8_t)(1u << (s % 8));
			if (x->rev && (x->rev->n[t][s] != n ||
				       x->rev->j[t][s] != j))
				return BAD("%s slot %u: the slot -> page map "
					   "names another page than node %llu "
					   "page %u",
					   kvt_tier_kind_name(
					   (kvt_tier_kind)x->kind[t]), s,
					   (unsigned long long)n->id, j);
		}
	}
	for (int t = 0; t < x->nt; t++) {
		if (cnt[t] != n->cnt[t])
			return BAD("node %llu: %u pages in tier %d, counted %u",
				   (unsigned long long)n->id, cnt[t], t,
				   n->cnt[t]);
		tot[t] += cnt[t];
	}
	if (need != n->nneed)
		return BAD("node %llu: %u single-copy pages, counted %u",
			   (unsigned long long)n->id, need, n->nneed);
	return 0;
}

static int check_node(struct chk *c, size_t i, uint64_t *tot,
		      uint64_t *pages, uint64_t *trans, uint64_t *pinned)
{
	kvt_index *x = c->x;
	struct knode *n = c->all[i];
	int err;

	if (c->kids[i] != n->nchild)
		return BAD("node %llu: %u children, counted %u",
			   (unsigned long long)n->id, c->kids[i], n->nchild);
	{
		uint32_t k = 0;
		for (struct knode *s = n->kid, *prev = NULL; s;
		     prev = s, s = s->next, k++)
			if (s->parent != n || s->prev != prev || k > n->nchild)
				return BAD("node %llu: child list broken at "
					   "%u", (unsigned long long)n->id, k);
		if (k != n->nchild)
			return BAD("node %llu: child list holds %u of %u",
				   (unsigned long long)n->id, k, n->nchild);
	}
	for (int t = 0; t < x->nt; t++) {
		int want;
		if (c->sub[i * x->nt + t] != n->sub[t])
			return BAD("node %llu: subtree holds %llu pages in "
				   "tier %d, counted %u",
				   (unsigned long long)n->id,
				   (unsigned long long)c->sub[i * x->nt + t],
				   t, n->sub[t]);
		want = !n->is_root && !n->pins && n->cnt[t] &&
		       n->sub[t] == n->cnt[t];
		if (want != (n->hpos[t] != POS_NONE))
			return BAD("node %llu: %s tier %d's eviction heap",
				   (unsigned long long)n->id,
				   want ? "missing from" : "wrongly in", t);
	}
	for (int t = x->nt; t < KVT_TIER_COUNT; t++)
		if (n->hpos[t] != POS_NONE || n->cnt[t] || n->sub[t])
			return BAD("node %llu: counts for an absent tier",
				   (unsigned long long)n->id);
	if (n->is_root)
		return n->nchild || !n->pins ? 0 : BAD("a root is pinned");
	if ((err = check_pages(c, n, tot)))
		return err;
	if (!n->parent->is_root && n->pins > n->parent->pins)
		return BAD("node %llu: %u pins, its parent only %u",
			   (unsigned long long)n->id, n->pins,
			   n->parent->pins);
	if (c->kpins[i] != n->kpins || n->kpins > n->pins)
		return BAD("node %llu: children hold %llu pins, counted %u, "
			   "own %u", (unsigned long long)n->id,
			   (unsigned long long)c->kpins[i], n->kpins, n->pins);
	if (n->tstate > KVT_PAGE_INFLIGHT ||
	    (n->tstate && n->tstate < KVT_PAGE_QUEUED) ||
	    (n->tstate && !n->ticket))
		return BAD("node %llu: bad transient mark %u (ticket %llu)",
			   (unsigned long long)n->id, n->tstate,
			   (unsigned long long)n->ticket);
	if (!n->nchild && !n->pins &&
	    page_empty(n, nmask(x, n)[n->npages - 1]))
		return BAD("node %llu: a leaf ending in an empty page",
			   (unsigned long long)n->id);
	if (n->ord > x->tick || n->atime > x->clock)
		return BAD("node %llu: accessed in the future",
			   (unsigned long long)n->id);
	*pages += n->npages;
	*trans += n->tstate ? n->npages : 0;
	*pinned += n->pins ? n->npages : 0;
	return 0;
}

static int check_heaps(kvt_index *x, struct tacct *ta, uint32_t id)
{
	for (int t = 0; t < x->nt; t++) {
		if (ta->hn[t] > ta->hcap || ta->hcap < ta->nodes)
			return BAD("tenant %u tier %d heap: %u nodes, room for "
				   "%zu, tenant has %llu", id, t, ta->hn[t],
				   ta->hcap, (unsigned long long)ta->nodes);
		for (uint32_t i = 0; i < ta->hn[t]; i++) {
			struct knode *n = ta->heap[t][i];
			if (n->ta != ta)
				return BAD("tenant %u tier %d heap: node %llu "
					   "of another tenant", id, t,
					   (unsigned long long)n->id);
			if (n->hpos[t] != i)
				return BAD("tenant %u tier %d heap: node %llu "
					   "thinks it is at %u, is at %u", id,
					   t, (unsigned long long)n->id,
					   n->hpos[t], i);
			if (i && kvti_key_less(x, n, ta->heap[t][(i - 1) / 2]))
				return BAD("tenant %u tier %d heap: out of %s "
					   "order at %u", id, t,
					   x->lfu ? "LFU" : "LRU", i);
		}
	}
	return 0;
}

/* Each tenant's node count and per-tier usage (its root's sub) against
 * the recount, then its heaps. */
static int check_tenants(struct chk *c)
{
	kvt_index *x = c->x;

	for (size_t i = 0; i < x->nten; i++) {
		struct knode *r = x->ten[i].root;
		long ri = find(c, r);
		int err;

		if (ri < 0)
			return BAD("tenant %u: root not gathered",
				   x->ten[i].id);
		if (c->tnodes[ri] != r->ta->nodes)
			return BAD("tenant %u: %llu nodes, counted %llu",
				   x->ten[i].id,
				   (unsigned long long)c->tnodes[ri],
				   (unsigned long long)r->ta->nodes);
		for (int t = 0; t < x->nt; t++)
			if (c->sub[(size_t)ri * x->nt + t] !=
			    kvti_quota_used(r->ta, t))
				return BAD("tenant %u: %llu pages in tier %s, "
					   "usage says %llu", x->ten[i].id,
					   (unsigned long long)
					   c->sub[(size_t)ri * x->nt + t],
					   kvt_tier_kind_name(
					   (kvt_tier_kind)x->kind[t]),
					   (unsigned long long)
					   kvti_quota_used(r->ta, t));
		if ((err = check_heaps(x, r->ta, x->ten[i].id)))
			return err;
	}
	return 0;
}

int kvt_index_check(kvt_index *x)
{
	uint64_t tot[KVT_TIER_COUNT] = { 0 }, pages = 0, trans = 0, pinned = 0;
	struct chk c = { .x = x };
	int err;

	kvti_errclear();
	if ((err = check_table(&c)) || (err = gather(&c)) ||
	    (err = check_tenants(&c)))
		goto out;
	for (int t = 0; t < x->nt; t++) {
		c.seen[t] = kvt_calloc(kvt_pool_slots(x->pool[t]) / 8 + 1, 1);
		if (!c.seen[t]) {
			err = -ENOMEM;
			goto out;
		}
	}
	for (size_t i = 0; i < c.n; i++)
		if ((err = check_node(&c, i, tot, &pages, &trans, &pinned)))
			goto out;
	if (pages != x->pages || trans != x->transient || pinned != x->pinned) {
		err = BAD("pages %llu/%llu, transient %llu/%llu, pinned "
			  "%llu/%llu (counted/stat)",
			  (unsigned long long)pages,
			  (unsigned long long)x->pages,
			  (unsigned long long)trans,
			  (unsigned long long)x->transient,
			  (unsigned long long)pinned,
			  (unsigned long long)x->pinned);
		goto out;
	}
	for (int t = 0; t < x->nt; t++)
		if (tot[t] != x->resident[t] ||
		    tot[t] != kvt_pool_used(x->pool[t])) {
			err = BAD("tier %s: %llu pages resident, stat %llu, "
				  "pool holds %llu",
				  kvt_tier_kind_name((kvt_tier_kind)x->kind[t]),
				  (unsigned long long)tot[t],
				  (unsigned long long)x->resident[t],
				  (unsigned long long)kvt_pool_used(x->pool[t]));
			goto out;
		}
out:
	for (int t = 0; t < KVT_TIER_COUNT; t++)
		kvt_free(c.seen[t]);
	kvt_free(c.all);
	kvt_free(c.kids);
	kvt_free(c.kpins);
	kvt_free(c.sub);
	kvt_free(c.tnodes);
	return err;
}
