/*
 * cache.c — the node cache as an engine uses it (include/kvtier/cache.h is
 * the contract): owned tiers + index + transfer engine, engine-registered
 * memory, asynchronous layer-wise jobs, background demotion.
 *
 * STATE PER SLOT OF EVERY OWNED TIER (struct meta; c->smu)
 *
 *   sums[slot * L + l]  XXH3-64 of layer l of the page the slot should hold
 *   state[slot]         NONE  nothing known (free, or reserved by a store
 *                             that has not started)
 *                       PEND  bytes on their way: a store or a demotion is
 *                             writing it; never served, counted in flight
 *                       OK    committed: bytes in place, sums verified
 *                       BAD   a copy into it failed or did not verify:
 *                             never served; reclaimed by eviction, or
 *                             rewritten by the next store of the page
 *   rd[slot]            background copies still reading the slot. The
 *                       index frees a demoted page's source slot as soon
 *                       as it decides; anyone who writes a slot first
 *                       waits for rd == 0 (a real, counted wait).
 *
 * THREADS AND LOCKS
 *
 *   c->mu   the index, the mover's queue, tenants; held for bookkeeping
 *           and for the synchronous copies an index call may need (a full
 *           tier, write-through) — never by the background copies.
 *   c->smu  the slot metadata above and the statistics; a leaf lock
 *           (taken after mu, never the other way), with c->scv broadcast
 *           whenever a slot leaves PEND or its rd drops.
 *   job->mu a job's progress; a leaf too.
 *
 *   engine threads      lookup, load, store (setup under mu, then submit)
 *   xfer threads        layer callbacks -> job progress (job->mu only);
 *                       done callbacks -> queue the job for the worker
 *   worker thread       finishes jobs (commit, unpin under mu, which may
 *                       run write-through copies), runs staged ssd loads
 *   background thread   demotes above the high watermark: decides under
 *                       mu, copies without it, commits under smu
 *
 * A job is finished only by the worker, once every transfer it issued is
 * done, so a job's pins and slot states change in one place.
 */
#include "cache/persist.h"
#include "core/core.h"
#include "cache/cache_remote.h"
#include "core/cuda.h"
#include "xfer/xxh.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

enum { ST_NONE = 0, ST_PEND = 1, ST_OK = 2, ST_BAD = 3 };
enum { JOB_LOAD = 1, JOB_STORE = 2 };

#define ENGINE KVT_TIER_COUNT  /* "tier" index of the engine's memory */
#define STAGE_SLOTS 64u        /* pages of the ssd -> GPU bounce tier */
#define MAX_SUBS (KVT_TIER_COUNT + 2) /* load: one per source tier;
					 store: engine + one per source
					 tier; the last is the start hold */
#define HOLD (MAX_SUBS - 1)

struct meta {
	uint64_t *sums;
	uint8_t *state;
	uint16_t *rd;        /* batches' pending reads of the slot */
	uint16_t *wr;        /* batches' pending writes to the slot */
	uint32_t *pby;       /* PEND: the batch writing it (0: a store) */
	uint64_t n;
};

struct move {
	uint8_t src, dst;
	uint8_t ok;          /* the source held a page (committed or on its
				way): bytes to move, marks taken */
	uint32_t ss, ds;
	uint32_t wave;
	uint32_t si, di;     /* batch_run: source / destination in the
				batch's slot map */
	int err;
};

/* The copies of one index call (or one background pass), with each
 * move's layer sums (L per move, taken when the move was decided). */
struct batch {
	struct move *mv;
	uint64_t *sums;
	size_t n, cap, scap;
};

/* One transfer of a job: pages from one source to one destination. */
struct sub {
	kvt_cache_job *cj;
	kvt_xfer_job *xj;
	int src, dst;        /* tier kinds, or ENGINE */
	size_t n;
	uint32_t *ss, *ds;
	size_t *pg;          /* index of each page in the job's request */
	uint64_t *sums;      /* n * L */
	uint8_t *bad;        /* n */
	uint32_t landed;     /* job->mu: layers landed */
	int err;             /* job->mu: the transfer's result once done */
	int done;            /* job->mu */
	int staged;          /* ssd -> stage -> engine, run by the worker */
};

struct kvt_cache_job {
	kvt_cache *c;
	int kind;
	uint32_t tenant;
	kvt_page_key *keys;
	size_t nkeys;        /* the prefix (pinned while the job runs) */
	int pinned;
	uint8_t *pin_each;   /* KVT_CACHE_IO_EACH: page i's own prefix pinned
				(NULL otherwise) */
	size_t first, n;     /* requested pages [first, first + n) */
	size_t absent;       /* load: pages failed at setup (not cached) */
	uint32_t *blocks;    /* n */
	uint8_t *failed;     /* n, final once done */
	struct sub sub[MAX_SUBS];
	int nsub;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int subs_left;       /* mu */
	int done;            /* mu */
	int result;          /* mu, once done */
	int cancel;          /* mu */
	int stage_todo;      /* mu: staged loads for the worker to run */
	int efd;
	kvt_cache_job_stat st;
	uint64_t rfail[KVT_TIER_COUNT]; /* load: read failures by tier */
	uint64_t t0;
	kvt_cache_mem *mem;  /* the engine memory it reads or writes */
	int memref;          /* c->smu: counted in mem->jobs */
	kvt_cache_progress_fn *progress; /* j->mu: kvt_cache_io */
	void *parg;
	uint32_t reported;   /* j->mu: layers last reported */
	int freported;       /* j->mu: all-failed reported */
	kvt_cache_job *qnext; /* c->wmu: worker queue */
	kvt_cache_job *lprev, *lnext; /* c->smu: the cache's live jobs */
};

/* Engine memory: kvt_cache_register()'s, or one per kvt_cache_attach(). */
struct kvt_cache_mem {
	kvt_cache *c;
	kvt_tier *t;         /* the wrapped memory (layout + bases) */
	int jobs;            /* c->smu: jobs created on it, not finished */
	int gone;            /* c->smu: being detached: no new jobs */
	kvt_cache_mem *next; /* c->mu: c->mems */
};

struct kvt_cache {
	kvt_geom geom;
	uint32_t L;
	int verify, background, stage_ssd;
	double high, low;
	kvt_tier *tiers[KVT_TIER_COUNT]; /* owned: fabric, dram, ssd */
	int top;                         /* fastest owned tier */
	kvt_cache_mem *reg;              /* kvt_cache_register()'s, or NULL */
	kvt_cache_mem *mems;             /* mu: every attached memory */
	kvt_tier *stage;                 /* ssd -> GPU bounce, or NULL */
	kvt_xfer *x;

	pthread_mutex_t mu;
	kvt_index *idx;
	struct batch cur;                /* mu: copies of the current call */
	int bg_mode;                     /* mu: the background is evicting */
	uint32_t batch, batch_seq;       /* mu: the current batch's id */
	struct batch bgb;                /* mu, then the background thread:
					    its pass's copies, run unlocked */
	double fg_wait_s;                /* mu: synchronous copies, total */

	pthread_mutex_t smu;
	pthread_cond_t scv;
	struct meta m[KVT_TIER_COUNT];
	kvtp *persist;                   /* ssd records ('persist'), or NULL */
	kvt_cache_stat st;
	int jobs;                        /* jobs not yet finished */
	kvt_cache_job *live;             /* them, for kvt_cache_close() */

	pthread_mutex_t wmu;             /* worker and background queues */
	pthread_cond_t wcv, bgcv;
	kvt_cache_job *wq, *wq_tail;
	int stopping, bg_kick, bg_busy;
	pthread_t worker, bg;
	int have_worker, have_bg;
	struct kvti_cremote *remote;     /* the remote tier, or NULL */
};

/* ---- small helpers ------------------------------------------------------ */

static double secs(uint64_t t0)
{
	return (double)(kvt_now_ns() - t0) / 1e9;
}

static uint64_t page_bytes(const kvt_cache *c)
{
	return kvt_geom_page_bytes(&c->geom);
}

static kvt_tier *side(const kvt_cache_job *j, int t)
{
	return t == ENGINE ? j->mem->t : j->c->tiers[t];
}

static kvt_prefix prefix(const kvt_cache_job *j, size_t n)
{
	kvt_prefix px = { .tenant = j->tenant, .keys = j->keys, .nkeys = n };
	return px;
}

/* The prefix of one page of its own (KVT_LOOKUP_EACH, KVT_CACHE_IO_EACH). */
static kvt_prefix page_prefix(uint32_t tenant, const kvt_page_key *key)
{
	kvt_prefix px = { .tenant = tenant, .keys = key, .nkeys = 1 };
	return px;
}

/* Unpin what the job pinned: its prefix, or (KVT_CACHE_IO_EACH) each
 * page's own one-page prefix (c->mu held). */
static void job_unpin(kvt_cache *c, kvt_cache_job *j)
{
	if (j->pin_each) {
		for (size_t i = 0; i < j->nkeys; i++) {
			kvt_prefix px = page_prefix(j->tenant, j->keys + i);

			if (j->pin_each[i])
				kvt_index_unpin(c->idx, &px);
			j->pin_each[i] = 0;
		}
	} else if (j->pinned) {
		kvt_prefix px = prefix(j, j->nkeys);

		kvt_index_unpin(c->idx, &px);
	}
	j->pinned = 0;
}



/* Wait (smu held) until no batch still reads or writes slot @s of @t:
 * before a store writes it (the index may hand out a slot a background
 * demotion is still copying from). */
static void slot_settle(kvt_cache *c, int t, uint32_t s)
{
	struct meta *m = &c->m[t];

	while (m->rd[s] || m->wr[s])
		pthread_cond_wait(&c->scv, &c->smu);
}

/* ---- persistence hooks (persist.c; smu held) ---------------------------- */

/* Slot @s of @t is about to be written, failed, or left the index: a
 * persistent ssd slot loses its record first. */
static void persist_gone(kvt_cache *c, int t, uint32_t s)
{
	if (c->persist && t == KVT_TIER_SSD)
		kvtp_drop(c->persist, s);
}

/* Slot @s of @t just committed (bytes in place, verified): record it. */
static void persist_ok(kvt_cache *c, int t, uint32_t s)
{
	if (c->persist && t == KVT_TIER_SSD)
		kvtp_commit(c->persist, s, c->m[t].sums + (uint64_t)s * c->L);
}

/* Mark slot @s of @t as being written by batch @batch (smu held). */
static void slot_pend(kvt_cache *c, int t, uint32_t s, uint32_t batch)
{
	persist_gone(c, t, s);
	c->m[t].state[s] = ST_PEND;
	c->m[t].pby[s] = batch;
}

/* ---- the mover: copies the index asks for ------------------------------ */

/*
 * Every copy the index asks for joins the batch of the current index call.
 * At decision time (c->mu held) the destination takes the page's sums and
 * goes PEND, and marks are taken: a reader on the source, a writer on the
 * destination (struct meta: rd, wr). A batch then runs in dependency waves
 * and releases a move's marks, and commits its destination, when the move's
 * wave ends.
 *
 * Who waits for whom:
 *  - a background batch waits for nobody: it was decided when no other
 *    batch was in flight (synchronous batches finish inside c->mu, the
 *    previous background batch before the next is decided), and nobody
 *    else writes a slot it uses while it holds its marks;
 *  - a synchronous batch (c->mu held) may meet the background batch's
 *    slots: the index can free a slot the background is still reading, or
 *    evict a page the background is still writing. Before each wave it
 *    waits until no other batch holds a mark on its moves' slots;
 *  - a store about to write a fresh slot waits for its marks too
 *    (slot_settle()).
 * So waits point one way (towards the background batch), never in a cycle.
 */

static int batch_add(kvt_cache *c, struct batch *b, size_t more)
{
	if (kvti_grow((void **)&b->mv, &b->cap, b->n + more, sizeof(*b->mv),
		      64) ||
	    kvti_grow((void **)&b->sums, &b->scap, b->n + more,
		      c->L * sizeof(*b->sums), 64))
		return -ENOMEM;
	return 0;
}

static int mover_copy(void *arg, const kvt_move *m)
{
	kvt_cache *c = arg;
	struct batch *b = &c->cur;
	struct meta *sm = &c->m[m->src], *dm = &c->m[m->dst];
	struct move *mv;

	if (batch_add(c, b, 1))
		return -ENOMEM; /* the index cancels this move */
	if (!b->n && !c->bg_mode)
		c->batch = ++c->batch_seq ? c->batch_seq : ++c->batch_seq;
	mv = &b->mv[b->n];
	memset(mv, 0, sizeof(*mv));
	mv->src = (uint8_t)m->src;
	mv->dst = (uint8_t)m->dst;
	mv->ss = m->src_slot;
	mv->ds = m->dst_slot;
	pthread_mutex_lock(&c->smu);
	mv->ok = sm->state[mv->ss] == ST_OK || sm->state[mv->ss] == ST_PEND;
	memcpy(b->sums + b->n * c->L, sm->sums + (uint64_t)mv->ss * c->L,
	       c->L * sizeof(uint64_t));
	/* the destination holds this page from now on (a reader of it waits
	 * for our write: PEND) */
	memcpy(dm->sums + (uint64_t)mv->ds * c->L, b->sums + b->n * c->L,
	       c->L * sizeof(uint64_t));
	if (c->persist)
		kvtp_ident_copy(c->persist, mv->src, mv->ss, mv->dst, mv->ds);
	if (mv->ok) {
		slot_pend(c, mv->dst, mv->ds, c->batch);
		sm->rd[mv->ss]++;
		dm->wr[mv->ds]++;
	} else {
		dm->state[mv->ds] = ST_BAD;
	}
	pthread_mutex_unlock(&c->smu);
	b->n++;
	return 0;
}

static void mover_release(void *arg, kvt_tier_kind tier, uint32_t slot)
{
	kvt_cache *c = arg;

	pthread_mutex_lock(&c->smu);
	if (c->m[tier].state[slot] != ST_PEND) {
		c->m[tier].state[slot] = ST_NONE;
		persist_gone(c, tier, slot);
	}
	c->st.evicted++;
	pthread_mutex_unlock(&c->smu);
}

/* Slot -> last wave that read / wrote it within one batch, and the marks
 * the batch still holds on it. */
struct slotmap {
	uint64_t *key;
	int32_t *rd, *wr;
	int32_t *own_rd, *own_wr;
	size_t mask;
};

static void slotmap_free(struct slotmap *m)
{
	kvt_free(m->key);
	kvt_free(m->rd);
	kvt_free(m->wr);
	kvt_free(m->own_rd);
	kvt_free(m->own_wr);
}

static int slotmap_init(struct slotmap *m, size_t n)
{
	size_t cap = 16;

	while (cap < 4 * n)
		cap *= 2;
	m->key = kvt_malloc(cap * sizeof(*m->key));
	m->rd = kvt_malloc(cap * sizeof(*m->rd));
	m->wr = kvt_malloc(cap * sizeof(*m->wr));
	m->own_rd = kvt_calloc(cap, sizeof(*m->own_rd));
	m->own_wr = kvt_calloc(cap, sizeof(*m->own_wr));
	if (!m->key || !m->rd || !m->wr || !m->own_rd || !m->own_wr) {
		slotmap_free(m);
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

/* Order a batch in dependency waves: a move goes one wave after any
 * earlier move that wrote its source or read or wrote its destination
 * (the slot reuse of a demotion chain). Fills @m (freed by the caller),
 * each move's place in it and the batch's own marks per slot. Returns the
 * number of waves, or -ENOMEM. */
static int assign_waves(struct batch *b, struct slotmap *m)
{
	uint32_t top = 0;
	int err;

	if ((err = slotmap_init(m, b->n)))
		return err;
	for (size_t i = 0; i < b->n; i++) {
		struct move *mv = &b->mv[i];
		size_t s = slotmap_at(m, mv->src, mv->ss);
		size_t d = slotmap_at(m, mv->dst, mv->ds);
		int32_t w = KVT_MAX(m->wr[s], KVT_MAX(m->rd[d], m->wr[d])) + 1;

		mv->wave = (uint32_t)w;
		mv->si = (uint32_t)s;
		mv->di = (uint32_t)d;
		m->rd[s] = KVT_MAX(m->rd[s], w);
		m->wr[d] = w;
		m->own_rd[s] += mv->ok;
		m->own_wr[d] += mv->ok;
		top = KVT_MAX(top, (uint32_t)w + 1);
	}
	return (int)top;
}

/* Run the moves of wave @w from tier @s to tier @d as one job, each page
 * verified on its own, and wait for it. Each move's err gets the job's
 * result, or KVT_ECORRUPT for a page that did not verify. */
static void run_pair(kvt_cache *c, struct batch *b, uint32_t w, int s, int d)
{
	uint32_t *ss = NULL, *ds = NULL;
	uint64_t *sums = NULL;
	uint8_t *bad = NULL;
	size_t k = 0, cnt = 0, nbad = 0;
	kvt_xfer_job *job;
	int err;

#define IN_PAIR(m) ((m).wave == w && (m).src == s && (m).dst == d && (m).ok)
	for (size_t i = 0; i < b->n; i++)
		cnt += IN_PAIR(b->mv[i]);
	if (!cnt)
		return;
	ss = kvt_malloc(cnt * sizeof(*ss));
	ds = kvt_malloc(cnt * sizeof(*ds));
	sums = kvt_malloc(cnt * c->L * sizeof(*sums));
	bad = kvt_calloc(cnt, 1);
	if (!ss || !ds || !sums || !bad) {
		err = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < b->n; i++) {
		if (!IN_PAIR(b->mv[i]))
			continue;
		ss[k] = b->mv[i].ss;
		ds[k] = b->mv[i].ds;
		memcpy(sums + k * c->L, b->sums + i * c->L,
		       c->L * sizeof(*sums));
		k++;
	}
	kvt_xfer_desc xd = {
		.src = c->tiers[s], .dst = c->tiers[d], .src_slots = ss,
		.dst_slots = ds, .npages = cnt, .prio = KVT_XFER_PRIO_LOW,
		.sums = c->verify ? sums : NULL, .bad = c->verify ? bad : NULL,
		.flags = c->verify ? KVT_XFER_LVERIFY : 0,
	};
	err = kvt_xfer_submit(c->x, &xd, &job);
	if (!err) {
		err = kvt_xfer_wait(job, -1);
		kvt_xfer_job_free(job);
	}
	if (err)
		kvti_warn("cache: copying %zu pages %s -> %s failed: %s", cnt,
			  kvt_tier_kind_name((kvt_tier_kind)s),
			  kvt_tier_kind_name((kvt_tier_kind)d), kvt_errdetail());
out:
	k = 0;
	for (size_t i = 0; i < b->n; i++) {
		struct move *mv = &b->mv[i];

		if (!IN_PAIR(*mv))
			continue;
		mv->err = err ? err : bad[k] ? KVT_ECORRUPT : 0;
		if (!err && bad[k]) {
			nbad++;
			kvti_warn("cache: page copy %s slot %u -> %s slot %u "
				  "failed its checksum: dropped",
				  kvt_tier_kind_name((kvt_tier_kind)s), mv->ss,
				  kvt_tier_kind_name((kvt_tier_kind)d), mv->ds);
		}
		k++;
	}
#undef IN_PAIR
	pthread_mutex_lock(&c->smu);
	c->st.moves++;
	c->st.move_pages += cnt;
	c->st.move_bytes += cnt * page_bytes(c);
	if (err)
		c->st.move_errors += cnt;
	else if (c->verify)
		c->st.verified += cnt - nbad;
	c->st.corrupt += nbad;
	pthread_mutex_unlock(&c->smu);
	kvt_free(ss);
	kvt_free(ds);
	kvt_free(sums);
	kvt_free(bad);
}

/* Release a move's marks and commit its destination (smu held). */
static void move_end(kvt_cache *c, struct move *mv, uint32_t batch)
{
	struct meta *d = &c->m[mv->dst];

	c->m[mv->src].rd[mv->ss]--;
	d->wr[mv->ds]--;
	if (d->state[mv->ds] == ST_PEND && d->pby[mv->ds] == batch) {
		d->state[mv->ds] = mv->err ? ST_BAD : ST_OK;
		if (!mv->err)
			persist_ok(c, mv->dst, mv->ds);
	}
}

/* Run a batch wave by wave, committing each wave as it ends. @sync: a
 * synchronous batch (c->mu held), which first waits for other batches'
 * marks on its slots (see the top of this section). */
static void batch_run(kvt_cache *c, struct batch *b, uint32_t batch, int sync)
{
	struct slotmap m;
	int nw = assign_waves(b, &m);

	if (nw < 0) { /* no memory to order them: nothing moves */
		pthread_mutex_lock(&c->smu);
		for (size_t i = 0; i < b->n; i++)
			if (b->mv[i].ok) {
				b->mv[i].err = nw;
				move_end(c, &b->mv[i], batch);
			}
		pthread_cond_broadcast(&c->scv);
		pthread_mutex_unlock(&c->smu);
		return;
	}
	for (int w = 0; w < nw; w++) {
		pthread_mutex_lock(&c->smu);
		for (size_t i = 0; i < b->n && sync; i++) {
			struct move *mv = &b->mv[i];
			struct meta *sm = &c->m[mv->src], *dm = &c->m[mv->dst];

			if (mv->wave != (uint32_t)w || !mv->ok)
				continue;
			while (dm->rd[mv->ds] > m.own_rd[mv->di] ||
			       dm->wr[mv->ds] > m.own_wr[mv->di] ||
			       sm->wr[mv->ss] > m.own_wr[mv->si])
				pthread_cond_wait(&c->scv, &c->smu);
			/* the write we waited for may have failed */
			if (sm->state[mv->ss] == ST_BAD)
				mv->err = KVT_ECORRUPT;
		}
		pthread_mutex_unlock(&c->smu);
		for (int s = 0; s < KVT_TIER_COUNT; s++)
			for (int d = 0; d < KVT_TIER_COUNT; d++)
				if (c->tiers[s] && c->tiers[d] && s != d)
					run_pair(c, b, (uint32_t)w, s, d);
		pthread_mutex_lock(&c->smu);
		for (size_t i = 0; i < b->n; i++) {
			struct move *mv = &b->mv[i];

			if (mv->wave != (uint32_t)w || !mv->ok)
				continue;
			move_end(c, mv, batch);
			m.own_rd[mv->si]--;
			m.own_wr[mv->di]--;
		}
		pthread_cond_broadcast(&c->scv);
		pthread_mutex_unlock(&c->smu);
	}
	slotmap_free(&m);
}

/* End of an index call that issued copies. In the background thread the
 * batch is kept and run after c->mu is dropped; anywhere else the copies
 * run now, with c->mu held: the caller waits (counted). */
static void mover_flush(void *arg)
{
	kvt_cache *c = arg;
	struct batch *b = &c->cur;
	uint64_t t0;

	if (!b->n)
		return;
	if (c->bg_mode) {
		struct batch *g = &c->bgb;

		if (!batch_add(c, g, b->n)) {
			memcpy(g->mv + g->n, b->mv, b->n * sizeof(*b->mv));
			memcpy(g->sums + g->n * c->L, b->sums,
			       b->n * c->L * sizeof(*b->sums));
			g->n += b->n;
			b->n = 0;
			return;
		}
		/* no memory to keep them: run them now, like a flush */
	}
	t0 = kvt_now_ns();
	batch_run(c, b, c->batch, !c->bg_mode);
	b->n = 0;
	c->fg_wait_s += secs(t0);
}

/* ---- the background thread: demotion above the high watermark ---------- */

/* One pass (c->mu held): evict every owned tier above its high mark down
 * to its low mark. Returns 1 if it decided anything. */
static int bg_decide(kvt_cache *c)
{
	int any = 0;

	c->bg_mode = 1;
	c->batch = ++c->batch_seq ? c->batch_seq : ++c->batch_seq;
	for (int t = 0; t < KVT_TIER_COUNT; t++) {
		kvt_pool *p;
		uint64_t used, slots, freed = 0;

		if (!c->tiers[t])
			continue;
		p = kvt_tier_pool(c->tiers[t]);
		used = kvt_pool_used(p);
		slots = kvt_pool_slots(p);
		if ((double)used <= c->high * (double)slots)
			continue;
		kvt_index_evict_pages(c->idx, (kvt_tier_kind)t,
				      used - (uint64_t)(c->low * (double)slots),
				      &freed);
		any |= freed > 0;
	}
	c->bg_mode = 0;
	return any;
}

static void *bg_main(void *arg)
{
	kvt_cache *c = arg;

	pthread_mutex_lock(&c->wmu);
	while (!c->stopping) {
		struct timespec ts;
		uint64_t t0;
		uint32_t batch;
		int any;

		if (!c->bg_kick) {
			kvti_deadline(&ts, 20 * 1000000);
			pthread_cond_timedwait(&c->bgcv, &c->wmu, &ts);
			if (c->stopping)
				break;
		}
		c->bg_kick = 0;
		c->bg_busy = 1;
		pthread_mutex_unlock(&c->wmu);

		t0 = kvt_now_ns();
		pthread_mutex_lock(&c->mu);
		any = bg_decide(c);
		batch = c->batch; /* a synchronous flush may take a new id */
		pthread_mutex_unlock(&c->mu);
		if (c->bgb.n) {
			batch_run(c, &c->bgb, batch, 0);
			c->bgb.n = 0;
		}
		pthread_mutex_lock(&c->smu);
		if (any) {
			c->st.bg_passes++;
			c->st.bg_s += secs(t0);
		}
		pthread_mutex_unlock(&c->smu);

		pthread_mutex_lock(&c->wmu);
		c->bg_busy = 0;
		if (any)
			c->bg_kick = 1; /* look again at once */
		pthread_cond_broadcast(&c->bgcv);
	}
	pthread_mutex_unlock(&c->wmu);
	return NULL;
}

static void bg_kick(kvt_cache *c)
{
	if (!c->background)
		return;
	pthread_mutex_lock(&c->wmu);
	c->bg_kick = 1;
	pthread_cond_broadcast(&c->bgcv);
	pthread_mutex_unlock(&c->wmu);
}

void kvt_cache_quiesce(kvt_cache *c)
{
	pthread_mutex_lock(&c->wmu);
	while (c->background && (c->bg_kick || c->bg_busy)) {
		pthread_cond_broadcast(&c->bgcv);
		pthread_cond_wait(&c->bgcv, &c->wmu);
	}
	pthread_mutex_unlock(&c->wmu);
}

/* ---- jobs: progress from the transfer engine --------------------------- */

static uint32_t job_ready(kvt_cache_job *j)
{
	uint32_t r = j->c->L;

	for (int i = 0; i < j->nsub; i++)
		if (j->sub[i].n)
			r = KVT_MIN(r, j->sub[i].landed);
	return r;
}

static int job_failed_now(kvt_cache_job *j, int *err);

static int job_all_failed(kvt_cache_job *j)
{
	return j->n && j->st.failed == j->n;
}

/* c->smu held: the job no longer counts against its memory (detach waits
 * for that). */
static void mem_unref(kvt_cache *c, kvt_cache_job *j)
{
	if (j->memref && --j->mem->jobs == 0)
		pthread_cond_broadcast(&c->scv);
	j->memref = 0;
}

/* j->mu held: tell a kvt_cache_io progress callback what changed (layers
 * ready, every block failed); the final report is job_finish()'s. */
static void job_report(kvt_cache_job *j)
{
	kvt_cache_progress p = { .layers = job_ready(j) };
	int why, fnow;

	if (!j->progress || j->done)
		return;
	if (j->absent == j->n)
		p.layers = 0; /* nothing copied: no layer is ever ready */
	fnow = !j->freported && job_failed_now(j, &why);
	if (p.layers <= j->reported && !fnow)
		return;
	if (fnow) {
		j->freported = 1;
		p.failed = why;
	}
	j->reported = KVT_MAX(j->reported, p.layers);
	p.layers = j->reported;
	j->progress(j->parg, &p);
}

static void sub_layer(kvt_xfer_job *xj, uint32_t layer, void *arg)
{
	struct sub *s = arg;
	kvt_cache_job *j = s->cj;

	pthread_mutex_lock(&j->mu);
	if (layer + 1 > s->landed)
		s->landed = layer + 1;
	if (!j->st.layer0_s && j->absent < j->n && job_ready(j) > 0)
		j->st.layer0_s = secs(j->t0);
	job_report(j);
	pthread_cond_broadcast(&j->cv);
	pthread_mutex_unlock(&j->mu);
}

static void worker_push(kvt_cache *c, kvt_cache_job *j)
{
	pthread_mutex_lock(&c->wmu);
	j->qnext = NULL;
	if (c->wq_tail)
		c->wq_tail->qnext = j;
	else
		c->wq = j;
	c->wq_tail = j;
	pthread_cond_broadcast(&c->wcv);
	pthread_mutex_unlock(&c->wmu);
}

/* A transfer is done (xfer thread, or the worker for staged loads). */
static void sub_end(struct sub *s, int err)
{
	kvt_cache_job *j = s->cj;
	int last;

	pthread_mutex_lock(&j->mu);
	s->err = err;
	s->done = 1;
	if (!err)
		s->landed = j->c->L;
	if (!j->st.layer0_s && j->absent < j->n && job_ready(j) > 0 &&
	    !err)
		j->st.layer0_s = secs(j->t0);
	last = --j->subs_left == 0;
	job_report(j);
	pthread_cond_broadcast(&j->cv);
	pthread_mutex_unlock(&j->mu);
	if (last)
		worker_push(j->c, j);
}

static void sub_done(kvt_xfer_job *xj, int err, void *arg)
{
	sub_end(arg, err); /* (staged loads have no callback: the worker
			      runs and ends them) */
}

/* ---- finishing a job (worker thread) ------------------------------------ */

static void job_fail_page(kvt_cache_job *j, size_t i, int err)
{
	if (!j->failed[i]) {
		j->failed[i] = 1;
		j->st.failed++;
		if (!j->result)
			j->result = err;
	}
}

static void load_finish(kvt_cache *c, kvt_cache_job *j)
{
	pthread_mutex_lock(&c->smu);
	for (int k = 0; k < j->nsub; k++) {
		struct sub *s = &j->sub[k];

		for (size_t i = 0; i < s->n; i++) {
			int bad = __atomic_load_n(&s->bad[i], __ATOMIC_RELAXED);

			if (s->err) {
				job_fail_page(j, s->pg[i], s->err);
				if (s->err != -ECANCELED)
					j->rfail[s->src]++;
			} else if (bad) {
				/* the source copy is not what was stored */
				job_fail_page(j, s->pg[i], KVT_ECORRUPT);
				j->rfail[s->src]++;
				if (c->m[s->src].state[s->ss[i]] == ST_OK) {
					c->m[s->src].state[s->ss[i]] = ST_BAD;
					persist_gone(c, s->src, s->ss[i]);
				}
				c->st.corrupt++;
			} else {
				j->st.copied++;
				j->st.from[s->src]++;
				j->st.verified += c->verify;
			}
		}
	}
	j->st.bytes = j->st.copied * page_bytes(c);
	c->st.loads++;
	c->st.load_pages += j->st.copied;
	c->st.load_bytes += j->st.bytes;
	c->st.verified += j->st.verified;
	c->st.failed_blocks += j->st.failed;
	pthread_mutex_unlock(&c->smu);
}

static void store_finish(kvt_cache *c, kvt_cache_job *j, int cancel)
{
	const uint32_t L = c->L;

	pthread_mutex_lock(&c->smu);
	for (int k = 0; k < j->nsub; k++) {
		struct sub *s = &j->sub[k];
		struct meta *m = &c->m[s->dst];

		for (size_t i = 0; i < s->n; i++) {
			int bad = __atomic_load_n(&s->bad[i], __ATOMIC_RELAXED);
			int ok = !s->err && !bad && !cancel;

			if (ok)
				memcpy(m->sums + (uint64_t)s->ds[i] * L,
				       s->sums + i * L, L * sizeof(uint64_t));
			m->state[s->ds[i]] = ok ? ST_OK : ST_BAD;
			if (ok)
				persist_ok(c, s->dst, s->ds[i]);
			if (s->src == ENGINE && s->pg[i] != SIZE_MAX) {
				if (ok) {
					j->st.copied++;
				} else {
					job_fail_page(j, s->pg[i], s->err ? s->err :
						      cancel ? -ECANCELED :
						      KVT_ECORRUPT);
				}
			} else if (!ok && !j->result) {
				/* a parent's promotion failed */
				j->result = s->err ? s->err : cancel ?
					    -ECANCELED : KVT_ECORRUPT;
			}
			if (bad && s->src != ENGINE &&
			    c->m[s->src].state[s->ss[i]] == ST_OK) {
				/* the copy it came from is not what was
				 * stored (a lower tier's page that did not
				 * all reach the disk): never served again */
				c->m[s->src].state[s->ss[i]] = ST_BAD;
				persist_gone(c, s->src, s->ss[i]);
			}
			if (bad)
				c->st.corrupt++;
		}
	}
	j->st.bytes = j->st.copied * page_bytes(c);
	c->st.stores++;
	c->st.store_pages += j->st.copied;
	c->st.store_bytes += j->st.bytes;
	pthread_cond_broadcast(&c->scv);
	pthread_mutex_unlock(&c->smu);
}

static void job_finish(kvt_cache *c, kvt_cache_job *j)
{
	uint64_t one = 1;
	double wait_s;
	int cancel;

	pthread_mutex_lock(&j->mu);
	cancel = j->cancel;
	pthread_mutex_unlock(&j->mu);
	if (j->kind == JOB_LOAD)
		load_finish(c, j);
	else
		store_finish(c, j, cancel);
	if (j->pinned) {
		double w0;

		pthread_mutex_lock(&c->mu);
		w0 = c->fg_wait_s;
		job_unpin(c, j); /* write policy copies run here */
		j->st.wait_s += c->fg_wait_s - w0;
		pthread_mutex_unlock(&c->mu);
	}
	if (j->kind == JOB_STORE)
		bg_kick(c);
	wait_s = j->st.wait_s;
	pthread_mutex_lock(&c->smu);
	if (j->lprev)
		j->lprev->lnext = j->lnext;
	else
		c->live = j->lnext;
	if (j->lnext)
		j->lnext->lprev = j->lprev;
	mem_unref(c, j); /* every transfer is over: detach may go on */
	pthread_mutex_unlock(&c->smu);
	/* the job is the caller's once done is set: touch nothing of it
	 * after this critical section (kvt_cache_job_free() takes j->mu) */
	pthread_mutex_lock(&j->mu);
	j->st.total_s = secs(j->t0);
	if (j->cancel && !j->result)
		j->result = -ECANCELED;
	j->done = 1;
	pthread_cond_broadcast(&j->cv);
	if (write(j->efd, &one, sizeof(one)) < 0) {
		/* cannot overflow in practice */
	}
	if (j->progress) {
		kvt_cache_progress p = {
			.layers = job_all_failed(j) ? 0 : job_ready(j),
			.done = 1, .result = j->result,
			.failed = job_all_failed(j) ? j->result : 0,
		};
		j->progress(j->parg, &p);
	}
	pthread_mutex_unlock(&j->mu);
	pthread_mutex_lock(&c->smu);
	c->st.wait_s += wait_s;
	if (--c->jobs == 0)
		pthread_cond_broadcast(&c->scv);
	pthread_mutex_unlock(&c->smu);
}

/* ssd -> stage -> engine, STAGE_SLOTS pages at a time (worker thread). The
 * ssd read verifies every layer sum; the stage -> engine copy verifies
 * again what landed. Layers are reported when the last round is in. */
static int staged_run(kvt_cache *c, struct sub *s)
{
	uint32_t st_slots[STAGE_SLOTS];
	int err = 0;

	for (uint32_t i = 0; i < STAGE_SLOTS; i++)
		st_slots[i] = i;
	for (size_t off = 0; off < s->n && !err; off += STAGE_SLOTS) {
		size_t k = KVT_MIN(STAGE_SLOTS, s->n - off);
		kvt_xfer_desc a = {
			.src = c->tiers[KVT_TIER_SSD], .dst = c->stage,
			.src_slots = s->ss + off, .dst_slots = st_slots,
			.npages = k, .prio = KVT_XFER_PRIO_HIGH,
			.sums = c->verify ? s->sums + off * c->L : NULL,
			.bad = c->verify ? s->bad + off : NULL,
			.flags = c->verify ? KVT_XFER_LVERIFY : 0,
		};
		kvt_xfer_desc b = a;
		kvt_xfer_job *xj;

		b.src = c->stage;
		b.dst = s->cj->mem->t;
		b.src_slots = st_slots;
		b.dst_slots = s->ds + off;
		pthread_mutex_lock(&s->cj->mu);
		if (s->cj->cancel)
			err = -ECANCELED;
		pthread_mutex_unlock(&s->cj->mu);
		for (int step = 0; step < 2 && !err; step++) {
			err = kvt_xfer_submit(c->x, step ? &b : &a, &xj);
			if (!err) {
				err = kvt_xfer_wait(xj, -1);
				kvt_xfer_job_free(xj);
			}
		}
	}
	return err;
}

static void *worker_main(void *arg)
{
	kvt_cache *c = arg;

	pthread_mutex_lock(&c->wmu);
	for (;;) {
		kvt_cache_job *j = c->wq;

		if (!j) {
			if (c->stopping)
				break;
			pthread_cond_wait(&c->wcv, &c->wmu);
			continue;
		}
		c->wq = j->qnext;
		if (!c->wq)
			c->wq_tail = NULL;
		pthread_mutex_unlock(&c->wmu);
		int staged;

		pthread_mutex_lock(&j->mu);
		staged = j->stage_todo;
		j->stage_todo = 0;
		pthread_mutex_unlock(&j->mu);
		if (staged) {
			/* a staged load handed over at start; its last
			 * sub_end() queues the job again to finish it */
			for (int k = 0; k < j->nsub; k++)
				if (j->sub[k].staged)
					sub_end(&j->sub[k],
						staged_run(c, &j->sub[k]));
		} else {
			job_finish(c, j);
		}
		pthread_mutex_lock(&c->wmu);
	}
	pthread_mutex_unlock(&c->wmu);
	return NULL;
}

/* ---- open / close / register ---------------------------------------------- */

static void meta_free(struct meta *m)
{
	kvt_free(m->sums);
	kvt_free(m->state);
	kvt_free(m->rd);
	kvt_free(m->wr);
	kvt_free(m->pby);
	memset(m, 0, sizeof(*m));
}

static void stop_threads(kvt_cache *c)
{
	pthread_mutex_lock(&c->wmu);
	c->stopping = 1;
	pthread_cond_broadcast(&c->wcv);
	pthread_cond_broadcast(&c->bgcv);
	pthread_mutex_unlock(&c->wmu);
	if (c->have_bg)
		pthread_join(c->bg, NULL);
	if (c->have_worker)
		pthread_join(c->worker, NULL);
	c->have_bg = c->have_worker = 0;
}

/* A persistent ssd tier: its records, and the index rebuilt from them
 * (before any thread runs). */
static int persist_open(kvt_cache *c)
{
	kvt_tier *ssd = c->tiers[KVT_TIER_SSD];
	kvt_tier_desc d;
	int err;

	if (!ssd)
		return 0;
	kvt_tier_info(ssd, &d);
	if (!d.persistent)
		return 0;
	if (!c->verify)
		return kvti_fail(-EINVAL, "cache: a persistent ssd tier needs "
				 "checksums (every load of a restored page is "
				 "verified): drop KVT_CACHE_NO_VERIFY or "
				 "'persist'");
	if ((err = kvtp_open(&c->persist, ssd, c->tiers, c->L)))
		return err;
	return kvtp_rebuild(c->persist, c->idx, c->m[KVT_TIER_SSD].sums,
			    c->m[KVT_TIER_SSD].state, ST_OK);
}

/* Forget the records' state; the records stay for the next open. */
static void persist_close(kvt_cache *c)
{
	pthread_mutex_lock(&c->smu);
	kvtp_free(c->persist);
	c->persist = NULL;
	pthread_mutex_unlock(&c->smu);
}

static void cache_free(kvt_cache *c)
{
	stop_threads(c);
	kvt_xfer_destroy(c->x);
	persist_close(c); /* before the index gives its slots back */
	kvt_index_destroy(c->idx);
	for (int t = 0; t < KVT_TIER_COUNT; t++) {
		kvt_tier_close(c->tiers[t]);
		meta_free(&c->m[t]);
	}
	kvt_tier_close(c->stage);
	while (c->mems) {
		kvt_cache_mem *m = c->mems;

		c->mems = m->next;
		kvt_tier_close(m->t);
		kvt_free(m);
	}
	kvt_free(c->cur.mv);
	kvt_free(c->cur.sums);
	kvt_free(c->bgb.mv);
	kvt_free(c->bgb.sums);
	pthread_mutex_destroy(&c->mu);
	pthread_mutex_destroy(&c->smu);
	pthread_mutex_destroy(&c->wmu);
	pthread_cond_destroy(&c->scv);
	pthread_cond_destroy(&c->wcv);
	pthread_cond_destroy(&c->bgcv);
	kvt_free(c);
}

static int open_tiers(kvt_cache *c, const char *spec)
{
	kvt_tier_spec specs[KVT_TIER_COUNT + 1];
	size_t n;
	int err;

	if (!spec || !*spec)
		return kvti_fail(KVT_ESPEC, "cache: no tier spec");
	err = kvt_tier_spec_parse(spec, specs, KVT_ARRAY_SIZE(specs), &n);
	if (err)
		return err;
	for (size_t i = 0; i < n; i++) {
		kvt_tier_kind k = specs[i].kind;

		if (k == KVT_TIER_HBM)
			return kvti_fail(KVT_ESPEC, "cache: '%s' names an %s tier: "
					 "the engine's own memory is registered "
					 "with kvt_cache_register(), not opened "
					 "as a tier", spec, specs[i].hostdev ?
					 "hostdev" : "hbm");
		if (k == KVT_TIER_REMOTE)
			return kvti_fail(KVT_ESPEC, "cache: the remote tier is "
					 "not an owned tier: give its spec in "
					 "kvt_cache_config.remote");
		if (c->tiers[k])
			return kvti_fail(KVT_ESPEC, "cache: two %s tiers in '%s'",
					 kvt_tier_kind_name(k), spec);
		if ((err = kvt_tier_open(&c->tiers[k], &specs[i], &c->geom)))
			return err;
	}
	for (c->top = 0; c->top < KVT_TIER_COUNT && !c->tiers[c->top]; c->top++)
		;
	if (c->top == KVT_TIER_COUNT)
		return kvti_fail(KVT_ESPEC, "cache: '%s' has no tier", spec);
	return 0;
}

static int config_take(kvt_cache_config *cfg, const kvt_cache_config *in)
{
	memset(cfg, 0, sizeof(*cfg));
	if (!in)
		return kvti_fail(-EINVAL, "cache: no configuration");
	if (in->size < offsetof(kvt_cache_config, xfer_threads) +
			       sizeof(in->xfer_threads) ||
	    in->size > 4096)
		return kvti_fail(-EINVAL, "cache: configuration size %u: start "
				 "from KVT_CACHE_CONFIG_INIT", in->size);
	memcpy(cfg, in, KVT_MIN(in->size, sizeof(*cfg)));
	if (cfg->flags & ~(KVT_CACHE_NO_VERIFY | KVT_CACHE_STAGE_SSD |
			   KVT_CACHE_NO_BACKGROUND))
		return kvti_fail(-EINVAL, "cache: unknown flags 0x%x",
				 cfg->flags);
	if (!cfg->high)
		cfg->high = 0.90;
	if (!cfg->low)
		cfg->low = KVT_MIN(0.75, cfg->high);
	if (!(cfg->low > 0 && cfg->low <= cfg->high && cfg->high <= 1))
		return kvti_fail(-EINVAL, "cache: watermarks low %g, high %g: "
				 "need 0 < low <= high <= 1", cfg->low,
				 cfg->high);
	return 0;
}

static int geom_take(kvt_cache *c, const kvt_cache_config *cfg)
{
	uint32_t P = cfg->page_tokens ? cfg->page_tokens : 16;
	uint32_t tp = cfg->tp_size ? cfg->tp_size : 1;
	int err;

	if (cfg->geom) {
		c->geom = *cfg->geom;
		return kvt_geom_finish(&c->geom);
	}
	if (!cfg->model || !*cfg->model)
		return kvti_fail(-EINVAL, "cache: no geometry (set model or "
				 "geom)");
	if (strchr(cfg->model, '/') && access(cfg->model, R_OK) == 0)
		err = kvt_geom_from_config(&c->geom, cfg->model, P, tp,
					   cfg->tp_rank);
	else
		err = kvt_geom_preset(&c->geom, cfg->model, P, tp, cfg->tp_rank);
	return err;
}

int kvt_cache_open(kvt_cache **out, const kvt_cache_config *in)
{
	kvt_index_config ic = { 0 };
	kvt_xfer_config xc = { 0 };
	kvt_cache_config cfg;
	kvt_cache *c;
	int err;

	kvti_errclear();
	if (!out)
		return kvti_fail(-EINVAL, "cache open: no handle to fill");
	if ((err = config_take(&cfg, in)))
		return err;
	c = kvt_calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	pthread_mutex_init(&c->mu, NULL);
	pthread_mutex_init(&c->smu, NULL);
	pthread_mutex_init(&c->wmu, NULL);
	kvti_cond_init_mono(&c->scv);
	kvti_cond_init_mono(&c->wcv);
	kvti_cond_init_mono(&c->bgcv);
	c->verify = !(cfg.flags & KVT_CACHE_NO_VERIFY);
	c->background = !(cfg.flags & KVT_CACHE_NO_BACKGROUND);
	c->stage_ssd = !!(cfg.flags & KVT_CACHE_STAGE_SSD);
	c->high = cfg.high;
	c->low = cfg.low;
	if ((err = geom_take(c, &cfg)) || (err = open_tiers(c, cfg.tiers)))
		goto fail;
	c->L = c->geom.layers;
	for (int t = 0; t < KVT_TIER_COUNT; t++) {
		struct meta *m = &c->m[t];

		if (!c->tiers[t])
			continue;
		m->n = kvt_pool_slots(kvt_tier_pool(c->tiers[t]));
		m->sums = kvt_calloc(m->n * c->L, sizeof(uint64_t));
		m->state = kvt_calloc(m->n, 1);
		m->rd = kvt_calloc(m->n, sizeof(uint16_t));
		m->wr = kvt_calloc(m->n, sizeof(uint16_t));
		m->pby = kvt_calloc(m->n, sizeof(uint32_t));
		if (!m->sums || !m->state || !m->rd || !m->wr || !m->pby) {
			err = -ENOMEM;
			goto fail;
		}
		ic.pools[t] = kvt_tier_pool(c->tiers[t]);
	}
	xc.cpu_threads = cfg.xfer_threads;
	if ((err = kvt_xfer_create(&c->x, &xc)))
		goto fail;
	ic.page_tokens = c->geom.page_tokens;
	ic.key_mode = KVT_KEY_HASH;
	ic.evict = cfg.evict;
	ic.write = cfg.write;
	ic.selective_hits = cfg.selective_hits;
	ic.mover.copy = mover_copy;
	ic.mover.flush = mover_flush;
	ic.mover.release = mover_release;
	ic.mover.arg = c;
	if ((err = kvt_index_create(&c->idx, &ic)) ||
	    (err = persist_open(c)))
		goto fail;
	if ((err = -pthread_create(&c->worker, NULL, worker_main, c))) {
		kvti_fail(err, "cache: starting the worker thread");
		goto fail;
	}
	c->have_worker = 1;
	if (c->background) {
		if ((err = -pthread_create(&c->bg, NULL, bg_main, c))) {
			kvti_fail(err, "cache: starting the background thread");
			goto fail;
		}
		c->have_bg = 1;
	}
	/* last: it attaches staging memory to the finished cache */
	if (cfg.remote && (err = kvti_cache_remote_open(c, cfg.remote,
							  &c->remote)))
		goto fail;
	*out = c;
	return 0;
fail:
	cache_free(c);
	return err;
}

void kvt_cache_close(kvt_cache *c)
{
	struct kvti_cremote *cr;

	if (!c)
		return;
	cr = c->remote;
	kvti_cache_remote_stop(cr); /* its writer's jobs end first */
	/* cancel what is still running (a job stays on the list, and so
	 * valid, until it is finished, which takes smu) */
	pthread_mutex_lock(&c->smu);
	for (kvt_cache_job *j = c->live; j; j = j->lnext)
		kvt_cache_job_cancel(j);
	while (c->jobs)
		pthread_cond_wait(&c->scv, &c->smu);
	pthread_mutex_unlock(&c->smu);
	cache_free(c);
	kvti_cache_remote_free(cr); /* its staging memory outlived the copies */
}

static int open_stage(kvt_cache *c, int pin)
{
	kvt_tier_spec s;
	char spec[96];
	size_t n;
	int err;

	if (!c->tiers[KVT_TIER_SSD] || c->stage)
		return 0;
	snprintf(spec, sizeof(spec), "dram:%llu%s",
		 (unsigned long long)(STAGE_SLOTS * page_bytes(c)),
		 pin ? ",pin" : "");
	if ((err = kvt_tier_spec_parse(spec, &s, 1, &n)))
		return err;
	return kvt_tier_open(&c->stage, &s, &c->geom);
}

/* One (token, head) row: D*s bytes, the head stride of packed memory. */
static uint64_t row_bytes(const kvt_cache *c)
{
	return c ? (uint64_t)c->geom.head_dim * c->geom.dtype_bytes : 0;
}

/* kvt_cache_register() (@reg), kvt_cache_attach(), kvt_cache_attach_rows():
 * check, wrap, link. */
static int mem_attach(kvt_cache *c, void *const *base, uint32_t nlayers,
		      uint64_t nblocks, uint64_t block_stride,
		      uint64_t kv_stride, uint64_t token_stride,
		      uint64_t head_stride, int device, int reg,
		      kvt_cache_mem **out)
{
	kvt_cache_mem *m;
	kvt_layout l;
	kvt_tier *t = NULL;
	int err;

	kvti_errclear();
	if (!c || !base)
		return kvti_fail(-EINVAL, "cache register: no base pointers");
	if (nlayers != c->L)
		return kvti_fail(KVT_EGEOM, "cache register: %u layers, the "
				 "geometry (%s) has %u", nlayers, c->geom.name,
				 c->L);
	if (!nblocks || nblocks > KVT_POOL_MAX_SLOTS)
		return kvti_fail(-EINVAL, "cache register: %llu blocks",
				 (unsigned long long)nblocks);
	if ((err = kvt_layout_init_rows(&l, &c->geom, nblocks, block_stride,
					kv_stride, token_stride, head_stride)))
		return err;
	if (device >= 0 && kvt_layout_rows(&l) > 1)
		return kvti_fail(KVT_ENOTBUILT, "cache register: GPU memory "
				 "whose chunks are kept in rows (token stride "
				 "%llu, head stride %llu) is not supported: the "
				 "GPU copies move whole chunks",
				 (unsigned long long)token_stride,
				 (unsigned long long)head_stride);
	if (device >= 0) {
		char note[128] = "";
		int ngpu = 0;

		/* no CUDA or no such GPU first: pinning cannot help then */
		if (!kvti_cuda_built())
			return kvti_fail(KVT_ENOTBUILT, "cache register: GPU "
					 "memory in a build without CUDA");
		if ((err = kvti_cuda_device_count(&ngpu, note, sizeof(note))))
			return kvti_fail(err, "cache register: GPU memory in a "
					 "build without CUDA");
		if (device >= ngpu)
			return kvti_fail(KVT_ENODEV, "cache register: no GPU %d "
					 "(%d found%s%s)", device, ngpu,
					 note[0] ? ": " : "", note);
		for (int k = 0; k < KVT_TIER_COUNT; k++) {
			kvt_tier_desc d;

			if (!c->tiers[k] || k == KVT_TIER_SSD)
				continue;
			kvt_tier_info(c->tiers[k], &d);
			if (!d.cuda_registered)
				return kvti_fail(KVT_ESPEC, "cache register: GPU "
						 "memory is loaded by a kernel "
						 "that reads host tiers "
						 "directly: open the %s tier "
						 "with 'pin'", d.name);
		}
	}
	if (!(m = kvt_calloc(1, sizeof(*m))))
		return -ENOMEM;
	pthread_mutex_lock(&c->mu);
	if (reg && c->reg) {
		pthread_mutex_unlock(&c->mu);
		kvt_free(m);
		return kvti_fail(KVT_EBUSY, "cache register: memory is already "
				 "registered");
	}
	err = kvt_tier_wrap(&t, &l, base, device);
	if (!err && (device >= 0 || c->stage_ssd))
		err = open_stage(c, device >= 0);
	if (!err) {
		m->c = c;
		m->t = t;
		m->next = c->mems;
		c->mems = m;
		if (reg)
			c->reg = m;
		if (out)
			*out = m;
	} else {
		kvt_tier_close(t);
		kvt_free(m);
	}
	pthread_mutex_unlock(&c->mu);
	return err;
}

int kvt_cache_register(kvt_cache *c, void *const *base, uint32_t nlayers,
		       uint64_t nblocks, uint64_t block_stride,
		       uint64_t kv_stride, uint64_t token_stride, int device)
{
	return mem_attach(c, base, nlayers, nblocks, block_stride, kv_stride,
			  token_stride, row_bytes(c), device, 1, NULL);
}

int kvt_cache_attach(kvt_cache *c, void *const *base, uint32_t nlayers,
		     uint64_t nblocks, uint64_t block_stride,
		     uint64_t kv_stride, uint64_t token_stride, int device,
		     kvt_cache_mem **out)
{
	if (!out)
		return kvti_fail(-EINVAL, "cache attach: no handle to fill");
	return mem_attach(c, base, nlayers, nblocks, block_stride, kv_stride,
			  token_stride, row_bytes(c), device, 0, out);
}

int kvt_cache_attach_rows(kvt_cache *c, void *const *base, uint32_t nlayers,
			  uint64_t nblocks, uint64_t block_stride,
			  uint64_t kv_stride, uint64_t token_stride,
			  uint64_t head_stride, int device,
			  kvt_cache_mem **out)
{
	if (!out)
		return kvti_fail(-EINVAL, "cache attach: no handle to fill");
	return mem_attach(c, base, nlayers, nblocks, block_stride, kv_stride,
			  token_stride, head_stride, device, 0, out);
}

void kvt_cache_detach(kvt_cache_mem *m)
{
	kvt_cache *c;

	if (!m)
		return;
	c = m->c;
	pthread_mutex_lock(&c->smu);
	m->gone = 1;
	while (m->jobs) {
		/* cancel what runs on it; a job between job_new() and
		 * job_start() is not live yet: it starts, then ends */
		for (kvt_cache_job *j = c->live; j; j = j->lnext)
			if (j->mem == m)
				kvt_cache_job_cancel(j);
		pthread_cond_wait(&c->scv, &c->smu);
	}
	pthread_mutex_unlock(&c->smu);
	pthread_mutex_lock(&c->mu);
	for (kvt_cache_mem **p = &c->mems; *p; p = &(*p)->next)
		if (*p == m) {
			*p = m->next;
			break;
		}
	if (c->reg == m)
		c->reg = NULL;
	pthread_mutex_unlock(&c->mu);
	kvt_tier_close(m->t);
	kvt_free(m);
}

/* kvt_cache_tenant_add() with a persistent tier (c->mu held): 1 when the
 * tenant was restored with this salt (nothing to add), 0 to add it, or an
 * error. A tenant restored with another salt loses its pages first. */
static int persist_tenant(kvt_cache *c, uint32_t tenant, uint64_t salt)
{
	int keep, drop;

	pthread_mutex_lock(&c->smu);
	keep = kvtp_tenant_add(c->persist, tenant, salt, &drop);
	pthread_mutex_unlock(&c->smu);
	if (drop)
		return kvt_index_tenant_remove(c->idx, tenant);
	return keep;
}

int kvt_cache_tenant_add(kvt_cache *c, uint32_t tenant, uint64_t salt)
{
	int err = 0;

	pthread_mutex_lock(&c->mu);
	if (c->persist)
		err = persist_tenant(c, tenant, salt);
	if (!err)
		err = kvt_index_tenant_add(c->idx, tenant, salt);
	if (!err && c->persist) {
		pthread_mutex_lock(&c->smu);
		err = kvtp_tenant_note(c->persist, tenant, salt);
		pthread_mutex_unlock(&c->smu);
	}
	pthread_mutex_unlock(&c->mu);
	return err > 0 ? 0 : err;
}

int kvt_cache_tenant_quota(kvt_cache *c, uint32_t tenant, kvt_tier_kind tier,
			   uint64_t max_pages)
{
	int err;

	kvti_errclear();
	if ((unsigned)tier >= KVT_TIER_COUNT || !c->tiers[tier])
		return kvti_fail(KVT_ENOTFOUND, "cache: no owned %s tier for a "
				 "quota", (unsigned)tier < KVT_TIER_COUNT ?
				 kvt_tier_kind_name(tier) : "?");
	pthread_mutex_lock(&c->mu);
	err = kvt_index_tenant_quota(c->idx, tenant, tier, max_pages);
	pthread_mutex_unlock(&c->mu);
	return err;
}

int kvt_cache_tenant_usage(kvt_cache *c, uint32_t tenant,
			   kvt_tenant_usage *u)
{
	int err;

	kvti_errclear();
	pthread_mutex_lock(&c->mu);
	err = kvt_index_tenant_usage(c->idx, tenant, u);
	pthread_mutex_unlock(&c->mu);
	return err;
}

int kvt_cache_hash_tokens(kvt_cache *c, uint32_t tenant,
			  const uint32_t *tokens, size_t ntokens,
			  kvt_page_key *keys)
{
	int err;

	pthread_mutex_lock(&c->mu);
	err = kvt_index_hash_tokens(c->idx, tenant, tokens, ntokens, keys);
	pthread_mutex_unlock(&c->mu);
	return err;
}

/* ---- lookup ----------------------------------------------------------------- */

/* Per-page records of keys[0..n) (c->mu held): how many are in the tree. */
static int inspect(kvt_cache *c, uint32_t tenant, const kvt_page_key *keys,
		   size_t n, kvt_page_info **info, size_t *found)
{
	kvt_prefix px = { .tenant = tenant, .keys = keys, .nkeys = n };

	*info = NULL;
	*found = 0;
	if (!n)
		return 0;
	*info = kvt_malloc(n * sizeof(**info));
	if (!*info)
		return -ENOMEM;
	return kvt_index_inspect(c->idx, &px, *info, n, found);
}

/* The fastest committed copy of a page (smu held): its tier, or -1; with
 * *pend set when a copy is on its way. */
static int best_copy(kvt_cache *c, const kvt_page_info *pi, int *pend)
{
	*pend = 0;
	for (int t = 0; t < KVT_TIER_COUNT; t++) {
		uint32_t s = pi->slot[t];

		if (!c->tiers[t] || s == KVT_SLOT_NONE)
			continue;
		if (c->m[t].state[s] == ST_OK)
			return t;
		*pend |= c->m[t].state[s] == ST_PEND;
	}
	return -1;
}

/* KVT_LOOKUP_EACH: keys[i] is a one-page prefix of its own; the leading
 * run of cached ones, then the run being stored (one inspect per key,
 * under one hold of the locks). */
static int lookup_each(kvt_cache *c, uint32_t tenant, const kvt_page_key *keys,
		       size_t nkeys, unsigned flags, kvt_cache_lookup_result *r)
{
	kvt_page_info info;
	int err = 0, hits = 1;

	pthread_mutex_lock(&c->mu);
	for (size_t i = 0; i < nkeys && !err; i++) {
		kvt_prefix px = page_prefix(tenant, keys + i);
		size_t found = 0;
		int pend = 0, t = -1;

		err = kvt_index_inspect(c->idx, &px, &info, 1, &found);
		if (err)
			break;
		if (found) {
			pthread_mutex_lock(&c->smu);
			t = best_copy(c, &info, &pend);
			pthread_mutex_unlock(&c->smu);
		}
		if (hits && t >= 0) {
			r->pages++;
			r->tier_pages[t]++;
			if (flags & KVT_LOOKUP_TOUCH) {
				kvt_match m;

				err = kvt_index_match(c->idx, &px,
						      KVT_MATCH_TOUCH,
						      kvt_now_ns(), &m, NULL, 0);
			}
			continue;
		}
		hits = 0;
		if (t >= 0 || !pend)
			break;
		r->inflight++;
	}
	pthread_mutex_unlock(&c->mu);
	return err;
}

int kvt_cache_lookup(kvt_cache *c, uint32_t tenant, const kvt_page_key *keys,
		     size_t nkeys, unsigned flags, kvt_cache_lookup_result *r)
{
	kvt_page_info *info;
	size_t found, i;
	int err;

	kvti_errclear();
	if (!r || (nkeys && !keys) ||
	    (flags & ~(KVT_LOOKUP_TOUCH | KVT_LOOKUP_EACH)))
		return kvti_fail(-EINVAL, "cache lookup: bad arguments");
	memset(r, 0, sizeof(*r));
	if (flags & KVT_LOOKUP_EACH)
		return lookup_each(c, tenant, keys, nkeys, flags, r);
	pthread_mutex_lock(&c->mu);
	err = inspect(c, tenant, keys, nkeys, &info, &found);
	if (!err) {
		pthread_mutex_lock(&c->smu);
		for (i = 0; i < found; i++) {
			int pend, t = best_copy(c, &info[i], &pend);

			if (t < 0)
				break;
			r->pages++;
			r->tier_pages[t]++;
		}
		for (; i < found; i++) {
			int pend;

			if (best_copy(c, &info[i], &pend) >= 0 || !pend)
				break;
			r->inflight++;
		}
		pthread_mutex_unlock(&c->smu);
	}
	if (!err && r->pages && (flags & KVT_LOOKUP_TOUCH)) {
		kvt_prefix px = { .tenant = tenant, .keys = keys,
				  .nkeys = r->pages };
		kvt_match m;

		err = kvt_index_match(c->idx, &px, KVT_MATCH_TOUCH, kvt_now_ns(),
				      &m, NULL, 0);
	}
	pthread_mutex_unlock(&c->mu);
	kvt_free(info);
	if (!err && c->remote) /* network: outside the lock */
		kvti_cache_remote_lookup(c->remote, keys, nkeys, r);
	return err;
}

/* ---- jobs: creation ------------------------------------------------------- */

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

static int job_new(kvt_cache *c, int kind, uint32_t tenant,
		   const kvt_page_key *keys, size_t nkeys, size_t first,
		   const uint32_t *blocks, const kvt_cache_io *io,
		   kvt_cache_job **out)
{
	kvt_cache_io o = { 0 };
	kvt_cache_mem *m;
	kvt_cache_job *j;
	uint32_t *sorted;
	size_t n;

	if (!out || (nkeys && !keys) || first > nkeys ||
	    (nkeys > first && !blocks))
		return kvti_fail(-EINVAL, "cache %s: bad arguments (first %zu of "
				 "%zu keys)", kind == JOB_LOAD ? "load" :
				 "store", first, nkeys);
	if (nkeys > KVT_INDEX_MAX_PAGES)
		return kvti_fail(-E2BIG, "cache: %zu pages in one call", nkeys);
	if (io) {
		if (io->size < sizeof(uint32_t) || io->size > sizeof(o))
			return kvti_fail(-EINVAL, "cache: kvt_cache_io.size %u "
					 "(this library knows %zu)", io->size,
					 sizeof(o));
		memcpy(&o, io, io->size);
	}
	if (o.flags & ~KVT_CACHE_IO_EACH)
		return kvti_fail(-EINVAL, "cache: kvt_cache_io.flags 0x%x",
				 o.flags);
	if ((o.flags & KVT_CACHE_IO_EACH) && first)
		return kvti_fail(-EINVAL, "cache: KVT_CACHE_IO_EACH with first "
				 "%zu (each key is a prefix of its own: first "
				 "must be 0)", first);
	m = o.mem ? o.mem : c->reg;
	if (!m)
		return kvti_fail(KVT_EBUSY, "cache: no engine memory registered "
				 "(kvt_cache_register())");
	if (m->c != c)
		return kvti_fail(-EINVAL, "cache: memory attached to another "
				 "cache");
	n = nkeys - first;
	for (size_t i = 0; i < n; i++)
		if (blocks[i] >= kvt_tier_layout(m->t)->slots)
			return kvti_fail(-EINVAL, "cache: block %u out of range "
					 "(%llu blocks)", blocks[i],
					 (unsigned long long)kvt_tier_layout(
						 m->t)->slots);
	j = kvt_calloc(1, sizeof(*j));
	if (!j)
		return -ENOMEM;
	pthread_mutex_lock(&c->smu);
	if (m->gone) {
		pthread_mutex_unlock(&c->smu);
		kvt_free(j);
		return kvti_fail(KVT_EBUSY, "cache: the memory is being "
				 "detached");
	}
	m->jobs++;
	pthread_mutex_unlock(&c->smu);
	j->mem = m;
	j->memref = 1;
	j->progress = o.progress;
	j->parg = o.arg;
	j->c = c;
	j->kind = kind;
	j->tenant = tenant;
	j->nkeys = nkeys;
	j->first = first;
	j->n = n;
	j->efd = -1;
	j->t0 = kvt_now_ns();
	j->st.pages = n;
	pthread_mutex_init(&j->mu, NULL);
	kvti_cond_init_mono(&j->cv);
	j->keys = kvt_malloc((nkeys ? nkeys : 1) * sizeof(*keys));
	j->blocks = kvt_malloc((n ? n : 1) * sizeof(*blocks));
	j->failed = kvt_calloc(n ? n : 1, 1);
	sorted = kvt_malloc((n ? n : 1) * sizeof(*sorted));
	if (o.flags & KVT_CACHE_IO_EACH)
		j->pin_each = kvt_calloc(nkeys ? nkeys : 1, 1);
	j->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (!j->keys || !j->blocks || !j->failed || !sorted || j->efd < 0 ||
	    ((o.flags & KVT_CACHE_IO_EACH) && !j->pin_each)) {
		int err = j->efd < 0 ? kvti_fail(-errno, "eventfd: %s",
						 strerror(errno)) : -ENOMEM;
		j->done = 1; /* never started: nothing to wait for */
		kvt_free(sorted);
		kvt_cache_job_free(j);
		return err;
	}
	memcpy(j->keys, keys, nkeys * sizeof(*keys));
	memcpy(j->blocks, blocks, n * sizeof(*blocks));
	/* a block named twice would be written twice by one job */
	memcpy(sorted, blocks, n * sizeof(*blocks));
	qsort(sorted, n, sizeof(*sorted), cmp_u32);
	for (size_t i = 1; i < n; i++)
		if (sorted[i] == sorted[i - 1]) {
			uint32_t b = sorted[i];

			j->done = 1; /* never started */
			kvt_free(sorted);
			kvt_cache_job_free(j);
			return kvti_fail(-EINVAL, "cache: block %u named twice", b);
		}
	kvt_free(sorted);
	*out = j;
	return 0;
}

static int sub_alloc(kvt_cache *c, struct sub *s, size_t cap)
{
	cap = cap ? cap : 1;
	s->ss = kvt_malloc(cap * sizeof(*s->ss));
	s->ds = kvt_malloc(cap * sizeof(*s->ds));
	s->pg = kvt_malloc(cap * sizeof(*s->pg));
	s->sums = kvt_malloc(cap * c->L * sizeof(*s->sums));
	s->bad = kvt_calloc(cap, 1);
	return s->ss && s->ds && s->pg && s->sums && s->bad ? 0 : -ENOMEM;
}

static void sub_free(struct sub *s)
{
	kvt_xfer_job_free(s->xj);
	kvt_free(s->ss);
	kvt_free(s->ds);
	kvt_free(s->pg);
	kvt_free(s->sums);
	kvt_free(s->bad);
}

/* Submit every transfer of a set-up job; the job counts itself as one
 * unfinished job of the cache. On a submit error, transfers already
 * submitted are cancelled and finish normally (their pages fail). */
static int job_start(kvt_cache *c, kvt_cache_job *j)
{
	int err = 0, staged = 0;
	kvt_xfer_job *xj;

	pthread_mutex_lock(&c->smu);
	c->jobs++;
	j->lnext = c->live;
	if (c->live)
		c->live->lprev = j;
	c->live = j;
	pthread_mutex_unlock(&c->smu);
	j->subs_left = 1; /* held until every transfer is submitted */
	for (int k = 0; k < j->nsub; k++) {
		struct sub *s = &j->sub[k];
		int lsum = c->verify && s->src == ENGINE;
		kvt_xfer_desc d = {
			.prio = j->kind == JOB_LOAD ? KVT_XFER_PRIO_HIGH :
				KVT_XFER_PRIO_NORMAL,
			.src_slots = s->ss, .dst_slots = s->ds, .npages = s->n,
			.sums = c->verify ? s->sums : NULL,
			.bad = c->verify && !lsum ? s->bad : NULL,
			.flags = lsum ? KVT_XFER_LSUM :
				 c->verify ? KVT_XFER_LVERIFY : 0,
			.done = sub_done, .layer = sub_layer, .arg = s,
		};

		if (!s->n || k == HOLD)
			continue;
		d.src = side(j, s->src);
		d.dst = side(j, s->dst);
		pthread_mutex_lock(&j->mu);
		j->subs_left++;
		if (s->staged)
			j->stage_todo = staged = 1;
		pthread_mutex_unlock(&j->mu);
		if (s->staged)
			continue;
		if (err) {
			sub_end(s, err);
			continue;
		}
		if ((err = kvt_xfer_submit(c->x, &d, &xj))) {
			sub_end(s, err);
			continue;
		}
		pthread_mutex_lock(&j->mu);
		s->xj = xj;
		pthread_mutex_unlock(&j->mu);
	}
	if (staged)
		worker_push(c, j); /* subs_left > 0: the worker runs them */
	sub_end(&j->sub[HOLD], 0); /* drops the hold */
	return err;
}

/* KVT_CACHE_IO_EACH load (c->mu held): each page's record, and a lease
 * on each one-page prefix that has a copy (pin_each[i]); a page absent
 * or not pinnable gets a zeroed record (no copy: its block fails). */
static int inspect_each(kvt_cache *c, kvt_cache_job *j, kvt_page_info **info)
{
	*info = kvt_calloc(j->nkeys ? j->nkeys : 1, sizeof(**info));
	if (!*info)
		return -ENOMEM;
	for (size_t i = 0; i < j->nkeys; i++) {
		kvt_prefix px = page_prefix(j->tenant, j->keys + i);
		kvt_page_info pi;
		size_t found = 0;
		int err = kvt_index_inspect(c->idx, &px, &pi, 1, &found);

		if (err)
			return err; /* the tenant: nothing pinned yet matters */
		if (!found || !pi.resident || kvt_index_pin(c->idx, &px))
			continue;
		(*info)[i] = pi;
		j->pin_each[i] = 1;
		j->pinned = 1;
	}
	return 0;
}

int kvt_cache_load(kvt_cache *c, uint32_t tenant, const kvt_page_key *keys,
		   size_t nkeys, size_t first, const uint32_t *blocks,
		   kvt_cache_job **out)
{
	return kvt_cache_load_ex(c, tenant, keys, nkeys, first, blocks, NULL,
				 out);
}

int kvt_cache_load_ex(kvt_cache *c, uint32_t tenant, const kvt_page_key *keys,
		      size_t nkeys, size_t first, const uint32_t *blocks,
		      const kvt_cache_io *io, kvt_cache_job **out)
{
	kvt_page_info *info = NULL;
	kvt_cache_job *j;
	size_t found = 0, npin;
	int err;

	kvti_errclear();
	if (!out)
		return kvti_fail(-EINVAL, "cache load: no job handle to fill");
	if ((err = job_new(c, JOB_LOAD, tenant, keys, nkeys, first, blocks, io,
			   &j)))
		return err;
	for (int t = 0; t < KVT_TIER_COUNT; t++) {
		j->sub[t].cj = j;
		j->sub[t].src = t;
		j->sub[t].dst = ENGINE;
		if ((err = sub_alloc(c, &j->sub[t], j->n)))
			goto fail;
	}
	j->sub[HOLD].cj = j;
	j->nsub = KVT_TIER_COUNT;

	pthread_mutex_lock(&c->mu);
	npin = 0;
	if (j->pin_each) {
		err = inspect_each(c, j, &info);
	} else {
		err = inspect(c, tenant, keys, nkeys, &info, &found);
		/* lease the leading pages that have a copy (pin needs every
		 * page of the prefix to have one) */
		while (!err && npin < found && info[npin].resident)
			npin++;
		if (!err && npin) {
			kvt_prefix px = prefix(j, npin);
			err = kvt_index_pin(c->idx, &px);
			j->nkeys = npin;
			j->pinned = !err;
		}
	}
	pthread_mutex_unlock(&c->mu);
	if (err)
		goto fail;

	/* each page's fastest committed copy (the lease keeps it) */
	pthread_mutex_lock(&c->smu);
	for (size_t i = 0; i < j->n; i++) {
		size_t p = first + i;
		int pend = 0, t = -1;

		if (j->pin_each ? j->pin_each[p] : p < npin)
			t = best_copy(c, &info[p], &pend);
		if (t < 0) {
			/* never waited for: a load starts at once */
			j->failed[i] = 1;
			j->st.failed++;
			if (!j->result)
				j->result = pend ?
					kvti_fail(KVT_EBUSY, "cache load: page "
						  "%zu is being stored or moved: "
						  "not loadable yet", p) :
					kvti_fail(KVT_ENOTFOUND, "cache load: "
						  "page %zu is not in the cache",
						  p);
			continue;
		}
		struct sub *s = &j->sub[t];
		s->ss[s->n] = info[p].slot[t];
		s->ds[s->n] = blocks[i];
		s->pg[s->n] = i;
		memcpy(s->sums + s->n * c->L,
		       c->m[t].sums + (uint64_t)info[p].slot[t] * c->L,
		       c->L * sizeof(uint64_t));
		s->n++;
	}
	pthread_mutex_unlock(&c->smu);
	j->absent = j->st.failed;
	if (j->sub[KVT_TIER_SSD].n &&
	    (c->stage_ssd || kvt_tier_kind_of(j->mem->t) == KVT_TIER_HBM) &&
	    c->stage)
		j->sub[KVT_TIER_SSD].staged = 1;
	kvt_free(info);
	job_start(c, j);
	*out = j;
	return 0;
fail:
	kvt_free(info);
	if (j->pinned) {
		pthread_mutex_lock(&c->mu);
		job_unpin(c, j);
		pthread_mutex_unlock(&c->mu);
	}
	j->done = 1;
	kvt_cache_job_free(j);
	return err;
}

int kvt_cache_store(kvt_cache *c, uint32_t tenant, const kvt_page_key *keys,
		    size_t nkeys, size_t first, const uint32_t *blocks,
		    kvt_cache_job **out)
{
	return kvt_cache_store_ex(c, tenant, keys, nkeys, first, blocks, NULL,
				  out);
}

int kvt_cache_store_ex(kvt_cache *c, uint32_t tenant,
		       const kvt_page_key *keys, size_t nkeys, size_t first,
		       const uint32_t *blocks, const kvt_cache_io *io,
		       kvt_cache_job **out)
{
	kvt_page_loc *locs = NULL;
	kvt_page_info *info = NULL;
	kvt_insert_result res;
	kvt_cache_job *j;
	struct sub *eng;
	size_t found = 0;
	uint64_t t0;
	double w0;
	int err;

	kvti_errclear();
	if (c && c->remote && kvti_cache_remote_wants(c->remote, io))
		return kvti_cache_remote_store(c->remote, tenant, keys, nkeys,
					       first, blocks, io, out);
	if (!out)
		return kvti_fail(-EINVAL, "cache store: no job handle to fill");
	if ((err = job_new(c, JOB_STORE, tenant, keys, nkeys, first, blocks,
			   io, &j)))
		return err;
	/* sub 0: engine -> top tier; sub 1 + t: a parent promoted from t */
	for (int k = 0; k < MAX_SUBS; k++) {
		j->sub[k].cj = j;
		j->sub[k].src = k ? k - 1 : ENGINE;
		j->sub[k].dst = c->top;
	}
	j->nsub = 1 + KVT_TIER_COUNT;
	eng = &j->sub[0];
	if ((err = sub_alloc(c, eng, j->n)))
		goto fail;
	locs = kvt_malloc((nkeys ? nkeys : 1) * sizeof(*locs));
	if (!locs) {
		err = -ENOMEM;
		goto fail;
	}
	if (!nkeys)
		goto start;

	pthread_mutex_lock(&c->mu);
	if (j->pin_each) {
		/* each page its own prefix; one that finds no room fails
		 * alone (the call fails only for the tenant) */
		w0 = c->fg_wait_s;
		for (size_t i = 0; !err && i < nkeys; i++) {
			kvt_prefix px = page_prefix(tenant, keys + i);
			int e = kvt_index_insert(c->idx, &px,
						 (kvt_tier_kind)c->top,
						 KVT_INSERT_PIN, kvt_now_ns(),
						 &res, locs + i, 1);

			if (e == KVT_ENOTFOUND && !i)
				err = e; /* no such tenant */
			else if (e)
				job_fail_page(j, i, e);
			else
				j->pin_each[i] = j->pinned = 1;
		}
		j->st.wait_s += c->fg_wait_s - w0;
	} else {
		err = inspect(c, tenant, keys, nkeys, &info, &found);
	}
	if (!err && !j->pin_each) {
		size_t i = 0;
		while (i < first && i < found && info[i].resident)
			i++;
		if (i < first)
			err = kvti_fail(KVT_ENOTFOUND, "cache store: page %zu "
					"(before first %zu) is not in the cache: "
					"store it too", i, first);
	}
	for (int t = 0; !err && first && t < KVT_TIER_COUNT; t++)
		if (c->tiers[t] && t != c->top)
			err = sub_alloc(c, &j->sub[1 + t], first);
	if (!err && !j->pin_each) {
		kvt_prefix px = prefix(j, nkeys);

		w0 = c->fg_wait_s;
		err = kvt_index_insert(c->idx, &px, (kvt_tier_kind)c->top,
				       KVT_INSERT_PIN, kvt_now_ns(), &res, locs,
				       nkeys);
		j->st.wait_s += c->fg_wait_s - w0;
		j->pinned = !err;
	}
	if (err) {
		pthread_mutex_unlock(&c->mu);
		goto fail;
	}
	/* which pages get bytes, and from where; their slots go PEND */
	t0 = kvt_now_ns();
	pthread_mutex_lock(&c->smu);
	for (size_t p = 0; p < nkeys; p++) {
		if (j->pin_each && !j->pin_each[p])
			continue; /* failed above: no slot */
		struct meta *m = &c->m[c->top];
		uint32_t slot = locs[p].slot;
		uint8_t st = m->state[slot];
		struct sub *sp = eng;
		int t = ENGINE;

		if (!locs[p].fresh && (st == ST_OK || st == ST_PEND))
			continue; /* cached, or being stored or moved */
		if (p < first) {
			/* a parent promoted into the top tier, from its
			 * fastest committed copy below */
			int pend;

			t = best_copy(c, &info[p], &pend);
			if (t < 0 || t == c->top) {
				m->state[slot] = ST_BAD;
				continue;
			}
			sp = &j->sub[1 + t];
		}
		slot_settle(c, c->top, slot);
		sp->ss[sp->n] = t == ENGINE ? blocks[p - first] :
					      info[p].slot[t];
		sp->ds[sp->n] = slot;
		sp->pg[sp->n] = t == ENGINE ? p - first : SIZE_MAX;
		if (t != ENGINE)
			memcpy(sp->sums + sp->n * c->L,
			       c->m[t].sums + (uint64_t)info[p].slot[t] * c->L,
			       c->L * sizeof(uint64_t));
		sp->n++;
		slot_pend(c, c->top, slot, 0);
		if (c->persist)
			kvtp_ident_set(c->persist, c->top, slot, tenant,
				       j->pin_each ? keys + p : keys,
				       j->pin_each ? 0 : p);
	}
	j->st.skipped = j->n - eng->n - j->st.failed;
	pthread_mutex_unlock(&c->smu);
	j->st.wait_s += secs(t0);
	pthread_mutex_unlock(&c->mu);
start:
	kvt_free(locs);
	kvt_free(info);
	job_start(c, j);
	*out = j;
	return 0;
fail:
	kvt_free(locs);
	kvt_free(info);
	if (j->pinned) {
		pthread_mutex_lock(&c->mu);
		job_unpin(c, j);
		pthread_mutex_unlock(&c->mu);
	}
	j->done = 1;
	kvt_cache_job_free(j);
	return err;
}

/* ---- jobs: waiting, results ---------------------------------------------- */

/* j->mu held: 1 when every block of a load is known to have failed by now
 * (absent at the start, on a transfer that ended in error, or marked bad
 * by its checks), with *err the reason. A layer is never reported ready
 * for a block that failed at or before it; when that is every block, the
 * wait ends in this error. */
static int job_failed_now(kvt_cache_job *j, int *err)
{
	size_t n = j->absent;

	*err = j->result ? j->result : KVT_ECORRUPT;
	if (!j->n || j->kind != JOB_LOAD)
		return 0;
	for (int k = 0; k < j->nsub; k++) {
		struct sub *s = &j->sub[k];

		if (s->done && s->err) {
			n += s->n;
			*err = s->err;
			continue;
		}
		for (size_t i = 0; i < s->n; i++)
			n += __atomic_load_n(&s->bad[i], __ATOMIC_RELAXED) != 0;
	}
	return n >= j->n;
}

int kvt_cache_job_wait_layer(kvt_cache_job *j, uint32_t layer,
			     int64_t timeout_ns)
{
	struct timespec ts;
	int err = 0, why;

	if (layer >= j->c->L)
		return kvti_fail(-ERANGE, "cache job: layer %u of %u", layer,
				 j->c->L);
	if (timeout_ns >= 0)
		kvti_deadline(&ts, timeout_ns);
	pthread_mutex_lock(&j->mu);
	/* a load none of whose pages is cached copies nothing: its layers
	 * are never ready, its error comes when it is done */
	while (!j->done && (job_ready(j) <= layer || j->absent == j->n) &&
	       !err) {
		if (timeout_ns < 0)
			pthread_cond_wait(&j->cv, &j->mu);
		else
			err = -pthread_cond_timedwait(&j->cv, &j->mu, &ts);
	}
	if (err == -ETIMEDOUT && (j->done ||
				 (job_ready(j) > layer && j->absent < j->n)))
		err = 0;
	if (!err && j->done && job_all_failed(j))
		err = j->result; /* no transfer may have run: nothing landed */
	else if (!err && !j->done && job_failed_now(j, &why))
		err = why; /* every block failed at or before this layer */
	else if (!err && j->done && job_ready(j) <= layer &&
		 j->cancel && j->result == -ECANCELED)
		err = -ECANCELED;
	pthread_mutex_unlock(&j->mu);
	return err;
}

int kvt_cache_job_wait(kvt_cache_job *j, int64_t timeout_ns)
{
	struct timespec ts;
	int err = 0;

	if (timeout_ns >= 0)
		kvti_deadline(&ts, timeout_ns);
	pthread_mutex_lock(&j->mu);
	while (!j->done && !err) {
		if (timeout_ns < 0)
			pthread_cond_wait(&j->cv, &j->mu);
		else
			err = -pthread_cond_timedwait(&j->cv, &j->mu, &ts);
	}
	if (j->done)
		err = j->result;
	pthread_mutex_unlock(&j->mu);
	return err;
}

int kvt_cache_job_poll(kvt_cache_job *j)
{
	int err;

	pthread_mutex_lock(&j->mu);
	err = j->done ? j->result : -EINPROGRESS;
	pthread_mutex_unlock(&j->mu);
	return err;
}

int kvt_cache_job_fd(kvt_cache_job *j)
{
	return j->efd;
}

int kvt_cache_job_cancel(kvt_cache_job *j)
{
	kvt_xfer_job *xj[MAX_SUBS];
	int n = 0;

	pthread_mutex_lock(&j->mu);
	if (j->done) {
		pthread_mutex_unlock(&j->mu);
		return -EALREADY;
	}
	j->cancel = 1;
	for (int k = 0; k < j->nsub; k++)
		if (j->sub[k].xj && !j->sub[k].done)
			xj[n++] = j->sub[k].xj;
	pthread_mutex_unlock(&j->mu);
	/* outside j->mu: a transfer cancelled before it started ends here,
	 * and its callback takes j->mu. The handles live until the job is
	 * freed, which needs it done, which needs these transfers over. */
	for (int k = 0; k < n; k++)
		kvt_xfer_cancel(xj[k]);
	return 0;
}

long kvt_cache_job_failed(kvt_cache_job *j, uint32_t *blocks, size_t max)
{
	long n = 0;

	pthread_mutex_lock(&j->mu);
	if (!j->done) {
		pthread_mutex_unlock(&j->mu);
		return -EINPROGRESS;
	}
	pthread_mutex_unlock(&j->mu);
	for (size_t i = 0; i < j->n; i++)
		if (j->failed[i]) {
			if ((size_t)n < max)
				blocks[n] = j->blocks[i];
			n++;
		}
	return n;
}

int kvt_cache_job_read_failures(kvt_cache_job *j,
				uint64_t per_tier[KVT_TIER_COUNT])
{
	pthread_mutex_lock(&j->mu);
	if (!j->done) {
		pthread_mutex_unlock(&j->mu);
		return -EINPROGRESS;
	}
	pthread_mutex_unlock(&j->mu);
	memcpy(per_tier, j->rfail, sizeof(j->rfail));
	return 0;
}

void kvt_cache_job_stat_get(kvt_cache_job *j, kvt_cache_job_stat *st)
{
	pthread_mutex_lock(&j->mu);
	*st = j->st;
	pthread_mutex_unlock(&j->mu);
}

void kvt_cache_job_free(kvt_cache_job *j)
{
	int done;

	if (!j)
		return;
	pthread_mutex_lock(&j->mu);
	done = j->done;
	pthread_mutex_unlock(&j->mu);
	if (!done) {
		kvt_cache_job_cancel(j);
		kvt_cache_job_wait(j, -1);
	}
	/* job_finish()'s last touch ends with its critical section */
	pthread_mutex_lock(&j->mu);
	pthread_mutex_unlock(&j->mu);
	if (j->memref) { /* never started */
		pthread_mutex_lock(&j->c->smu);
		mem_unref(j->c, j);
		pthread_mutex_unlock(&j->c->smu);
	}
	for (int k = 0; k < MAX_SUBS; k++)
		sub_free(&j->sub[k]);
	if (j->efd >= 0)
		close(j->efd);
	pthread_mutex_destroy(&j->mu);
	pthread_cond_destroy(&j->cv);
	kvt_free(j->keys);
	kvt_free(j->pin_each);
	kvt_free(j->blocks);
	kvt_free(j->failed);
	kvt_free(j);
}

/* ---- accounting, checking -------------------------------------------------- */

void kvt_cache_stat_get(kvt_cache *c, kvt_cache_stat *st)
{
	pthread_mutex_lock(&c->smu);
	*st = c->st;
	pthread_mutex_unlock(&c->smu);
}

int kvt_cache_verify(kvt_cache *c, kvt_cache_check *r)
{
	uint64_t pb = page_bytes(c), lb = pb / c->L;
	char first[128] = "";
	void *page;
	int err = 0;

	memset(r, 0, sizeof(*r));
	if (!c->verify)
		return kvti_fail(-EINVAL, "cache verify: this cache keeps no "
				 "checksums (KVT_CACHE_NO_VERIFY)");
	page = kvti_aligned_alloc(4096, pb);
	if (!page)
		return -ENOMEM;
	pthread_mutex_lock(&c->smu);
	while (c->jobs) /* job_finish takes c->mu: wait before taking it */
		pthread_cond_wait(&c->scv, &c->smu);
	pthread_mutex_unlock(&c->smu);
	kvt_cache_quiesce(c);
	pthread_mutex_lock(&c->mu);
	pthread_mutex_lock(&c->smu);
	for (int t = 0; t < KVT_TIER_COUNT && !err; t++) {
		struct meta *m = &c->m[t];
		kvt_pool *pool;

		if (!c->tiers[t])
			continue;
		pool = kvt_tier_pool(c->tiers[t]);
		for (uint64_t s = 0; s < m->n; s++) {
			int ok = 1;

			if (!kvt_pool_is_used(pool, (uint32_t)s) ||
			    m->state[s] != ST_OK)
				continue;
			if ((err = kvt_tier_read(c->tiers[t], (uint32_t)s, page)))
				break;
			for (uint32_t l = 0; l < c->L && ok; l++)
				ok = XXH3_64bits((char *)page + l * lb, lb) ==
				     m->sums[s * c->L + l];
			r->checked++;
			r->per_tier[t]++;
			if (!ok && !r->bad++)
				snprintf(first, sizeof(first), "%s slot %llu",
					 kvt_tier_kind_name((kvt_tier_kind)t),
					 (unsigned long long)s);
		}
	}
	pthread_mutex_unlock(&c->smu);
	pthread_mutex_unlock(&c->mu);
	kvt_free(page);
	if (err)
		return err;
	if (r->bad)
		return kvti_fail(KVT_ECORRUPT, "cache: %llu of %llu page copies "
				 "do not match their checksums (first: %s)",
				 (unsigned long long)r->bad,
				 (unsigned long long)r->checked, first);
	return 0;
}

const kvt_geom *kvt_cache_geom(const kvt_cache *c)
{
	return &c->geom;
}

kvt_tier *kvt_cache_tier(kvt_cache *c, kvt_tier_kind k)
{
	if ((unsigned)k >= KVT_TIER_COUNT)
		return NULL;
	if (k == KVT_TIER_HBM)
		return c->reg ? c->reg->t : NULL;
	return c->tiers[k];
}

int kvt_cache_restore_info(kvt_cache *c, kvt_cache_restore *r)
{
	if (!c->persist)
		return kvti_fail(-EINVAL, "cache: no persistent ssd tier (ssd "
				 "spec option 'persist')");
	pthread_mutex_lock(&c->smu);
	kvtp_restore_stat(c->persist, r);
	pthread_mutex_unlock(&c->smu);
	return 0;
}

kvt_index *kvt_cache_index(kvt_cache *c)
{
	return c->idx;
}

kvt_xfer *kvt_cache_xfer(kvt_cache *c)
{
	return c->x;
}

/* ---- the remote tier (cache_remote.c) -------------------------------------- */

int kvt_cache_prefetch(kvt_cache *c, uint32_t tenant, const kvt_page_key *keys,
		       size_t nkeys, size_t first, uint64_t *pages)
{
	kvti_errclear();
	if (!c || !pages || (nkeys && !keys) || first > nkeys)
		return kvti_fail(-EINVAL, "cache prefetch: bad arguments");
	if (!c->remote)
		return kvti_fail(KVT_ENOTFOUND, "cache prefetch: no remote tier");
	return kvti_cache_remote_prefetch(c->remote, tenant, keys, nkeys, first,
					  pages);
}

int kvt_cache_prefetch_start(kvt_cache *c, uint32_t tenant,
			     const kvt_page_key *keys, size_t nkeys,
			     size_t first, kvt_cache_fetch **out)
{
	kvti_errclear();
	if (!c || !out || (nkeys && !keys) || first > nkeys)
		return kvti_fail(-EINVAL, "cache prefetch: bad arguments");
	if (!c->remote)
		return kvti_fail(KVT_ENOTFOUND, "cache prefetch: no remote tier");
	return kvti_cache_remote_fetch_start(c->remote, tenant, keys, nkeys,
					     first, out);
}

int kvt_cache_remote_flush(kvt_cache *c, int64_t timeout_ns)
{
	if (!c || !c->remote)
		return kvti_fail(KVT_ENOTFOUND, "cache: no remote tier");
	return kvti_cache_remote_flush(c->remote, timeout_ns);
}

int kvt_cache_remote_stat_get(kvt_cache *c, kvt_cache_remote_stat *st)
{
	if (!c || !c->remote)
		return kvti_fail(KVT_ENOTFOUND, "cache: no remote tier");
	kvti_cache_remote_stat(c->remote, st);
	return 0;
}
