/*
 * cache.c — the node cache: tiers + index + transfer engine, with a
 * checksum for every slot (see include/kvtier/cache.h for the contract).
 *
 * STATE PER SLOT
 *
 *   sums[tier][slot]   XXH3-64 of the page the slot should hold
 *   state[tier][slot]  SUM_NONE (nothing known), SUM_OK, SUM_BAD (a copy
 *                      into it failed: its bytes are not the page's)
 *
 * A sum is set by kvt_cache_put() (computed pages), carried along by every
 * move the index asks for (copy() records the destination's sum at once,
 * from the source's), and cleared by release() when the index frees a slot.
 *
 * THE MOVER
 *
 * copy() only queues; flush() (once per index call) runs the queue in
 * dependency waves (a move goes one wave after any earlier move that wrote
 * its source, or read or wrote its destination: the slot-reuse hazards of a
 * demotion chain), each wave as one transfer job per (source, destination)
 * tier pair, all submitted, then all waited for. A failed job marks its
 * destination slots SUM_BAD: the index already records them, so every later
 * load of those pages fails verification instead of serving wrong bytes.
 *
 * LOCKING: none; a kvt_cache is used by one thread at a time. The transfer
 * engine's threads only touch the job arrays, which live until the wait.
 */
#include "core/core.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

enum { SUM_NONE = 0, SUM_OK = 1, SUM_BAD = 2 };

#define STAGE_SLOTS 64u /* pages in the ssd -> hbm bounce tier */

struct move {
	uint8_t src, dst;
	uint8_t state; /* the source's sum state when the move was asked */
	uint32_t ss, ds;
	uint32_t wave;
	uint64_t sum;
};

struct kvt_cache {
	kvt_tier *tiers[KVT_TIER_COUNT];
	kvt_tier *stage;          /* ssd -> hbm bounce tier, or NULL */
	kvt_index *idx;
	kvt_xfer *x;
	kvt_geom geom;
	int verify;

	uint64_t *sums[KVT_TIER_COUNT];
	uint8_t *state[KVT_TIER_COUNT];
	uint64_t nslots[KVT_TIER_COUNT];

	struct move *mv;          /* moves queued in the current index call */
	size_t nmv, mvcap;

	kvt_index_config icfg;    /* to rebuild the index (reset) */
	kvt_page_loc *locs;       /* scratch for acquire */
	size_t locs_cap;
	void *page;               /* one page, for put/verify */

	kvt_cache_stat st;
};

/* ---- small helpers ------------------------------------------------------ */

static double secs(uint64_t t0)
{
	return (double)(kvt_now_ns() - t0) / 1e9;
}

/* One job between two tiers over parallel slot arrays; waits for it.
 * With sums: verified (and, on failure, *bad names the first bad page). */
static int run_job(kvt_cache *c, kvt_tier *src, kvt_tier *dst,
		   const uint32_t *ss, const uint32_t *ds, uint64_t *sums,
		   size_t n, int prio, size_t *bad)
{
	kvt_xfer_desc d = {
		.src = src, .dst = dst, .src_slots = ss, .dst_slots = ds,
		.npages = n, .prio = prio, .sums = sums,
		.flags = sums ? KVT_XFER_VERIFY : 0,
	};
	kvt_xfer_status st;
	kvt_xfer_job *job;
	int err;

	*bad = SIZE_MAX;
	if (!n)
		return 0;
	err = kvt_xfer_submit(c->x, &d, &job);
	if (err)
		return err;
	err = kvt_xfer_wait(job, -1);
	if (err == KVT_ECORRUPT) {
		kvt_xfer_status_get(job, &st);
		*bad = st.bad_page;
	}
	kvt_xfer_job_free(job);
	return err;
}

/* ---- the mover ---------------------------------------------------------- */

static int mover_copy(void *arg, const kvt_move *m)
{
	kvt_cache *c = arg;
	struct move *mv;

	if (kvti_grow((void **)&c->mv, &c->mvcap, c->nmv + 1, sizeof(*c->mv),
		      64))
		return -ENOMEM; /* the index cancels this move */
	mv = &c->mv[c->nmv++];
	mv->src = (uint8_t)m->src;
	mv->dst = (uint8_t)m->dst;
	mv->ss = m->src_slot;
	mv->ds = m->dst_slot;
	mv->sum = c->sums[m->src][m->src_slot];
	mv->state = c->state[m->src][m->src_slot];
	mv->wave = 0;
	/* the destination holds that page from now on */
	c->sums[m->dst][m->dst_slot] = mv->sum;
	c->state[m->dst][m->dst_slot] = mv->state;
	return 0;
}

static void mover_release(void *arg, kvt_tier_kind tier, uint32_t slot)
{
	kvt_cache *c = arg;

	c->state[tier][slot] = SUM_NONE;
}

/* Slot -> (last wave that read it, last wave that wrote it), for the waves
 * of one flush: open addressing over (tier, slot) keys. */
struct slotmap {
	uint64_t *key;
	int32_t *rd, *wr;
	size_t mask;
};

static int slotmap_init(struct slotmap *m, size_t n)
{
	size_t cap = 16;

	while (cap < 4 * n)
		cap *= 2;
	m->key = kvt_malloc(cap * sizeof(*m->key));
	m->rd = kvt_malloc(cap * sizeof(*m->rd));
	m->wr = kvt_malloc(cap * sizeof(*m->wr));
	if (!m->key || !m->rd || !m->wr) {
		kvt_free(m->key);
		kvt_free(m->rd);
		kvt_free(m->wr);
		return -ENOMEM;
	}
	memset(m->key, 0xff, cap * sizeof(*m->key));
	m->mask = cap - 1;
	return 0;
}

static size_t slotmap_at(struct slotmap *m, uint8_t tier, uint32_t slot)
{
	uint64_t k = (uint64_t)tier << 32 | slot;
	size_t i = (size_t)(XXH3_64bits(&k, sizeof(k)) & m->mask);

	while (m->key[i] != UINT64_MAX && m->key[i] != k)
		i = (i + 1) & m->mask;
	if (m->key[i] == UINT64_MAX) {
		m->key[i] = k;
		m->rd[i] = -1;
		m->wr[i] = -1;
	}
	return i;
}

static void slotmap_free(struct slotmap *m)
{
	kvt_free(m->key);
	kvt_free(m->rd);
	kvt_free(m->wr);
}

/* Give each queued move its wave; returns the number of waves. */
static int assign_waves(kvt_cache *c, uint32_t *nwaves)
{
	struct slotmap m;
	uint32_t top = 0;
	int err;

	if ((err = slotmap_init(&m, c->nmv)))
		return err;
	for (size_t i = 0; i < c->nmv; i++) {
		struct move *mv = &c->mv[i];
		size_t s = slotmap_at(&m, mv->src, mv->ss);
		size_t d = slotmap_at(&m, mv->dst, mv->ds);
		int32_t w = KVT_MAX(m.wr[s], KVT_MAX(m.rd[d], m.wr[d])) + 1;

		mv->wave = (uint32_t)w;
		m.rd[s] = KVT_MAX(m.rd[s], w);
		m.wr[d] = w;
		top = KVT_MAX(top, (uint32_t)w + 1);
	}
	slotmap_free(&m);
	*nwaves = top;
	return 0;
}

/* Run every queued move of wave @w between tiers (s, d) as one job. */
static int flush_pair(kvt_cache *c, uint32_t w, int s, int d)
{
	uint32_t *ss = NULL, *ds = NULL;
	uint64_t *sums = NULL;
	size_t n = 0, k = 0, bad;
	int verify = c->verify, err = 0;

	for (size_t i = 0; i < c->nmv; i++)
		if (c->mv[i].wave == w && c->mv[i].src == s && c->mv[i].dst == d) {
			n++;
			verify &= c->mv[i].state == SUM_OK;
		}
	if (!n)
		return 0;
	ss = kvt_malloc(n * sizeof(*ss));
	ds = kvt_malloc(n * sizeof(*ds));
	sums = kvt_malloc(n * sizeof(*sums));
	if (!ss || !ds || !sums) {
		err = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < c->nmv; i++) {
		struct move *mv = &c->mv[i];
		if (mv->wave != w || mv->src != s || mv->dst != d)
			continue;
		ss[k] = mv->ss;
		ds[k] = mv->ds;
		sums[k] = mv->sum;
		k++;
	}
	err = run_job(c, c->tiers[s], c->tiers[d], ss, ds,
		      verify ? sums : NULL, n, KVT_XFER_PRIO_LOW, &bad);
	c->st.moves++;
	c->st.move_pages += n;
	c->st.move_bytes += n * kvt_geom_page_bytes(&c->geom);
	if (!err && verify)
		c->st.verified += n;
	if (err) {
		/* the index records these copies: make every later use fail */
		for (size_t i = 0; i < n; i++)
			c->state[d][ds[i]] = SUM_BAD;
		c->st.move_errors += n;
		if (err == KVT_ECORRUPT)
			c->st.corrupt++;
		kvti_warn("cache: copying %zu pages %s -> %s failed: %s", n,
			  kvt_tier_kind_name((kvt_tier_kind)s),
			  kvt_tier_kind_name((kvt_tier_kind)d), kvt_errdetail());
	}
out:
	kvt_free(ss);
	kvt_free(ds);
	kvt_free(sums);
	return err;
}

static void mover_flush(void *arg)
{
	kvt_cache *c = arg;
	uint64_t t0 = kvt_now_ns();
	uint32_t nwaves = 0;
	int err;

	if (!c->nmv)
		return;
	err = assign_waves(c, &nwaves);
	if (err)
		nwaves = 0;
	for (uint32_t w = 0; w < nwaves; w++) {
		for (int s = 0; s < KVT_TIER_COUNT; s++)
			for (int d = 0; d < KVT_TIER_COUNT; d++) {
				int e = flush_pair(c, w, s, d);
				if (e && !err)
					err = e;
			}
		c->st.move_waves++;
	}
	if (err && !nwaves) { /* no memory to order them: mark all bad */
		for (size_t i = 0; i < c->nmv; i++)
			c->state[c->mv[i].dst][c->mv[i].ds] = SUM_BAD;
		c->st.move_errors += c->nmv;
	}
	c->nmv = 0;
	c->st.move_s += secs(t0);
}

/* ---- open / close ---------------------------------------------------- */

static void cache_free(kvt_cache *c)
{
	kvt_index_destroy(c->idx);
	kvt_xfer_destroy(c->x);
	for (int t = 0; t < KVT_TIER_COUNT; t++) {
		kvt_tier_close(c->tiers[t]);
		kvt_free(c->sums[t]);
		kvt_free(c->state[t]);
	}
	kvt_tier_close(c->stage);
	kvt_free(c->mv);
	kvt_free(c->locs);
	kvt_free(c->page);
	kvt_free(c);
}

static int open_tiers(kvt_cache *c, const kvt_cache_config *cfg)
{
	kvt_tier_spec specs[KVT_TIER_COUNT + 1];
	size_t n;
	int err;

	if (!cfg->tiers || !*cfg->tiers)
		return kvti_fail(KVT_ESPEC, "cache: no tier spec");
	err = kvt_tier_spec_parse(cfg->tiers, specs, KVT_ARRAY_SIZE(specs), &n);
	if (err)
		return err;
	for (size_t i = 0; i < n; i++) {
		kvt_tier_kind k = specs[i].kind;

		if (c->tiers[k])
			return kvti_fail(KVT_ESPEC, "cache: two %s tiers in '%s'",
					 kvt_tier_kind_name(k), cfg->tiers);
		if (k == KVT_TIER_REMOTE)
			return kvti_fail(KVT_ENOTBUILT, "cache: the remote tier "
					 "is not built yet");
		err = kvt_tier_open(&c->tiers[k], &specs[i], &c->geom);
		if (err)
			return err;
	}
	if (!c->tiers[KVT_TIER_HBM])
		return kvti_fail(KVT_ESPEC, "cache: '%s' has no hbm or hostdev "
				 "tier to use pages from", cfg->tiers);
	return 0;
}

static int open_stage(kvt_cache *c, const kvt_cache_config *cfg)
{
	kvt_tier_desc d;
	kvt_tier_spec s;
	char spec[64];
	size_t n;
	int err;

	kvt_tier_info(c->tiers[KVT_TIER_HBM], &d);
	if (!c->tiers[KVT_TIER_SSD] || (d.hostdev && !cfg->stage_ssd))
		return 0;
	snprintf(spec, sizeof(spec), "dram:%llu",
		 (unsigned long long)(STAGE_SLOTS * kvt_geom_page_bytes(&c->geom)));
	if ((err = kvt_tier_spec_parse(spec, &s, 1, &n)))
		return err;
	return kvt_tier_open(&c->stage, &s, &c->geom);
}

int kvt_cache_open(kvt_cache **out, const kvt_cache_config *cfg)
{
	kvt_index_config ic = { 0 };
	kvt_cache *c;
	int err;

	kvti_errclear();
	c = kvt_calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->geom = cfg->geom;
	c->verify = !cfg->no_verify;
	if ((err = kvt_geom_finish(&c->geom)) || (err = open_tiers(c, cfg)) ||
	    (err = open_stage(c, cfg)))
		goto fail;
	for (int t = 0; t < KVT_TIER_COUNT; t++) {
		if (!c->tiers[t])
			continue;
		c->nslots[t] = kvt_pool_slots(kvt_tier_pool(c->tiers[t]));
		c->sums[t] = kvt_calloc(c->nslots[t], sizeof(uint64_t));
		c->state[t] = kvt_calloc(c->nslots[t], 1);
		if (!c->sums[t] || !c->state[t]) {
			err = -ENOMEM;
			goto fail;
		}
		ic.pools[t] = kvt_tier_pool(c->tiers[t]);
	}
	c->page = kvti_aligned_alloc(4096, kvt_geom_page_bytes(&c->geom));
	if (!c->page) {
		err = -ENOMEM;
		goto fail;
	}
	if ((err = kvt_xfer_create(&c->x, &cfg->xfer)))
		goto fail;
	ic.page_tokens = c->geom.page_tokens;
	ic.key_mode = KVT_KEY_TOKENS;
	ic.evict = cfg->evict;
	ic.write = cfg->write;
	ic.selective_hits = cfg->selective_hits;
	ic.high = cfg->high > 0 ? cfg->high : 0.95;
	ic.low = cfg->low > 0 ? cfg->low : 0.85;
	ic.mover.copy = mover_copy;
	ic.mover.flush = mover_flush;
	ic.mover.release = mover_release;
	ic.mover.arg = c;
	c->icfg = ic;
	if ((err = kvt_index_create(&c->idx, &ic)))
		goto fail;
	*out = c;
	return 0;
fail:
	cache_free(c);
	return err;
}

void kvt_cache_close(kvt_cache *c)
{
	if (c)
		cache_free(c);
}

int kvt_cache_reset(kvt_cache *c, int evict, int write)
{
	kvt_index_config ic = c->icfg;

	kvt_index_destroy(c->idx); /* gives every slot back (release()) */
	c->idx = NULL;
	for (int t = 0; t < KVT_TIER_COUNT; t++)
		if (c->tiers[t])
			memset(c->state[t], SUM_NONE, c->nslots[t]);
	memset(&c->st, 0, sizeof(c->st));
	c->nmv = 0;
	ic.evict = evict;
	ic.write = write;
	c->icfg = ic;
	return kvt_index_create(&c->idx, &ic);
}

kvt_index *kvt_cache_index(kvt_cache *c)
{
	return c->idx;
}

kvt_xfer *kvt_cache_xfer(kvt_cache *c)
{
	return c->x;
}

kvt_tier *kvt_cache_tier(kvt_cache *c, kvt_tier_kind k)
{
	return (unsigned)k < KVT_TIER_COUNT ? c->tiers[k] : NULL;
}

const kvt_geom *kvt_cache_geom(const kvt_cache *c)
{
	return &c->geom;
}

void kvt_cache_stat_get(kvt_cache *c, kvt_cache_stat *st)
{
	*st = c->st;
}

/* ---- acquire: loads into hbm ----------------------------------------- */

/* Pages of @locs that tier @src supplies, as parallel arrays. */
struct batch {
	uint32_t *ss, *ds;
	uint64_t *sums;
	size_t *page; /* index in the prefix, for messages */
	size_t n;
	int verify;   /* every source page has a sum */
};

static int ssd_staged(kvt_cache *c, struct batch *b, size_t *bad)
{
	uint32_t st_slots[STAGE_SLOTS];
	int err = 0;

	for (uint32_t i = 0; i < STAGE_SLOTS; i++)
		st_slots[i] = i;
	for (size_t off = 0; off < b->n && !err; off += STAGE_SLOTS) {
		size_t k = KVT_MIN(STAGE_SLOTS, b->n - off);
		uint64_t *sums = b->verify ? b->sums + off : NULL;

		err = run_job(c, c->tiers[KVT_TIER_SSD], c->stage, b->ss + off,
			      st_slots, sums, k, KVT_XFER_PRIO_HIGH, bad);
		if (err == KVT_ECORRUPT && *bad != SIZE_MAX)
			*bad += off;
		if (!err)
			err = run_job(c, c->stage, c->tiers[KVT_TIER_HBM],
				      st_slots, b->ds + off, NULL, k,
				      KVT_XFER_PRIO_HIGH, bad);
	}
	return err;
}

/* Submit one load per source tier, wait for all; verify on the way. */
static int load_batches(kvt_cache *c, struct batch *b, kvt_cache_fill *f)
{
	kvt_xfer_job *jobs[KVT_TIER_COUNT] = { 0 };
	uint64_t t0 = kvt_now_ns();
	int err = 0;

	for (int t = 1; t < KVT_TIER_COUNT; t++) {
		kvt_xfer_desc d = {
			.src = c->tiers[t], .dst = c->tiers[KVT_TIER_HBM],
			.src_slots = b[t].ss, .dst_slots = b[t].ds,
			.npages = b[t].n, .prio = KVT_XFER_PRIO_HIGH,
			.sums = b[t].verify ? b[t].sums : NULL,
			.flags = b[t].verify ? KVT_XFER_VERIFY : 0,
		};
		int e;

		if (!b[t].n || (t == KVT_TIER_SSD && c->stage))
			continue;
		e = kvt_xfer_submit(c->x, &d, &jobs[t]);
		if (e && !err)
			err = e;
	}
	for (int t = 1; t < KVT_TIER_COUNT; t++) {
		size_t bad = SIZE_MAX;
		int e = 0;

		if (t == KVT_TIER_SSD && c->stage && b[t].n && !err) {
			e = ssd_staged(c, &b[t], &bad);
		} else if (jobs[t]) {
			e = kvt_xfer_wait(jobs[t], -1);
			if (e == KVT_ECORRUPT) {
				kvt_xfer_status st;
				kvt_xfer_status_get(jobs[t], &st);
				bad = st.bad_page;
			}
			kvt_xfer_job_free(jobs[t]);
		}
		if (!e) {
			if (b[t].verify)
				f->verified += b[t].n;
			continue;
		}
		for (size_t i = 0; i < b[t].n; i++)
			c->state[KVT_TIER_HBM][b[t].ds[i]] = SUM_BAD;
		if (e == KVT_ECORRUPT) {
			c->st.corrupt++;
			e = kvti_fail(KVT_ECORRUPT, "cache: page %zu of the prefix "
				      "(%s slot %u) failed its checksum on load",
				      bad < b[t].n ? b[t].page[bad] : 0,
				      kvt_tier_kind_name((kvt_tier_kind)t),
				      bad < b[t].n ? b[t].ss[bad] : 0);
		}
		if (!err)
			err = e;
	}
	f->load_s = secs(t0);
	c->st.load_s += f->load_s;
	return err;
}

int kvt_cache_acquire(kvt_cache *c, const kvt_prefix *px_in, uint64_t now,
		      kvt_cache_fill *f, kvt_page_loc *locs, size_t nlocs)
{
	const uint32_t P = c->geom.page_tokens;
	uint64_t page_bytes = kvt_geom_page_bytes(&c->geom);
	double move_s0;
	struct batch b[KVT_TIER_COUNT];
	kvt_insert_result res;
	kvt_prefix px = *px_in;
	size_t npages;
	int err;

	memset(f, 0, sizeof(*f));
	memset(b, 0, sizeof(b));
	px.ntokens = px.ntokens / P * P;
	npages = px.ntokens / P;
	if (!npages)
		return 0;
	if ((err = kvti_grow((void **)&c->locs, &c->locs_cap, npages,
			     sizeof(*c->locs), 64)))
		return err;
	move_s0 = c->st.move_s;
	/* insert and lease in one call: nothing can evict (or write through)
	 * a fresh page before its bytes are there */
	err = kvt_index_insert(c->idx, &px, KVT_TIER_HBM, KVT_INSERT_PIN, now,
			       &res, c->locs, npages);
	f->evict_s = c->st.move_s - move_s0;
	if (err)
		return err;
	/* from here on the prefix is leased: every failure unpins it at out */

	for (int t = 0; t < KVT_TIER_COUNT; t++) {
		b[t].ss = kvt_malloc(npages * sizeof(uint32_t));
		b[t].ds = kvt_malloc(npages * sizeof(uint32_t));
		b[t].sums = kvt_malloc(npages * sizeof(uint64_t));
		b[t].page = kvt_malloc(npages * sizeof(size_t));
		if (!b[t].ss || !b[t].ds || !b[t].sums || !b[t].page) {
			err = -ENOMEM;
			goto out;
		}
	}
	f->pages = res.pages;
	for (size_t i = 0; i < npages; i++) {
		kvt_page_loc *l = &c->locs[i];
		int t = l->src_tier;

		if (!l->fresh) {
			if (c->state[KVT_TIER_HBM][l->slot] == SUM_BAD) {
				err = kvti_fail(KVT_ECORRUPT, "cache: page %zu of "
						"the prefix (hbm slot %u) holds a "
						"failed copy", i, l->slot);
				goto out;
			}
			f->from[KVT_TIER_HBM]++;
			continue;
		}
		if (t >= KVT_TIER_COUNT) {
			f->compute++;
			c->state[KVT_TIER_HBM][l->slot] = SUM_NONE;
			continue;
		}
		if (c->state[t][l->src_slot] == SUM_BAD) {
			err = kvti_fail(KVT_ECORRUPT, "cache: page %zu of the "
					"prefix (%s slot %u) holds a failed copy",
					i, kvt_tier_kind_name((kvt_tier_kind)t),
					l->src_slot);
			goto out;
		}
		b[t].ss[b[t].n] = l->src_slot;
		b[t].ds[b[t].n] = l->slot;
		b[t].sums[b[t].n] = c->sums[t][l->src_slot];
		b[t].page[b[t].n] = i;
		b[t].n++;
		f->from[t]++;
		c->sums[KVT_TIER_HBM][l->slot] = c->sums[t][l->src_slot];
		c->state[KVT_TIER_HBM][l->slot] = c->state[t][l->src_slot];
	}
	for (int t = 1; t < KVT_TIER_COUNT; t++) {
		f->bytes_loaded += b[t].n * page_bytes;
		b[t].verify = c->verify;
		for (size_t i = 0; i < b[t].n && b[t].verify; i++)
			b[t].verify = c->state[t][b[t].ss[i]] == SUM_OK;
	}
	err = load_batches(c, b, f);
	if (!err && f->bytes_loaded) {
		c->st.loads++;
		c->st.load_pages += f->bytes_loaded / page_bytes;
		c->st.load_bytes += f->bytes_loaded;
		c->st.verified += f->verified;
	}
	if (locs)
		memcpy(locs, c->locs, KVT_MIN(nlocs, npages) * sizeof(*locs));
out:
	for (int t = 0; t < KVT_TIER_COUNT; t++) {
		kvt_free(b[t].ss);
		kvt_free(b[t].ds);
		kvt_free(b[t].sums);
		kvt_free(b[t].page);
	}
	if (err) {
		char detail[512];
		kvti_strlcpy(detail, kvt_errdetail(), sizeof(detail));
		kvt_index_unpin(c->idx, &px);
		kvti_fail(err, "%s", detail);
	}
	return err;
}

int kvt_cache_put(kvt_cache *c, uint32_t slot, const void *page)
{
	int err;

	if (slot >= c->nslots[KVT_TIER_HBM])
		return kvti_fail(-ERANGE, "cache: hbm slot %u of %llu", slot,
				 (unsigned long long)c->nslots[KVT_TIER_HBM]);
	err = kvt_tier_write(c->tiers[KVT_TIER_HBM], slot, page);
	if (err)
		return err;
	c->sums[KVT_TIER_HBM][slot] = XXH3_64bits(page,
						  kvt_geom_page_bytes(&c->geom));
	c->state[KVT_TIER_HBM][slot] = SUM_OK;
	c->st.puts++;
	return 0;
}

int kvt_cache_release(kvt_cache *c, const kvt_prefix *px_in)
{
	kvt_prefix px = *px_in;

	px.ntokens = px.ntokens / c->geom.page_tokens * c->geom.page_tokens;
	if (!px.ntokens)
		return 0;
	return kvt_index_unpin(c->idx, &px);
}

/* ---- verify everything ----------------------------------------------- */

int kvt_cache_verify(kvt_cache *c, kvt_cache_check *r)
{
	uint64_t page_bytes = kvt_geom_page_bytes(&c->geom);
	char first[128] = "";
	int err = 0;

	memset(r, 0, sizeof(*r));
	for (int t = 0; t < KVT_TIER_COUNT; t++) {
		kvt_pool *pool;

		if (!c->tiers[t])
			continue;
		pool = kvt_tier_pool(c->tiers[t]);
		for (uint64_t s = 0; s < c->nslots[t]; s++) {
			uint8_t state = c->state[t][s];
			int ok;

			if (!kvt_pool_is_used(pool, (uint32_t)s))
				continue;
			if (state == SUM_NONE) {
				r->unsummed++;
				continue;
			}
			ok = state == SUM_OK;
			if (ok) {
				err = kvt_tier_read(c->tiers[t], (uint32_t)s, c->page);
				if (err)
					return err;
				ok = XXH3_64bits(c->page, page_bytes) == c->sums[t][s];
			}
			r->checked++;
			r->per_tier[t]++;
			if (!ok && !r->bad++)
				snprintf(first, sizeof(first), "%s slot %llu",
					 kvt_tier_kind_name((kvt_tier_kind)t),
					 (unsigned long long)s);
		}
	}
	if (r->bad)
		return kvti_fail(KVT_ECORRUPT, "cache: %llu of %llu page copies "
				 "do not match their checksum (first: %s)",
				 (unsigned long long)r->bad,
				 (unsigned long long)r->checked, first);
	return 0;
}
