/*
 * job.c — a job's life (cache_impl.h: struct kvt_cache_job, struct sub):
 * creation and checks of the request, submission of its transfers,
 * progress reported by the transfer engine, waiting and results, freeing.
 * What a load or a store puts in a job is in load.c and store.c; finishing
 * (commit, unpin) on the worker threads in job_finish.c.
 *
 *   kvti_cache_job_new()     the request checked and copied; the job counts
 *                            against its engine memory (detach waits)
 *   load.c / store.c         fill the subs: one transfer per (source,
 *                            destination), slots, sums, request indices
 *   kvti_cache_job_start()   the job joins c->live; every sub is submitted
 *                            (staged ones handed to the worker); a hold on
 *                            subs_left keeps the job from finishing before
 *                            the last submit
 *   sub_layer / sub_done     (xfer threads, j->mu) layers landed, reports
 *                            to kvt_cache_io.progress; the last sub queues
 *                            the job for the worker
 *   job_finish.c             commits, unpins, sets done, wakes waiters
 *
 * j->mu guards the progress fields; a job is the caller's once done is
 * set, and is freed only by kvt_cache_job_free(), which waits for done.
 */
#include "cache/cache_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* Unpin what the job pinned: its prefix, or (KVT_CACHE_IO_EACH) each
 * page's own one-page prefix (c->mu held). */
void kvti_cache_job_unpin(kvt_cache *c, kvt_cache_job *j)
{
	if (j->pin_each) {
		for (size_t i = 0; i < j->nkeys; i++) {
			kvt_prefix px = kvti_cache_page_prefix(j->tenant,
							       j->keys + i);

			if (j->pin_each[i])
				kvt_index_unpin(c->idx, &px);
			j->pin_each[i] = 0;
		}
	} else if (j->pinned) {
		kvt_prefix px = kvti_cache_prefix(j, j->nkeys);

		kvt_index_unpin(c->idx, &px);
	}
	j->pinned = 0;
}

void kvti_cache_job_fail_page(kvt_cache_job *j, size_t i, int err)
{
	if (!j->failed[i]) {
		j->failed[i] = 1;
		j->st.failed++;
		if (!j->result)
			j->result = err;
	}
}

/* ---- jobs: progress from the transfer engine --------------------------- */

uint32_t kvti_cache_job_ready(kvt_cache_job *j)
{
	uint32_t r = j->c->L;

	for (int i = 0; i < j->nsub; i++)
		if (j->sub[i].n)
			r = KVT_MIN(r, j->sub[i].landed);
	return r;
}

/* j->mu held: stamp the layers that became ready since the last call
 * (@done: the job ended, every layer is as ready as it will be). */
void kvti_cache_job_stamp(kvt_cache_job *j, int done)
{
	uint32_t r = done ? j->c->L : kvti_cache_job_ready(j);
	uint64_t now;

	if (r <= j->stamped)
		return;
	if (!done && j->absent == j->n)
		return; /* nothing copied: no layer is ready until done */
	now = kvt_now_ns();
	for (uint32_t l = j->stamped; l < r; l++)
		j->ready_ns[l] = now;
	j->stamped = r;
}

static int job_failed_now(kvt_cache_job *j, int *err);

int kvti_cache_job_all_failed(kvt_cache_job *j)
{
	return j->n && j->st.failed == j->n;
}

/* c->smu held: the job no longer counts against its memory (detach waits
 * for that). */
void kvti_cache_mem_unref(kvt_cache *c, kvt_cache_job *j)
{
	if (j->memref && --j->mem->jobs == 0)
		pthread_cond_broadcast(&c->scv);
	j->memref = 0;
}

/* j->mu held: tell a kvt_cache_io progress callback what changed (layers
 * ready, every block failed); the final report is job_finish()'s. */
static void job_report(kvt_cache_job *j)
{
	kvt_cache_progress p = { .layers = kvti_cache_job_ready(j) };
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

void kvti_cache_sub_layer(kvt_xfer_job *xj, uint32_t layer, void *arg)
{
	struct sub *s = arg;
	kvt_cache_job *j = s->cj;

	pthread_mutex_lock(&j->mu);
	if (layer + 1 > s->landed)
		s->landed = layer + 1;
	if (!j->st.layer0_s && j->absent < j->n && kvti_cache_job_ready(j) > 0)
		j->st.layer0_s = kvti_cache_secs(j->t0);
	kvti_cache_job_stamp(j, 0);
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
void kvti_cache_sub_end(struct sub *s, int err)
{
	kvt_cache_job *j = s->cj;
	int last;

	pthread_mutex_lock(&j->mu);
	s->err = err;
	s->done = 1;
	if (!err)
		s->landed = j->c->L;
	if (!j->st.layer0_s && j->absent < j->n &&
	    kvti_cache_job_ready(j) > 0 && !err)
		j->st.layer0_s = kvti_cache_secs(j->t0);
	last = --j->subs_left == 0;
	kvti_cache_job_stamp(j, 0);
	job_report(j);
	pthread_cond_broadcast(&j->cv);
	pthread_mutex_unlock(&j->mu);
	if (last)
		worker_push(j->c, j);
}

static void sub_done(kvt_xfer_job *xj, int err, void *arg)
{
	/* (staged loads have no callback: the worker runs and ends them) */
	kvti_cache_sub_end(arg, err);
}

/* ---- jobs: creation ------------------------------------------------------- */

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

int kvti_cache_job_new(kvt_cache *c, int kind, uint32_t tenant,
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
	j->wait = o.wait;
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
	j->ready_ns = kvt_calloc(c->L ? c->L : 1, sizeof(*j->ready_ns));
	sorted = kvt_malloc((n ? n : 1) * sizeof(*sorted));
	if (o.flags & KVT_CACHE_IO_EACH)
		j->pin_each = kvt_calloc(nkeys ? nkeys : 1, 1);
	j->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (!j->keys || !j->blocks || !j->failed || !j->ready_ns || !sorted ||
	    j->efd < 0 ||
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

int kvti_cache_sub_alloc(kvt_cache *c, struct sub *s, size_t cap)
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

/* Start a set-up job: it counts itself as one unfinished job of the
 * cache, and every transfer is submitted. On a submit error, transfers
 * already submitted are cancelled and finish normally (their pages
 * fail); so does every transfer of a job cancelled before it was
 * submitted (a store that waited for room). */
void kvti_cache_job_link(kvt_cache *c, kvt_cache_job *j)
{
	pthread_mutex_lock(&c->smu);
	c->jobs++;
	j->lnext = c->live;
	if (c->live)
		c->live->lprev = j;
	c->live = j;
	pthread_mutex_unlock(&c->smu);
}

int kvti_cache_job_start(kvt_cache *c, kvt_cache_job *j)
{
	kvti_cache_job_link(c, j);
	return kvti_cache_job_submit(c, j);
}

int kvti_cache_job_submit(kvt_cache *c, kvt_cache_job *j)
{
	int err = 0, staged = 0;
	kvt_xfer_job *xj;

	pthread_mutex_lock(&j->mu);
	j->subs_left = 1; /* held until every transfer is submitted */
	if (j->cancel) /* while it waited for room: nothing is copied */
		err = -ECANCELED;
	pthread_mutex_unlock(&j->mu);
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
			.done = sub_done, .layer = kvti_cache_sub_layer,
			.arg = s,
			.wait = s->src == ENGINE || s->dst == ENGINE ?
				j->wait : NULL,
		};

		if (!s->n || k == HOLD)
			continue;
		d.src = kvti_cache_side(j, s->src);
		d.dst = kvti_cache_side(j, s->dst);
		pthread_mutex_lock(&j->mu);
		j->subs_left++;
		if (s->staged)
			j->stage_todo = staged = 1;
		pthread_mutex_unlock(&j->mu);
		if (s->staged)
			continue;
		if (err) {
			kvti_cache_sub_end(s, err);
			continue;
		}
		if ((err = kvt_xfer_submit(c->x, &d, &xj))) {
			kvti_cache_sub_end(s, err);
			continue;
		}
		pthread_mutex_lock(&j->mu);
		s->xj = xj;
		pthread_mutex_unlock(&j->mu);
	}
	if (staged)
		worker_push(c, j); /* subs_left > 0: the worker runs them */
	kvti_cache_sub_end(&j->sub[HOLD], 0); /* drops the hold */
	return err;
}

/* A job set up but never started (an error in load or store): unpin what
 * it pinned and free it. */
void kvti_cache_job_abort(kvt_cache *c, kvt_cache_job *j)
{
	if (j->pinned) {
		pthread_mutex_lock(&c->mu);
		kvti_cache_job_unpin(c, j);
		kvti_cache_unlock(c);
	}
	j->done = 1;
	kvt_cache_job_free(j);
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
	while (!j->done && !err &&
	       (kvti_cache_job_ready(j) <= layer || j->absent == j->n)) {
		if (timeout_ns < 0)
			pthread_cond_wait(&j->cv, &j->mu);
		else
			err = -pthread_cond_timedwait(&j->cv, &j->mu, &ts);
	}
	if (err == -ETIMEDOUT &&
	    (j->done || (kvti_cache_job_ready(j) > layer && j->absent < j->n)))
		err = 0;
	if (!err && j->done && kvti_cache_job_all_failed(j))
		err = j->result; /* no transfer may have run: nothing landed */
	else if (!err && !j->done && job_failed_now(j, &why))
		err = why; /* every block failed at or before this layer */
	else if (!err && j->done && kvti_cache_job_ready(j) <= layer &&
		 j->cancel && j->result == -ECANCELED)
		err = -ECANCELED;
	pthread_mutex_unlock(&j->mu);
	return err;
}

uint64_t kvt_cache_job_layer_ns(kvt_cache_job *j, uint32_t layer)
{
	uint64_t t = 0;

	if (layer >= j->c->L)
		return 0;
	pthread_mutex_lock(&j->mu);
	if (layer < j->stamped)
		t = j->ready_ns[layer];
	pthread_mutex_unlock(&j->mu);
	return t;
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
		kvti_cache_mem_unref(j->c, j);
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
	kvt_free(j->ready_ns);
	kvt_free(j);
}
