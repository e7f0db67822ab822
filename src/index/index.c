/*
 * index.c — the radix index: nodes, the child table, the eviction heaps,
 * splitting and pruning. The operations are in ops.c and mark.c, eviction
 * and the write policies in evict.c, the tenants' accounts in quota.c,
 * creation, tenants and counters in create.c, the invariant checker in
 * check.c.
 *
 * THE TREE (P = 4 tokens per page here; each [....] is one page)
 *
 * Every tenant has a root. An edge (a node) holds a run of whole pages;
 * a node's children differ in their first page, found through one child
 * table keyed by (parent id, fingerprint of the first page):
 *
 *   tenant 0 root
 *     |
 *     +-- A: [1 2 3 4][5 6 7 8]              (2 pages, one edge)
 *     |     +-- B: [9 9 9 9]
 *     |     +-- C: [7 7 7 7][0 0 0 0][1 1 1 1]
 *     +-- D: [4 4 4 4]
 *
 * Inserting [1 2 3 4][5 6 0 0] splits A after its first page into two
 * right-sized nodes (the head takes A's place; the tail keeps A's id, so
 * its children's table entries stay valid) and hangs the new page under
 * the head:
 *
 *   root
 *     +-- A': [1 2 3 4]
 *     |     +-- A: [5 6 7 8]
 *     |     |     +-- B ...  +-- C ...
 *     |     +-- E: [5 6 0 0]
 *     +-- D ...
 *
 * Edges are never merged back; an edge is split wherever a node-level
 * field would otherwise differ inside it: where a match that touches ends,
 * where a pin or a transient mark ends, where a mark starts.
 *
 * PER PAGE: the key, one slot per managed tier, a residency mask (bit i =
 * compact tier i, fastest first). PER NODE: pins, hits, last access and
 * access order, transient mark (state, ticket, ready time), and per tier:
 * cnt (its pages in the tier), sub (pages of its subtree in the tier) and
 * its place in that tier's eviction heap of its tenant (n->ta, quota.c: a
 * root's sub[i] is what its tenant holds in tier i).
 *
 * INVARIANTS (kvt_index_check() verifies all of them)
 *   - every non-root node is in the child table exactly once, under its
 *     parent's id and its first page's fingerprint; nchild counts them;
 *   - a node's edge holds 1..cap pages; a root holds none;
 *   - cnt[i] = pages with bit i; sub[i] = cnt[i] + sum of children's sub[i];
 *   - every set bit i holds a slot allocated in tier i's pool, each slot
 *     held by one page; pool occupancy = pages resident in the tier;
 *   - pins count the leases (pinned prefixes) covering a node; kpins is
 *     the sum of the children's pins and pins >= kpins (a lease covers
 *     every page above its end); a pinned page has a copy;
 *   - a node with no child and no pins ends in a page that is resident or
 *     transient (placeholders and empty pages never dangle);
 *   - a tenant's tier-i heap holds exactly its nodes with cnt[i] > 0,
 *     sub[i] == cnt[i] (nothing below in tier i) and no pins, ordered by
 *     (hits if LFU, access order, id): the top's last tier-i page is the
 *     tenant's page to evict next; the tier's next page is the least of
 *     the tenants' tops (those over their quota in tier i first). Access
 *     order follows the clock, which never goes back, so LRU by order is
 *     LRU by time;
 *   - every node points to its tenant's accounts (n->ta), whose node count
 *     is its tree's and whose heaps have room for all of them.
 *
 * LOCKING: none. One thread at a time (the caller serializes). Pool
 * watermark callbacks that arrive while an index call is running (busy)
 * are recorded in pending[] and served before the call returns.
 */
#include "index/index_impl.h"

#include <errno.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

/* ---- small pieces ----------------------------------------------------- */

#define mix64 kvti_mix64
#define tab_hash kvti_tab_hash

uint64_t kvti_fp(const kvt_index *x, uint64_t salt, const void *key)
{
	const kvt_page_key *pk;

	if (x->mode == KVT_KEY_TOKENS)
		return XXH3_64bits_withSeed(key, x->ksize, salt);
	pk = key;
	return mix64(pk->lo ^ mix64(pk->hi + salt));
}

void kvti_set_clock(kvt_index *x, uint64_t now)
{
	if (now > x->clock)
		x->clock = now;
}

struct tenant *kvti_tenant(kvt_index *x, uint32_t id)
{
	size_t lo = 0, hi = x->nten;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (x->ten[mid].id == id)
			return &x->ten[mid];
		if (x->ten[mid].id < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

void kvti_release(kvt_index *x, int t, uint32_t slot)
{
	if (x->rev)
		x->rev->n[t][slot] = NULL;
	kvt_pool_free(x->pool[t], slot);
	if (x->mover.release)
		x->mover.release(x->mover.arg, (kvt_tier_kind)x->kind[t], slot);
}

/* ---- prefixes --------------------------------------------------------- */

static kvt_page_key chain_key(uint64_t salt, const kvt_page_key *prev,
			      const uint32_t *tok, uint32_t P)
{
	unsigned char buf[16 + 4 * 256];
	XXH128_hash_t h;
	kvt_page_key k;

	if (P <= 256) { /* one shot over parent key || tokens */
		memcpy(buf, prev, 16);
		memcpy(buf + 16, tok, (size_t)P * 4);
		h = XXH3_128bits_withSeed(buf, 16 + (size_t)P * 4, salt);
	} else {
		XXH3_state_t st;
		memset(&st, 0, sizeof(st));
		XXH3_128bits_reset_withSeed(&st, salt);
		XXH3_128bits_update(&st, prev, sizeof(*prev));
		XXH3_128bits_update(&st, tok, (size_t)P * sizeof(*tok));
		h = XXH3_128bits_digest(&st);
	}
	k.lo = h.low64;
	k.hi = h.high64;
	return k;
}

int kvti_px_open(kvt_index *x, const kvt_prefix *px, int whole, struct pk *k)
{
	memset(k, 0, sizeof(*k));
	k->x = x;
	k->ci = SIZE_MAX;
	if (!px)
		return kvti_fail(-EINVAL, "no prefix given");
	k->ten = kvti_tenant(x, px->tenant);
	if (!k->ten)
		return kvti_fail(KVT_ENOTFOUND, "tenant %u is not registered",
				 px->tenant);
	if ((px->tokens && px->keys) || (px->ntokens && px->nkeys))
		return kvti_fail(-EINVAL, "prefix gives both tokens and page "
				 "keys; give one");
	if ((!px->tokens && px->ntokens) || (!px->keys && px->nkeys))
		return kvti_fail(-EINVAL, "prefix length %zu with a NULL array",
				 px->ntokens + px->nkeys);
	if (px->keys && x->mode == KVT_KEY_TOKENS)
		return kvti_fail(-EINVAL, "page keys given to an index keyed "
				 "by tokens");
	if (px->keys) {
		k->keys = px->keys;
		k->n = px->nkeys;
		k->ntokens = px->nkeys * x->P;
	} else {
		k->tok = px->tokens;
		k->n = px->ntokens / x->P;
		k->ntokens = px->ntokens;
		if (whole && px->ntokens % x->P)
			return kvti_fail(-EINVAL, "%zu tokens is not a whole "
					 "number of %u-token pages",
					 px->ntokens, x->P);
	}
	if (k->n > KVT_INDEX_MAX_PAGES)
		return kvti_fail(-E2BIG, "prefix of %zu pages (at most %u)",
				 k->n, KVT_INDEX_MAX_PAGES);
	if (whole && !k->n)
		return kvti_fail(-EINVAL, "empty prefix");
	return 0;
}

/* The key of prefix page i. Chained hashing computes keys in order; the
 * walks ask for i, i+1, ... and come back to i at most. */
const void *kvti_pk_key(struct pk *k, size_t i)
{
	kvt_index *x = k->x;
	kvt_page_key zero = { 0, 0 };

	if (x->mode == KVT_KEY_TOKENS)
		return k->tok + i * x->P;
	if (k->keys)
		return &k->keys[i];
	if (k->ci == SIZE_MAX || i < k->ci) {
		k->ck = chain_key(k->ten->salt, &zero, k->tok, x->P);
		k->ci = 0;
	}
	while (k->ci < i) {
		k->ci++;
		k->ck = chain_key(k->ten->salt, &k->ck,
				  k->tok + k->ci * x->P, x->P);
	}
	return &k->ck;
}

int kvt_index_hash_tokens(kvt_index *x, uint32_t tenant,
			  const uint32_t *tokens, size_t ntokens,
			  kvt_page_key *out)
{
	struct tenant *t = kvti_tenant(x, tenant);
	kvt_page_key prev = { 0, 0 };

	kvti_errclear();
	if (!t)
		return kvti_fail(KVT_ENOTFOUND, "tenant %u is not registered",
				 tenant);
	if ((!tokens && ntokens) || (!out && ntokens >= x->P))
		return kvti_fail(-EINVAL, "NULL tokens or output");
	for (size_t i = 0; i < ntokens / x->P; i++) {
		prev = chain_key(t->salt, &prev, tokens + i * x->P, x->P);
		out[i] = prev;
	}
	return 0;
}

/* ---- nodes ------------------------------------------------------------ */

static size_t node_bytes(const kvt_index *x, uint32_t cap)
{
	return sizeof(struct knode) +
	       (size_t)cap * (x->ksize + 4u * (uint32_t)x->nt + 1);
}

struct knode *kvti_node_new(kvt_index *x, uint32_t cap)
{
	struct knode *n = kvt_calloc(1, node_bytes(x, cap));

	if (!n)
		return NULL;
	n->id = ++x->next_id;
	n->cap = cap;
	for (int t = 0; t < KVT_TIER_COUNT; t++)
		n->hpos[t] = POS_NONE;
	memset(nslots(x, n), 0xff, (size_t)cap * x->nt * 4);
	x->mem += node_bytes(x, cap);
	return n;
}

void kvti_node_free(kvt_index *x, struct knode *n)
{
	if (!n)
		return;
	x->mem -= node_bytes(x, n->cap);
	kvt_free(n);
}

/* ---- the child table: open addressing, linear probing ----------------- */

static void tab_put_raw(struct tab_ent *tab, size_t cap, uint64_t h,
			struct knode *n)
{
	size_t i = h & (cap - 1);

	while (tab[i].n)
		i = (i + 1) & (cap - 1);
	tab[i].h = h;
	tab[i].n = n;
}

static int tab_grow(kvt_index *x, size_t want)
{
	size_t cap = x->tabcap ? x->tabcap : 64;
	struct tab_ent *nt;

	while (want * 2 > cap)
		cap *= 2;
	if (cap == x->tabcap)
		return 0;
	nt = kvt_calloc(cap, sizeof(*nt));
	if (!nt)
		return -ENOMEM;
	for (size_t i = 0; i < x->tabcap; i++)
		if (x->tab[i].n)
			tab_put_raw(nt, cap, x->tab[i].h, x->tab[i].n);
	x->mem += (cap - x->tabcap) * sizeof(*nt);
	kvt_free(x->tab);
	x->tab = nt;
	x->tabcap = cap;
	return 0;
}

/* Room for @nodes more nodes in the table and the heaps (of whichever
 * tenant gets them): the only allocations a change needs besides the
 * nodes themselves, taken before the change starts. */
int kvti_reserve(kvt_index *x, size_t nodes)
{
	int err = tab_grow(x, x->tabcount + nodes);

	for (size_t i = 0; !err && i < x->nten; i++)
		err = kvti_tacct_reserve(x, x->ten[i].root->ta, nodes);
	return err;
}

static struct tab_ent *tab_slot_of(kvt_index *x, struct knode *n)
{
	uint64_t h = tab_hash(n->parent->id, n->fp);
	size_t i = h & (x->tabcap - 1);

	while (x->tab[i].n && x->tab[i].n != n)
		i = (i + 1) & (x->tabcap - 1);
	return x->tab[i].n ? &x->tab[i] : NULL;
}

void kvti_tab_del(kvt_index *x, struct knode *n)
{
	size_t mask = x->tabcap - 1, i, j;
	struct tab_ent *e = tab_slot_of(x, n);

	if (!e)
		return;
	i = (size_t)(e - x->tab);
	x->tab[i].n = NULL;
	x->tabcount--;
	/* shift back the entries that probed past the hole */
	for (j = (i + 1) & mask; x->tab[j].n; j = (j + 1) & mask) {
		size_t home = x->tab[j].h & mask;
		if ((j > i && (home <= i || home > j)) ||
		    (j < i && (home <= i && home > j))) {
			x->tab[i] = x->tab[j];
			x->tab[j].n = NULL;
			i = j;
		}
	}
}

/* Hang @n (its fp set) under @parent. Table room reserved by the caller. */
void kvti_attach(kvt_index *x, struct knode *parent, struct knode *n)
{
	n->parent = parent;
	n->salt = parent->salt;
	n->ta = parent->ta;
	n->ta->nodes++;
	tab_put_raw(x->tab, x->tabcap, tab_hash(parent->id, n->fp), n);
	x->tabcount++;
	n->prev = NULL;
	n->next = parent->kid;
	if (parent->kid)
		parent->kid->prev = n;
	parent->kid = n;
	parent->nchild++;
	x->nodes++;
	x->pages += n->npages;
	for (int t = 0; t < x->nt; t++) {
		if (!n->sub[t])
			continue;
		for (struct knode *a = parent; a; a = a->parent) {
			a->sub[t] += n->sub[t];
			kvti_heap_fix(x, a, t);
		}
	}
	kvti_heap_fix_all(x, n);
}

/* Take a childless node out of the tree (its pages have no copies) and
 * free it. */
void kvti_detach(kvt_index *x, struct knode *n)
{
	for (int t = 0; t < x->nt; t++)
		if (n->hpos[t] != POS_NONE) {
			n->cnt[t] = 0; /* make heap_fix take it out */
			kvti_heap_fix(x, n, t);
		}
	kvti_tab_del(x, n);
	if (n->prev)
		n->prev->next = n->next;
	else
		n->parent->kid = n->next;
	if (n->next)
		n->next->prev = n->prev;
	n->parent->nchild--;
	n->ta->nodes--;
	x->nodes--;
	x->pages -= n->npages;
	if (n->tstate)
		x->transient -= n->npages;
	if (n->pins)
		x->pinned -= n->npages;
	kvti_node_free(x, n);
}

static int key_eq(const kvt_index *x, const void *a, const void *b)
{
	return !memcmp(a, b, x->ksize);
}

/* The child of @parent whose first page is prefix page @i. */
struct knode *kvti_child(kvt_index *x, struct knode *parent, struct pk *k,
			 size_t i)
{
	const void *key = kvti_pk_key(k, i);
	uint64_t fp = kvti_fp(x, parent->salt, key);
	uint64_t h = tab_hash(parent->id, fp);
	size_t m = x->tabcap - 1, s;

	if (!x->tabcap)
		return NULL;
	for (s = h & m; x->tab[s].n; s = (s + 1) & m) {
		struct knode *c = x->tab[s].n;
		if (x->tab[s].h == h && c->parent == parent && c->fp == fp &&
		    key_eq(x, nkey(x, c, 0), key))
			return c;
	}
	return NULL;
}

/* ---- walking ---------------------------------------------------------- */

void kvti_walk_init(struct pk *k, struct walker *w)
{
	w->n = k->ten->root;
	w->j = 0;
	w->i = 0;
}

/* Pages of @n from @j on that equal prefix pages from @i on (at most
 * @max). Contiguous keys compare as one block first. */
static uint32_t run_match(kvt_index *x, struct knode *n, uint32_t j,
			  struct pk *k, size_t i, uint32_t max)
{
	uint32_t m = 0;

	if (x->mode == KVT_KEY_TOKENS || k->keys) {
		const unsigned char *a = nkey(x, n, j);
		const unsigned char *b = kvti_pk_key(k, i);
		if (!memcmp(a, b, (size_t)max * x->ksize))
			return max;
		while (m < max && !memcmp(a + (size_t)m * x->ksize,
					  b + (size_t)m * x->ksize, x->ksize))
			m++;
		return m;
	}
	while (m < max && key_eq(x, nkey(x, n, j + m), kvti_pk_key(k, i + m)))
		m++;
	return m;
}

/* Step into the next edge along the prefix: returns how many of its pages
 * match (0: the walk is over), at most @limit - w->i. */
uint32_t kvti_walk_next(kvt_index *x, struct pk *k, struct walker *w,
			size_t limit)
{
	struct knode *c;
	uint32_t max;

	if (limit > k->n)
		limit = k->n;
	if (w->i >= limit || w->j < w->n->npages)
		return 0;
	c = kvti_child(x, w->n, k, w->i);
	if (!c)
		return 0;
	max = (uint32_t)KVT_MIN((size_t)c->npages, limit - w->i);
	w->n = c;
	w->j = max > 1 ? 1 + run_match(x, c, 1, k, w->i + 1, max - 1) : 1;
	w->i += w->j;
	return w->j;
}

/* ---- heaps: per tenant and tier, the evictable nodes, least valuable on
 * top (a node is in its own tenant's heaps, n->ta) --------------------- */

int kvti_key_less(const kvt_index *x, const struct knode *a,
		  const struct knode *b)
{
	if (x->lfu && a->hits != b->hits)
		return a->hits < b->hits;
	if (a->ord != b->ord)
		return a->ord < b->ord;
	return a->id < b->id;
}

static void heap_set(struct tacct *ta, int t, uint32_t i, struct knode *n)
{
	ta->heap[t][i] = n;
	n->hpos[t] = i;
}

static void heap_up(kvt_index *x, struct tacct *ta, int t, uint32_t i)
{
	struct knode *n = ta->heap[t][i];

	while (i) {
		uint32_t p = (i - 1) / 2;
		if (!kvti_key_less(x, n, ta->heap[t][p]))
			break;
		heap_set(ta, t, i, ta->heap[t][p]);
		i = p;
	}
	heap_set(ta, t, i, n);
}

static void heap_down(kvt_index *x, struct tacct *ta, int t, uint32_t i)
{
	struct knode *n = ta->heap[t][i];
	uint32_t len = ta->hn[t];

	for (;;) {
		uint32_t c = 2 * i + 1;
		if (c >= len)
			break;
		if (c + 1 < len && kvti_key_less(x, ta->heap[t][c + 1],
						 ta->heap[t][c]))
			c++;
		if (!kvti_key_less(x, ta->heap[t][c], n))
			break;
		heap_set(ta, t, i, ta->heap[t][c]);
		i = c;
	}
	heap_set(ta, t, i, n);
}

static void heap_remove(kvt_index *x, int t, struct knode *n)
{
	struct tacct *ta = n->ta;
	uint32_t i = n->hpos[t], last = --ta->hn[t];
	struct knode *m = ta->heap[t][last];

	n->hpos[t] = POS_NONE;
	if (i == last)
		return;
	heap_set(ta, t, i, m);
	heap_up(x, ta, t, i);
	heap_down(x, ta, t, m->hpos[t]);
}

/* Put @n in or out of its tenant's tier @t heap as its state says. The
 * heaps have room for every node (kvti_reserve). */
void kvti_heap_fix(kvt_index *x, struct knode *n, int t)
{
	int want = !n->is_root && !n->pins && n->cnt[t] &&
		   n->sub[t] == n->cnt[t];
	struct tacct *ta = n->ta;

	if (want && n->hpos[t] == POS_NONE) {
		n->hpos[t] = ta->hn[t]++;
		ta->heap[t][n->hpos[t]] = n;
		heap_up(x, ta, t, n->hpos[t]);
	} else if (!want && n->hpos[t] != POS_NONE) {
		heap_remove(x, t, n);
	}
}

void kvti_heap_fix_all(kvt_index *x, struct knode *n)
{
	for (int t = 0; t < x->nt; t++)
		kvti_heap_fix(x, n, t);
}

/* @n's key grew (touched): move it down where it is in a heap. */
void kvti_heap_rekey(kvt_index *x, struct knode *n)
{
	for (int t = 0; t < x->nt; t++)
		if (n->hpos[t] != POS_NONE) {
			heap_up(x, n->ta, t, n->hpos[t]);
			heap_down(x, n->ta, t, n->hpos[t]);
		}
}

/* ---- residency bookkeeping -------------------------------------------- */

void kvti_set_mask(kvt_index *x, struct knode *n, uint32_t j, uint8_t m)
{
	uint8_t *mk = &nmask(x, n)[j];

	n->nneed += mask_needs_copy(x, m) - mask_needs_copy(x, *mk);
	*mk = m;
}

/* @n has @d more (or fewer) pages in tier @t: counts up the tree, heaps. */
void kvti_res_delta(kvt_index *x, struct knode *n, int t, int d)
{
	n->cnt[t] += d;
	x->resident[t] += d;
	for (struct knode *a = n; a; a = a->parent) {
		a->sub[t] += d;
		kvti_heap_fix(x, a, t);
	}
}

void kvti_pin_delta(kvt_index *x, struct knode *n, int d)
{
	uint32_t was = n->pins;

	n->pins += d;
	if (n->parent)
		n->parent->kpins += d;
	if (!was != !n->pins) {
		x->pinned += n->pins ? n->npages : -(uint64_t)n->npages;
		kvti_heap_fix_all(x, n);
	}
}

void kvti_touch(kvt_index *x, struct knode *n)
{
	n->atime = x->clock;
	n->ord = ++x->tick;
	n->hits++;
	kvti_heap_rekey(x, n);
}

/* ---- splitting and pruning -------------------------------------------- */

static void count_pages(kvt_index *x, struct knode *n)
{
	const uint8_t *mk = nmask(x, n);

	memset(n->cnt, 0, sizeof(n->cnt));
	n->nneed = 0;
	for (uint32_t j = 0; j < n->npages; j++) {
		for (int t = 0; t < x->nt; t++)
			n->cnt[t] += (mk[j] >> t) & 1;
		n->nneed += mask_needs_copy(x, mk[j]);
	}
}

/* Copy pages [from, from + cnt) of @src into empty node @dst (their
 * slots now point at @dst in the reverse map). */
static void copy_pages(kvt_index *x, struct knode *dst, struct knode *src,
		       uint32_t from, uint32_t cnt)
{
	const uint8_t *mk;

	memcpy(nkeys(x, dst), nkey(x, src, from), (size_t)cnt * x->ksize);
	memcpy(nslots(x, dst), nslot(x, src, from, 0), (size_t)cnt * x->nt * 4);
	memcpy(nmask(x, dst), nmask(x, src) + from, cnt);
	dst->npages = cnt;
	mk = nmask(x, dst);
	for (uint32_t j = 0; x->rev && j < cnt; j++)
		for (int t = 0; t < x->nt; t++)
			if (mk[j] & (1u << t))
				kvti_rev_set(x, t, *nslot(x, dst, j, t), dst, j);
}

/*
 * Split @n before its page @j (0 < j < npages) into two right-sized nodes:
 * a head with pages [0, j) takes n's place under its parent, a tail with
 * the rest takes n's id and children and hangs under the head; n is
 * freed. Only the shape changes. Both nodes are allocated before anything
 * is touched: -ENOMEM leaves n as it was.
 */
int kvti_split(kvt_index *x, struct knode *n, uint32_t j, struct knode **head)
{
	uint32_t rest = n->npages - j;
	struct knode *h, *tl, *p = n->parent;
	struct tab_ent *e;
	int err;

	if ((err = kvti_reserve(x, 1)))
		return err;
	h = kvti_node_new(x, j);
	tl = h ? kvti_node_new(x, rest) : NULL;
	if (!tl) {
		kvti_node_free(x, h);
		return -ENOMEM;
	}
	/* the tail is n, moved: same id, fields, children, heap places */
	{
		uint32_t cap = tl->cap;
		memcpy(tl, n, sizeof(*n));
		tl->cap = cap;
	}
	copy_pages(x, tl, n, j, rest);
	copy_pages(x, h, n, 0, j);
	h->fp = n->fp;
	h->salt = n->salt;
	h->ta = n->ta;
	h->ta->nodes++;
	h->atime = n->atime;
	h->ord = n->ord;
	h->hits = n->hits;
	h->pins = n->pins;
	h->kpins = n->pins;
	h->tstate = n->tstate;
	h->ticket = n->ticket;
	h->ready = n->ready;
	count_pages(x, h);
	count_pages(x, tl);
	for (int t = 0; t < x->nt; t++) {
		h->sub[t] = n->sub[t];
		tl->sub[t] = n->sub[t] - h->cnt[t];
		if (n->hpos[t] != POS_NONE)
			n->ta->heap[t][n->hpos[t]] = tl;
	}
	/* the head takes n's table entry and sibling place */
	e = tab_slot_of(x, n);
	e->n = h;
	h->parent = p;
	h->prev = n->prev;
	h->next = n->next;
	if (h->prev)
		h->prev->next = h;
	else
		p->kid = h;
	if (h->next)
		h->next->prev = h;
	h->kid = tl;
	h->nchild = 1;
	/* the tail goes in under the head; n's children follow it */
	tl->parent = h;
	tl->prev = tl->next = NULL;
	for (struct knode *c = tl->kid; c; c = c->next)
		c->parent = tl;
	tl->fp = kvti_fp(x, tl->salt, nkey(x, tl, 0));
	tab_put_raw(x->tab, x->tabcap, tab_hash(h->id, tl->fp), tl);
	x->tabcount++;
	x->nodes++;
	x->splits++;
	x->mem -= node_bytes(x, n->cap);
	kvt_free(n);
	kvti_heap_fix_all(x, tl);
	kvti_heap_fix_all(x, h);
	*head = h;
	return 0;
}

/* Trim pages that no longer stand for anything off the end of childless,
 * unpinned nodes, removing nodes that empty, up the tree. */
void kvti_prune(kvt_index *x, struct knode *n)
{
	while (n && !n->is_root && !n->nchild && !n->pins) {
		struct knode *p = n->parent;
		const uint8_t *mk = nmask(x, n);
		uint32_t keep = n->npages;

		while (keep && page_empty(n, mk[keep - 1]))
			keep--;
		if (keep) {
			for (uint32_t j = keep; j < n->npages; j++)
				memset(nslot(x, n, j, 0), 0xff, 4u * x->nt);
			x->pages -= n->npages - keep;
			n->npages = keep;
			return;
		}
		kvti_detach(x, n);
		n = p;
	}
}
