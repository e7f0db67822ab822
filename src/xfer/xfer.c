/*
 * xfer.c — the transfer engine itself: method names, the queues, create
 * and destroy, info, the eventfd, pause. The picture, invariants and
 * locking rule of the whole engine are in xfer_impl.h; a job's way
 * through it is submit.c (checks, lane and method, the plan, queueing),
 * the lanes that move bytes (cpu.c, io.c, dev_lane.c), job.c (completion,
 * waiting, cancel, the counters) and sum.c (checksums); contig.c is the
 * one-contiguous-copy limit the benchmarks compare with.
 *
 *   kvt_xfer_create: config filled in, ssd I/O probed, eventfd, cpu
 *   workers started (io and device lanes start with their first job)
 *   kvt_xfer_destroy: stopping set, every queued job cancelled and its
 *   unclaimed units retired, wait for unfinished == 0, lanes stopped
 *
 * Locking: the queue helpers here run with x->mu held (they say so);
 * destroy drops x->mu around each job's units_done (which may finish the
 * job and take j->mu, then x->mu again).
 */
#include "xfer/xfer_impl.h"
#include "xfer/xfer_int.h"
#include "core/cuda.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
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

void kvti_queue_push(struct kvt_xfer *x, struct kvt_xfer_job *j)
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

void kvti_lane_kick(struct kvt_xfer *x, int lane)
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
	return kvti_xfer_create_nice(out, cfg, 0);
}

int kvti_xfer_create_nice(kvt_xfer **out, const kvt_xfer_config *cfg,
			  int nice)
{
	struct kvt_xfer *x;
	int err;

	kvti_errclear();
	if (nice < 0 || nice > 19)
		return kvti_fail(-EINVAL, "transfer engine: nice %d (0 to 19)",
				 nice);
	x = kvt_calloc(1, sizeof(*x));
	if (!x)
		return -ENOMEM;
	x->nice = nice;
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
size_t kvti_retire_unclaimed(struct kvt_xfer *x, struct kvt_xfer_job *j)
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
				n = kvti_retire_unclaimed(x, j);
				pthread_mutex_unlock(&x->mu);
				kvti_job_units_done(j, n);
				pthread_mutex_lock(&x->mu);
			}
		}
	x->paused = 0;
	for (int lane = 0; lane < LANE_COUNT; lane++)
		kvti_lane_kick(x, lane);
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
void kvti_cuda_probe(struct kvt_xfer *x)
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
	kvti_cuda_probe(x);
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
			kvti_lane_kick(x, lane);
	pthread_mutex_unlock(&x->mu);
}
