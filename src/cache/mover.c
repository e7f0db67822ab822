/*
 * mover.c — the copies the index asks for (its mover callbacks), run as
 * batches in dependency waves, and the background thread that keeps every
 * owned tier under its high watermark (cache_impl.h has the structures and
 * the locks; slot.c the slot states and marks used here).
 *
 *   index call (c->mu)          mover_copy(): the move joins c->cur; its
 *     evict / demote / copy       destination takes the sums, goes PEND,
 *                                 marks taken (rd on source, wr on dest)
 *   end of the call             mover_flush(): a synchronous call runs the
 *                                 batch now (c->mu held, counted as
 *                                 fg_wait_s); the background thread keeps
 *                                 it in c->bgb and runs it after dropping
 *                                 c->mu
 *   batch_run()                 wave by wave: one xfer job per (source,
 *                                 destination) tier pair, each page
 *                                 verified; a wave's moves end (marks
 *                                 dropped, destination OK or BAD) together
 *
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
 *    (kvti_cache_slot_settle()).
 * So waits point one way (towards the background batch), never in a cycle.
 */
#include "cache/cache_impl.h"
#include "xfer/xxh.h"

#include <errno.h>
#include <string.h>
#include <time.h>

static int batch_add(kvt_cache *c, struct batch *b, size_t more)
{
	if (kvti_grow((void **)&b->mv, &b->cap, b->n + more, sizeof(*b->mv),
		      64) ||
	    kvti_grow((void **)&b->sums, &b->scap, b->n + more,
		      c->L * sizeof(*b->sums), 64))
		return -ENOMEM;
	return 0;
}

int kvti_cache_mover_copy(void *arg, const kvt_move *m)
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
		kvti_cache_slot_pend(c, mv->dst, mv->ds, c->batch);
		sm->rd[mv->ss]++;
		dm->wr[mv->ds]++;
	} else {
		dm->state[mv->ds] = ST_BAD;
	}
	pthread_mutex_unlock(&c->smu);
	b->n++;
	return 0;
}

void kvti_cache_mover_release(void *arg, kvt_tier_kind tier, uint32_t slot)
{
	kvt_cache *c = arg;

	pthread_mutex_lock(&c->smu);
	if (c->m[tier].state[slot] != ST_PEND) {
		c->m[tier].state[slot] = ST_NONE;
		kvti_cache_persist_gone(c, tier, slot);
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
	c->st.move_bytes += cnt * kvti_cache_page_bytes(c);
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
			kvti_cache_persist_ok(c, mv->dst, mv->ds);
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
void kvti_cache_mover_flush(void *arg)
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
	c->fg_wait_s += kvti_cache_secs(t0);
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

void *kvti_cache_bg_main(void *arg)
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
			c->st.bg_s += kvti_cache_secs(t0);
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

void kvti_cache_bg_kick(kvt_cache *c)
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
