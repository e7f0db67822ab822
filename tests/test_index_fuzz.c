/*
 * test_index_fuzz — differential fuzz of the radix index against a
 * trivially correct model: a flat table of pages, each knowing its parent
 * page, with every rule of include/kvtier/index.h applied page by page
 * (leaves first, LRU/LFU order, demotion, write policies, pins as nested
 * leases, transient marks, pruning, per-tenant quotas). Random inserts,
 * matches, pins, unpins, evictions, transient marks and (half the seeds
 * from 24 on) quota changes over many seeds, tier layouts and policies;
 * after every step the index must agree with the model on every page
 * (inspect), on the match results and counts, on each tenant's usage, and
 * pass kvt_index_check().
 *
 * Usage: test_index_fuzz [SEEDS [FIRST [STEPS]]] (default 96 1 300, plus
 * the regression seeds). Runs are short and numerous: small alphabets
 * (3 token values, 2 tokens per page) make prefixes share and diverge.
 */
#include "harness.h"

#define P 2
#define MAXPG 4096
#define MAXLEN 6

enum { T_HBM, T_DRAM, T_SSD };

struct mpage {
	int used;
	uint32_t tenant;
	int parent;          /* model page, -1 for the tenant root */
	uint32_t key[P];
	uint8_t mask;        /* bit = compact tier (0 fastest) */
	uint32_t pins, hits;
	uint64_t atime, seq;
	int tstate;
	uint64_t ticket, ready;
	int prot;            /* protected during the current call */
};

static struct model {
	struct mpage pg[MAXPG];
	int nt;
	uint64_t cap[3];
	int kind[3];
	int lfu;
	uint32_t copy_hits;
	uint64_t clock, seq;
	int top;             /* pages [top, MAXPG) were never used */
	uint64_t quota[2][3]; /* per tenant (0, 1) and tier; 0: none */
} M;

static kvt_index *X;
/* what the runs exercised, summed over seeds (checked at the end) */
static uint64_t n_evicted, n_demoted, n_copied, n_dropped, n_full, n_marks,
	n_splits, n_pinfail, n_partial, n_pinned_inserts, n_qevicted,
	n_quota_set, n_spilled, n_spill_low, n_drops;
/* the second pass: stores place by room (KVT_INSERT_SPILL) */
static int spill_mode;
static kvt_pool *pools[KVT_TIER_COUNT];

/* ---- model helpers ---------------------------------------------------- */

static int m_find(uint32_t tenant, int parent, const uint32_t *key)
{
	for (int i = 0; i < M.top; i++)
		if (M.pg[i].used && M.pg[i].tenant == tenant &&
		    M.pg[i].parent == parent &&
		    !memcmp(M.pg[i].key, key, sizeof(M.pg[i].key)))
			return i;
	return -1;
}

static int m_new(uint32_t tenant, int parent, const uint32_t *key)
{
	for (int i = 0; i < MAXPG; i++)
		if (!M.pg[i].used) {
			memset(&M.pg[i], 0, sizeof(M.pg[i]));
			M.pg[i].used = 1;
			M.pg[i].tenant = tenant;
			M.pg[i].parent = parent;
			memcpy(M.pg[i].key, key, sizeof(M.pg[i].key));
			M.pg[i].atime = M.clock;
			if (i >= M.top)
				M.top = i + 1;
			return i;
		}
	fprintf(stderr, "model full\n");
	exit(1);
}

/* Pages of the prefix that exist, in order; returns how many. */
static int m_path(uint32_t tenant, const uint32_t *tok, int np, int *out)
{
	int parent = -1, n = 0;

	for (int i = 0; i < np; i++) {
		int p = m_find(tenant, parent, tok + i * P);
		if (p < 0)
			break;
		out[n++] = parent = p;
	}
	return n;
}

static uint64_t m_used(int t)
{
	uint64_t n = 0;

	for (int i = 0; i < M.top; i++)
		n += M.pg[i].used && (M.pg[i].mask >> t & 1);
	return n;
}

static uint64_t m_used_by(uint32_t tenant, int t)
{
	uint64_t n = 0;

	for (int i = 0; i < M.top; i++)
		n += M.pg[i].used && M.pg[i].tenant == tenant &&
		     (M.pg[i].mask >> t & 1);
	return n;
}

static int m_over(uint32_t tenant, int t)
{
	return M.quota[tenant][t] && m_used_by(tenant, t) > M.quota[tenant][t];
}

static int m_has_desc_in(int p, int t)
{
	for (int i = 0; i < M.top; i++)
		if (M.pg[i].used && M.pg[i].parent == p &&
		    ((M.pg[i].mask >> t & 1) || m_has_desc_in(i, t)))
			return 1;
	return 0;
}

static int m_less(int a, int b)
{
	if (M.lfu && M.pg[a].hits != M.pg[b].hits)
		return M.pg[a].hits < M.pg[b].hits;
	return M.pg[a].seq < M.pg[b].seq;
}

static int m_empty(int i)
{
	return !M.pg[i].mask && !M.pg[i].tstate;
}

/* Remove empty pages with no pages below them, to a fixpoint. */
static void m_prune(void)
{
	int again = 1;

	while (again) {
		again = 0;
		for (int i = 0; i < M.top; i++) {
			int kids = 0;
			if (!M.pg[i].used || !m_empty(i) || M.pg[i].pins ||
			    M.pg[i].prot)
				continue;
			for (int j = 0; j < M.top; j++)
				kids += M.pg[j].used && M.pg[j].parent == i;
			if (!kids) {
				M.pg[i].used = 0;
				again = 1;
			}
		}
	}
}

static int m_make_room(int t, uint64_t n);
static int m_quota_room(uint32_t tenant, int t, uint64_t n);

/* Evict one page from tier t (@only >= 0: of that tenant; else pages of
 * tenants over their quota in t first); 0 if none can go. */
static int m_evict_one(int t, int only)
{
	int best = -1, bover = 0;
	uint8_t bit = (uint8_t)(1u << t);

	for (int i = 0; i < M.top; i++) {
		struct mpage *p = &M.pg[i];
		int over;
		if (!p->used || !(p->mask & bit) || p->pins || p->prot ||
		    (only >= 0 && p->tenant != (uint32_t)only) ||
		    m_has_desc_in(i, t))
			continue;
		over = only < 0 && m_over(p->tenant, t);
		if (best < 0 || over > bover || (over == bover &&
						 m_less(i, best))) {
			best = i;
			bover = over;
		}
	}
	if (best < 0)
		return 0;
	if (only >= 0)
		n_qevicted++;
	if (M.pg[best].mask == bit && t + 1 < M.nt &&
	    !m_quota_room(M.pg[best].tenant, t + 1, 1) &&
	    !m_make_room(t + 1, 1))
		M.pg[best].mask |= (uint8_t)(1u << (t + 1));
	M.pg[best].mask &= (uint8_t)~bit;
	if (!M.pg[best].mask)
		m_prune();
	return 1;
}

static int m_make_room(int t, uint64_t n)
{
	while (M.cap[t] - m_used(t) < n)
		if (!m_evict_one(t, -1))
			return -1;
	return 0;
}

/* Room for n more pages of @tenant in tier t under its quota: evict its
 * own pages. */
static int m_quota_room(uint32_t tenant, int t, uint64_t n)
{
	uint64_t q = M.quota[tenant][t];

	while (q && m_used_by(tenant, t) + n > q)
		if (!m_evict_one(t, (int)tenant))
			return -1;
	return 0;
}

static int single_below(uint8_t m)
{
	return m && !(m & (m - 1)) && m < (1u << (M.nt - 1));
}

static void m_policy(const int *path, int n)
{
	if (!M.copy_hits)
		return;
	for (int i = 0; i < n; i++) {
		struct mpage *p = &M.pg[path[i]];
		int f;
		if (p->hits < M.copy_hits || !single_below(p->mask))
			continue;
		f = __builtin_ctz(p->mask);
		if (!m_quota_room(p->tenant, f + 1, 1) && !m_make_room(f + 1, 1))
			p->mask |= (uint8_t)(1u << (f + 1));
	}
}

static void m_touch(int i)
{
	M.pg[i].hits++;
	M.pg[i].atime = M.clock;
	M.pg[i].seq = M.seq;
}

static void m_protect(const int *path, int n, int on)
{
	for (int i = 0; i < n; i++)
		M.pg[path[i]].prot = on;
}

/* An insert refused for want of room: the index said KVT_EFULL, nothing
 * was kept (the eviction it did stays). Returns 0. */
static int m_refused(const int *path, int have, int err)
{
	n_full++;
	m_protect(path, have, 0);
	m_prune();
	CHECK_ERR(err, KVT_EFULL);
	return 0;
}

/* The end of an insert: with KVT_INSERT_PIN its pin of the first @npin
 * pages stays as the caller's lease (the write policy waits for the
 * unpin), else the write policy over the first @npol pages; prune. */
static void m_insert_end(const int *path, int npin, int npol, unsigned flags)
{
	if (flags & KVT_INSERT_PIN) {
		for (int i = 0; i < npin; i++)
			M.pg[path[i]].pins++;
		n_pinned_inserts++;
	} else {
		m_protect(path, npol, 1);
		m_policy(path, npol);
		m_protect(path, npol, 0);
	}
	m_prune();
}

/* ---- operations, each on both sides ----------------------------------- */

static kvt_prefix pfx(uint32_t tenant, const uint32_t *tok, int np)
{
	kvt_prefix p = { .tenant = tenant, .tokens = tok,
			 .ntokens = (size_t)np * P };
	return p;
}

/* Returns 1 if the insert succeeded. */
static int op_insert(uint32_t tenant, const uint32_t *tok, int np, int t,
		     unsigned flags)
{
	int path[MAXLEN], have = m_path(tenant, tok, np, path), err;
	kvt_prefix px = pfx(tenant, tok, np);
	kvt_insert_result r;
	uint64_t miss = 0, free, q = M.quota[tenant][t], avail;
	int cut = np, partial = (flags & KVT_INSERT_PARTIAL) != 0;

	err = kvt_index_insert(X, &px, (kvt_tier_kind)M.kind[t], flags, M.clock,
			       &r, NULL, 0);
	M.seq++;
	for (int i = 0; i < have; i++)
		miss += !(M.pg[path[i]].mask >> t & 1);
	miss += (uint64_t)(np - have);
	m_protect(path, have, 1);
	/* the tenant's quota first (its own pages), then the tier's room;
	 * a whole insert larger than the quota fails at once */
	if (partial || miss <= q)
		m_quota_room(tenant, t, miss);
	avail = miss;
	if (q)
		avail = m_used_by(tenant, t) >= q ? 0 :
			q - m_used_by(tenant, t) < miss ?
			q - m_used_by(tenant, t) : miss;
	if (avail && (avail == miss || partial))
		m_make_room(t, avail);
	free = M.cap[t] - m_used(t) < avail ? M.cap[t] - m_used(t) : avail;
	if (free < miss) {
		uint64_t k = 0;
		for (int i = 0; i < np; i++) {
			int missing = i >= have || !(M.pg[path[i]].mask >> t & 1);
			if (missing && k++ == free) {
				cut = i;
				break;
			}
		}
		if (!(flags & KVT_INSERT_PARTIAL) || !cut)
			return m_refused(path, have, err);
	}
	CHECK_OK(err);
	n_partial += cut < np;
	for (int i = have; i < cut; i++)
		path[i] = m_new(tenant, i ? path[i - 1] : -1, tok + i * P);
	if (cut > have)
		have = cut;
	for (int i = 0; i < cut; i++)
		M.pg[path[i]].mask |= (uint8_t)(1u << t);
	for (int i = 0; i < have; i++) {
		m_touch(path[i]);
		if (t == 0 && i < cut && M.pg[path[i]].tstate) {
			M.pg[path[i]].tstate = 0;
			M.pg[path[i]].ticket = M.pg[path[i]].ready = 0;
		}
	}
	m_insert_end(path, np, have, flags);
	if (!err)
		CHECK_EQ(r.pages, cut);
	return !err;
}

/* KVT_INSERT_SPILL: each page with no copy from t down goes to the fastest
 * tier from t down with room, in prefix order; pages with a copy there
 * keep it; a copy in a faster tier neither counts nor moves. */
static int op_insert_spill(uint32_t tenant, const uint32_t *tok, int np,
			   int t, unsigned flags)
{
	int path[MAXLEN], have = m_path(tenant, tok, np, path), err;
	kvt_prefix px = pfx(tenant, tok, np);
	kvt_page_loc loc[MAXLEN];
	kvt_insert_result r;
	uint64_t miss = 0, placed = 0, got[3] = { 0 }, fresh = 0;
	int cut = np, partial = (flags & KVT_INSERT_PARTIAL) != 0, u;
	const uint8_t below = (uint8_t)(((1u << M.nt) - 1) & ~((1u << t) - 1));

	err = kvt_index_insert(X, &px, (kvt_tier_kind)M.kind[t], flags, M.clock,
			       &r, loc, MAXLEN);
	M.seq++;
	for (int i = 0; i < have; i++)
		miss += !(M.pg[path[i]].mask & below);
	miss += (uint64_t)(np - have);
	m_protect(path, have, 1);
	for (u = t; u < M.nt && placed < miss; u++) {
		uint64_t want = miss - placed, avail = want, q;

		m_quota_room(tenant, u, want);
		q = M.quota[tenant][u];
		if (q)
			avail = m_used_by(tenant, u) >= q ? 0 :
				q - m_used_by(tenant, u) < want ?
				q - m_used_by(tenant, u) : want;
		if (avail)
			m_make_room(u, avail);
		got[u] = M.cap[u] - m_used(u) < avail ? M.cap[u] - m_used(u) :
			 avail;
		placed += got[u];
	}
	if (placed < miss) {
		uint64_t k = 0;
		for (int i = 0; i < np; i++) {
			int missing = i >= have || !(M.pg[path[i]].mask & below);
			if (missing && k++ == placed) {
				cut = i;
				break;
			}
		}
		if (!partial || !cut)
			return m_refused(path, have, err);
	}
	CHECK_OK(err);
	if (err)
		return 0;
	n_partial += cut < np;
	n_spilled += cut;
	for (int i = have; i < cut; i++)
		path[i] = m_new(tenant, i ? path[i - 1] : -1, tok + i * P);
	u = t;
	for (int i = 0; i < cut; i++) {
		struct mpage *p = &M.pg[path[i]];
		int fr = !(p->mask & below);

		if (fr) {
			while (!got[u])
				u++;
			got[u]--;
			p->mask |= (uint8_t)(1u << u);
			fresh++;
			n_spill_low += u > t;
		}
		CHECK_EQ(loc[i].tier, M.kind[__builtin_ctz(p->mask & below)]);
		CHECK_EQ(loc[i].fresh, fr);
		m_touch(path[i]);
		if (t == 0 && p->tstate) { /* placed: the bytes are there */
			p->tstate = 0;
			p->ticket = p->ready = 0;
		}
	}
	m_protect(path, have > cut ? have : cut, 0);
	m_insert_end(path, cut, cut, flags);
	CHECK_EQ(r.pages, cut);
	CHECK_EQ(r.fresh, fresh);
	return (int)cut;
}

static void op_match(uint32_t tenant, const uint32_t *tok, int np, int touch)
{
	kvt_prefix px = pfx(tenant, tok, np);
	int path[MAXLEN], have = m_path(tenant, tok, np, path), n = 0;
	uint64_t tc[3] = { 0 }, q = 0, fl = 0, ticket = 0, ready = 0;
	kvt_page_loc loc[MAXLEN];
	kvt_match m;

	CHECK_OK(kvt_index_match(X, &px, touch ? KVT_MATCH_TOUCH : 0, M.clock,
				 &m, loc, MAXLEN));
	for (n = 0; n < have; n++) {
		struct mpage *p = &M.pg[path[n]];
		if (p->tstate && !(p->mask & 1)) {
			ticket = p->ticket;
			if (p->tstate == KVT_PAGE_INFLIGHT) {
				fl++;
				if (p->ready > ready)
					ready = p->ready;
			} else {
				q++;
			}
		} else if (p->mask) {
			tc[__builtin_ctz(p->mask)]++;
		} else {
			break;
		}
		if (p->mask)
			CHECK_EQ(loc[n].tier,
				 M.kind[__builtin_ctz(p->mask)]);
	}
	CHECK_EQ(m.pages, n);
	for (int t = 0; t < M.nt; t++)
		CHECK_EQ(m.tier_tokens[M.kind[t]], tc[t] * P);
	CHECK_EQ(m.queued_tokens, q * P);
	CHECK_EQ(m.inflight_tokens, fl * P);
	CHECK_EQ(m.ticket, ticket);
	CHECK_EQ(m.ready_ns, ready);
	CHECK_EQ(m.compute_tokens, (uint64_t)(np - n) * P);
	if (touch && n) {
		M.seq++;
		for (int i = 0; i < n; i++)
			m_touch(path[i]);
		m_protect(path, n, 1);
		m_policy(path, n);
		m_protect(path, n, 0);
	}
}

static int op_pin(uint32_t tenant, const uint32_t *tok, int np, int unpin)
{
	kvt_prefix px = pfx(tenant, tok, np);
	int path[MAXLEN], have = m_path(tenant, tok, np, path), ok = have == np;
	int err = unpin ? kvt_index_unpin(X, &px) : kvt_index_pin(X, &px);

	for (int i = 0; ok && i < np; i++)
		ok = unpin ? M.pg[path[i]].pins > 0 : M.pg[path[i]].mask != 0;
	if (ok && unpin) {
		uint32_t kp = 0;
		for (int j = 0; j < M.top; j++)
			if (M.pg[j].used && M.pg[j].parent == path[np - 1])
				kp += M.pg[j].pins;
		ok = M.pg[path[np - 1]].pins > kp;
	}
	if (!ok) {
		n_pinfail++;
		CHECK_ERR(err, unpin ? -EINVAL : KVT_ENOTFOUND);
		return 0;
	}
	CHECK_OK(err);
	if (unpin) { /* the write policy, while the pages are still held */
		m_protect(path, np, 1);
		m_policy(path, np);
		m_protect(path, np, 0);
	}
	for (int i = 0; i < np; i++)
		M.pg[path[i]].pins += unpin ? -1u : 1u;
	return 1;
}

static void op_evict(int t, uint64_t n)
{
	uint64_t freed = 0, done = 0;
	int err = kvt_index_evict_pages(X, (kvt_tier_kind)M.kind[t], n, &freed);

	while (done < n && m_evict_one(t, -1))
		done++;
	CHECK_EQ(freed, done);
	CHECK_ERR(err, done == n ? 0 : KVT_EBUSY);
}

/* The copy of a random page in a random tier turned out bad
 * (kvt_index_drop_copy(), spill seeds: their index has a mover). */
static void op_drop(uint64_t pick, int t)
{
	uint32_t tok[64 * P];
	int chain[64], d = 0, i, n = 0;
	kvt_page_info pi[64];
	size_t found;
	kvt_prefix px;
	struct mpage *p;
	int err;

	for (i = 0; i < M.top; i++)
		n += M.pg[i].used && (M.pg[i].mask >> t & 1);
	if (!n) {
		CHECK_ERR(kvt_index_drop_copy(X, (kvt_tier_kind)M.kind[t], 0),
			  KVT_ENOTFOUND);
		return;
	}
	pick %= (uint64_t)n;
	for (i = 0; i < M.top; i++)
		if (M.pg[i].used && (M.pg[i].mask >> t & 1) && !pick--)
			break;
	p = &M.pg[i];
	for (int j = i; j >= 0; j = M.pg[j].parent)
		chain[d++] = j;
	for (int k = 0; k < d; k++)
		memcpy(tok + k * P, M.pg[chain[d - 1 - k]].key, sizeof(p->key));
	px = pfx(p->tenant, tok, d);
	CHECK_OK(kvt_index_inspect(X, &px, pi, 64, &found));
	err = kvt_index_drop_copy(X, (kvt_tier_kind)M.kind[t],
				  pi[d - 1].slot[M.kind[t]]);
	if (p->mask == (1u << t) && p->pins) {
		CHECK_ERR(err, KVT_EBUSY);
		return;
	}
	CHECK_OK(err);
	p->mask &= (uint8_t)~(1u << t);
	n_drops++;
	m_prune();
}

static void drop_release(void *arg, kvt_tier_kind tier, uint32_t slot)
{
	(void)arg;
	(void)tier;
	(void)slot;
}

/* A new quota for @tenant in tier t: its excess leaves at once. */
static void op_quota(uint32_t tenant, int t, uint64_t q)
{
	CHECK_OK(kvt_index_tenant_quota(X, tenant, (kvt_tier_kind)M.kind[t],
					q));
	M.quota[tenant][t] = q;
	while (m_over(tenant, t) && m_evict_one(t, (int)tenant))
		;
	n_quota_set++;
}

enum { MQ, MS, MC };

static void op_mark(int op, uint32_t tenant, const uint32_t *tok, int np,
		    uint64_t ticket, uint64_t ready)
{
	kvt_prefix px = pfx(tenant, tok, np);
	int path[MAXLEN], have = m_path(tenant, tok, np, path);
	uint64_t got = 0, want = 0;
	int err;

	err = op == MQ ? kvt_index_queue(X, &px, ticket, M.clock, &got) :
	      op == MS ? kvt_index_start(X, &px, ticket, ready, M.clock, &got) :
			 kvt_index_cancel(X, &px, ticket, &got);
	CHECK_OK(err);
	if (op != MC)
		for (int i = have; i < np; i++)
			path[i] = m_new(tenant, i ? path[i - 1] : -1, tok + i * P);
	else
		np = have;
	for (int i = 0; i < np; i++) {
		struct mpage *p = &M.pg[path[i]];
		if (op == MC) {
			if (p->tstate && p->ticket == ticket) {
				p->tstate = 0;
				p->ticket = p->ready = 0;
				want++;
			}
			continue;
		}
		if (p->mask & 1)
			continue;
		if (op == MQ && p->tstate)
			continue;
		if (op == MS && p->tstate == KVT_PAGE_INFLIGHT &&
		    p->ticket != ticket)
			continue;
		p->tstate = op == MQ ? KVT_PAGE_QUEUED : KVT_PAGE_INFLIGHT;
		p->ticket = ticket;
		p->ready = op == MS ? ready : 0;
		want++;
	}
	CHECK_EQ(got, want);
	n_marks += want;
	m_prune();
}

/* ---- comparing everything --------------------------------------------- */

static void compare_all(void)
{
	uint64_t pages = 0, trans = 0, pinned = 0, res[3] = { 0 };
	kvt_index_stat st;

	for (int i = 0; i < M.top; i++) {
		struct mpage *p = &M.pg[i];
		uint32_t tok[64 * P];
		int chain[64], d = 0;
		kvt_page_info pi[64];
		kvt_prefix px;
		size_t found;
		uint32_t resident = 0;

		if (!p->used)
			continue;
		pages++;
		trans += p->tstate != 0;
		pinned += p->pins != 0;
		for (int t = 0; t < M.nt; t++)
			res[t] += p->mask >> t & 1;
		for (int j = i; j >= 0; j = M.pg[j].parent)
			chain[d++] = j;
		for (int k = 0; k < d; k++)
			memcpy(tok + k * P, M.pg[chain[d - 1 - k]].key,
			       sizeof(p->key));
		px = pfx(p->tenant, tok, d);
		CHECK_OK(kvt_index_inspect(X, &px, pi, 64, &found));
		CHECK_EQ(found, d);
		if (found != (size_t)d)
			continue;
		for (int t = 0; t < M.nt; t++)
			if (p->mask >> t & 1)
				resident |= 1u << M.kind[t];
		CHECK_EQ(pi[d - 1].resident, resident);
		CHECK_EQ(pi[d - 1].pins, p->pins);
		CHECK_EQ(pi[d - 1].hits, p->hits);
		CHECK_EQ(pi[d - 1].atime, p->atime);
		if (p->tstate && !(p->mask & 1)) {
			CHECK_EQ(pi[d - 1].state, p->tstate);
			CHECK_EQ(pi[d - 1].ticket, p->ticket);
			CHECK_EQ(pi[d - 1].ready_ns, p->ready);
		} else {
			CHECK_EQ(pi[d - 1].state, p->mask ? KVT_PAGE_RESIDENT :
				 KVT_PAGE_EMPTY);
		}
	}
	for (uint32_t tn = 0; tn < 2; tn++) {
		kvt_tenant_usage u;
		CHECK_OK(kvt_index_tenant_usage(X, tn, &u));
		for (int t = 0; t < M.nt; t++) {
			CHECK_EQ(u.pages[M.kind[t]], m_used_by(tn, t));
			CHECK_EQ(u.quota[M.kind[t]], M.quota[tn][t]);
		}
	}
	kvt_index_stat_get(X, &st);
	CHECK_EQ(st.pages, pages);
	CHECK_EQ(st.transient, trans);
	CHECK_EQ(st.pinned, pinned);
	for (int t = 0; t < M.nt; t++)
		CHECK_EQ(st.resident[M.kind[t]], res[t]);
	CHECK_OK(kvt_index_check(X));
}

/* ---- the run ---------------------------------------------------------- */

static void run(uint64_t seed, int steps)
{
	static const int layouts[4][3] = {
		{ KVT_TIER_HBM, -1, -1 },
		{ KVT_TIER_HBM, KVT_TIER_DRAM, -1 },
		{ KVT_TIER_HBM, KVT_TIER_DRAM, KVT_TIER_SSD },
		{ KVT_TIER_FABRIC, KVT_TIER_SSD, -1 },
	};
	kvt_index_config cfg = { .page_tokens = P };
	uint64_t r = seed * 0x9e3779b97f4a7c15ull + 1;
	const int *lay = layouts[seed % 4];
	int transients = seed % 2, failures = kvt_test_failures;
	int quotas = (seed / 24) % 2;
	uint32_t leases[64][MAXLEN * P + 2];
	int nleases = 0;

	memset(&M, 0, sizeof(M));
	memset(pools, 0, sizeof(pools));
	M.lfu = (seed / 2) % 2;
	cfg.evict = M.lfu ? KVT_EVICT_LFU : KVT_EVICT_LRU;
	cfg.write = (int)((seed / 4) % 3);
	cfg.selective_hits = 2;
	M.copy_hits = cfg.write == KVT_WRITE_THROUGH ? 1 :
		      cfg.write == KVT_WRITE_SELECTIVE ? 2 : 0;
	cfg.key_mode = (seed / 12) % 2;
	for (int t = 0; t < 3 && lay[t] >= 0; t++) {
		M.kind[t] = lay[t];
		M.cap[t] = 3 + test_rand(&r) % 5;
		M.nt++;
		CHECK_OK(kvt_pool_create(&pools[lay[t]], M.cap[t], 64));
		cfg.pools[lay[t]] = pools[lay[t]];
	}
	if (spill_mode) /* a mover: the slot -> page map, drop_copy */
		cfg.mover.release = drop_release;
	CHECK_OK(kvt_index_create(&X, &cfg));
	CHECK_OK(kvt_index_tenant_add(X, 1, 77));
	for (int t = 0; quotas && t < M.nt; t++)
		for (uint32_t tn = 0; tn < 2; tn++)
			if (test_rand(&r) % 2)
				op_quota(tn, t, 1 + test_rand(&r) % M.cap[t]);

	for (int s = 0; s < steps && kvt_test_failures == failures; s++) {
		uint32_t tok[MAXLEN * P], tenant = test_rand(&r) % 4 == 0;
		int np = 1 + (int)(test_rand(&r) % MAXLEN), op;
		uint64_t now = M.clock + test_rand(&r) % 3;

		if (test_rand(&r) % 16 == 0 && now > 2)
			now -= 2; /* time going back is clamped */
		if (now > M.clock)
			M.clock = now;
		for (int i = 0; i < np * P; i++)
			tok[i] = (uint32_t)(test_rand(&r) % 3);
		if (quotas) /* both tenants as busy: one's quota, the other's */
			tenant = test_rand(&r) % 2;
		if (quotas && test_rand(&r) % 8 == 0) {
			/* a new quota (0: none) for a tenant in a tier */
			int t = (int)(test_rand(&r) % (uint64_t)M.nt);
			op_quota(tenant, t, test_rand(&r) % (M.cap[t] + 1));
			compare_all();
		}
		op = (int)(test_rand(&r) % 12);
		switch (op) {
		case 0: case 1: case 2:
			{
				unsigned f = transients ? 2 :
					     (unsigned)(test_rand(&r) % 3);
				unsigned fl = f == 0 ? KVT_INSERT_PARTIAL :
					      f == 1 ? KVT_INSERT_PIN : 0;
				int ok;

				if (spill_mode) { /* PIN with PARTIAL too */
					fl |= KVT_INSERT_SPILL;
					if (f == 1 && test_rand(&r) % 2)
						fl |= KVT_INSERT_PARTIAL;
				}
				ok = spill_mode ? op_insert_spill(tenant, tok, np,
						  0, fl) : op_insert(tenant, tok,
						  np, 0, fl);
				if (spill_mode && ok && f == 1)
					np = ok; /* the lease is the kept part */
				if (ok && f == 1 && (quotas || spill_mode) &&
				    nleases < 64) {
					/* quotas: a pinned insert's lease
					 * ends like a pin's (case 7) */
					leases[nleases][0] = tenant;
					leases[nleases][1] = (uint32_t)np;
					memcpy(&leases[nleases][2], tok,
					       sizeof(uint32_t) * np * P);
					nleases++;
				}
			}
			break;
		case 3:
			if (spill_mode)
				op_insert_spill(tenant, tok, np, (int)(test_rand(
					&r) % (uint64_t)M.nt), KVT_INSERT_SPILL |
					KVT_INSERT_PARTIAL);
			else
				op_insert(tenant, tok, np, (int)(test_rand(&r) %
					  (uint64_t)M.nt), 0);
			break;
		case 4: case 5:
			op_match(tenant, tok, np, (int)(test_rand(&r) % 2));
			break;
		case 6:
			CHECK_ERR(kvt_index_unpin(X, &(kvt_prefix){ 0 }),
				  -EINVAL);
			if (op_pin(tenant, tok, np, 0) && nleases < 64) {
				leases[nleases][0] = tenant;
				leases[nleases][1] = (uint32_t)np;
				memcpy(&leases[nleases][2], tok,
				       sizeof(uint32_t) * np * P);
				nleases++;
				/* a quota lowered under pinned pages: the
				 * tenant stays over it until they unpin;
				 * then a touch (and its copies down) */
				if (quotas && test_rand(&r) % 2) {
					op_quota(tenant, (int)(test_rand(&r) %
					    (uint64_t)M.nt), 1);
					op_match(tenant, tok, np, 1);
				}
			}
			break;
		case 7:
			if (nleases && test_rand(&r) % 4) {
				uint32_t *l = leases[--nleases];
				op_pin(l[0], &l[2], (int)l[1], 1);
			} else {
				op_pin(tenant, tok, np, 1);
			}
			break;
		case 8:
			if (spill_mode && test_rand(&r) % 2)
				op_drop(test_rand(&r), (int)(test_rand(&r) %
					(uint64_t)M.nt));
			else
				op_evict((int)(test_rand(&r) % (uint64_t)M.nt),
					 1 + test_rand(&r) % 4);
			break;
		default:
			if (!transients) {
				op_match(tenant, tok, np, 1);
				break;
			}
			op_mark((int)(test_rand(&r) % 3), tenant, tok, np,
				1 + test_rand(&r) % 3, M.clock + test_rand(&r) % 50);
			break;
		}
		compare_all();
		if (kvt_test_failures != failures)
			fprintf(stderr, "seed %llu step %d (op %d): %s\n",
				(unsigned long long)seed, s, op, kvt_errdetail());
	}
	while (nleases) {
		uint32_t *l = leases[--nleases];
		op_pin(l[0], &l[2], (int)l[1], 1);
	}
	{
		kvt_index_stat st;
		kvt_index_stat_get(X, &st);
		for (int t = 0; t < KVT_TIER_COUNT; t++) {
			n_evicted += st.evicted[t];
			n_demoted += st.demoted[t];
			n_copied += st.copied[t];
		}
		n_dropped += st.dropped;
		n_splits += st.splits;
	}
	kvt_index_destroy(X);
	for (int t = 0; t < KVT_TIER_COUNT; t++) {
		if (pools[t])
			CHECK_EQ(kvt_pool_used(pools[t]), 0);
		kvt_pool_destroy(pools[t]);
	}
}

int main(int argc, char **argv)
{
	int seeds = argc > 1 ? atoi(argv[1]) : 96;
	int first = argc > 2 ? atoi(argv[2]) : 1; /* to rerun one seed */
	int steps = argc > 3 ? atoi(argv[3]) : 300;
	int64_t live = kvt_alloc_live();

	for (int s = first; s < first + seeds && !kvt_test_failures; s++)
		run((uint64_t)s, steps);
	/* regression: seed 290 found an insert refused with KVT_EFULL that
	 * left an emptied page of its own path unpruned */
	if (argc == 1)
		run(290, 300);
	/* again with inserts that place by room (the node cache's stores):
	 * SEEDS / 2 more seeds */
	spill_mode = 1;
	for (int s = first; s < first + seeds / 2 && !kvt_test_failures; s++)
		run((uint64_t)s + 1000, steps);
	spill_mode = 0;
	fprintf(stderr, "%d seeds: %llu evicted, %llu demoted, %llu copied "
		"down, %llu dropped, %llu splits, %llu inserts refused full, "
		"%llu partial, %llu pinned inserts, %llu pin/unpin refused, "
		"%llu pages marked, %llu quotas set, %llu pages evicted for "
		"their quota; by room: %llu pages kept, %llu placed below the "
		"insert's tier; %llu bad copies dropped\n",
		seeds, (unsigned long long)n_evicted,
		(unsigned long long)n_demoted, (unsigned long long)n_copied,
		(unsigned long long)n_dropped, (unsigned long long)n_splits,
		(unsigned long long)n_full, (unsigned long long)n_partial,
		(unsigned long long)n_pinned_inserts,
		(unsigned long long)n_pinfail, (unsigned long long)n_marks,
		(unsigned long long)n_quota_set,
		(unsigned long long)n_qevicted,
		(unsigned long long)n_spilled, (unsigned long long)n_spill_low,
		(unsigned long long)n_drops);
	/* the runs must have reached every path */
	if (seeds < 96)
		TEST_DONE();
	CHECK(n_evicted > 1000 && n_demoted > 100 && n_copied > 100);
	CHECK(n_dropped > 100 && n_splits > 100 && n_full > 10);
	CHECK(n_partial > 10 && n_pinfail > 10 && n_marks > 100);
	CHECK(n_pinned_inserts > 100);
	CHECK(n_quota_set > 100 && n_qevicted > 100);
	CHECK(n_spilled > 1000 && n_spill_low > 100 && n_drops > 100);
	CHECK_EQ(kvt_alloc_live(), live);
	TEST_DONE();
}
