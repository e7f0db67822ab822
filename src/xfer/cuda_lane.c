/*
 * cuda_lane.c — the cuda lane: jobs to and from the GPU (hbm tiers).
 *
 * Two threads, one per direction, each with its own stream (loads on a
 * high-priority stream, stores and hbm -> hbm on a low one) so a load never
 * queues behind a backup and the two directions use both copy engines.
 * A thread takes the highest-priority job of its direction, computes
 * every chunk's (dst, src) address with kvt_layout_chunk() — the same
 * arithmetic as the cpu lane and the reference conversion — and enqueues
 * the job layer by layer with the job's method (xfer_cuda.cu), recording
 * an event after each layer; layers are reported as their events fire.
 * Then it waits for the last layer, verifies or records checksums on the
 * host side (on the CPU: XXH3 is the same whoever moved the bytes), and
 * finishes the job. A cancel stops the enqueueing between layers; what was
 * enqueued is waited for before the job is reported done.
 *
 * Without CUDA in the build every entry point reports KVT_ENOTBUILT.
 *
 * Locking: x->mu guards the queues and x->cuda; each thread owns its
 * kvti_cu.
 */
#include "xfer/xfer_impl.h"
#include "core/cuda.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#ifdef KVT_HAVE_CUDA
#include "xfer/cuda/xfer_cuda.h"

struct cuda_thread {
	struct kvt_xfer *x;
	int lane;
	pthread_t th;
	pthread_cond_t cv;
	struct kvti_cu *cu;
	int running;
};

struct xfer_cuda {
	struct cuda_thread t[2]; /* LANE_CUDA_LOAD, LANE_CUDA_STORE */
	int stop;                /* x->mu */
};

static int side_gpu(kvt_tier *t)
{
	return kvt_tier_kind_of(t) == KVT_TIER_HBM && !t->spec.hostdev;
}

void kvti_cuda_probe(struct kvt_xfer *x)
{
	int n = 0;
	char note[128];

	if (x->cuda_state)
		return;
	kvti_cuda_device_count(&n, note, sizeof(note));
	if (n > 0) {
		x->cuda_state = 1;
		snprintf(x->cuda_note, sizeof(x->cuda_note), "%d GPU%s", n,
			 n == 1 ? "" : "s");
	} else {
		x->cuda_state = -1;
		snprintf(x->cuda_note, sizeof(x->cuda_note), "no GPU: %s", note);
	}
}

int kvti_cuda_batch_built(void)
{
	return kvti_cu_batch_built();
}

int kvti_cuda_plan(struct kvt_xfer *x, struct kvt_xfer_job *j)
{
	kvt_tier *sides[2] = { j->d.src, j->d.dst };

	if (j->method == KVT_XFER_CUDA_BATCH && !kvti_cu_batch_built())
		return kvti_fail(KVT_ENOTBUILT, "cuda-batch needs "
				 "cudaMemcpyBatchAsync (CUDA 12.8 or later)");
	for (int i = 0; i < 2; i++) {
		kvt_tier_desc d;

		kvt_tier_info(sides[i], &d);
		if (j->method == KVT_XFER_CUDA_KERNEL && !side_gpu(sides[i]) &&
		    !d.cuda_registered)
			return kvti_fail(-EOPNOTSUPP, "the cuda-kernel method "
					 "reads and writes host memory directly: "
					 "open the %s tier with 'pin'", d.name);
	}
	if ((j->d.flags & XFER_ANY_SUMS) &&
	    side_gpu(j->d.src) && side_gpu(j->d.dst))
		return kvti_fail(-EOPNOTSUPP, "checksums are taken on the host "
				 "side; an hbm -> hbm move has none");
	atomic_init(&j->units_left, 1);
	return 0;
}

/* Device-usable base for one side: the tier's region, translated for the
 * kernel when it is host memory. */
static int side_base(struct cuda_thread *ct, struct kvt_xfer_job *j,
		     kvt_tier *t, void *const *bufs, char **dev)
{
	void *p;
	int err;

	*dev = bufs[0];
	if (j->method != KVT_XFER_CUDA_KERNEL || side_gpu(t))
		return 0;
	if ((err = kvti_cu_host_devptr(ct->cu, bufs[0], &p)))
		return err;
	*dev = p;
	return 0;
}

/* Fill layer @layer's pointers at [o, o + kv*n). */
static void fill_layer(struct kvt_xfer_job *j, uint32_t layer, size_t o,
		       char *sdev, char *ddev, void **dsts, const void **srcs)
{
	const kvt_layout *sl = j->sl, *dl = j->dl;
	const char *sb = j->sbufs[0], *db = j->dbufs[0];
	size_t n = j->d.npages;

	for (uint32_t k = 0; k < sl->kv; k++)
		for (size_t p = 0; p < n; p++) {
			kvt_chunk_loc s = kvt_layout_chunk(sl, job_src_slot(j, p),
							   layer, k);
			kvt_chunk_loc d = kvt_layout_chunk(dl, job_dst_slot(j, p),
							   layer, k);
			const char *sa = (const char *)j->sbufs[s.buf] + s.off;
			char *da = (char *)j->dbufs[d.buf] + d.off;

			srcs[o + k * n + p] = sdev + (sa - sb);
			dsts[o + k * n + p] = ddev + (da - db);
		}
}

static void job_sums(struct kvt_xfer_job *j)
{
	int host_src = !side_gpu(j->d.src);
	kvt_tier *h = host_src ? j->d.src : j->d.dst;

	for (size_t p = 0; p < j->d.npages && !kvti_job_stopped(j); p++) {
		uint32_t slot = host_src ? job_src_slot(j, p) : job_dst_slot(j, p);
		kvti_job_sum_side(j, p, kvt_tier_layout(h), kvt_tier_bufs(h),
				  slot);
	}
}

/* LVERIFY of a load: layer @layer of every page's host source, checked
 * just before that layer's DMA is enqueued (so layers stay reportable one
 * by one). */
static void layer_src_sums(struct kvt_xfer_job *j, uint32_t layer)
{
	const kvt_layout *l = kvt_tier_layout(j->d.src);

	for (size_t p = 0; p < j->d.npages && !kvti_job_stopped(j); p++)
		kvti_job_lsum(j, p, layer,
			      kvti_layer_sum(l, j->sbufs, job_src_slot(j, p),
					     layer));
}

static void cuda_run(struct kvt_xfer *x, struct cuda_thread *ct,
		     struct kvt_xfer_job *j)
{
	size_t m = j->d.npages * j->sl->kv;
	int progress = j->dl->kind != KVT_LAYOUT_PAGE_FIRST &&
		       !(j->d.flags & KVT_XFER_VERIFY);
	int lsrc = (j->d.flags & KVT_XFER_LVERIFY) && !side_gpu(j->d.src);
	uint32_t told = 0, queued = 0;
	char *sdev, *ddev;
	const void **srcs;
	void **dsts;
	int err;

	kvti_job_started(j);
	/* the kernel and the DMA copy chunks whole: memory registered in rows
	 * (geom.h "ROWS") is host memory, moved by the cpu lane */
	if (kvt_layout_rows(j->sl) > 1 || kvt_layout_rows(j->dl) > 1)
		err = kvti_fail(KVT_ENOTBUILT, "cuda lane: a chunk kept in "
				"rows (token/head strides) is not copied by "
				"the GPU path");
	else
		err = kvti_cu_stage(ct->cu, m * j->layers, j->layers, &dsts,
				    &srcs);
	if (!err)
		err = side_base(ct, j, j->d.src, j->sbufs, &sdev);
	if (!err)
		err = side_base(ct, j, j->d.dst, j->dbufs, &ddev);
	for (; !err && queued < j->layers && !kvti_job_stopped(j); queued++) {
		size_t o = (size_t)queued * m;

		if (lsrc) {
			layer_src_sums(j, queued);
			if (kvti_job_stopped(j))
				break;
		}
		fill_layer(j, queued, o, sdev, ddev, dsts, srcs);
		err = kvti_cu_enqueue(ct->cu, j->method, o, m,
				      j->sl->chunk_bytes, x->cfg.cuda_blocks);
		if (!err)
			err = kvti_cu_mark(ct->cu, queued);
		while (!err && progress && told < queued &&
		       kvti_cu_query(ct->cu, told) == 1)
			kvti_job_layer_landed(j, told++);
	}
	if (err) {
		kvti_job_fail(j, err, "%s", kvt_errdetail());
		kvti_cu_sync(ct->cu); /* nothing may still be writing */
	}
	for (; !err && told < queued; told++) {
		if ((err = kvti_cu_wait(ct->cu, told)))
			kvti_job_fail(j, err, "%s", kvt_errdetail());
		else if (progress)
			kvti_job_layer_landed(j, told);
	}
	if (!kvti_job_stopped(j) && (j->d.flags & XFER_ANY_SUMS) && !lsrc)
		job_sums(j);
	if (!kvti_job_stopped(j))
		atomic_store(&j->bytes_done, j->bytes);
	kvti_job_units_done(j, 1);
}

static void *cuda_main(void *arg)
{
	struct cuda_thread *ct = arg;
	struct kvt_xfer *x = ct->x;
	int bound = kvti_cu_bind(ct->cu);
	char why[256];

	snprintf(why, sizeof(why), "%s", bound ? kvt_errdetail() : "");
	pthread_mutex_lock(&x->mu);
	for (;;) {
		struct kvt_xfer_job *j = x->paused ? NULL :
				       kvti_queue_head(x, ct->lane);
		if (!j) {
			if (x->cuda->stop)
				break;
			pthread_cond_wait(&ct->cv, &x->mu);
			continue;
		}
		kvti_queue_remove(x, j);
		pthread_mutex_unlock(&x->mu);
		if (bound) { /* the GPU cannot be used from this thread */
			kvti_job_started(j);
			kvti_job_fail(j, bound, "cuda lane: %s", why);
			kvti_job_units_done(j, 1);
		} else {
			cuda_run(x, ct, j);
		}
		pthread_mutex_lock(&x->mu);
	}
	pthread_mutex_unlock(&x->mu);
	return NULL;
}

static void cuda_free(struct xfer_cuda *c)
{
	for (int i = 0; i < 2; i++) {
		kvti_cu_close(c->t[i].cu);
		if (c->t[i].x)
			pthread_cond_destroy(&c->t[i].cv);
	}
	kvt_free(c);
}

int kvti_cuda_start(struct kvt_xfer *x, int dev)
{
	struct xfer_cuda *c;
	int err;

	kvti_cuda_probe(x);
	if (x->cuda_state < 0)
		return kvti_fail(KVT_ENODEV, "%s", x->cuda_note);
	if (x->cuda)
		return 0;
	if (x->cfg.cuda_device > 0 && dev != x->cfg.cuda_device)
		return kvti_fail(-EINVAL, "the engine is configured for GPU %d, "
				 "the job's hbm tier is on GPU %d",
				 x->cfg.cuda_device, dev);
	c = kvt_calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	for (int i = 0; i < 2; i++) {
		struct cuda_thread *ct = &c->t[i];

		ct->x = x;
		ct->lane = i ? LANE_CUDA_STORE : LANE_CUDA_LOAD;
		pthread_cond_init(&ct->cv, NULL);
		if ((err = kvti_cu_open(&ct->cu, dev, i == 0))) {
			kvti_errctx("cuda lane on GPU %d", dev);
			goto err_stop;
		}
	}
	x->cuda = c;
	x->cuda_dev = dev;
	for (int i = 0; i < 2; i++) {
		int e = pthread_create(&c->t[i].th, NULL, cuda_main, &c->t[i]);
		if (e) {
			err = kvti_fail(-e, "starting the cuda lane: %s",
					strerror(e));
			goto err_stop;
		}
		c->t[i].running = 1;
	}
	return 0;

err_stop:
	c->stop = 1;
	for (int i = 0; i < 2; i++)
		if (c->t[i].running) {
			pthread_cond_signal(&c->t[i].cv);
			pthread_mutex_unlock(&x->mu);
			pthread_join(c->t[i].th, NULL);
			pthread_mutex_lock(&x->mu);
		}
	x->cuda = NULL;
	x->cuda_dev = -1;
	cuda_free(c);
	return err;
}

void kvti_cuda_kick(struct kvt_xfer *x, int lane)
{
	if (x->cuda)
		pthread_cond_signal(&x->cuda->t[lane == LANE_CUDA_STORE].cv);
}

void kvti_cuda_stop(struct kvt_xfer *x)
{
	struct xfer_cuda *c = x->cuda;

	if (!c)
		return;
	pthread_mutex_lock(&x->mu);
	c->stop = 1;
	for (int i = 0; i < 2; i++)
		pthread_cond_signal(&c->t[i].cv);
	pthread_mutex_unlock(&x->mu);
	for (int i = 0; i < 2; i++)
		if (c->t[i].running)
			pthread_join(c->t[i].th, NULL);
	x->cuda = NULL;
	cuda_free(c);
}

int kvti_cuda_contig(int dev, void *dst, const void *src, uint64_t n,
		     double *seconds)
{
	return kvti_cu_contig(dev, dst, src, n, seconds);
}

#else /* !KVT_HAVE_CUDA */

static int not_built(void)
{
	return kvti_fail(KVT_ENOTBUILT, "this kvtier was built without CUDA: "
			 "the cuda methods are not available");
}

void kvti_cuda_probe(struct kvt_xfer *x)
{
	if (x->cuda_state)
		return;
	x->cuda_state = -1;
	snprintf(x->cuda_note, sizeof(x->cuda_note), "built without CUDA");
}

int kvti_cuda_batch_built(void)
{
	return 0;
}

int kvti_cuda_plan(struct kvt_xfer *x, struct kvt_xfer_job *j)
{
	return not_built();
}

int kvti_cuda_start(struct kvt_xfer *x, int dev)
{
	return not_built();
}

void kvti_cuda_kick(struct kvt_xfer *x, int lane)
{
}

void kvti_cuda_stop(struct kvt_xfer *x)
{
}

int kvti_cuda_contig(int dev, void *dst, const void *src, uint64_t n,
		     double *seconds)
{
	return not_built();
}

#endif
