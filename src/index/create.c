/*
 * create.c — the index's life: kvt_index_create() (the configuration
 * checked, the managed tiers in compact order, the reverse map of an index
 * with a mover, tenant 0, the pools' watermarks hooked), tenants added and
 * removed with their trees, kvt_index_destroy(), the counters and the
 * policies' names. The tree itself, its invariants and the locking rule
 * (none: one thread at a time) are in index.c's header comment.
 *
 * Removing a tenant frees its whole tree at once: no heap upkeep beyond
 * leaving the heaps, no eviction, every slot back to its pool; it fails
 * (KVT_EBUSY) while any of its pages is pinned, before changing anything.
 */
#include "index/index_impl.h"

#include <errno.h>
#include <string.h>

/* ---- tenants ---------------------------------------------------------- */

static int tenant_insert(kvt_index *x, uint32_t id, uint64_t salt)
{
	struct knode *root;
	size_t i;

	if (kvti_tenant(x, id))
		return kvti_fail(-EEXIST, "tenant %u already exists", id);
	if (x->nten == x->capten) {
		size_t cap = x->capten ? x->capten * 2 : 4;
		struct tenant *t = kvt_realloc(x->ten, cap * sizeof(*t));
		if (!t)
			return -ENOMEM;
		x->mem += (cap - x->capten) * sizeof(*t);
		x->ten = t;
		x->capten = cap;
	}
	root = kvti_node_new(x, 0);
	if (root && !(root->ta = kvti_tacct_new(x))) {
		kvti_node_free(x, root);
		root = NULL;
	}
	if (!root)
		return -ENOMEM;
	root->ta->root = root;
	root->is_root = 1;
	root->salt = salt;
	root->tenant = id;
	for (i = x->nten; i > 0 && x->ten[i - 1].id > id; i--)
		x->ten[i] = x->ten[i - 1];
	x->ten[i].id = id;
	x->ten[i].salt = salt;
	x->ten[i].root = root;
	x->nten++;
	return 0;
}

int kvt_index_tenant_add(kvt_index *x, uint32_t tenant, uint64_t salt)
{
	kvti_errclear();
	return tenant_insert(x, tenant, salt);
}

static struct knode *root_of(struct knode *n)
{
	while (n->parent)
		n = n->parent;
	return n;
}

/* Free every page's slots (no heap or count upkeep: the nodes are going). */
static void node_drop_slots(kvt_index *x, struct knode *n)
{
	const uint8_t *mk = nmask(x, n);

	for (uint32_t j = 0; j < n->npages; j++)
		for (int t = 0; t < x->nt; t++)
			if (mk[j] & (1u << t)) {
				kvti_release(x, t, *nslot(x, n, j, t));
				x->resident[t]--;
			}
}

int kvt_index_tenant_remove(kvt_index *x, uint32_t tenant)
{
	struct tenant *ten;
	struct knode **all, *root;
	size_t n = 0, pos;

	kvti_errclear();
	ten = kvti_tenant(x, tenant);
	if (!ten)
		return kvti_fail(KVT_ENOTFOUND, "tenant %u is not registered",
				 tenant);
	root = ten->root;
	all = kvt_malloc((x->tabcount + 1) * sizeof(*all));
	if (!all)
		return -ENOMEM;
	for (size_t i = 0; i < x->tabcap; i++) {
		struct knode *c = x->tab[i].n;
		if (!c || root_of(c) != root)
			continue;
		if (c->pins) {
			kvt_free(all);
			return kvti_fail(KVT_EBUSY, "tenant %u has pinned pages",
					 tenant);
		}
		all[n++] = c;
	}
	for (size_t i = 0; i < n; i++) {
		struct knode *c = all[i];
		for (int t = 0; t < x->nt; t++)
			if (c->hpos[t] != POS_NONE) {
				c->cnt[t] = 0;
				kvti_heap_fix(x, c, t);
			}
		node_drop_slots(x, c);
		kvti_tab_del(x, c);
	}
	for (size_t i = 0; i < n; i++) {
		struct knode *c = all[i];
		x->nodes--;
		x->pages -= c->npages;
		if (c->tstate)
			x->transient -= c->npages;
		kvti_node_free(x, c);
	}
	kvt_free(all);
	kvti_tacct_free(x, root->ta);
	kvti_node_free(x, root);
	pos = (size_t)(ten - x->ten);
	memmove(&x->ten[pos], &x->ten[pos + 1],
		(x->nten - pos - 1) * sizeof(*x->ten));
	x->nten--;
	return 0;
}

/* ---- creation --------------------------------------------------------- */

/* The slot -> page map (struct kvti_rev) for every managed tier. */
static int rev_alloc(kvt_index *x)
{
	if (!(x->rev = kvt_calloc(1, sizeof(*x->rev))))
		return -ENOMEM;
	x->mem += sizeof(*x->rev);
	for (int t = 0; t < x->nt; t++) {
		uint64_t n = kvt_pool_slots(x->pool[t]);

		x->rev->n[t] = kvt_calloc(n, sizeof(*x->rev->n[t]));
		x->rev->j[t] = kvt_malloc(n * sizeof(*x->rev->j[t]));
		if (!x->rev->n[t] || !x->rev->j[t])
			return -ENOMEM;
		x->mem += n * (sizeof(*x->rev->n[t]) + sizeof(*x->rev->j[t]));
	}
	return 0;
}

int kvt_index_create(kvt_index **out, const kvt_index_config *cfg)
{
	kvt_index *x;
	int err;

	kvti_errclear();
	if (!cfg || !out)
		return kvti_fail(-EINVAL, "no index config");
	if (cfg->page_tokens < 1 || cfg->page_tokens > 65536)
		return kvti_fail(-EINVAL, "index page_tokens %u (want 1..65536)",
				 cfg->page_tokens);
	if (cfg->key_mode != KVT_KEY_TOKENS && cfg->key_mode != KVT_KEY_HASH)
		return kvti_fail(-EINVAL, "index key_mode %d unknown",
				 cfg->key_mode);
	if (cfg->evict != KVT_EVICT_LRU && cfg->evict != KVT_EVICT_LFU)
		return kvti_fail(-EINVAL, "index eviction policy %d unknown",
				 cfg->evict);
	if (cfg->write < KVT_WRITE_BACK || cfg->write > KVT_WRITE_SELECTIVE)
		return kvti_fail(-EINVAL, "index write policy %d unknown",
				 cfg->write);
	if (cfg->high != 0 &&
	    !(cfg->low > 0 && cfg->low <= cfg->high && cfg->high <= 1))
		return kvti_fail(-EINVAL, "index watermarks need 0 < low <= "
				 "high <= 1 (got high %g, low %g)", cfg->high,
				 cfg->low);
	for (int a = 0; a < KVT_TIER_COUNT; a++)
		for (int b = a + 1; b < KVT_TIER_COUNT; b++)
			if (cfg->pools[a] && cfg->pools[a] == cfg->pools[b])
				return kvti_fail(-EINVAL, "index: tiers %s and %s "
						 "share one pool",
						 kvt_tier_kind_name((kvt_tier_kind)a),
						 kvt_tier_kind_name((kvt_tier_kind)b));
	x = kvt_calloc(1, sizeof(*x));
	if (!x)
		return -ENOMEM;
	x->mem = sizeof(*x);
	x->P = cfg->page_tokens;
	x->mode = cfg->key_mode;
	x->lfu = cfg->evict == KVT_EVICT_LFU;
	x->write = cfg->write;
	x->copy_hits = cfg->write == KVT_WRITE_THROUGH ? 1 :
		       cfg->write == KVT_WRITE_SELECTIVE ?
		       (cfg->selective_hits ? cfg->selective_hits : 2) : 0;
	x->ksize = x->mode == KVT_KEY_TOKENS ? 4u * x->P : sizeof(kvt_page_key);
	x->mover = cfg->mover;
	for (int k = 0; k < KVT_TIER_COUNT; k++) {
		x->ti[k] = -1;
		if (!cfg->pools[k])
			continue;
		kvt_pool_stat st;
		kvt_pool_stat_get(cfg->pools[k], &st);
		x->ti[k] = x->nt;
		x->kind[x->nt] = k;
		x->pool[x->nt] = cfg->pools[k];
		x->slot_bytes[x->nt] = st.slot_bytes;
		x->nt++;
	}
	if (!x->nt) {
		kvt_free(x);
		return kvti_fail(-EINVAL, "index with no tier pool");
	}
	/* an index that moves bytes can be told a copy went bad */
	if ((x->mover.copy || x->mover.release) &&
	    (err = rev_alloc(x))) {
		kvt_index_destroy(x);
		return err;
	}
	if ((err = kvti_reserve(x, 1)) || (err = tenant_insert(x, 0, 0))) {
		kvt_index_destroy(x);
		return err;
	}
	if (cfg->high > 0) {
		for (int t = 0; t < x->nt; t++)
			kvt_pool_set_watermarks(x->pool[t], cfg->high, cfg->low,
						kvti_wm_evict, x);
		x->hooked = 1;
	}
	*out = x;
	return 0;
}

void kvt_index_destroy(kvt_index *x)
{
	if (!x)
		return;
	if (x->hooked)
		for (int t = 0; t < x->nt; t++)
			kvt_pool_set_watermarks(x->pool[t], 1, 1, NULL, NULL);
	for (size_t i = 0; i < x->tabcap; i++)
		if (x->tab[i].n) {
			node_drop_slots(x, x->tab[i].n);
			kvti_node_free(x, x->tab[i].n);
		}
	for (size_t i = 0; i < x->nten; i++) {
		kvti_tacct_free(x, x->ten[i].root->ta);
		kvti_node_free(x, x->ten[i].root);
	}
	for (int t = 0; x->rev && t < KVT_TIER_COUNT; t++) {
		kvt_free(x->rev->n[t]);
		kvt_free(x->rev->j[t]);
	}
	kvt_free(x->rev);
	kvt_free(x->tab);
	kvt_free(x->ten);
	kvt_free(x);
}

void kvt_index_stat_get(kvt_index *x, kvt_index_stat *st)
{
	memset(st, 0, sizeof(*st));
	st->nodes = x->nodes;
	st->pages = x->pages;
	st->transient = x->transient;
	st->pinned = x->pinned;
	st->tenants = x->nten;
	st->mem_bytes = x->mem;
	st->matches = x->matches;
	st->inserts = x->inserts;
	st->dropped = x->dropped;
	st->move_failed = x->move_failed;
	st->splits = x->splits;
	for (int t = 0; t < x->nt; t++) {
		int k = x->kind[t];
		st->resident[k] = x->resident[t];
		st->evicted[k] = x->evicted[t];
		st->demoted[k] = x->demoted[t];
		st->copied[k] = x->copied[t];
	}
}

const char *kvt_evict_policy_name(int p)
{
	return p == KVT_EVICT_LRU ? "lru" : p == KVT_EVICT_LFU ? "lfu" : "?";
}

const char *kvt_write_policy_name(int p)
{
	static const char *const names[] = { "write-back", "write-through",
					     "selective" };
	return p >= 0 && p <= KVT_WRITE_SELECTIVE ? names[p] : "?";
}

const char *kvt_page_state_name(int s)
{
	static const char *const names[] = { "none", "empty", "resident",
					     "queued", "inflight" };
	return s >= 0 && s <= KVT_PAGE_INFLIGHT ? names[s] : "?";
}
