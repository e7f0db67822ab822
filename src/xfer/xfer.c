/*
 * xfer.c — the transfer engine's core: create/destroy, submit (checks,
 * lane and method, the plan), the queues, completion, waiting, cancel.
 * The picture, invariants and locking rule are in xfer_impl.h; the lanes
 * that move bytes are cpu.c, io.c and dev_lane.c.
 *
 * Submission checks everything a job could trip on later (tiers, shapes,
 * slots, duplicates, the path between the tiers) so that a queued job can
 * only fail for reasons of the moment: an I/O error, a checksum, a cancel.
 */
#include "xfer/xfer_impl.h"
#include "core/cuda.h"
#include "dev/dev.h"
#include "xfer/xxh.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

static const char *method_names[KVT_XFER_METHOD_COUNT] = {
	"auto", "cpu", "uring", "pread", "cuda-chunk", "cuda-batch",
	"cuda-kernel",
};

const char *kvt_xfer_method_name(int method)
{
	return method >= 0 && method < KVT_XFER_METHOD_COUNT ?
		       method_names[method] : "?";
}

int kvt_xfer_method_parse(const char *s, int *method)
{
	for (int i = 0; i < KVT_XFER_METHOD_COUNT; i++)
		if (kvti_streq_ci(s, method_names[i])) {
			*method = i;
			return 0;
		}
	return kvti_fail(-EINVAL, "unknown transfer method '%s' (auto, cpu, "
			 "uring, pread, cuda-chunk, cuda-batch, cuda-kernel)", s);
}

/* ---- queues (x->mu held) ------------------------------------------- */

static void queue_push(struct kvt_xfer *x, struct kvt_xfer_job *j)
{
	struct job_queue *q = &x->q[j->lane][j->prio];

	j->qnext = NULL;
	if (q->tail)
		q->tail->qnext = j;
	else
		q->head = j;
	q->tail = j;
	j->queued = 1;
}

void kvti_queue_remove(struct kvt_xfer *x, struct kvt_xfer_job *j)
{
	struct job_queue *q = &x->q[j->lane][j->prio];
	struct kvt_xfer_job **pp = &q->head, *prev = NULL;

	if (!j->queued)
		return;
	while (*pp && *pp != j) {
		prev = *pp;
		pp = &(*pp)->qnext;
	}
	if (*pp) {
		*pp = j->qnext;
		if (q->tail == j)
			q->tail = prev;
	}
	j->qnext = NULL;
	j->queued = 0;
}

struct kvt_xfer_job *kvti_queue_head(struct kvt_xfer *x, int lane)
{
	for (int p = 0; p < XFER_NPRIO; p++)
		if (x->q[lane][p].head)
			return x->q[lane][p].head;
	return NULL;
}

size_t kvti_io_claim(struct kvt_xfer *x, struct kvt_xfer_job *j)
{
	size_t i = j->next_page++;

	if (j->next_page >= j->d.npages)
		kvti_queue_remove(x, j);
	return i;
}

static void lane_kick(struct kvt_xfer *x, int lane)
{
	switch (lane) {
	case LANE_CPU:
		pthread_cond_broadcast(&x->cpu_cv);
		break;
	case LANE_IO:
		kvti_io_kick(x);
		break;
	default:
		kvti_dev_kick(x, lane);
		break;
	}
}

/* ---- job life ------------------------------------------------------- */

static void job_put(struct kvt_xfer_job *j)
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

#define ADD(a, v) atomic_fetch_add_explicit(&(a), (v), memory_order_relaxed)

/* What a finished job moved and hashed, into the engine's counters. */
static void job_count(struct kvt_xfer *x, struct kvt_xfer_job *j, int err)
{
	ADD(x->jobs, 1);
	if (err) {
		ADD(x->failed_jobs, 1);
		return;
	}
	ADD(x->moved[j->mover][j->flow], j->bytes);
	if (!(j->d.flags & XFER_ANY_SUMS))
		return;
	if (lane_is_dev(j->lane))
		ADD(x->dev_hashed[j->flow], j->bytes);
	else
		ADD(x->cpu_hashed[j->flow], j->bytes);
}

void kvti_xfer_count_dev_sums(struct kvt_xfer_job *j, uint64_t n)
{
	ADD(j->x->dev_verified, n);
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
	job_put(j);
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

void kvti_job_sum(struct kvt_xfer_job *j, size_t i, uint64_t h)
{
	if (j->d.flags & KVT_XFER_SUM) {
		j->d.sums[i] = h;
		return;
	}
	if (!(j->d.flags & KVT_XFER_VERIFY) || j->d.sums[i] == h)
		return;
	if (lane_is_dev(j->lane))
		ADD(j->x->dev_failed, 1);
	/* keep the lowest bad page */
	size_t cur = atomic_load(&j->bad_page);
	while (i < cur && !atomic_compare_exchange_weak(&j->bad_page, &cur, i))
		;
	kvti_job_fail(j, KVT_ECORRUPT, "page %zu (slot %u of %s) failed its "
		      "checksum: XXH3 %016llx, expected %016llx", i,
		      job_src_slot(j, i), kvt_tier_kind_name(
			      kvt_tier_kind_of(j->d.src)),
		      (unsigned long long)h, (unsigned long long)j->d.sums[i]);
}

void kvti_job_lsum(struct kvt_xfer_job *j, size_t i, uint32_t layer,
		   uint64_t h)
{
	size_t k = i * j->layers + layer;

	if (j->d.flags & KVT_XFER_LSUM) {
		j->d.sums[k] = h;
		return;
	}
	if (!(j->d.flags & KVT_XFER_LVERIFY) || j->d.sums[k] == h)
		return;
	if (lane_is_dev(j->lane))
		ADD(j->x->dev_failed, 1);
	if (j->d.bad) {
		__atomic_store_n(&j->d.bad[i], 1, __ATOMIC_RELAXED);
		return;
	}
	size_t cur = atomic_load(&j->bad_page);
	while (i < cur && !atomic_compare_exchange_weak(&j->bad_page, &cur, i))
		;
	kvti_job_fail(j, KVT_ECORRUPT, "page %zu (slot %u of %s) layer %u "
		      "failed its checksum: XXH3 %016llx, expected %016llx", i,
		      job_src_slot(j, i), kvt_tier_kind_name(
			      kvt_tier_kind_of(j->d.src)), layer,
		      (unsigned long long)h, (unsigned long long)j->d.sums[k]);
}

void kvti_job_sum_pf(struct kvt_xfer_job *j, size_t i, const void *pf)
{
	const kvt_layout *l = j->sl;
	uint64_t lb = l->page_bytes / j->layers;

	if (j->d.flags & XFER_PAGE_SUMS) {
		kvti_job_sum(j, i, XXH3_64bits(pf, l->page_bytes));
		return;
	}
	for (uint32_t layer = 0; layer < j->layers; layer++)
		kvti_job_lsum(j, i, layer,
			      XXH3_64bits((const char *)pf + layer * lb, lb));
}

uint64_t kvti_layer_sum(const kvt_layout *l, void *const *bufs, uint32_t slot,
			uint32_t layer)
{
	XXH3_state_t h;

	XXH3_64bits_reset(&h);
	for (uint32_t k = 0; k < l->kv; k++) {
		kvt_chunk_loc c = kvt_layout_chunk(l, slot, layer, k);
		kvti_chunk_hash(&h, l, (const char *)bufs[c.buf] + c.off);
	}
	return XXH3_64bits_digest(&h);
}

void kvti_job_sum_side(struct kvt_xfer_job *j, size_t i, const kvt_layout *l,
		       void *const *bufs, uint32_t slot)
{
	if (j->d.flags & XFER_PAGE_SUMS) {
		kvti_job_sum(j, i, kvti_page_sum(l, bufs, slot));
		return;
	}
	for (uint32_t layer = 0; layer < j->layers; layer++)
		kvti_job_lsum(j, i, layer, kvti_layer_sum(l, bufs, slot, layer));
}

/* ---- create / destroy ---------------------------------------------- */

static int config_fill(kvt_xfer_config *c)
{
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);

	if (!c->cpu_threads)
		c->cpu_threads = (unsigned)KVT_MIN(KVT_MAX(ncpu, 1), 4);
	if (c->cpu_threads > 256)
		return kvti_fail(-EINVAL, "transfer engine: cpu_threads %u "
				 "(at most 256)", c->cpu_threads);
	if (!c->task_bytes)
		c->task_bytes = 4u << 20;
	if (c->task_bytes < 4096)
		return kvti_fail(-EINVAL, "transfer engine: task_bytes %llu "
				 "(at least 4096)",
				 (unsigned long long)c->task_bytes);
	if (c->nt < KVT_XFER_NT_AUTO || c->nt > KVT_XFER_NT_OFF)
		return kvti_fail(-EINVAL, "transfer engine: nt %d", c->nt);
	if (c->ssd_io != KVT_XFER_AUTO && c->ssd_io != KVT_XFER_URING &&
	    c->ssd_io != KVT_XFER_PREAD)
		return kvti_fail(-EINVAL, "transfer engine: ssd_io must be auto, "
				 "uring or pread, not %s",
				 kvt_xfer_method_name(c->ssd_io));
	if (!c->uring_depth)
		c->uring_depth = 32;
	if (c->uring_depth > 4096)
		return kvti_fail(-EINVAL, "transfer engine: uring_depth %u (at "
				 "most 4096)", c->uring_depth);
	if (!c->bounce_bytes)
		c->bounce_bytes = 256u << 20;
	if (!c->cuda_load)
		c->cuda_load = KVT_XFER_CUDA_KERNEL;
	if (!c->cuda_store)
		c->cuda_store = KVT_XFER_CUDA_BATCH;
	for (int i = 0; i < 2; i++) {
		int m = i ? c->cuda_store : c->cuda_load;
		if (m < KVT_XFER_CUDA_CHUNK || m > KVT_XFER_CUDA_KERNEL)
			return kvti_fail(-EINVAL, "transfer engine: %s method "
					 "must be cuda-chunk, cuda-batch or "
					 "cuda-kernel, not %s",
					 i ? "cuda_store" : "cuda_load",
					 kvt_xfer_method_name(m));
	}
	if (!c->cuda_blocks)
		c->cuda_blocks = 2;
	if (c->cuda_blocks > 64)
		return kvti_fail(-EINVAL, "transfer engine: cuda_blocks %u (at "
				 "most 64: the kernel is meant to leave the SMs "
				 "to the model)", c->cuda_blocks);
	return 0;
}

static void stop_workers(struct kvt_xfer *x)
{
	pthread_mutex_lock(&x->mu);
	x->stopping = 1;
	pthread_cond_broadcast(&x->cpu_cv);
	pthread_mutex_unlock(&x->mu);
	for (unsigned i = 0; i < x->nworkers; i++)
		pthread_join(x->workers[i], NULL);
	x->nworkers = 0;
}


int kvt_xfer_create(kvt_xfer **out, const kvt_xfer_config *cfg)
{
	struct kvt_xfer *x;
	int err;

	kvti_errclear();
	x = kvt_calloc(1, sizeof(*x));
	if (!x)
		return -ENOMEM;
	if (cfg)
		x->cfg = *cfg;
	if ((err = config_fill(&x->cfg)) || (err = kvti_io_probe(x)))
		goto err_free;
	x->copy_nt = kvti_copy_nt_pick(&x->copy_isa);
	x->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (x->efd < 0) {
		err = kvti_fail(-errno, "eventfd: %s", strerror(errno));
		goto err_free;
	}
	x->workers = kvt_calloc(x->cfg.cpu_threads, sizeof(pthread_t));
	if (!x->workers) {
		err = -ENOMEM;
		goto err_close;
	}
	pthread_mutex_init(&x->mu, NULL);
	pthread_mutex_init(&x->rmu, NULL);
	kvti_cond_init_mono(&x->cpu_cv);
	kvti_cond_init_mono(&x->idle_cv);
	for (unsigned i = 0; i < x->cfg.cpu_threads; i++) {
		int e = kvti_fault() ? EAGAIN :
			pthread_create(&x->workers[i], NULL, kvti_cpu_worker, x);
		if (e) {
			err = kvti_fail(-e, "transfer engine: starting worker "
					"%u: %s", i, strerror(e));
			goto err_stop;
		}
		x->nworkers++;
	}
	*out = x;
	return 0;

err_stop:
	stop_workers(x);
	pthread_cond_destroy(&x->cpu_cv);
	pthread_cond_destroy(&x->idle_cv);
	pthread_mutex_destroy(&x->mu);
	pthread_mutex_destroy(&x->rmu);
	kvt_free(x->workers);
err_close:
	close(x->efd);
err_free:
	kvt_free(x);
	return err;
}

/* x->mu held: take the unclaimed units of @j out of its queue. */
static size_t retire_unclaimed(struct kvt_xfer *x, struct kvt_xfer_job *j)
{
	size_t n;

	if (!j->queued)
		return 0;
	switch (j->lane) {
	case LANE_CPU:
		n = j->ntasks - j->next_task;
		j->next_task = j->ntasks;
		break;
	case LANE_IO:
		n = j->d.npages - j->next_page;
		j->next_page = j->d.npages;
		break;
	default:
		n = 1;
		break;
	}
	kvti_queue_remove(x, j);
	return n;
}

void kvt_xfer_destroy(kvt_xfer *x)
{
	if (!x)
		return;
	pthread_mutex_lock(&x->mu);
	x->stopping = 1;
	for (int lane = 0; lane < LANE_COUNT; lane++)
		for (int p = 0; p < XFER_NPRIO; p++) {
			struct kvt_xfer_job *j;
			while ((j = x->q[lane][p].head)) {
				size_t n;
				atomic_store(&j->cancel, 1);
				n = retire_unclaimed(x, j);
				pthread_mutex_unlock(&x->mu);
				kvti_job_units_done(j, n);
				pthread_mutex_lock(&x->mu);
			}
		}
	x->paused = 0;
	for (int lane = 0; lane < LANE_COUNT; lane++)
		lane_kick(x, lane);
	while (x->unfinished)
		pthread_cond_wait(&x->idle_cv, &x->mu);
	pthread_mutex_unlock(&x->mu);
	stop_workers(x);
	kvti_io_stop(x);
	kvti_dev_stop(x);
	pthread_cond_destroy(&x->cpu_cv);
	pthread_cond_destroy(&x->idle_cv);
	pthread_mutex_destroy(&x->mu);
	pthread_mutex_destroy(&x->rmu);
	close(x->efd);
	kvt_free(x->workers);
	kvt_free(x);
}

/* Find out once whether CUDA works here (x->mu held): cuda_state (1
 * usable, -1 not) and cuda_note, for reports. Starts nothing. */
static void cuda_probe(struct kvt_xfer *x)
{
	char note[128];
	int n = 0;

	if (x->cuda_state)
		return;
	kvti_cuda_device_count(&n, note, sizeof(note));
	x->cuda_state = n > 0 ? 1 : -1;
	if (n > 0)
		snprintf(x->cuda_note, sizeof(x->cuda_note), "%d GPU%s", n,
			 n == 1 ? "" : "s");
	else
		snprintf(x->cuda_note, sizeof(x->cuda_note), "%s%s",
			 kvti_cuda_built() ? "no GPU: " : "", note);
}

void kvt_xfer_info_get(kvt_xfer *x, kvt_xfer_info *info)
{
	memset(info, 0, sizeof(*info));
	info->cpu_threads = x->nworkers;
	info->task_bytes = x->cfg.task_bytes;
	info->nt = x->cfg.nt;
	info->copy_isa = x->copy_isa;
	info->ssd_io = x->ssd_io;
	info->ssd_io_note = x->ssd_note;
	info->uring_depth = x->cfg.uring_depth;
	pthread_mutex_lock(&x->mu);
	cuda_probe(x);
	info->cuda = x->cuda_state > 0;
	pthread_mutex_unlock(&x->mu);
	info->cuda_note = x->cuda_note;
	info->cuda_load = x->cfg.cuda_load;
	info->cuda_store = x->cfg.cuda_store;
	info->cuda_blocks = x->cfg.cuda_blocks;
	info->cuda_batch = kvti_cuda_batch_built();
}

int kvt_xfer_eventfd(kvt_xfer *x)
{
	return x->efd;
}

void kvt_xfer_pause(kvt_xfer *x, int paused)
{
	pthread_mutex_lock(&x->mu);
	x->paused = paused != 0;
	if (!x->paused)
		for (int lane = 0; lane < LANE_COUNT; lane++)
			lane_kick(x, lane);
	pthread_mutex_unlock(&x->mu);
}

/* ---- submit: checks ------------------------------------------------- */

static const char *tier_name(kvt_tier *t)
{
	kvt_tier_desc d;

	kvt_tier_info(t, &d);
	return d.name;
}

static int is_gpu(kvt_tier *t)
{
	kvt_tier_desc d;

	kvt_tier_info(t, &d);
	return d.kind == KVT_TIER_HBM && !d.hostdev;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

/* Slots in range, destination slots distinct, no slot both read and
 * written when the tiers are one. */
static int check_slots(const kvt_xfer_desc *d)
{
	uint64_t sn = kvt_tier_layout(d->src)->slots;
	uint64_t dn = kvt_tier_layout(d->dst)->slots;
	uint32_t *a, *b = NULL;
	size_t n = d->npages;
	int err = 0;

	for (size_t i = 0; i < n; i++) {
		if (d->src_slots[i] >= sn)
			return kvti_fail(-ERANGE, "page %zu: source slot %u out of "
					 "range (%s has %llu slots)", i,
					 d->src_slots[i], tier_name(d->src),
					 (unsigned long long)sn);
		if (d->dst_slots[i] >= dn)
			return kvti_fail(-ERANGE, "page %zu: destination slot %u "
					 "out of range (%s has %llu slots)", i,
					 d->dst_slots[i], tier_name(d->dst),
					 (unsigned long long)dn);
	}
	if (n < 2 && d->src != d->dst)
		return 0;
	a = kvt_malloc(n * sizeof(*a));
	if (!a)
		return -ENOMEM;
	memcpy(a, d->dst_slots, n * sizeof(*a));
	qsort(a, n, sizeof(*a), cmp_u32);
	for (size_t i = 1; i < n && !err; i++)
		if (a[i] == a[i - 1])
			err = kvti_fail(-EINVAL, "destination slot %u appears more "
					"than once", a[i]);
	if (!err && d->src == d->dst) {
		b = kvt_malloc(n * sizeof(*b));
		if (!b) {
			err = -ENOMEM;
			goto out;
		}
		memcpy(b, d->src_slots, n * sizeof(*b));
		qsort(b, n, sizeof(*b), cmp_u32);
		for (size_t i = 0, k = 0; i < n && k < n && !err;) {
			if (a[i] == b[k])
				err = kvti_fail(-EINVAL, "slot %u of %s is both "
						"read and written", a[i],
						tier_name(d->src));
			else if (a[i] < b[k])
				i++;
			else
				k++;
		}
	}
out:
	kvt_free(a);
	kvt_free(b);
	return err;
}

static int check_desc(const kvt_xfer_desc *d)
{
	unsigned sums = d->flags & XFER_ANY_SUMS;

	if (!d->src || !d->dst)
		return kvti_fail(-EINVAL, "transfer without a %s tier",
				 d->src ? "destination" : "source");
	if (d->npages && (!d->src_slots || !d->dst_slots))
		return kvti_fail(-EINVAL, "transfer of %zu pages without slot "
				 "lists", d->npages);
	if (d->flags & ~(XFER_ANY_SUMS | KVT_XFER_DURABLE))
		return kvti_fail(-EINVAL, "unknown transfer flags 0x%x",
				 d->flags);
	if (sums & (sums - 1))
		return kvti_fail(-EINVAL, "a transfer records checksums (SUM, "
				 "LSUM) or verifies them (VERIFY, LVERIFY): one "
				 "of the four, not 0x%x", sums);
	if (d->bad && !(sums & KVT_XFER_LVERIFY))
		return kvti_fail(-EINVAL, "a bad-page array without LVERIFY");
	if (d->wait && !is_gpu(d->src) && !is_gpu(d->dst))
		return kvti_fail(-EINVAL, "a device event to wait for on a job "
				 "that moves no device memory");
	if (sums && d->npages && !d->sums)
		return kvti_fail(-EINVAL, "checksum flag without a sums array");
	if (d->prio < KVT_XFER_PRIO_DEFAULT || d->prio > KVT_XFER_PRIO_LOW)
		return kvti_fail(-EINVAL, "bad transfer priority %d", d->prio);
	if (d->method < 0 || d->method >= KVT_XFER_METHOD_COUNT)
		return kvti_fail(-EINVAL, "bad transfer method %d", d->method);
	if (!kvt_geom_same_shape(kvt_tier_geom(d->src), kvt_tier_geom(d->dst)))
		return kvti_fail(KVT_EGEOM, "transfer between tiers of different "
				 "KV shape (%s, %s)", kvt_tier_geom(d->src)->name,
				 kvt_tier_geom(d->dst)->name);
	return check_slots(d);
}

/* Pick the lane and method for the two tiers. */
static int pick_path(struct kvt_xfer *x, struct kvt_xfer_job *j)
{
	kvt_tier *s = j->d.src, *t = j->d.dst;
	int sk = kvt_tier_kind_of(s), tk = kvt_tier_kind_of(t);
	int m = j->d.method, sg = is_gpu(s), tg = is_gpu(t);

	if ((sk == KVT_TIER_SSD && (tk == KVT_TIER_SSD || tg)) ||
	    (tk == KVT_TIER_SSD && sg))
		return kvti_fail(-EOPNOTSUPP, "no path from %s to %s: stage the "
				 "pages through a host tier", tier_name(s),
				 tier_name(t));
	if (sk == KVT_TIER_SSD || tk == KVT_TIER_SSD) {
		j->lane = LANE_IO;
		if (m == KVT_XFER_AUTO)
			m = x->ssd_io;
		if (m == KVT_XFER_URING && x->ssd_io != KVT_XFER_URING)
			return kvti_fail(KVT_ENODEV, "io_uring asked for, but %s",
					 x->ssd_note);
		if (m != KVT_XFER_URING && m != KVT_XFER_PREAD)
			return kvti_fail(-EOPNOTSUPP, "%s cannot move pages "
					 "between %s and %s (uring or pread can)",
					 kvt_xfer_method_name(m), tier_name(s),
					 tier_name(t));
	} else if (sg || tg) {
		/* the slot is known once the device's lanes run (lane_ready) */
		j->lane = LANE_DEV0 + !(tg && !sg);
		j->dev_id = tg ? t->spec.device : s->spec.device;
		if (m == KVT_XFER_AUTO) {
			m = sg && tg ? KVT_XFER_CUDA_CHUNK :
			    tg ? x->cfg.cuda_load : x->cfg.cuda_store;
			j->method_auto = 1;
		}
		if (m < KVT_XFER_CUDA_CHUNK)
			return kvti_fail(-EOPNOTSUPP, "%s cannot move pages "
					 "between %s and %s (the cuda methods "
					 "can)", kvt_xfer_method_name(m),
					 tier_name(s), tier_name(t));
	} else {
		j->lane = LANE_CPU;
		if (m == KVT_XFER_AUTO)
			m = KVT_XFER_CPU;
		if (m != KVT_XFER_CPU)
			return kvti_fail(-EOPNOTSUPP, "%s cannot move pages "
					 "between %s and %s (host tiers: cpu)",
					 kvt_xfer_method_name(m), tier_name(s),
					 tier_name(t));
	}
	j->method = m;
	j->mover = j->lane == LANE_CPU ? KVT_XFER_MOVER_CPU :
		   j->lane == LANE_IO ? KVT_XFER_MOVER_IO :
		   m == KVT_XFER_CUDA_KERNEL ? KVT_XFER_MOVER_KERNEL :
		   KVT_XFER_MOVER_COPY_ENGINE;
	j->flow = tk == KVT_TIER_HBM ? KVT_XFER_FLOW_RESTORE :
		  sk == KVT_TIER_HBM ? KVT_XFER_FLOW_SAVE : KVT_XFER_FLOW_TIER;
	return 0;
}

/* Loads go into a faster tier: layer-first from page-first, or a lower
 * tier kind (hbm < fabric < dram < ssd). */
static int is_load(const struct kvt_xfer_job *j)
{
	int sf = j->sl->kind != KVT_LAYOUT_PAGE_FIRST;
	int df = j->dl->kind != KVT_LAYOUT_PAGE_FIRST;

	if (sf != df)
		return df;
	return kvt_tier_kind_of(j->d.dst) < kvt_tier_kind_of(j->d.src);
}

static int job_new(const kvt_xfer_desc *d, struct kvt_xfer_job **out)
{
	struct kvt_xfer_job *j = kvt_calloc(1, sizeof(*j));
	size_t n = d->npages;

	if (!j)
		return -ENOMEM;
	j->slots = kvt_malloc((n ? 2 * n : 1) * sizeof(uint32_t));
	if (!j->slots) {
		kvt_free(j);
		return -ENOMEM;
	}
	if (n) {
		memcpy(j->slots, d->src_slots, n * sizeof(uint32_t));
		memcpy(j->slots + n, d->dst_slots, n * sizeof(uint32_t));
	}
	j->d = *d;
	j->d.src_slots = j->slots;
	j->d.dst_slots = j->slots + n;
	j->sl = kvt_tier_layout(d->src);
	j->dl = kvt_tier_layout(d->dst);
	j->sbufs = kvt_tier_bufs(d->src);
	j->dbufs = kvt_tier_bufs(d->dst);
	j->layers = j->sl->geom.layers;
	j->bytes = (uint64_t)n * j->sl->page_bytes;
	j->load = is_load(j);
	j->prio = (d->prio ? d->prio : j->load ? KVT_XFER_PRIO_HIGH :
			     KVT_XFER_PRIO_LOW) - 1;
	atomic_init(&j->bad_page, SIZE_MAX);
	atomic_init(&j->refs, 2); /* the caller's and the engine's */
	pthread_mutex_init(&j->mu, NULL);
	pthread_mutex_init(&j->cb_mu, NULL);
	kvti_cond_init_mono(&j->cv);
	*out = j;
	return 0;
}

static void job_drop_unsubmitted(struct kvt_xfer_job *j)
{
	atomic_store(&j->refs, 1);
	job_put(j);
}

/* Start the lane the job needs (x->mu held). */
static int lane_ready(struct kvt_xfer *x, struct kvt_xfer_job *j)
{
	int err, slot;

	switch (j->lane) {
	case LANE_CPU:
		return 0;
	case LANE_IO:
		return x->io ? 0 : kvti_io_start(x);
	default:
		if (!kvti_dev_is_emu(j->dev_id)) {
			cuda_probe(x);
			if (x->cuda_state < 0)
				return kvti_fail(kvti_cuda_built() ? KVT_ENODEV :
						 KVT_ENOTBUILT, "%s", x->cuda_note);
		}
		if ((err = kvti_dev_lane_start(x, j->dev_id, &slot)))
			return err;
		j->lane = LANE_DEV0 + 2 * slot + (j->lane - LANE_DEV0);
		return kvti_dev_check(x, j, slot);
	}
}

int kvt_xfer_submit(kvt_xfer *x, const kvt_xfer_desc *d, kvt_xfer_job **out)
{
	struct kvt_xfer_job *j;
	int err;

	kvti_errclear();
	if (!x || !d || !out)
		return kvti_fail(-EINVAL, "kvt_xfer_submit: NULL argument");
	if ((err = check_desc(d)) || (err = job_new(d, &j)))
		return err;
	j->x = x;
	if ((err = pick_path(x, j)))
		goto err_drop;
	if (!d->npages)
		j->lane = LANE_CPU; /* nothing to move: one empty task */
	switch (j->lane) {
	case LANE_CPU:
		err = kvti_cpu_plan(x, j);
		break;
	case LANE_IO:
		err = kvti_io_plan(x, j);
		break;
	default:
		err = kvti_dev_plan(x, j);
		break;
	}
	if (err)
		goto err_drop;
	j->t_submit = kvt_now_ns();
	pthread_mutex_lock(&x->mu);
	if (x->stopping) {
		err = kvti_fail(-ESHUTDOWN, "the transfer engine is stopping");
	} else if (!(err = lane_ready(x, j))) {
		queue_push(x, j);
		x->unfinished++;
		if (!x->paused)
			lane_kick(x, j->lane);
	}
	pthread_mutex_unlock(&x->mu);
	if (err)
		goto err_drop;
	*out = j;
	return 0;

err_drop:
	job_drop_unsubmitted(j);
	return err;
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
	n = retire_unclaimed(x, j);
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
	job_put(j);
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

/* ---- the limit: one contiguous copy -------------------------------- */

/*
 * One thread: one memcpy() call over the whole region (glibc switches to
 * streaming stores above its non-temporal threshold). More threads: the
 * region cut into 4 MiB pieces that the threads take in turn, each copied
 * with the engine's streaming-store copy — balanced like the engine's own
 * tasks, so a thread the OS sets aside for a while does not hold the
 * others up (a static split would make the "limit" slower than the engine
 * on a busy machine).
 */
#define CONTIG_PIECE (4u << 20)

struct contig {
	char *dst;
	const char *src;
	uint64_t n;
	atomic_uint_fast64_t next;
	xfer_copy_fn copy;
};

static void *contig_thread(void *arg)
{
	struct contig *c = arg;
	uint64_t o;

	while ((o = atomic_fetch_add(&c->next, CONTIG_PIECE)) < c->n)
		c->copy(c->dst + o, c->src + o, KVT_MIN(c->n - o, CONTIG_PIECE));
	kvti_copy_fence();
	return NULL;
}

static int region(kvt_tier *t, uint64_t bytes, char **base)
{
	const kvt_layout *l = kvt_tier_layout(t);
	void *const *bufs = kvt_tier_bufs(t);

	if (kvt_tier_kind_of(t) == KVT_TIER_SSD || !bufs)
		return kvti_fail(-EINVAL, "%s has no memory to copy",
				 tier_name(t));
	if (kvt_layout_region_bytes(l) < bytes)
		return kvti_fail(-EINVAL, "%s holds %llu bytes, less than %llu",
				 tier_name(t),
				 (unsigned long long)kvt_layout_region_bytes(l),
				 (unsigned long long)bytes);
	*base = bufs[0]; /* buffers are carved back to back from one region */
	return 0;
}

int kvt_xfer_contig_copy(kvt_xfer *x, kvt_tier *src, kvt_tier *dst,
			 uint64_t bytes, unsigned threads, double *seconds)
{
	pthread_t th[256];
	struct contig c;
	uint64_t t0;
	unsigned n, started = 0;
	char *s, *d;
	int err;

	kvti_errclear();
	if ((err = region(src, bytes, &s)) || (err = region(dst, bytes, &d)))
		return err;
	if (is_gpu(src) || is_gpu(dst))
		return kvti_dev_contig(is_gpu(dst) ? dst->spec.device :
						     src->spec.device,
				       d, s, bytes, seconds);
	n = threads ? KVT_MIN(threads, 256u) : x->nworkers;
	t0 = kvt_now_ns();
	if (n <= 1 || bytes <= CONTIG_PIECE) {
		memcpy(d, s, bytes);
	} else {
		c.dst = d;
		c.src = s;
		c.n = bytes;
		c.copy = x->copy_nt;
		atomic_init(&c.next, 0);
		while (started + 1 < n &&
		       !pthread_create(&th[started], NULL, contig_thread, &c))
			started++;
		contig_thread(&c); /* this thread is one of the n */
		for (unsigned i = 0; i < started; i++)
			pthread_join(th[i], NULL);
	}
	*seconds = (kvt_now_ns() - t0) / 1e9;
	return 0;
}
