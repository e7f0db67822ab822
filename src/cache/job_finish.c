/*
 * job_finish.c — the worker thread: it finishes every job once all its
 * transfers are done, and runs the staged transfers through the ssd
 * bounce (ssd -> engine loads, device memory -> ssd stores).
 *
 *   load:  each page landed and verified counts; one that did not verify
 *          goes on the failed list and its source copy is marked BAD
 *   store: each destination slot goes OK (sums recorded, persisted) or
 *          BAD; a bad source copy of a promoted parent is marked BAD too
 *   then:  unpin under c->mu (write-policy copies run here), leave the
 *          live list, drop the memory's count, set done, wake waiters,
 *          the eventfd and the progress callback (its last call)
 *
 * Slot states change under c->smu; the job's own fields under j->mu.
 */
#include "cache/cache_impl.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

static void load_finish(kvt_cache *c, kvt_cache_job *j)
{
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
					c->m[s->src].state[s->ss[i]] = ST_BAD;
					kvti_cache_persist_gone(c, s->src,
								s->ss[i]);
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
				kvti_cache_persist_ok(c, s->dst, s->ds[i]);
			if (s->src == ENGINE && s->pg[i] != SIZE_MAX) {
				if (ok) {
					j->st.copied++;
				} else {
					kvti_cache_job_fail_page(j, s->pg[i],
						s->err ? s->err : cancel ?
						-ECANCELED : KVT_ECORRUPT);
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
				kvti_cache_persist_gone(c, s->src, s->ss[i]);
			}
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
		pthread_mutex_lock(&c->mu);
		kvti_cache_job_unpin(c, j);
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
	/* every transfer is over: detach may go on */
	kvti_cache_mem_unref(c, j);
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
	if (--c->jobs == 0)
		pthread_cond_broadcast(&c->scv);
	pthread_mutex_unlock(&c->smu);
}

/* Staged transfers through the ssd bounce tier, STAGE_SLOTS pages at a
 * time (worker thread), layers reported when the last round is in:
 *   load   ssd -> stage -> engine: into host memory both hops verify
 *          every layer; into device memory only the second, by the
 *          device over what landed, against the same sums — no CPU
 *          thread reads a page byte on the way to a GPU (a page damaged
 *          on the ssd still fails there, counted against the ssd tier)
 *   store  engine (device memory) -> stage -> ssd: the first hop takes
 *          the layer sums on the device over the engine's blocks (after
 *          the engine's event), the second writes the bounce out */
static int staged_run(kvt_cache *c, struct sub *s)
{
	uint32_t st_slots[STAGE_SLOTS];
	kvt_tier_desc ed;
	int err = 0, dev, store = s->src == ENGINE;

	kvt_tier_info(s->cj->mem->t, &ed);
	dev = !ed.hostdev;
	for (uint32_t i = 0; i < STAGE_SLOTS; i++)
		st_slots[i] = i;
	for (size_t off = 0; off < s->n && !err; off += STAGE_SLOTS) {
		size_t k = KVT_MIN(STAGE_SLOTS, s->n - off);
		uint64_t *sums = c->verify ? s->sums + off * c->L : NULL;
		kvt_xfer_desc a = { .dst = c->stage, .dst_slots = st_slots,
				    .npages = k, .sums = sums };
		kvt_xfer_desc b = { .src = c->stage, .src_slots = st_slots,
				    .npages = k };
		kvt_xfer_job *xj;

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

void *kvti_cache_worker_main(void *arg)
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
			 * kvti_cache_sub_end() queues the job again to
			 * finish it */
			for (int k = 0; k < j->nsub; k++)
				if (j->sub[k].staged)
					kvti_cache_sub_end(&j->sub[k],
						staged_run(c, &j->sub[k]));
		} else {
			job_finish(c, j);
		}
		pthread_mutex_lock(&c->wmu);
	}
	pthread_mutex_unlock(&c->wmu);
	return NULL;
}
