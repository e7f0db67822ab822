/*
 * persist.c — the node cache's restart-safe ssd tier: a record per ssd
 * slot saying which page it holds, written when the page commits and
 * dropped before the slot is written again; at open, the index is rebuilt
 * from the records (cache.h, PERSISTENCE; docs/FORMATS.md).
 *
 *   ssd tier directory (ssd:DIR,SIZE,persist)
 *   kvtier-ssd-000.kvt ...   slot data (O_DIRECT), as without persist
 *   kvtier-ssd-index.kvt     4 KiB header + one record per slot, mapped
 *                            shared (kvt_tier_ssd_records())
 *
 * A RECORD (R = KVT_SSD_REC_BYTES(L) bytes; all little endian)
 *
 *   OFFSET  SIZE  DESCRIPTION
 *   0       4     magic "KVTR" (0 or anything else: no record)
 *   4       4     layers L
 *   8       8     generation: commit order over the directory's life (> 0)
 *   16      16    page key (lo, hi)
 *   32      16    parent page key (zero at depth 0)
 *   48      4     tenant
 *   52      4     depth: the page's index in its prefix (0: first page)
 *   56      8     the tenant's salt
 *   64      8     geometry fingerprint (the area's header has the same)
 *   72      4     slot: where this record belongs
 *   76      4     reserved (0)
 *   80      8*L   XXH3-64 of each layer of the page (the cache's sums)
 *   80+8L   8     XXH3-64 of bytes [0, 80+8L): the record's checksum
 *   ...           zero up to R
 *
 * ORDER, AND WHY A CRASH SERVES NOTHING WRONG
 *
 *   1. before the first byte of a write into a slot (the slot goes PEND),
 *      its record is zeroed;                                   kvtp_drop
 *   2. the bytes are written (store, demotion, copy) and verified;
 *   3. only then is the record written, with the page's layer sums;
 *                                                             kvtp_commit
 *   4. a slot that leaves the index (eviction, a failed check) loses its
 *      record at once.                                         kvtp_drop
 *
 * The records live in a shared mapping, so each step is a store into the
 * page cache: a killed process leaves every store it made, in order (the
 * kernel writes the pages back later). So after kill -9 a record exists
 * only for a slot whose bytes were all written and verified: pages whose
 * commit had not finished have no record and are absent. A torn record
 * (killed inside step 3) fails its checksum and is dropped.
 *
 * A machine crash or power loss may lose or reorder any of these writes
 * (no fsync per commit: a clean close msyncs the records and fdatasyncs
 * the data). That cannot make a page be served with wrong contents,
 * because a load verifies every layer against the record's sums: a record
 * whose data did not all reach the disk fails there, is counted
 * (kvt_cache_stat.corrupt), dropped and never served; the engine gets the
 * block on its failed list and computes it.
 *
 * REBUILD (kvtp_rebuild, at kvt_cache_open): read every record; drop
 * those whose magic, checksum, layer count, geometry fingerprint or slot
 * is wrong; of two records of one page (tenant, key) keep the newer; keep
 * a page only if its parent (tenant, parent key, depth - 1, same salt) is
 * kept, up to depth 0; re-create the tenants; hand each leaf's chain to
 * kvt_index_restore() oldest first (so LRU order survives); zero every
 * record not restored. Only the record area is read, never the data; the
 * time goes mostly to one table probe per record and per parent (about
 * 1.5 s for a million slots here: docs/PERFORMANCE.md). No per-slot
 * identity is loaded: nothing is copied out of ssd by the mover except
 * from a committed slot, whose record says what it holds
 * (kvtp_ident_copy), and a slot written again gets a new identity first.
 *
 * Locking: every hook runs with the cache's slot lock held (persist.h).
 * A hook is a store into the mapped area, not a system call; it can still
 * wait for the kernel under that lock when the area's page is not in
 * memory (read back after memory pressure; the rebuild has just read it
 * all) or when dirtying it meets writeback throttling.
 */
#include "cache/persist.h"
#include "xfer/xxh.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define REC_MAGIC 0x5254564bu /* "KVTR" */
#define REC_HEAD 80u

struct rec {
	uint32_t magic, layers;
	uint64_t gen;
	kvt_page_key key, parent;
	uint32_t tenant, depth;
	uint64_t salt, geom_fp;
	uint32_t slot, reserved;
	/* uint64_t sums[L]; uint64_t check; */
};

_Static_assert(sizeof(struct rec) == REC_HEAD, "record head is 80 bytes");

struct ptenant {
	uint32_t id;
	uint64_t salt;
	int restored;          /* re-created by the rebuild, not yet added */
	uint64_t gen;          /* rebuild: generation the salt came from */
};

struct kvtp {
	unsigned char *recs;   /* the tier's record area */
	uint32_t rb, L;
	uint64_t gfp, nslots;
	kvt_pool *pool;        /* the ssd tier's */
	unsigned char *scratch; /* rb bytes: a record being built */
	uint64_t gen;          /* the next commit's generation */
	struct kvtp_ident *id[KVT_TIER_COUNT];
	struct ptenant *ten;
	size_t nten, capten;
	kvt_cache_restore st;
};

static struct rec *rec_at(kvtp *p, uint32_t slot)
{
	return (struct rec *)(p->recs + (uint64_t)slot * p->rb);
}

static uint64_t rec_check(const kvtp *p, const struct rec *r)
{
	return XXH3_64bits(r, REC_HEAD + 8u * p->L);
}

/* ---- open, free, tenants ------------------------------------------------ */

int kvtp_open(kvtp **out, kvt_tier *ssd, kvt_tier *const *tiers, uint32_t L)
{
	void *recs;
	uint32_t rb;
	uint64_t gfp;
	kvtp *p;
	int err;

	if ((err = kvt_tier_ssd_records(ssd, &recs, &rb, &gfp)))
		return err;
	p = kvt_calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->recs = recs;
	p->rb = rb;
	p->L = L;
	p->gfp = gfp;
	p->gen = 1;
	p->scratch = kvt_malloc(rb);
	if (!p->scratch) {
		kvt_free(p);
		return -ENOMEM;
	}
	p->pool = kvt_tier_pool(ssd);
	p->nslots = kvt_pool_slots(p->pool);
	for (int t = 0; t < KVT_TIER_COUNT; t++) {
		if (!tiers[t])
			continue;
		p->id[t] = kvt_calloc(kvt_pool_slots(kvt_tier_pool(tiers[t])),
				      sizeof(struct kvtp_ident));
		if (!p->id[t]) {
			kvtp_free(p);
			return -ENOMEM;
		}
	}
	*out = p;
	return 0;
}

void kvtp_free(kvtp *p)
{
	if (!p)
		return;
	for (int t = 0; t < KVT_TIER_COUNT; t++)
		kvt_free(p->id[t]);
	kvt_free(p->ten);
	kvt_free(p->scratch);
	kvt_free(p);
}

static struct ptenant *tenant_find(kvtp *p, uint32_t id)
{
	for (size_t i = 0; i < p->nten; i++)
		if (p->ten[i].id == id)
			return &p->ten[i];
	return NULL;
}

static struct ptenant *tenant_put(kvtp *p, uint32_t id, uint64_t salt)
{
	struct ptenant *t = tenant_find(p, id);

	if (!t) {
		if (kvti_grow((void **)&p->ten, &p->capten, p->nten + 1,
			      sizeof(*p->ten), 8))
			return NULL;
		t = &p->ten[p->nten++];
		t->id = id;
	}
	t->salt = salt;
	t->restored = 0;
	return t;
}

uint64_t kvtp_salt(kvtp *p, uint32_t tenant)
{
	struct ptenant *t = tenant_find(p, tenant);

	return t ? t->salt : 0;
}

int kvtp_tenant_add(kvtp *p, uint32_t tenant, uint64_t salt, int *drop)
{
	struct ptenant *t = tenant_find(p, tenant);

	*drop = 0;
	if (!t || !t->restored)
		return 0;
	if (t->salt == salt) {
		t->restored = 0;
		return 1;
	}
	*drop = 1;
	return 0;
}

int kvtp_tenant_note(kvtp *p, uint32_t tenant, uint64_t salt)
{
	return tenant_put(p, tenant, salt) ? 0 : -ENOMEM;
}

/* ---- hooks (c->smu held) ----------------------------------------------- */

void kvtp_ident_set(kvtp *p, int t, uint32_t slot, uint32_t tenant,
		    const kvt_page_key *keys, size_t i)
{
	struct kvtp_ident *d = &p->id[t][slot];

	d->key = keys[i];
	if (i)
		d->parent = keys[i - 1];
	else
		memset(&d->parent, 0, sizeof(d->parent));
	d->tenant = tenant;
	d->depth = (uint32_t)i;
	d->salt = kvtp_salt(p, tenant);
}

void kvtp_ident_copy(kvtp *p, int st, uint32_t ss, int dt, uint32_t ds)
{
	const struct rec *r = rec_at(p, ss);

	if (st != KVT_TIER_SSD || r->magic != REC_MAGIC) {
		p->id[dt][ds] = p->id[st][ss];
		return;
	}
	/* a committed ssd page: its record says what it is (the rebuild
	 * loads no identities, only the records) */
	p->id[dt][ds] = (struct kvtp_ident){
		.key = r->key, .parent = r->parent, .salt = r->salt,
		.tenant = r->tenant, .depth = r->depth };
}

void kvtp_drop(kvtp *p, uint32_t slot)
{
	struct rec *r = rec_at(p, slot);

	if (r->magic) /* most slots have none: keep their pages clean */
		memset(r, 0, p->rb);
}

void kvtp_commit(kvtp *p, uint32_t slot, const uint64_t *sums)
{
	const struct kvtp_ident *d = &p->id[KVT_TIER_SSD][slot];
	unsigned char *buf = p->scratch;
	struct rec *r = (struct rec *)buf;
	uint64_t check;

	/* built aside, then copied in one go: a kill inside the copy leaves
	 * a record whose checksum fails */
	memset(buf, 0, p->rb);
	r->magic = REC_MAGIC;
	r->layers = p->L;
	r->gen = p->gen++;
	r->key = d->key;
	r->parent = d->parent;
	r->tenant = d->tenant;
	r->depth = d->depth;
	r->salt = d->salt;
	r->geom_fp = p->gfp;
	r->slot = slot;
	memcpy(buf + REC_HEAD, sums, 8u * p->L);
	check = rec_check(p, r);
	memcpy(buf + REC_HEAD + 8u * p->L, &check, 8);
	memcpy(rec_at(p, slot), buf, p->rb);
}

/* ---- rebuild ------------------------------------------------------------- */

enum { R_NONE = 0, R_VALID, R_GOOD, R_BAD };

/* A page in the rebuild's table: the key inline, so a probe reads no
 * record (they are spread over the whole area: a cache miss each). */
struct tent {
	kvt_page_key key;
	uint32_t tenant;
	uint32_t slot1;     /* slot + 1; 0: empty */
};

struct rb {
	kvtp *p;
	uint8_t *st;        /* per slot: R_* */
	uint32_t *par;      /* per slot: the parent's slot (R_GOOD, depth > 0) */
	uint8_t *kid;       /* per slot: has a R_GOOD child */
	struct tent *tab;   /* (tenant, key) -> slot */
	size_t mask;
	uint32_t *stack;
	size_t cap;
};

/* A zeroed array for the rebuild. Large ones are asked to live on huge
 * pages: the table is probed at random over tens of MiB, and in a VM each
 * 4 KiB TLB miss costs a two-level page walk (a third of the rebuild's
 * time for a million slots without this). Free with kvt_free(). */
static void *rb_zalloc(size_t n)
{
	size_t huge = 2u << 20;
	void *q;

	if (n < 2 * huge)
		return kvt_calloc(1, n);
	n = (n + huge - 1) & ~(huge - 1);
	q = kvti_aligned_alloc(huge, n);
	if (!q)
		return NULL;
	madvise(q, n, MADV_HUGEPAGE); /* advice: fine if refused */
	memset(q, 0, n);
	return q;
}

static uint64_t key_hash(uint32_t tenant, const kvt_page_key *k)
{
	uint64_t h = k->lo ^ (k->hi * 0x9e3779b97f4a7c15ull) ^
		     ((uint64_t)tenant << 17);

	h ^= h >> 31;
	h *= 0xbf58476d1ce4e5b9ull;
	return h ^ (h >> 29);
}

static int rec_valid(kvtp *p, struct rec *r, uint32_t slot)
{
	uint64_t check;

	memcpy(&check, (unsigned char *)r + REC_HEAD + 8u * p->L, 8);
	return r->layers == p->L && r->geom_fp == p->gfp && r->slot == slot &&
	       r->gen && check == rec_check(p, r);
}

static int tent_is(const struct tent *e, uint32_t tenant,
		   const kvt_page_key *k)
{
	return e->tenant == tenant && e->key.lo == k->lo && e->key.hi == k->hi;
}

/* The slot holding (tenant, key), or UINT32_MAX. */
static uint32_t tab_get(struct rb *b, uint32_t tenant, const kvt_page_key *k)
{
	for (size_t i = key_hash(tenant, k) & b->mask; b->tab[i].slot1;
	     i = (i + 1) & b->mask)
		if (tent_is(&b->tab[i], tenant, k))
			return b->tab[i].slot1 - 1;
	return UINT32_MAX;
}

/* Enter a valid record; of two for one page the newer stays. */
static void tab_put(struct rb *b, uint32_t slot)
{
	struct rec *r = rec_at(b->p, slot);
	size_t i;

	for (i = key_hash(r->tenant, &r->key) & b->mask; b->tab[i].slot1;
	     i = (i + 1) & b->mask) {
		uint32_t old = b->tab[i].slot1 - 1, loser;

		if (!tent_is(&b->tab[i], r->tenant, &r->key))
			continue;
		loser = rec_at(b->p, old)->gen < r->gen ? old : slot;
		if (loser != slot)
			b->tab[i].slot1 = slot + 1;
		b->st[loser] = R_BAD;
		b->p->st.duplicates++;
		return;
	}
	b->tab[i].key = r->key;
	b->tab[i].tenant = r->tenant;
	b->tab[i].slot1 = slot + 1;
}

/* Settle slot @s and the chain above it: R_GOOD if every parent up to
 * depth 0 is there, with the depth and salt it should have. */
static int chain_resolve(struct rb *b, uint32_t s)
{
	size_t n = 0;
	uint8_t verdict;

	while (b->st[s] == R_VALID) {
		struct rec *r = rec_at(b->p, s);
		uint32_t ps;

		if (kvti_grow((void **)&b->stack, &b->cap, n + 1,
			      sizeof(*b->stack), 64))
			return -ENOMEM;
		b->stack[n++] = s;
		if (!r->depth) {
			verdict = R_GOOD;
			goto settle;
		}
		ps = tab_get(b, r->tenant, &r->parent);
		if (ps == UINT32_MAX || rec_at(b->p, ps)->depth + 1 != r->depth ||
		    rec_at(b->p, ps)->salt != r->salt) {
			verdict = R_BAD;
			goto settle;
		}
		b->par[s] = ps;
		s = ps;
	}
	verdict = b->st[s] == R_GOOD ? R_GOOD : R_BAD;
settle:
	while (n--) {
		uint32_t c = b->stack[n];

		b->st[c] = verdict;
		if (verdict == R_BAD)
			b->p->st.orphans++;
		else if (rec_at(b->p, c)->depth)
			b->kid[b->par[c]] = 1;
	}
	return 0;
}

static int cmp_gen(const void *a, const void *b, void *arg)
{
	kvtp *p = arg;
	uint64_t x = rec_at(p, *(const uint32_t *)a)->gen;
	uint64_t y = rec_at(p, *(const uint32_t *)b)->gen;

	return x < y ? -1 : x > y;
}

/* A tenant's salt is that of its newest record; records with another
 * salt are dropped (a tenant re-added with a new salt, pages of both). */
static int tenants_make(struct rb *b, kvt_index *idx)
{
	kvtp *p = b->p;

	for (uint64_t s = 0; s < p->nslots; s++) {
		struct rec *r = rec_at(p, (uint32_t)s);
		struct ptenant *t;

		if (b->st[s] != R_GOOD)
			continue;
		t = tenant_find(p, r->tenant);
		if (!t && !(t = tenant_put(p, r->tenant, r->salt)))
			return -ENOMEM;
		if (r->gen >= t->gen) {
			t->salt = r->salt;
			t->gen = r->gen;
		}
	}
	for (size_t i = 0; i < p->nten; i++) {
		struct ptenant *t = &p->ten[i];
		int err = 0;

		t->restored = 1;
		if (t->id || t->salt)
			err = kvt_index_tenant_add(idx, t->id, t->salt);
		if (err == -EEXIST) /* tenant 0 with another salt */
			t->salt = 0;
		else if (err)
			return err;
		else
			p->st.tenants += t->id != 0;
	}
	for (uint64_t s = 0; s < p->nslots; s++) {
		struct rec *r = rec_at(p, (uint32_t)s);

		if (b->st[s] == R_GOOD &&
		    r->salt != tenant_find(p, r->tenant)->salt) {
			b->st[s] = R_BAD;
			p->st.orphans++;
		}
	}
	return 0;
}

/* Restore the chain that ends at leaf @s (root side first). Out of memory
 * fails the rebuild (the records stay for the next open); a refusal of
 * the index drops the chain (counted, logged). */
static int chain_restore(struct rb *b, kvt_index *idx, uint32_t s,
			  kvt_page_key **keys, uint32_t **slots, size_t *cap)
{
	kvtp *p = b->p;
	struct rec *r = rec_at(p, s);
	size_t n = (size_t)r->depth + 1;
	uint64_t added = 0;
	kvt_prefix px = { .tenant = r->tenant };
	int err;

	if (n > *cap) {
		kvt_page_key *k = kvt_realloc(*keys, n * sizeof(**keys));
		uint32_t *sl = k ? kvt_realloc(*slots, n * sizeof(**slots)) :
				   NULL;

		if (k)
			*keys = k;
		if (!sl)
			return -ENOMEM;
		*slots = sl;
		*cap = n;
	}
	for (size_t i = n; i--;) {
		(*keys)[i] = rec_at(p, s)->key;
		(*slots)[i] = s;
		s = b->par[s];
	}
	px.keys = *keys;
	px.nkeys = n;
	err = kvt_index_restore(idx, &px, KVT_TIER_SSD, *slots, kvt_now_ns(),
				&added);
	if (err == -ENOMEM)
		return err;
	if (err) {
		kvti_warn("cache: restoring a chain of %zu ssd pages failed: %s",
			  n, kvt_errdetail());
		p->st.failed += n;
	}
	return 0;
}

int kvtp_rebuild(kvtp *p, kvt_index *idx, uint64_t *sums, uint8_t *state,
		 uint8_t ok)
{
	uint64_t t0 = kvt_now_ns(), maxgen = 0, nvalid = 0, nleaf = 0;
	kvt_page_key *keys = NULL;
	uint32_t *slots = NULL, *leaves = NULL;
	size_t kcap = 0, tcap = 16;
	struct rb b = { .p = p };
	int err = -ENOMEM;

	memset(&p->st, 0, sizeof(p->st));
	b.st = rb_zalloc(p->nslots);
	b.par = rb_zalloc(p->nslots * sizeof(*b.par));
	b.kid = rb_zalloc(p->nslots);
	if (!b.st || !b.par || !b.kid)
		goto out;

	/* 1. read every record */
	for (uint64_t s = 0; s < p->nslots; s++) {
		struct rec *r = rec_at(p, (uint32_t)s);

		if (!r->magic)
			continue;
		if (r->magic == REC_MAGIC && rec_valid(p, r, (uint32_t)s)) {
			b.st[s] = R_VALID;
			nvalid++;
			maxgen = KVT_MAX(maxgen, r->gen);
		} else {
			p->st.bad_records++;
			memset(r, 0, p->rb);
		}
	}
	p->st.records = nvalid;
	p->st.scan_s = (double)(kvt_now_ns() - t0) / 1e9;
	p->gen = maxgen + 1;

	/* 2. one record per page, chains whole up to depth 0 */
	while (tcap < 2 * nvalid)
		tcap *= 2;
	b.tab = rb_zalloc(tcap * sizeof(*b.tab));
	if (!b.tab)
		goto out;
	b.mask = tcap - 1;
	for (uint64_t s = 0; s < p->nslots; s++)
		if (b.st[s] == R_VALID)
			tab_put(&b, (uint32_t)s);
	for (uint64_t s = 0; s < p->nslots; s++)
		if (b.st[s] == R_VALID && (err = chain_resolve(&b, (uint32_t)s)))
			goto out;
	err = -ENOMEM;

	/* 3. tenants, then each leaf's chain, oldest first */
	if ((err = tenants_make(&b, idx)))
		goto out;
	err = -ENOMEM;
	leaves = kvt_malloc((nvalid ? nvalid : 1) * sizeof(*leaves));
	if (!leaves)
		goto out;
	for (uint64_t s = 0; s < p->nslots; s++)
		if (b.st[s] == R_GOOD && !b.kid[s])
			leaves[nleaf++] = (uint32_t)s;
	qsort_r(leaves, nleaf, sizeof(*leaves), cmp_gen, p);
	for (uint64_t i = 0; i < nleaf; i++)
		if ((err = chain_restore(&b, idx, leaves[i], &keys, &slots,
					 &kcap)))
			goto out;

	/* 4. the cache's slot state; every record not restored goes. A
	 * page is restored iff the index took its slot (the pool was empty
	 * and the index is its only user). */
	for (uint64_t s = 0; s < p->nslots; s++) {
		struct rec *r = rec_at(p, (uint32_t)s);

		if (b.st[s] != R_GOOD || !kvt_pool_is_used(p->pool, (uint32_t)s)) {
			kvtp_drop(p, (uint32_t)s);
			continue;
		}
		memcpy(sums + s * p->L, (unsigned char *)r + REC_HEAD,
		       8u * p->L);
		state[s] = ok;
		p->st.restored++;
	}
	err = 0;
out:
	kvt_free(b.st);
	kvt_free(b.par);
	kvt_free(b.kid);
	kvt_free(b.tab);
	kvt_free(b.stack);
	kvt_free(leaves);
	kvt_free(keys);
	kvt_free(slots);
	p->st.rebuild_s = (double)(kvt_now_ns() - t0) / 1e9;
	/* what a restart recovered, in one line an operator can read: a
	 * warning when records were dropped (pages lost), info otherwise */
	if (!err)
		kvti_log(p->st.bad_records || p->st.orphans ||
			 p->st.duplicates || p->st.failed ? KVT_LOG_WARN :
			 KVT_LOG_INFO,
			 "cache: persistent ssd tier: %llu pages restored of "
			 "%llu records (%llu tenants re-created; dropped: %llu "
			 "bad, %llu orphans, %llu duplicates, %llu refused) "
			 "in %.3f s", (unsigned long long)p->st.restored,
			 (unsigned long long)p->st.records,
			 (unsigned long long)p->st.tenants,
			 (unsigned long long)p->st.bad_records,
			 (unsigned long long)p->st.orphans,
			 (unsigned long long)p->st.duplicates,
			 (unsigned long long)p->st.failed, p->st.rebuild_s);
	return err;
}

void kvtp_restore_stat(kvtp *p, kvt_cache_restore *r)
{
	*r = p->st;
}
