/*
 * job.c — a transfer job's life after submit: started, layers landing
 * (callbacks in layer order), units counted down, the one finish, the
 * engine's counters that finish feeds; and the caller's side: poll, wait,
 * wait for a layer, cancel, status, free.
 *
 *   lane threads: kvti_job_started -> kvti_job_layer_landed(l) ... ->
 *   kvti_job_units_done(n) -- units_left hits 0 --> job_finish():
 *     layers_ready = all (no error) -> layer callbacks -> counters ->
 *     result, finishing -> done callback -> state DONE, waiters woken ->
 *     eventfd +1 -> the engine's unfinished count -1 -> drop a ref
 *
 * Invariants (xfer_impl.h has them all): whoever counts units_left to 0
 * finishes the job, so it finishes exactly once; the first error wins
 * (kvti_job_fail); a wait returns after the done callback, except on the
 * callback's own thread, which sees its job done; a job is freed when
 * both its refs (the caller's and the engine's) are dropped.
 *
 * Locking: j->mu guards state, result, finishing, layers_ready and the
 * waiters' condition; j->cb_mu serialises layer callbacks and is never
 * held with j->mu; cancel takes j->mu, drops it, then takes x->mu (x->mu
 * before j->mu is the engine's order, never the other way round).
 */
#include "xfer/xfer_impl.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- job life ------------------------------------------------------- */

void kvti_job_put(struct kvt_xfer_job *j)
{
	if (atomic_fetch_sub(&j->refs, 1) != 1)
		return;
	pthread_mutex_destroy(&j->mu);
	pthread_cond_destroy(&j->cv);
	pthread_mutex_destroy(&j->cb_mu);
	kvt_free(j->layer_left);
	kvt_free(j->slots);
	kvt_free(j);
}

void kvti_job_fail(struct kvt_xfer_job *j, int err, const char *fmt, ...)
{
	int zero = 0;
	va_list ap;

	if (!atomic_compare_exchange_strong(&j->err, &zero, err))
		return;
	va_start(ap, fmt);
	vsnprintf(j->detail, sizeof(j->detail), fmt, ap);
	va_end(ap);
}

void kvti_job_started(struct kvt_xfer_job *j)
{
	pthread_mutex_lock(&j->mu);
	if (j->state == KVT_XFER_QUEUED) {
		j->state = KVT_XFER_RUNNING;
		j->t_start = kvt_now_ns();
	}
	pthread_mutex_unlock(&j->mu);
}

/* Deliver layer callbacks up to layers_ready, in order, one thread at a
 * time. */
static void deliver_layers(struct kvt_xfer_job *j)
{
	uint32_t ready;

	if (!j->d.layer)
		return;
	pthread_mutex_lock(&j->cb_mu);
	pthread_mutex_lock(&j->mu);
	ready = j->layers_ready;
	pthread_mutex_unlock(&j->mu);
	while (j->layers_told < ready)
		j->d.layer(j, j->layers_told++, j->d.arg);
	pthread_mutex_unlock(&j->cb_mu);
}

void kvti_job_layer_landed(struct kvt_xfer_job *j, uint32_t layer)
{
	int moved = 0;

	pthread_mutex_lock(&j->mu);
	if (!kvti_job_stopped(j)) {
		while (j->layers_ready < j->layers &&
		       (j->layer_left ?
				atomic_load(&j->layer_left[j->layers_ready]) == 0 :
				j->layers_ready <= layer)) {
			j->layers_ready++;
			moved = 1;
		}
	}
	if (moved)
		pthread_cond_broadcast(&j->cv);
	pthread_mutex_unlock(&j->mu);
	if (moved)
		deliver_layers(j);
}

static const char *const mover_names[KVT_XFER_MOVER_COUNT] = {
	"cpu", "io", "copy_engine", "kernel",
};
static const char *const flow_names[KVT_XFER_FLOW_COUNT] = {
	"restore", "save", "tier",
};

const char *kvt_xfer_mover_name(int m)
{
	return m >= 0 && m < KVT_XFER_MOVER_COUNT ? mover_names[m] : "?";
}

const char *kvt_xfer_flow_name(int f)
{
	return f >= 0 && f < KVT_XFER_FLOW_COUNT ? flow_names[f] : "?";
}


/* What a finished job moved and hashed, into the engine's counters. */
static void job_count(struct kvt_xfer *x, struct kvt_xfer_job *j, int err)
{
	XFER_ADD(x->jobs, 1);
	if (err) {
		XFER_ADD(x->failed_jobs, 1);
		return;
	}
	XFER_ADD(x->moved[j->mover][j->flow], j->bytes);
	if (!(j->d.flags & XFER_ANY_SUMS))
		return;
	if (lane_is_dev(j->lane))
		XFER_ADD(x->dev_hashed[j->flow], j->bytes);
	else
		XFER_ADD(x->cpu_hashed[j->flow], j->bytes);
}

void kvti_xfer_count_dev_sums(struct kvt_xfer_job *j, uint64_t n)
{
	XFER_ADD(j->x->dev_verified, n);
}

void kvt_xfer_stat_get(kvt_xfer *x, kvt_xfer_stat *st)
{
	memset(st, 0, sizeof(*st));
	for (int m = 0; m < KVT_XFER_MOVER_COUNT; m++)
		for (int f = 0; f < KVT_XFER_FLOW_COUNT; f++)
			st->bytes[m][f] = atomic_load(&x->moved[m][f]);
	for (int f = 0; f < KVT_XFER_FLOW_COUNT; f++) {
		st->cpu_hashed[f] = atomic_load(&x->cpu_hashed[f]);
		st->dev_hashed[f] = atomic_load(&x->dev_hashed[f]);
	}
	st->dev_verified = atomic_load(&x->dev_verified);
	st->dev_failed = atomic_load(&x->dev_failed);
	st->jobs = atomic_load(&x->jobs);
	st->failed_jobs = atomic_load(&x->failed_jobs);
	st->method_substituted = atomic_load(&x->method_substituted);
}

/* The job is over: its callback runs first, then waiters are released
 * (so a wait returns after the callback), then the eventfd ticks (so a
 * poll after the tick sees the job done). */
static void job_finish(struct kvt_xfer_job *j)
{
	struct kvt_xfer *x = j->x;
	int err = atomic_load(&j->err);
	uint64_t one = 1;

	if (!err && atomic_load(&j->cancel)) {
		err = -ECANCELED;
		snprintf(j->detail, sizeof(j->detail), "transfer cancelled");
	}
	pthread_mutex_lock(&j->mu);
	if (!err && j->layers_ready < j->layers) {
		j->layers_ready = j->layers;
		pthread_cond_broadcast(&j->cv);
	}
	pthread_mutex_unlock(&j->mu);
	if (!err)
		deliver_layers(j);
	job_count(x, j, err);
	pthread_mutex_lock(&j->mu);
	j->result = err;
	j->finishing = 1;
	j->cb_thread = pthread_self();
	if (!j->t_start)
		j->t_start = kvt_now_ns();
	j->t_end = kvt_now_ns();
	pthread_mutex_unlock(&j->mu);
	if (!err)
		kvti_rate_job_done(x, j);
	if (j->d.done)
		j->d.done(j, err, j->d.arg);
	pthread_mutex_lock(&j->mu);
	j->state = KVT_XFER_DONE;
	pthread_cond_broadcast(&j->cv);
	pthread_mutex_unlock(&j->mu);
	if (write(x->efd, &one, sizeof(one)) < 0) {
		/* the counter cannot overflow in practice; nothing to do */
	}
	pthread_mutex_lock(&x->mu);
	if (--x->unfinished == 0)
		pthread_cond_broadcast(&x->idle_cv);
	pthread_mutex_unlock(&x->mu);
	kvti_job_put(j);
}

void kvti_job_units_done(struct kvt_xfer_job *j, size_t n)
{
	int io = j->lane == LANE_IO; /* read first: once our units are
					counted down, j may be gone */
	size_t left = atomic_fetch_sub(&j->units_left, n) - n;

	if (left == 0)
		job_finish(j);
	else if (left == 1 && io)
		kvti_io_final(j);
}

/* ---- waiting, status, cancel --------------------------------------- */

static int job_result(struct kvt_xfer_job *j)
{
	if (j->result)
		kvti_fail(j->result, "%s", j->detail);
	return j->result;
}

/* Done as this thread sees it (j->mu held): DONE, or finishing and this
 * is the thread running the done callback. */
static int is_done(struct kvt_xfer_job *j, uint32_t layer)
{
	return j->state == KVT_XFER_DONE ||
	       (j->finishing && pthread_equal(j->cb_thread, pthread_self()));
}

static int layer_in(struct kvt_xfer_job *j, uint32_t layer)
{
	return j->layers_ready > layer || is_done(j, layer);
}

int kvt_xfer_poll(kvt_xfer_job *j)
{
	int done;

	pthread_mutex_lock(&j->mu);
	done = is_done(j, 0);
	pthread_mutex_unlock(&j->mu);
	return done ? job_result(j) : -EINPROGRESS;
}


/* Wait on j->cv (j->mu held) until @ready(j) or the deadline. */
static int wait_until(struct kvt_xfer_job *j, int64_t timeout_ns,
		      int (*ready)(struct kvt_xfer_job *, uint32_t),
		      uint32_t layer)
{
	struct timespec ts;

	if (timeout_ns >= 0)
		kvti_deadline(&ts, timeout_ns);
	while (!ready(j, layer)) {
		if (timeout_ns < 0)
			pthread_cond_wait(&j->cv, &j->mu);
		else if (pthread_cond_timedwait(&j->cv, &j->mu, &ts) == ETIMEDOUT &&
			 !ready(j, layer))
			return -ETIMEDOUT;
	}
	return 0;
}


int kvt_xfer_wait(kvt_xfer_job *j, int64_t timeout_ns)
{
	int err;

	pthread_mutex_lock(&j->mu);
	err = wait_until(j, timeout_ns, is_done, 0);
	pthread_mutex_unlock(&j->mu);
	if (err)
		return kvti_fail(err, "transfer still running after %lld ns",
				 (long long)timeout_ns);
	return job_result(j);
}

int kvt_xfer_wait_layer(kvt_xfer_job *j, uint32_t layer, int64_t timeout_ns)
{
	int err, ready;

	if (layer >= j->layers)
		return kvti_fail(-ERANGE, "layer %u of a %u-layer model", layer,
				 j->layers);
	pthread_mutex_lock(&j->mu);
	err = wait_until(j, timeout_ns, layer_in, layer);
	ready = j->layers_ready > layer;
	pthread_mutex_unlock(&j->mu);
	if (err)
		return kvti_fail(err, "layer %u still moving after %lld ns",
				 layer, (long long)timeout_ns);
	return ready ? 0 : job_result(j);
}

int kvt_xfer_cancel(kvt_xfer_job *j)
{
	struct kvt_xfer *x;
	size_t n;

	pthread_mutex_lock(&j->mu);
	if (j->state == KVT_XFER_DONE || j->finishing) {
		pthread_mutex_unlock(&j->mu);
		return -EALREADY;
	}
	x = j->x; /* valid: the job is not done, so the engine lives */
	atomic_store(&j->cancel, 1);
	pthread_mutex_unlock(&j->mu);
	pthread_mutex_lock(&x->mu);
	n = kvti_retire_unclaimed(x, j);
	pthread_mutex_unlock(&x->mu);
	if (n)
		kvti_job_units_done(j, n);
	return 0;
}

void kvt_xfer_job_free(kvt_xfer_job *j)
{
	int done;

	if (!j)
		return;
	pthread_mutex_lock(&j->mu);
	done = is_done(j, 0); /* a callback freeing its own job: done */
	pthread_mutex_unlock(&j->mu);
	if (!done) {
		kvt_xfer_cancel(j);
		pthread_mutex_lock(&j->mu);
		wait_until(j, -1, is_done, 0);
		pthread_mutex_unlock(&j->mu);
	}
	kvti_job_put(j);
}

void kvt_xfer_status_get(kvt_xfer_job *j, kvt_xfer_status *st)
{
	memset(st, 0, sizeof(*st));
	pthread_mutex_lock(&j->mu);
	st->state = j->state;
	st->err = j->state == KVT_XFER_DONE ? j->result : 0;
	st->layers_ready = j->layers_ready;
	st->start_ns = j->t_start;
	st->end_ns = j->t_end;
	pthread_mutex_unlock(&j->mu);
	st->method = j->method;
	st->lane_direction = j->load;
	st->bytes = j->bytes;
	st->bytes_done = atomic_load(&j->bytes_done);
	st->npages = j->d.npages;
	st->layers = j->layers;
	st->bad_page = atomic_load(&j->bad_page);
	st->submit_ns = j->t_submit;
}
