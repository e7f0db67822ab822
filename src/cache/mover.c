/*
 * mover.c — the copies the index asks for (its mover callbacks), run as
 * batches in dependency waves after c->mu is dropped, and the background
 * thread that keeps every owned tier under its high watermark
 * (cache_impl.h has the structures and the locks; slot.c the slot states
 * and marks used here).
 *
 *   index call (c->mu)          kvti_cache_mover_copy(): the move joins
 *     evict / demote / copy       c->cur, the batch of this hold of c->mu
 *                                 (its id taken with the first move); the
 *                                 destination takes the sums and goes
 *                                 PEND, marks are taken: rd on the source,
 *                                 wr on the destination
 *   kvti_cache_unlock()         takes c->cur, drops c->mu, then runs the
 *                                 batch: c->mu is never held across a copy
 *   batch_run()                 in batch id order (one batch runs at a
 *                                 time), wave by wave: one xfer job per
 *                                 (source, destination) tier pair, each
 *                                 page verified; a wave's moves end
 *                                 together (marks dropped; a destination
 *                                 the batch writes for the last time goes
 *                                 OK or BAD, an earlier write of it stays
 *                                 PEND)
 *
 * Every copy the index asks for joins the batch of the current hold of
 * c->mu; the thread that drops the lock runs it (a job's unpin on the
 * worker, a touching lookup, a quota change, the background pass), so a
 * caller waits only for the copies its own call caused, and no one else
 * waits behind them for the lock. A store's batch is the exception: the
 * store queues itself with it on the room thread before it drops c->mu
 * (kvti_cache_room_defer()) and returns; the room thread runs the batch,
 * waits out the store's fresh slots' fences and submits its transfers, so
 * the engine's thread never waits for room. A batch's waves order its own
 * moves: a move goes one wave after any earlier move of the batch that
 * wrote its source or read or wrote its destination (the slot reuse of a
 * demotion chain).
 *
 * A demotion chain writes one slot several times in one batch: making room
 * for page a in dram evicts dram slot s (its page to ssd, wave 0), a goes
 * into s (wave 1); making room for b evicts s again (a to ssd, wave 2), b
 * goes into s (wave 3), and so on. The index and s's sums name the last
 * page from the moment it is decided, so s commits only when the batch's
 * last write of it ends: a load that found it OK after wave 1 would read
 * a's bytes as that last page's (a checksum failure, or worse without
 * verification). A write that fails in the middle of a chain fails the
 * batch's later reads of that slot (struct slotmap.failed), not the slot.
 *
 * Who waits for whom:
 *  - batches run one at a time in the order they were decided (ids taken
 *    under c->mu): a batch meets the slots of an earlier one only after
 *    that one is over (the index may free a slot an earlier batch still
 *    reads, or evict a page an earlier batch still writes), and a source
 *    an earlier batch failed to write is BAD by then (the move fails);
 *  - the room thread takes stores in the order of their batch ids (each
 *    queued under c->mu, with its id), so the batch it waits for in
 *    batch_run() is never one queued behind it: every earlier batch is
 *    either ahead of it in the queue or run by the thread that decided
 *    it, right after it dropped c->mu, waiting only for earlier ones;
 *    nothing the room thread does waits for a worker;
 *  - a store writes a fresh slot only once no batch holds a mark on it
 *    (kvti_cache_slot_settle(), on the room thread after its own batch):
 *    the marks it waits for belong to batches decided before it was,
 *    which run without waiting for anyone but earlier batches.
 * So waits point from later to earlier decisions, never in a cycle, and
 * none is taken with c->mu held.
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
	uint8_t st;

	pthread_mutex_lock(&c->smu);
	st = sm->state[m->src_slot];
	pthread_mutex_unlock(&c->smu);
	/* no page behind the source (it failed, or never landed): the move
	 * is cancelled, the index drops a demoted page (nothing to keep) */
	if (st != ST_OK && st != ST_PEND)
		return -EIO;
	if (batch_add(c, b, 1))
		return -ENOMEM; /* the index cancels this move */
	if (!c->batch)
		c->batch = ++c->batch_seq ? c->batch_seq : ++c->batch_seq;
	mv = &b->mv[b->n];
	memset(mv, 0, sizeof(*mv));
	mv->src = (uint8_t)m->src;
	mv->dst = (uint8_t)m->dst;
	mv->ss = m->src_slot;
	mv->ds = m->dst_slot;
	pthread_mutex_lock(&c->smu);
	memcpy(b->sums + b->n * c->L, sm->sums + (uint64_t)mv->ss * c->L,
	       c->L * sizeof(uint64_t));
	/* the destination holds this page from now on (a reader of it waits
	 * for our write: PEND) */
	memcpy(dm->sums + (uint64_t)mv->ds * c->L, b->sums + b->n * c->L,
	       c->L * sizeof(uint64_t));
	if (c->persist)
		kvtp_ident_copy(c->persist, mv->src, mv->ss, mv->dst, mv->ds);
	kvti_cache_slot_pend(c, mv->dst, mv->ds, c->batch);
	sm->rd[mv->ss]++;
	dm->wr[mv->ds]++;
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

/* Per slot a batch touches: the last wave that read / wrote it, the move
 * that writes it last, and whether what the batch last wrote there failed
 * (so the batch's later reads of it fail too). */
struct slotmap {
	uint64_t *key;
	int32_t *rd, *wr;
	size_t *last;
	uint8_t *failed;
	size_t mask;
};

static void slotmap_free(struct slotmap *m)
{
	kvt_free(m->key);
	kvt_free(m->rd);
	kvt_free(m->wr);
	kvt_free(m->last);
	kvt_free(m->failed);
}

static int slotmap_init(struct slotmap *m, size_t n)
{
	size_t cap = 16;

	while (cap < 4 * n)
		cap *= 2;
	m->key = kvt_malloc(cap * sizeof(*m->key));
	m->rd = kvt_malloc(cap * sizeof(*m->rd));
	m->wr = kvt_malloc(cap * sizeof(*m->wr));
	m->last = kvt_malloc(cap * sizeof(*m->last));
	m->failed = kvt_calloc(cap, sizeof(*m->failed));
	if (!m->key || !m->rd || !m->wr || !m->last || !m->failed) {
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
		m->last[i] = SIZE_MAX;
	}
	return i;
}

/* Order a batch in dependency waves: a move goes one wave after any
 * earlier move that wrote its source or read or wrote its destination
 * (the slot reuse of a demotion chain), and mark each slot's last write
 * (mv->last). Uses @m (freed by the caller). Returns the number of waves,
 * or -ENOMEM. */
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
		mv->last = 0;
		m->rd[s] = KVT_MAX(m->rd[s], w);
		m->wr[d] = w;
		m->last[d] = i;
		top = KVT_MAX(top, (uint32_t)w + 1);
	}
	for (size_t i = 0; i <= m->mask; i++)
		if (m->key[i] != UINT64_MAX && m->last[i] != SIZE_MAX)
			b->mv[m->last[i]].last = 1;
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

#define IN_PAIR(m) ((m).wave == w && (m).src == s && (m).dst == d && \
		    !(m).err)
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

/* Release a move's marks and, if it is the batch's last write of its
 * destination, commit it (smu held). An earlier write of the same slot in
 * the batch (a demotion chain through one slot: page a in, a out, b in,
 * ...) leaves it PEND: the slot's sums and the index already belong to the
 * last page written there, so committing on an earlier write would serve
 * another page's bytes as that page's. */
static void move_end(kvt_cache *c, struct move *mv, uint32_t batch)
{
	struct meta *d = &c->m[mv->dst];

	c->m[mv->src].rd[mv->ss]--;
	d->wr[mv->ds]--;
	if (mv->last && d->state[mv->ds] == ST_PEND &&
	    d->pby[mv->ds] == batch) {
		if (mv->err) {
			kvti_cache_slot_bad(c, mv->dst, mv->ds);
		} else {
			d->state[mv->ds] = ST_OK;
			kvti_cache_persist_ok(c, mv->dst, mv->ds);
		}
	}
}

static uint32_t next_id(uint32_t id)
{
	return ++id ? id : 1;
}

/* Run batch @b (id @batch) wave by wave, committing each wave as it ends,
 * once every batch decided before it is over. No lock held. */
static void batch_run(kvt_cache *c, struct batch *b, uint32_t batch)
{
	struct slotmap m;
	int nw, failed;

	pthread_mutex_lock(&c->smu);
	while (c->run_next != batch)
		pthread_cond_wait(&c->scv, &c->smu);
	pthread_mutex_unlock(&c->smu);
	nw = assign_waves(b, &m);
	if (nw < 0) { /* no memory to order them: nothing moves */
		pthread_mutex_lock(&c->smu);
		for (size_t i = 0; i < b->n; i++) {
			b->mv[i].err = nw;
			b->mv[i].last = 1; /* every destination fails */
			move_end(c, &b->mv[i], batch);
		}
		goto out;
	}
	for (int w = 0; w < nw; w++) {
		pthread_mutex_lock(&c->smu);
		for (size_t i = 0; i < b->n; i++) {
			struct move *mv = &b->mv[i];

			/* an earlier write of its source (an earlier wave, an
			 * earlier batch) failed: nothing to copy */
			if (mv->wave == (uint32_t)w &&
			    (m.failed[slotmap_at(&m, mv->src, mv->ss)] ||
			     c->m[mv->src].state[mv->ss] == ST_BAD))
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

			if (mv->wave != (uint32_t)w)
				continue;
			m.failed[slotmap_at(&m, mv->dst, mv->ds)] =
				mv->err != 0;
			move_end(c, mv, batch);
		}
		pthread_cond_broadcast(&c->scv);
		pthread_mutex_unlock(&c->smu);
	}
	slotmap_free(&m);
	pthread_mutex_lock(&c->smu);
out: /* smu held */
	c->run_next = next_id(batch);
	pthread_cond_broadcast(&c->scv);
	failed = c->nbad > 0;
	pthread_mutex_unlock(&c->smu);
	if (failed) { /* the copies that failed leave the index at once */
		pthread_mutex_lock(&c->mu);
		kvti_cache_reclaim(c); /* (decides no copy) */
		pthread_mutex_unlock(&c->mu);
	}
}

/* c->mu held: take the batch of this hold of the lock, drop the lock, run
 * the batch. Returns the seconds spent waiting for its turn and copying
 * (0 when the hold decided no copy). */
double kvti_cache_unlock(kvt_cache *c)
{
	struct batch b = c->cur;
	uint32_t id = c->batch;
	uint64_t t0;

	memset(&c->cur, 0, sizeof(c->cur));
	c->batch = 0;
	pthread_mutex_unlock(&c->mu);
	if (!id) {
		kvt_free(b.mv);
		kvt_free(b.sums);
		return 0;
	}
	t0 = kvt_now_ns();
	batch_run(c, &b, id);
	kvt_free(b.mv);
	kvt_free(b.sums);
	return kvti_cache_secs(t0);
}

/* ---- the room thread: a store's room, off the caller's thread ---------- */

void kvti_cache_room_defer(kvt_cache *c, kvt_cache_job *j)
{
	j->rb = c->cur;
	j->rid = c->batch;
	memset(&c->cur, 0, sizeof(c->cur));
	c->batch = 0;
	kvti_cache_job_link(c, j);
	/* queued before mu drops: the queue holds batch ids in order, so the
	 * room thread never waits for a batch queued behind it */
	pthread_mutex_lock(&c->rmu);
	j->rnext = NULL;
	if (c->rq_tail)
		c->rq_tail->rnext = j;
	else
		c->rq = j;
	c->rq_tail = j;
	pthread_cond_signal(&c->rcv);
	pthread_mutex_unlock(&c->rmu);
	pthread_mutex_unlock(&c->mu);
}

/* Make one queued store's room: its batch in turn (batch_run() waits only
 * for earlier batches: those queued before it here, or run by the thread
 * that decided them right after it dropped mu), then its fresh slots'
 * fences (marks of batches decided before it, all over by then or about
 * to be), then its transfers. */
static void room_run(kvt_cache *c, kvt_cache_job *j)
{
	uint64_t t0 = kvt_now_ns();
	double s;

	kvti_cache_job_hold(j, KVT_FAULT_ROOM); /* tests: its call returned */
	if (j->rid)
		batch_run(c, &j->rb, j->rid);
	kvt_free(j->rb.mv);
	kvt_free(j->rb.sums);
	memset(&j->rb, 0, sizeof(j->rb));
	pthread_mutex_lock(&c->smu);
	for (int k = 0; k < j->nsub; k++)
		for (size_t i = 0; i < j->sub[k].n; i++)
			kvti_cache_slot_settle(c, j->sub[k].dst,
					       j->sub[k].ds[i]);
	pthread_mutex_unlock(&c->smu);
	s = kvti_cache_secs(t0);
	pthread_mutex_lock(&j->mu);
	j->st.wait_s += s;
	pthread_mutex_unlock(&j->mu);
	kvti_cache_job_submit(c, j); /* its errors end the job's transfers */
}

void *kvti_cache_room_main(void *arg)
{
	kvt_cache *c = arg;

	kvti_thread_nice(c->nice);
	pthread_mutex_lock(&c->rmu);
	for (;;) {
		kvt_cache_job *j = c->rq;

		if (!j) {
			if (c->rstop)
				break;
			pthread_cond_wait(&c->rcv, &c->rmu);
			continue;
		}
		c->rq = j->rnext;
		if (!c->rq)
			c->rq_tail = NULL;
		pthread_mutex_unlock(&c->rmu);
		room_run(c, j); /* the job may be done (and freed) after */
		pthread_mutex_lock(&c->rmu);
	}
	pthread_mutex_unlock(&c->rmu);
	return NULL;
}

/* ---- the background thread: demotion above the high watermark ---------- */

/* One pass (c->mu held): evict every owned tier above its high mark down
 * to its low mark. Returns 1 if it decided anything. */
static int bg_decide(kvt_cache *c)
{
	int any = 0;

	kvti_cache_reclaim(c); /* failed copies give their room back */
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
	return any;
}

void *kvti_cache_bg_main(void *arg)
{
	kvt_cache *c = arg;

	kvti_thread_nice(c->nice);
	pthread_mutex_lock(&c->wmu);
	while (!c->stopping) {
		struct timespec ts;
		uint64_t t0;
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
		kvti_cache_unlock(c); /* its copies, without the lock */
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
