/*
 * job_finish.c — the worker threads (KVTI_CACHE_WORKERS of them, so one
 * slow job never holds up the others): they finish every job once all its
 * transfers are done, and run the staged transfers through the ssd bounce
 * (ssd -> engine loads, device memory -> ssd stores).
 *
 *   load:  each page landed and verified counts; one that did not verify
 *          goes on the failed list and its source copy is marked BAD
 *   store: each destination slot goes OK (sums recorded, persisted) or
 *          BAD (its block on the failed list)
 *   (a job kvt_fault_hold_jobs() holds waits here first: tests)
 *   then:  unpin under c->mu (write-policy copies run here), leave the
 *          live list, drop the memory's count, set done, wake waiters,
 *          the eventfd and the progress callback (its last call)
 *
 * Slot states change under c->smu; the job's own fields under j->mu.
 */
#include "cache/cache_impl.h"
#include "xfer/xfer_int.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

/* Returns 1 if a slot went BAD (to reclaim). */
static int load_finish(kvt_cache *c, kvt_cache_job *j)
{
	int nbad = 0;

	pthread_mutex_lock(&c->smu);
	for (int k = 0; k < j->nsub; k++) {
		struct sub *s = &j->sub[k];

		for (size_t i = 0; i < s->n; i++) {
			int bad = __atomic_load_n(&s->bad[i], __ATOMIC_RELAXED);

			if (s->err) {
				kvti_cache_job_fail_page(j, s->pg[i], s->err);
				if (s->err != -ECANCELED)
					j->rfail[s->src]++;
			} else if (bad) {
				/* the source copy is not what was stored */
				kvti_cache_job_fail_page(j, s->pg[i],
							 KVT_ECORRUPT);
				j->rfail[s->src]++;
				if (c->m[s->src].state[s->ss[i]] == ST_OK) {
					kvti_cache_slot_bad(c, s->src,
							    s->ss[i]);
					nbad++;
				}
				c->st.corrupt++;
			} else {
				j->st.copied++;
				j->st.from[s->src]++;
				j->st.verified += c->verify;
			}
		}
	}
	j->st.bytes = j->st.copied * kvti_cache_page_bytes(c);
	c->st.loads++;
	c->st.load_pages += j->st.copied;
	c->st.load_bytes += j->st.bytes;
	c->st.verified += j->st.verified;
	c->st.failed_blocks += j->st.failed;
	pthread_mutex_unlock(&c->smu);
	return nbad > 0;
}

/* Returns 1 if a slot went BAD (to reclaim). */
static int store_finish(kvt_cache *c, kvt_cache_job *j, int cancel)
{
	const uint32_t L = c->L;
	int nbad = 0;

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
			if (ok) {
				m->state[s->ds[i]] = ST_OK;
				kvti_cache_persist_ok(c, s->dst, s->ds[i]);
			} else {
				kvti_cache_slot_bad(c, s->dst, s->ds[i]);
				nbad++;
			}
			if (ok)
				j->st.copied++;
			else
				kvti_cache_job_fail_page(j, s->pg[i],
					s->err ? s->err : cancel ?
					-ECANCELED : KVT_ECORRUPT);
			if (bad)
				c->st.corrupt++;
		}
	}
	j->st.bytes = j->st.copied * kvti_cache_page_bytes(c);
	c->st.stores++;
	c->st.store_pages += j->st.copied;
	c->st.store_bytes += j->st.bytes;
	pthread_cond_broadcast(&c->scv);
	pthread_mutex_unlock(&c->smu);
	return nbad > 0;
}

void kvti_cache_job_hold(kvt_cache_job *j, unsigned kind)
{
	uint64_t t0 = kvt_now_ns(), ns;
	int stuck = 0, cancel;

	while ((ns = kvti_fault_hold(kind, &stuck)) &&
	       kvt_now_ns() - t0 < ns) {
		pthread_mutex_lock(&j->mu);
		cancel = j->cancel;
		pthread_mutex_unlock(&j->mu);
		if (cancel && !stuck)
			break;
		usleep(1000);
	}
}

static void job_finish(kvt_cache *c, kvt_cache_job *j)
{
	uint64_t one = 1;
	kvt_cache_mem *m;
	double wait_s;
	int cancel, bad;

	kvti_cache_job_hold(j, j->kind == JOB_STORE ? KVT_FAULT_STORES :
			    KVT_FAULT_LOADS);
	pthread_mutex_lock(&j->mu);
	cancel = j->cancel;
	pthread_mutex_unlock(&j->mu);
	if (j->kind == JOB_LOAD)
		bad = load_finish(c, j);
	else
		bad = store_finish(c, j, cancel);
	if (j->pinned || bad) {
		pthread_mutex_lock(&c->mu);
		kvti_cache_job_unpin(c, j);
		/* the slots that went bad leave the index, now unleased */
		kvti_cache_reclaim(c);
		/* the write policy's copies run here, without the lock */
		j->st.wait_s += kvti_cache_unlock(c);
	}
	if (j->kind == JOB_STORE)
		kvti_cache_bg_kick(c);
	wait_s = j->st.wait_s;
	pthread_mutex_lock(&c->smu);
	if (j->lprev)
		j->lprev->lnext = j->lnext;
	else
		c->live = j->lnext;
	if (j->lnext)
		j->lnext->lprev = j->lprev;
	/* every transfer is over, but the job counts against its memory
	 * until done is set below (detach waits for its jobs to end, and
	 * the remote write-through reads j->mem): the count drops after
	 * that, through @m, never through j */
	m = j->memref ? j->mem : NULL;
	j->memref = 0;
	pthread_mutex_unlock(&c->smu);
	/* the job is the caller's once done is set: touch nothing of it
	 * after this critical section (kvt_cache_job_free() takes j->mu) */
	pthread_mutex_lock(&j->mu);
	j->st.total_s = kvti_cache_secs(j->t0);
	if (j->cancel && !j->result)
		j->result = -ECANCELED;
	/* the remote tier's write-through, before anyone sees done */
	if (j->kind == JOB_STORE && c->ext && !j->result && !j->pin_each &&
	    !j->mem->quiet && j->first < j->nkeys)
		c->ext->stored(c->ext_arg, j->tenant, j->keys, j->nkeys,
			       j->first);
	j->done = 1;
	kvti_cache_job_stamp(j, 1);
	pthread_cond_broadcast(&j->cv);
	if (write(j->efd, &one, sizeof(one)) < 0) {
		/* cannot overflow in practice */
	}
	if (j->progress) {
		kvt_cache_progress p = {
			.layers = kvti_cache_job_all_failed(j) ? 0 :
				  kvti_cache_job_ready(j),
			.done = 1, .result = j->result,
			.failed = kvti_cache_job_all_failed(j) ? j->result : 0,
		};
		j->progress(j->parg, &p);
	}
	pthread_mutex_unlock(&j->mu);
	pthread_mutex_lock(&c->smu);
	c->st.wait_s += wait_s;
	if (m && --m->jobs == 0)
		pthread_cond_broadcast(&c->scv);
	if (--c->jobs == 0)
		pthread_cond_broadcast(&c->scv);
	pthread_mutex_unlock(&c->smu);
}

/* Wait for and free a transfer; its result, or @err if that came first. */
static int xj_end(kvt_xfer_job **xj, int err)
{
	int e;

	if (!*xj)
		return err;
	e = kvt_xfer_wait(*xj, -1);
	kvt_xfer_job_free(*xj);
	*xj = NULL;
	return err ? err : e;
}

/*
 * Staged transfers through the ssd bounce tier (a worker thread, one at a
 * time: the bounce is one tier of STAGE_SLOTS pages), in rounds of half
 * the bounce each, double-buffered: while round r's second hop runs out
 * of one half, round r + 1's first hop fills the other.
 *
 *   load   ssd -> stage -> engine: into host memory both hops verify every
 *          layer; into device memory only the second, by the device over
 *          what landed, against the same sums — no CPU thread reads a
 *          page byte on the way to a GPU (a page damaged on the ssd still
 *          fails there, counted against the ssd tier). The last round's
 *          copy reports its layers to the job as they land (the earlier
 *          rounds are in place by then): layer l is ready before the last
 *          layer lands, not all of them at the end.
 *   store  engine (device memory) -> stage -> ssd: the first hop takes the
 *          layer sums on the device over the engine's blocks (after the
 *          engine's event), the second writes the bounce out.
 */
static int staged_run(kvt_cache *c, struct sub *s)
{
	const uint32_t half = STAGE_SLOTS / 2;
	uint32_t st_slots[STAGE_SLOTS];
	kvt_xfer_job *second[2] = { NULL, NULL };
	kvt_tier_desc ed;
	int err = 0, dev, store = s->src == ENGINE;
	uint64_t t0;

	kvt_tier_info(s->cj->mem->t, &ed);
	dev = !ed.hostdev;
	for (uint32_t i = 0; i < STAGE_SLOTS; i++)
		st_slots[i] = i;
	pthread_mutex_lock(&c->stage_mu);
	t0 = kvt_now_ns(); /* the bounce is ours: its first read starts */
	for (size_t off = 0, r = 0; off < s->n && !err; off += half, r++) {
		size_t k = KVT_MIN(half, s->n - off);
		int h = (int)(r % 2), last = off + k == s->n;
		uint64_t *sums = c->verify ? s->sums + off * c->L : NULL;
		kvt_xfer_desc a = { .dst = c->stage,
				    .dst_slots = st_slots + h * half,
				    .npages = k, .sums = sums };
		kvt_xfer_desc b = { .src = c->stage,
				    .src_slots = st_slots + h * half,
				    .npages = k };
		kvt_xfer_job *xj = NULL;

		if (store) {
			a.src = s->cj->mem->t;
			a.src_slots = s->ss + off;
			a.prio = b.prio = KVT_XFER_PRIO_NORMAL;
			a.flags = c->verify ? KVT_XFER_LSUM : 0;
			a.wait = s->cj->wait;
			b.dst = c->tiers[KVT_TIER_SSD];
			b.dst_slots = s->ds + off;
		} else {
			a.src = c->tiers[KVT_TIER_SSD];
			a.src_slots = s->ss + off;
			a.prio = b.prio = KVT_XFER_PRIO_HIGH;
			a.bad = c->verify && !dev ? s->bad + off : NULL;
			a.flags = c->verify && !dev ? KVT_XFER_LVERIFY : 0;
			if (dev)
				a.sums = NULL;
			b.dst = s->cj->mem->t;
			b.dst_slots = s->ds + off;
			b.sums = sums;
			b.bad = c->verify ? s->bad + off : NULL;
			b.flags = c->verify ? KVT_XFER_LVERIFY : 0;
			b.wait = s->cj->wait;
		}
		pthread_mutex_lock(&s->cj->mu);
		if (s->cj->cancel)
			err = -ECANCELED;
		pthread_mutex_unlock(&s->cj->mu);
		/* this half's previous second hop is over before it refills */
		err = xj_end(&second[h], err);
		if (!err && !(err = kvt_xfer_submit(c->x, &a, &xj)))
			err = xj_end(&xj, 0);
		if (last) { /* every earlier round in place first */
			err = xj_end(&second[!h], err);
			if (!store) {
				b.layer = kvti_cache_sub_layer;
				b.arg = s;
			}
		}
		if (!err)
			err = kvt_xfer_submit(c->x, &b, &second[h]);
	}
	err = xj_end(&second[0], err);
	err = xj_end(&second[1], err);
	pthread_mutex_unlock(&c->stage_mu);
	/* the two hops are two jobs of other tier pairs (ssd <-> the dram
	 * bounce, the bounce <-> engine memory): the run as a whole is the
	 * rate between the ssd and the engine's memory that the scheduler
	 * prices this tier's loads at (kvt_cache_rates()) */
	if (!err)
		kvti_xfer_rate_add(c->x, store ? kvt_tier_kind_of(s->cj->mem->t) :
				   KVT_TIER_SSD,
				   store ? KVT_TIER_SSD :
				   kvt_tier_kind_of(s->cj->mem->t),
				   (uint64_t)s->n * kvti_cache_page_bytes(c), t0,
				   kvt_now_ns());
	return err;
}

void *kvti_cache_worker_main(void *arg)
{
	kvt_cache *c = arg;

	kvti_thread_nice(c->nice);
	pthread_mutex_lock(&c->wmu);
	for (;;) {
		kvt_cache_job *j = c->wq;
		struct sub *staged = NULL;

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
		pthread_mutex_lock(&j->mu);
		if (j->stage_todo)
			for (int k = 0; k < j->nsub && !staged; k++)
				if (j->sub[k].staged)
					staged = &j->sub[k];
		j->stage_todo = 0;
		pthread_mutex_unlock(&j->mu);
		/* a staged load handed over at start (one staged sub: ssd);
		 * its kvti_cache_sub_end() may queue the job again to finish
		 * it, on another worker: nothing of it is touched after */
		if (staged)
			kvti_cache_sub_end(staged, staged_run(c, staged));
		else
			job_finish(c, j);
		pthread_mutex_lock(&c->wmu);
	}
	pthread_mutex_unlock(&c->wmu);
	return NULL;
}
