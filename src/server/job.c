/*
 * job.c — a connection's jobs: LOAD, STORE (and their _EACH forms),
 * CANCEL, RELEASE, and the remote prefetch a LOOKUP starts.
 *
 *   LOAD/STORE (slot s) --> kvt_cache_load_ex/_store_ex(io.mem, io.progress)
 *        c->jobs[s] = job                      |
 *                                              v  the cache's threads
 *   client: futex wait on slot s  <---  on_progress(): result / failed,
 *           (shared page, read-only)     then the word (release), FUTEX_WAKE,
 *                                        eventfd +1 when done
 *   RELEASE s --> result, stats, failed blocks; the slot is free again
 *
 * The slot page (MAX_JOBS * KVTD_SLOT_BYTES, proto.h) is written by the
 * daemon only. Each slot's stream value also goes to the client's wait
 * words when it gave us some (WAITS): memory the client writes too (it
 * ends its streams' waits when it loses us), so the daemon only advances
 * those words (kvtd_stream_advance(), bounded) and never reads them for
 * anything else: a client scribbling there hurts only its own streams. A job is made and freed by its connection thread only
 * (c->jobs[] written under c->mu, for the reaper and close); the reaper
 * may cancel it (daemon.c). kvti_job_free() cancels a job still running
 * and waits for it, so its progress callback never outlives it.
 */
#include "server/daemon_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static _Atomic uint32_t *slot_word(struct conn *c, uint32_t s)
{
	return (_Atomic uint32_t *)(c->slots + (size_t)s * KVTD_SLOT_BYTES);
}

static _Atomic uint32_t *stream_word(struct conn *c, uint32_t s)
{
	return (_Atomic uint32_t *)(c->slots + (size_t)s * KVTD_SLOT_BYTES +
				    KVTD_SLOT_STREAM_OFF);
}

static void slot_put(struct conn *c, uint32_t s, int off, int32_t v)
{
	uint8_t *p = c->slots + (size_t)s * KVTD_SLOT_BYTES + off;
	__atomic_store_n((int32_t *)p, v, __ATOMIC_RELAXED);
}

static void futex_wake(_Atomic uint32_t *w)
{
	syscall(SYS_futex, w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Slot @s's stream value: the slot page's word, and the client's wait
 * word when there are wait words (WAITS). */
static void stream_set(struct conn *c, uint32_t s, uint32_t v)
{
	atomic_store_explicit(stream_word(c, s), v, memory_order_release);
	futex_wake(stream_word(c, s));
	if (c->waits) {
		kvtd_stream_advance(&c->waits[s], v);
		futex_wake((_Atomic uint32_t *)&c->waits[s]);
	}
}

/* The cache's threads, under the cache job's lock: publish progress. */
/* A job leaves the running gauges (once: at done, or at free). */
static void job_uncount(struct job *j)
{
	kvtd *d = j->c->d;

	if (atomic_exchange(&j->counted, 0)) {
		atomic_fetch_sub(&d->running_jobs, 1);
		atomic_fetch_sub(&d->running_pages, (int64_t)j->pages);
	}
}

static void on_progress(void *arg, const kvt_cache_progress *p)
{
	struct job *j = arg;
	struct conn *c = j->c;
	uint32_t w = KVT_MIN(p->layers, KVTD_SLOT_LAYERS);

	if (p->failed) {
		slot_put(c, j->slot, 8, p->failed);
		w |= KVTD_SLOT_FAILED;
	}
	if (p->done) {
		slot_put(c, j->slot, 4, p->result);
		w |= KVTD_SLOT_DONE;
		job_uncount(j);
		kvtd_metrics_observe(c->d->m, c->t->mt, j->store ?
				     KVTD_OP_STORE : KVTD_OP_LOAD,
				     kvt_now_ns() - j->t0);
	}
	/* when: before the word, so a reader of the word sees it (or later) */
	__atomic_store_n((uint64_t *)(c->slots + (size_t)j->slot *
				      KVTD_SLOT_BYTES + KVTD_SLOT_STAMP_OFF),
			 kvt_now_ns(), __ATOMIC_RELAXED);
	atomic_store_explicit(slot_word(c, j->slot), w, memory_order_release);
	futex_wake(slot_word(c, j->slot));
	/* the word an engine's stream waits on: layers, or the end */
	stream_set(c, j->slot, KVTD_STREAM_WORD(j->gen, p->done || p->failed ?
			KVTD_STREAM_END : KVT_MIN(p->layers, KVTD_STREAM_END - 1)));
	if (p->done) {
		uint64_t one = 1;
		if (write(c->efd, &one, sizeof(one)) < 0) {
			/* the counter cannot overflow in practice */
		}
	}
}

/* conn->mu not held; the conn thread only. */
void kvti_job_free(struct conn *c, uint32_t s)
{
	struct job *j;

	pthread_mutex_lock(&c->mu);
	j = c->jobs[s];
	c->jobs[s] = NULL;
	if (j)
		c->njobs--;
	pthread_mutex_unlock(&c->mu);
	if (!j)
		return;
	if (!j->dropped && kvt_cache_job_poll(j->cj) == -EINPROGRESS)
		kvtd_metrics_lease_expiry(c->d->m, c->t->mt,
					  KVTD_LEASE_DISCONNECT, 1);
	kvt_cache_job_free(j->cj); /* cancels and waits if still running */
	job_uncount(j);
	kvt_free(j);
}

/*
 * The conn thread, at the connection's end, before any kvti_job_free():
 * every job still running is cancelled first, then each is waited for.
 * Cancelling and waiting slot by slot is not the same: the cache finishes
 * jobs on a few workers (KVTI_CACHE_WORKERS), first come first served, so
 * a job cancelled and waited for could sit in their queue behind this
 * connection's later jobs, not cancelled yet, holding every worker for as
 * long as a stuck device holds them (test_server_stuck "queued": a
 * minute; a drain whose reaper ran late left that to this teardown). The
 * reaper no longer sees these jobs (the conn has left d->conns); c->jobs[]
 * is this thread's to read.
 */
void kvti_jobs_cancel_all(struct conn *c)
{
	for (uint32_t s = 0; s < MAX_JOBS; s++) {
		struct job *j = c->jobs[s];

		if (!j || kvt_cache_job_cancel(j->cj) == -EALREADY)
			continue; /* none, or done */
		j->dropped = 1;
		kvtd_metrics_lease_expiry(c->d->m, c->t->mt,
					  KVTD_LEASE_DISCONNECT, 1);
	}
}

kvt_page_key *kvti_keys_copy(const uint8_t *p, uint32_t n)
{
	kvt_page_key *k = kvt_malloc((n ? n : 1) * sizeof(*k));

	if (k)
		for (uint32_t i = 0; i < n; i++)
			k[i] = kvtd_key_at(p, i);
	return k;
}

/* The fastest owned tier (where stores and prefetches land). */
static int top_tier(kvtd *d)
{
	for (int k = KVT_TIER_FABRIC; k < KVT_TIER_REMOTE; k++)
		if (kvt_cache_tier(d->c, (kvt_tier_kind)k))
			return k;
	return KVT_TIER_DRAM;
}

/* End this client's prefetch: @cut 1 keeps what arrived and stops. */
void kvti_fetch_end(struct conn *c, int cut)
{
	uint64_t pages = 0;

	if (!c->fetch)
		return;
	kvt_cache_prefetch_end(c->fetch, cut, &pages);
	c->fetch = NULL;
	if (pages) /* remote -> the top owned tier */
		kvtd_metrics_bytes(c->d->m, c->t->mt, KVTD_END_REMOTE,
				   (enum kvtd_end)top_tier(c->d), pages *
				   kvt_geom_page_bytes(c->d->g));
}

void kvti_fetch_start(struct conn *c, const kvt_page_key *keys,
		      size_t nkeys, size_t first)
{
	kvti_fetch_end(c, 1); /* one at a time per client */
	if (kvt_cache_prefetch_start(c->d->c, c->itenant, keys, nkeys, first,
				     &c->fetch))
		c->fetch = NULL; /* a miss: the engine computes them */
}

/* LOAD / STORE (each: LOAD_EACH / STORE_EACH, KVT_CACHE_IO_EACH) */
int kvti_job_start(struct conn *c, const kvtd_req *q, int store, int each)
{
	kvtd *d = c->d;
	uint32_t s = q->u.job.slot, n = q->u.job.nkeys - q->u.job.first;
	kvt_cache_io io = KVT_CACHE_IO_INIT;
	struct cmem *cm = kvti_mem_find(c, q->u.job.mem_id);
	kvt_page_key *keys = NULL;
	uint32_t *blocks = NULL;
	struct job *j = NULL;
	void *ev = NULL;
	int err;

	if (q->u.job.event_id &&
	    !(ev = kvti_event_find(c, q->u.job.event_id)))
		return kvti_perr(c, KVTD_PERR_NOT_OWNER,
			    kvti_fail(KVT_ENOTFOUND, "%s: no event %u registered "
				      "by this client", store ? "STORE" : "LOAD",
				      q->u.job.event_id));
	if (ev && cm && cm->device < 0)
		return kvti_fail(-EINVAL, "%s: a device event on a job in host "
				 "memory", store ? "STORE" : "LOAD");
	if (!cm)
		return kvti_perr(c, KVTD_PERR_NOT_OWNER,
			    kvti_fail(KVT_ENOTFOUND,
			    "%s: no memory %u registered by this client",
			    store ? "STORE" : "LOAD", q->u.job.mem_id));
	if (s >= MAX_JOBS)
		return kvti_perr(c, KVTD_PERR_NOT_OWNER, kvti_fail(-EINVAL,
			    "%s: job slot %u (0..%u)", store ? "STORE" :
			    "LOAD", s, MAX_JOBS - 1));
	if (c->jobs[s])
		return kvti_perr(c, KVTD_PERR_ORDER, kvti_fail(KVT_EBUSY,
			    "%s: job slot %u is in use (RELEASE it first)",
			    store ? "STORE" : "LOAD", s));
	if (atomic_load(&d->draining))
		return kvti_fail(KVT_EBUSY, "%s: the daemon is stopping",
				 store ? "STORE" : "LOAD");
	/* the request is scheduled: whatever the prefetch brought is used */
	kvti_fetch_end(c, 1);
	keys = kvti_keys_copy(q->u.job.keys, q->u.job.nkeys);
	blocks = kvt_malloc((n ? n : 1) * sizeof(*blocks));
	j = kvt_calloc(1, sizeof(*j));
	if (!keys || !blocks || !j) {
		err = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < n; i++)
		blocks[i] = kvtd_u32_at(q->u.job.blocks, i);
	j->c = c;
	j->slot = s;
	j->pages = q->u.job.nkeys;
	j->store = store;
	j->t0 = kvt_now_ns();
	j->deadline = j->t0 + (uint64_t)d->cfg.lease_ms * 1000000ull;
	/* a fresh slot: generation up, nothing ready */
	j->gen = kvtd_u32_at(c->slots + (size_t)s * KVTD_SLOT_BYTES, 3) + 1;
	slot_put(c, s, 12, (int32_t)j->gen);
	slot_put(c, s, 4, 0);
	slot_put(c, s, 8, 0);
	atomic_store_explicit(slot_word(c, s), 0, memory_order_release);
	stream_set(c, s, KVTD_STREAM_WORD(j->gen, 0));
	io.mem = cm->m;
	io.progress = on_progress;
	io.arg = j;
	io.flags = each ? KVT_CACHE_IO_EACH : 0;
	io.wait = ev;
	/* counted before it can end (its done may come before the call
	 * returns) */
	atomic_store(&j->counted, 1);
	atomic_fetch_add(&d->running_jobs, 1);
	atomic_fetch_add(&d->running_pages, (int64_t)j->pages);
	err = store ? kvt_cache_store_ex(d->c, c->itenant, keys,
					 q->u.job.nkeys, q->u.job.first,
					 blocks, &io, &j->cj)
		    : kvt_cache_load_ex(d->c, c->itenant, keys, q->u.job.nkeys,
					q->u.job.first, blocks, &io, &j->cj);
	if (!err) { /* the reaper sees it from now on */
		pthread_mutex_lock(&c->mu);
		c->jobs[s] = j;
		c->njobs++;
		pthread_mutex_unlock(&c->mu);
		/* the reaper sleeps until the earliest lease's end: this one
		 * may be the earliest now */
		pthread_mutex_lock(&d->mu);
		pthread_cond_broadcast(&d->cv);
		pthread_mutex_unlock(&d->mu);
		j = NULL;
	} else {
		job_uncount(j);
	}
out:
	kvt_free(keys);
	kvt_free(blocks);
	kvt_free(j);
	return err;
}

int kvti_job_release(struct conn *c, const kvtd_hdr *h, uint32_t s)
{
	kvt_cache_job_stat st;
	struct job *j = s < MAX_JOBS ? c->jobs[s] : NULL;
	uint32_t *failed = NULL;
	long nf;
	int res;

	if (!j)
		return kvti_reply_status(c, h, kvti_perr(c,
				KVTD_PERR_NOT_OWNER, kvti_fail(KVT_ENOTFOUND,
				"RELEASE: no job in slot %u", s)));
	res = kvt_cache_job_poll(j->cj);
	if (res == -EINPROGRESS)
		return kvti_reply_status(c, h, kvti_fail(KVT_EBUSY,
				"RELEASE: job in slot %u is not done (CANCEL "
				"it, wait, then RELEASE)", s));
	kvt_cache_job_stat_get(j->cj, &st);
	nf = kvt_cache_job_failed(j->cj, NULL, 0);
	if (nf > 0 && !(failed = kvt_malloc((size_t)nf * sizeof(*failed))))
		return kvti_reply_status(c, h, -ENOMEM);
	if (nf > 0)
		kvt_cache_job_failed(j->cj, failed, (size_t)nf);
	/* metrics: what the load read, what it could not */
	if (!j->store) {
		for (int t = 0; t < KVT_TIER_COUNT; t++)
			if (st.from[t])
				kvtd_metrics_bytes(c->d->m, c->t->mt,
						   (enum kvtd_end)t,
						   KVTD_END_ENGINE,
						   st.from[t] *
						   kvt_geom_page_bytes(c->d->g));
		/* copies there but not readable right, by tier (absent or
		 * busy blocks were misses, counted at lookup) */
		uint64_t rf[KVT_TIER_COUNT];

		if (st.failed && !kvt_cache_job_read_failures(j->cj, rf))
			for (int t = 0; t < KVT_TIER_COUNT; t++) {
				if (!rf[t])
					continue;
				kvtd_metrics_read_failure(c->d->m, c->t->mt,
							  (kvt_tier_kind)t,
							  rf[t]);
				if (res == KVT_ECORRUPT)
					kvtd_metrics_checksum_failure(c->d->m,
						c->t->mt, (kvt_tier_kind)t,
						rf[t]);
			}
	} else if (st.bytes) {
		kvtd_metrics_bytes(c->d->m, c->t->mt, KVTD_END_ENGINE,
				   (enum kvtd_end)top_tier(c->d), st.bytes);
	}
	kvti_reply_begin(c, h, 0);
	kvtd_put_u32(&c->out, (uint32_t)res);
	kvtd_put_u64(&c->out, st.pages);
	kvtd_put_u64(&c->out, st.copied);
	kvtd_put_u64(&c->out, st.skipped);
	kvtd_put_u64(&c->out, st.failed);
	kvtd_put_u64(&c->out, st.verified);
	kvtd_put_u64(&c->out, st.bytes);
	kvtd_put_u32(&c->out, KVT_TIER_COUNT);
	for (int t = 0; t < KVT_TIER_COUNT; t++)
		kvtd_put_u64(&c->out, st.from[t]);
	kvtd_put_f64(&c->out, st.wait_s);
	kvtd_put_f64(&c->out, st.layer0_s);
	kvtd_put_f64(&c->out, st.total_s);
	kvtd_put_u64(&c->out, st.busy);
	kvtd_put_u64(&c->out, st.absent);
	kvtd_put_u32(&c->out, (uint32_t)(nf > 0 ? nf : 0));
	for (long i = 0; i < nf; i++)
		kvtd_put_u32(&c->out, failed[i]);
	kvt_free(failed);
	kvti_job_free(c, s);
	return kvti_reply_send(c, NULL, 0);
}

int kvti_job_cancel(struct conn *c, uint32_t s)
{
	struct job *j = s < MAX_JOBS ? c->jobs[s] : NULL;
	int err;

	if (!j)
		return kvti_perr(c, KVTD_PERR_NOT_OWNER,
				 kvti_fail(KVT_ENOTFOUND,
					   "CANCEL: no job in slot %u", s));
	err = kvt_cache_job_cancel(j->cj);
	return err == -EALREADY ? 0 : err;
}

/* ---- wait words (WAITS) ---------------------------------------------------- */

/*
 * The client's wait words: hostile input like everything else. The daemon
 * maps the memfd only when nothing can make the mapping fault: a regular
 * file that says its seals (a memfd), sealed against shrinking and growing
 * (and against new seals), of exactly the size it expects. Whatever the
 * client writes into it later the daemon never reads except to advance a
 * word (kvtd_stream_advance(), bounded).
 */
int kvti_waits_register(struct conn *c, const kvtd_req *q, int fd)
{
	const int need = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
	size_t len = KVTD_WAITS_BYTES(MAX_JOBS);
	struct stat st;
	uint32_t *w;
	int seals, njobs;

	pthread_mutex_lock(&c->mu);
	njobs = c->njobs;
	pthread_mutex_unlock(&c->mu);
	if (c->waits)
		return kvti_perr(c, KVTD_PERR_ORDER, kvti_fail(-EEXIST,
				 "WAITS: this connection has its wait words"));
	if (njobs)
		return kvti_perr(c, KVTD_PERR_ORDER, kvti_fail(KVT_EBUSY,
				 "WAITS: %d jobs are running (send WAITS "
				 "before the first LOAD or STORE)", njobs));
	if (q->u.id != MAX_JOBS)
		return kvti_perr(c, KVTD_PERR_MALFORMED, kvti_fail(-EINVAL,
				 "WAITS: %u words, the daemon has %u job slots",
				 q->u.id, MAX_JOBS));
	if (fstat(fd, &st) || !S_ISREG(st.st_mode))
		return kvti_perr(c, KVTD_PERR_MALFORMED, kvti_fail(-EINVAL,
				 "WAITS: the descriptor is not a memfd"));
	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 || (seals & need) != need)
		return kvti_perr(c, KVTD_PERR_MALFORMED, kvti_fail(-EINVAL,
				 "WAITS: the memfd must be sealed with "
				 "F_SEAL_SHRINK, F_SEAL_GROW and F_SEAL_SEAL "
				 "(it has %#x): one that could shrink would "
				 "fault the daemon's writes", seals < 0 ? 0 :
				 (unsigned)seals));
	if ((uint64_t)st.st_size != len)
		return kvti_perr(c, KVTD_PERR_MALFORMED, kvti_fail(-EINVAL,
				 "WAITS: a memfd of %lld bytes (%zu expected)",
				 (long long)st.st_size, len));
	w = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (w == MAP_FAILED)
		return kvti_perr(c, KVTD_PERR_MALFORMED, kvti_fail(-errno,
				 "WAITS: mapping the memfd: %s (sealed against "
				 "writes?)", strerror(errno)));
	c->waits = w; /* jobs made after this see it */
	return 0;
}

/* The conn thread, once every job is freed. */
void kvti_waits_drop(struct conn *c)
{
	if (c->waits)
		munmap(c->waits, KVTD_WAITS_BYTES(MAX_JOBS));
	c->waits = NULL;
}
