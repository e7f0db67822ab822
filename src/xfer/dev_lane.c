/*
 * dev_lane.c — the device lane: jobs to and from device memory (hbm tiers:
 * a GPU's, or the emulated device's), over the device interface
 * (src/dev/dev.h). The same code drives every device; only the calls
 * behind the interface differ, so CI runs this whole file on the
 * emulated device.
 *
 *   per device (up to XFER_MAX_DEVS): two threads, a load and a store
 *   lane, each with its own stream (loads high priority) so a load never
 *   queues behind a backup and both copy directions run at once.
 *
 *   a job, layer by layer:
 *     fill the layer's chunk addresses (kvt_layout_chunk(): the same
 *       arithmetic as the cpu lane and the reference conversion)
 *     move them: the gather kernel (SM-capped; loads by default), one
 *       batched copy-engine call (stores by default), or one copy each
 *     checksum them on the device: XXH3-64 of each page's layer over the
 *       device side's chunks — what landed in engine memory for a load,
 *       the engine's blocks for a store (src/dev/xxh3.h, the CPU's
 *       function bit for bit); results into page-locked host memory
 *     record the layer's event
 *   and as each event completes: compare (or record) the layer's sums —
 *   npages integers, no page byte — and report the layer. A page that
 *   fails a layer is marked bad (d.bad) or fails the job; it is never
 *   reported good. No CPU thread reads a page byte on this lane.
 *
 * Whole-page sums (SUM / VERIFY) are one more checksum pass at the end,
 * each page an item of L*kv segments in page-first order.
 *
 * A cancel stops the enqueueing between layers; what was enqueued is
 * waited for before the job is reported done (the device may still be
 * writing). Host memory must be registered with the device (a tier opened
 * with 'pin' for CUDA, kvti_dev register for the emulated device): the
 * lane refuses unregistered memory for every method, since the copy
 * engines would stage it through a driver bounce (the path this project
 * exists to avoid) and the kernel cannot reach it at all.
 *
 * Locking: x->mu guards the queues, x->dev[] and each xfer_dev's stop;
 * each thread owns its stream, events and staging.
 */
#include "xfer/xfer_impl.h"
#include "dev/dev.h"
#include "core/cuda.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

struct dev_thread {
	struct kvt_xfer *x;
	struct xfer_dev *xd;
	int store;
	int lane;                /* its queue: LANE_DEV0 + 2 * slot + store */
	pthread_t th;
	pthread_cond_t cv;
	int running;
	kvti_dev_stream *s;
	kvti_dev_event **ev;     /* per layer, + 1 for whole-page sums */
	uint32_t nev;
	/* page-locked staging, grown as jobs need (host_alloc) */
	void **dst;
	const void **src;
	size_t *len;
	size_t cap;              /* chunk pointers */
	const void **seg;
	size_t segcap;
	uint64_t *res;
	size_t rescap;
};

struct xfer_dev {
	int id;
	kvti_dev *dev;
	struct dev_thread t[2];  /* load, store */
	int stop;                /* x->mu */
};

static int side_dev(kvt_tier *t)
{
	return kvt_tier_kind_of(t) == KVT_TIER_HBM && !t->spec.hostdev;
}

int kvti_dev_plan(struct kvt_xfer *x, struct kvt_xfer_job *j)
{
	if ((j->d.flags & XFER_ANY_SUMS) && side_dev(j->d.src) &&
	    side_dev(j->d.dst))
		return kvti_fail(-EOPNOTSUPP, "checksums are taken on the "
				 "device side of a host <-> device move; an hbm "
				 "-> hbm move has none");
	if (side_dev(j->d.src) && side_dev(j->d.dst) &&
	    j->d.src->spec.device != j->d.dst->spec.device)
		return kvti_fail(-EOPNOTSUPP, "hbm -> hbm between two devices "
				 "(%d, %d): stage through host memory",
				 j->d.src->spec.device, j->d.dst->spec.device);
	atomic_init(&j->units_left, 1);
	return 0;
}

/* ---- staging ------------------------------------------------------------ */

static int grow(kvti_dev *d, void **p, size_t *cap, size_t need, size_t elem)
{
	void *q;
	int err;

	if (need <= *cap)
		return 0;
	need += need / 4 + 16;
	if ((err = d->ops->host_alloc(d, need * elem, &q)))
		return err;
	d->ops->host_free(d, *p); /* the previous job is done with it */
	*p = q;
	*cap = need;
	return 0;
}

static int events_grow(struct dev_thread *t, uint32_t n)
{
	kvti_dev *d = t->xd->dev;
	kvti_dev_event **ev;
	int err;

	if (n <= t->nev)
		return 0;
	if (!(ev = kvt_realloc(t->ev, n * sizeof(*ev))))
		return -ENOMEM;
	t->ev = ev;
	for (; t->nev < n; t->nev++)
		if ((err = d->ops->event_create(d, 0, &t->ev[t->nev])))
			return err;
	return 0;
}

static int stage(struct dev_thread *t, size_t chunks, size_t segs,
		 size_t res, uint32_t nev)
{
	kvti_dev *d = t->xd->dev;
	size_t c1 = t->cap, c2 = t->cap, c3 = t->cap;
	int err;

	if ((err = events_grow(t, nev)))
		return err;
	if ((err = grow(d, (void **)&t->dst, &c1, chunks, sizeof(void *))) ||
	    (err = grow(d, (void **)&t->src, &c2, chunks, sizeof(void *))) ||
	    (err = grow(d, (void **)&t->len, &c3, chunks, sizeof(size_t))))
		return err;
	t->cap = KVT_MIN(c1, KVT_MIN(c2, c3));
	if ((err = grow(d, (void **)&t->seg, &t->segcap, segs, sizeof(void *))) ||
	    (err = grow(d, (void **)&t->res, &t->rescap, res, sizeof(uint64_t))))
		return err;
	return 0;
}

/* The device address of one side's region: device memory is used as it
 * is; host memory must be registered with the device. */
static int side_base(kvti_dev *d, kvt_tier *t, void *const *bufs, char **out)
{
	kvt_tier_desc td;
	void *p;
	int err;

	*out = bufs[0];
	if (side_dev(t))
		return 0;
	if ((err = kvti_dev_host_devptr(d, bufs[0], &p))) {
		kvt_tier_info(t, &td);
		kvti_errctx("the %s tier's memory is not registered with %s "
			    "(CUDA: open it with 'pin'); the device lane moves "
			    "only registered host memory", td.name, d->name);
		return err;
	}
	*out = p;
	return 0;
}

/* ---- a job --------------------------------------------------------------- */

struct run {
	struct kvt_xfer_job *j;
	struct dev_thread *t;
	kvti_dev *d;
	size_t n, m;             /* pages, chunks per layer (n * kv) */
	uint32_t kv, L;
	char *sdev, *ddev;       /* device addresses of the two regions */
	int hash_dst;            /* sums over the destination (a load) */
	int lsums, psums;        /* per-layer / whole-page sums */
	int progress;            /* report layers as they land */
};

/* Chunk (page p, layer l, k) of a side, as a device address. */
static char *chunk_at(const struct run *r, int dst, size_t p, uint32_t l,
		      uint32_t k)
{
	const struct kvt_xfer_job *j = r->j;
	const kvt_layout *lay = dst ? j->dl : j->sl;
	void *const *bufs = dst ? j->dbufs : j->sbufs;
	char *base = dst ? r->ddev : r->sdev;
	kvt_chunk_loc c = kvt_layout_chunk(lay, dst ? job_dst_slot(j, p) :
					   job_src_slot(j, p), l, k);

	return base + (((char *)bufs[c.buf] + c.off) - (char *)bufs[0]);
}

static int enqueue_layer(struct run *r, uint32_t l)
{
	struct dev_thread *t = r->t;
	kvti_dev *d = r->d;
	size_t o = (size_t)l * r->m, n = r->n;
	size_t bytes = r->j->sl->chunk_bytes;
	int err = 0;

	for (uint32_t k = 0; k < r->kv; k++)
		for (size_t p = 0; p < n; p++) {
			t->dst[o + k * n + p] = chunk_at(r, 1, p, l, k);
			t->src[o + k * n + p] = chunk_at(r, 0, p, l, k);
			t->len[o + k * n + p] = bytes;
		}
	switch (r->j->method) {
	case KVT_XFER_CUDA_KERNEL: {
		kvti_dev_gather g = { .dst = t->dst + o, .src = t->src + o,
				      .n = r->m, .bytes = bytes,
				      .blocks = r->j->x->cfg.cuda_blocks };
		err = d->ops->gather(t->s, &g);
		break;
	}
	case KVT_XFER_CUDA_BATCH:
		err = kvti_dev_copy_batch(d, t->s, t->dst + o, t->src + o,
					  t->len + o, r->m);
		break;
	default:
		for (size_t i = 0; i < r->m && !err; i++)
			err = d->ops->copy(t->s, t->dst[o + i], t->src[o + i],
					   bytes);
		break;
	}
	if (!err && r->lsums) {
		const void **seg = t->seg + o;

		for (size_t p = 0; p < n; p++)
			for (uint32_t k = 0; k < r->kv; k++)
				seg[p * r->kv + k] = chunk_at(r, r->hash_dst, p,
							      l, k);
		kvti_dev_sum s = { .seg = seg, .nseg = r->kv,
				   .seg_len = bytes, .nitems = n,
				   .out = t->res + (size_t)l * n };
		err = d->ops->sum(t->s, &s);
	}
	if (!err)
		err = d->ops->event_record(t->ev[l], t->s);
	return err;
}

/* Whole-page sums after the last layer: page p is an item of L*kv
 * segments in page-first order. */
static int enqueue_page_sums(struct run *r)
{
	struct dev_thread *t = r->t;
	size_t per = (size_t)r->L * r->kv;

	for (size_t p = 0; p < r->n; p++)
		for (uint32_t l = 0; l < r->L; l++)
			for (uint32_t k = 0; k < r->kv; k++)
				t->seg[p * per + l * r->kv + k] =
					chunk_at(r, r->hash_dst, p, l, k);
	kvti_dev_sum s = { .seg = t->seg, .nseg = (uint32_t)per,
			   .seg_len = r->j->sl->chunk_bytes, .nitems = r->n,
			   .out = t->res };
	int err = r->d->ops->sum(t->s, &s);

	return err ? err : r->d->ops->event_record(t->ev[r->L], t->s);
}

/* Layer @l's event completed: its sums, then its progress. */
static void layer_done(struct run *r, uint32_t l)
{
	struct kvt_xfer_job *j = r->j;

	if (r->lsums) {
		const uint64_t *res = r->t->res + (size_t)l * r->n;

		for (size_t p = 0; p < r->n && !kvti_job_stopped(j); p++)
			kvti_job_lsum(j, p, l, res[p]);
		kvti_xfer_count_dev_sums(j, r->n);
	}
	if (r->progress && !kvti_job_stopped(j))
		kvti_job_layer_landed(j, l);
}

static void dev_run(struct dev_thread *t, struct kvt_xfer_job *j)
{
	kvti_dev *d = t->xd->dev;
	struct run r = { .j = j, .t = t, .d = d, .n = j->d.npages,
			 .kv = j->sl->kv, .L = j->layers };
	uint32_t told = 0, queued = 0;
	size_t segs;
	int err;

	kvti_job_started(j);
	/* the engine's work on these blocks first (its IPC event) */
	err = j->d.wait ? d->ops->stream_wait_event(t->s, j->d.wait) : 0;
	r.m = r.n * r.kv;
	r.hash_dst = side_dev(j->d.dst);
	r.lsums = !!(j->d.flags & XFER_LAYER_SUMS);
	r.psums = !!(j->d.flags & XFER_PAGE_SUMS);
	r.progress = j->dl->kind != KVT_LAYOUT_PAGE_FIRST &&
		     !(j->d.flags & KVT_XFER_VERIFY);
	segs = r.m * r.L;
	/* the device copies chunks whole: memory registered in rows
	 * (geom.h "ROWS") is host memory, moved by the cpu lane */
	if (!err && (kvt_layout_rows(j->sl) > 1 || kvt_layout_rows(j->dl) > 1))
		err = kvti_fail(KVT_ENOTBUILT, "device lane: a chunk kept in "
				"rows (token/head strides) is not copied by "
				"the device path");
	if (!err)
		err = stage(t, r.m * r.L, segs, r.n * (r.lsums ? r.L : 1),
			    r.L + 1);
	if (!err)
		err = side_base(d, j->d.src, j->sbufs, &r.sdev);
	if (!err)
		err = side_base(d, j->d.dst, j->dbufs, &r.ddev);
	for (; !err && queued < r.L && !kvti_job_stopped(j); queued++) {
		if ((err = enqueue_layer(&r, queued)))
			break;
		while (told < queued) {
			int q = d->ops->event_query(t->ev[told]);

			if (q < 0)
				err = q;
			if (q != 1)
				break;
			layer_done(&r, told++);
		}
	}
	if (!err && r.psums && queued == r.L && !kvti_job_stopped(j))
		err = enqueue_page_sums(&r);
	else
		r.psums = 0;
	if (err) {
		kvti_job_fail(j, err, "%s", kvt_errdetail());
		d->ops->stream_sync(t->s); /* nothing may still be writing */
	}
	for (; told < queued; told++) {
		if (!err && (err = d->ops->event_sync(t->ev[told], -1))) {
			kvti_job_fail(j, err, "%s: %s", d->name, kvt_errdetail());
			d->ops->stream_sync(t->s);
		}
		if (!err)
			layer_done(&r, told);
	}
	if (!err && r.psums) {
		if ((err = d->ops->event_sync(t->ev[r.L], -1))) {
			kvti_job_fail(j, err, "%s: %s", d->name, kvt_errdetail());
		} else {
			for (size_t p = 0; p < r.n && !kvti_job_stopped(j); p++)
				kvti_job_sum(j, p, t->res[p]);
			kvti_xfer_count_dev_sums(j, r.n * r.L);
		}
	}
	if (!kvti_job_stopped(j))
		atomic_store(&j->bytes_done, j->bytes);
	kvti_job_units_done(j, 1);
}

/* ---- threads -------------------------------------------------------------- */

static void *dev_main(void *arg)
{
	struct dev_thread *t = arg;
	struct kvt_xfer *x = t->x;
	int lane = t->lane;

	kvti_thread_nice(x->nice);
	pthread_mutex_lock(&x->mu);
	for (;;) {
		struct kvt_xfer_job *j = x->paused ? NULL :
				       kvti_queue_head(x, lane);
		if (!j) {
			if (t->xd->stop)
				break;
			pthread_cond_wait(&t->cv, &x->mu);
			continue;
		}
		kvti_queue_remove(x, j);
		pthread_mutex_unlock(&x->mu);
		dev_run(t, j);
		pthread_mutex_lock(&x->mu);
	}
	pthread_mutex_unlock(&x->mu);
	return NULL;
}

static void thread_free(struct dev_thread *t)
{
	kvti_dev *d = t->xd->dev;

	if (t->s)
		d->ops->stream_destroy(t->s);
	for (uint32_t i = 0; i < t->nev; i++)
		d->ops->event_destroy(t->ev[i]);
	kvt_free(t->ev);
	d->ops->host_free(d, t->dst);
	d->ops->host_free(d, (void *)t->src);
	d->ops->host_free(d, t->len);
	d->ops->host_free(d, (void *)t->seg);
	d->ops->host_free(d, t->res);
	pthread_cond_destroy(&t->cv);
}

/* Stop a device's threads and free it: x->mu held on entry and on
 * return, dropped while the threads are joined. */
static void xdev_free(struct kvt_xfer *x, struct xfer_dev *xd)
{
	xd->stop = 1;
	for (int i = 0; i < 2; i++)
		if (xd->t[i].x)
			pthread_cond_signal(&xd->t[i].cv);
	pthread_mutex_unlock(&x->mu);
	for (int i = 0; i < 2; i++)
		if (xd->t[i].running)
			pthread_join(xd->t[i].th, NULL);
	for (int i = 0; i < 2; i++)
		if (xd->t[i].x)
			thread_free(&xd->t[i]);
	kvti_dev_put(xd->dev);
	kvt_free(xd);
	pthread_mutex_lock(&x->mu);
}

/* x->mu held. */
/* The copy method of each direction on @d, said once when its lanes
 * start: loads (latency-critical) by the SM-capped gather kernel, stores
 * (background) by batched copy-engine DMA, unless configured otherwise;
 * where batched copies are not built, stores go one copy per chunk. */
static void report_methods(struct kvt_xfer *x, kvti_dev *d)
{
	int ld = x->cfg.cuda_load, st = x->cfg.cuda_store;
	int nobatch = !(d->caps & KVTI_DEV_CAP_BATCH);
	char lb[32] = "";

	if (ld == KVT_XFER_CUDA_KERNEL)
		snprintf(lb, sizeof(lb), " (%u blocks)", x->cfg.cuda_blocks);
	if (nobatch && (ld == KVT_XFER_CUDA_BATCH || st == KVT_XFER_CUDA_BATCH))
		kvti_warn("xfer: %s has no batched copies "
			  "(cudaMemcpyBatchAsync: CUDA 12.8 or later); %s by "
			  "one copy per chunk instead", d->name,
			  st == KVT_XFER_CUDA_BATCH ? "stores" : "loads");
	if (nobatch && ld == KVT_XFER_CUDA_BATCH)
		ld = KVT_XFER_CUDA_CHUNK;
	if (nobatch && st == KVT_XFER_CUDA_BATCH)
		st = KVT_XFER_CUDA_CHUNK;
	kvti_info("xfer: %s: loads by %s%s, stores by %s, both verified by "
		  "the device's checksum kernel", d->name,
		  kvt_xfer_method_name(ld), lb, kvt_xfer_method_name(st));
}

int kvti_dev_lane_start(struct kvt_xfer *x, int id, int *slot)
{
	struct xfer_dev *xd;
	int free_slot = -1, err;

	for (int i = 0; i < XFER_MAX_DEVS; i++) {
		if (x->dev[i] && x->dev[i]->id == id) {
			*slot = i;
			return 0;
		}
		if (!x->dev[i] && free_slot < 0)
			free_slot = i;
	}
	if (x->cfg.cuda_device > 0 && id != x->cfg.cuda_device)
		return kvti_fail(-EINVAL, "the engine is configured for device "
				 "%d, the job's hbm tier is on device %d",
				 x->cfg.cuda_device, id);
	if (free_slot < 0)
		return kvti_fail(-ENOSPC, "the transfer engine serves %d devices "
				 "already", XFER_MAX_DEVS);
	if (!(xd = kvt_calloc(1, sizeof(*xd))))
		return -ENOMEM;
	xd->id = id;
	if ((err = kvti_dev_get(id, &xd->dev))) {
		kvt_free(xd);
		return err;
	}
	x->dev[free_slot] = xd;
	for (int i = 0; i < 2; i++) {
		struct dev_thread *t = &xd->t[i];

		t->x = x;
		t->xd = xd;
		t->store = i;
		t->lane = LANE_DEV0 + 2 * free_slot + i;
		pthread_cond_init(&t->cv, NULL);
		if ((err = xd->dev->ops->stream_create(xd->dev, i == 0, &t->s)))
			goto fail;
	}
	for (int i = 0; i < 2; i++) {
		int e = kvti_fault() ? EAGAIN :
			pthread_create(&xd->t[i].th, NULL, dev_main, &xd->t[i]);
		if (e) {
			err = kvti_fail(-e, "starting the device lane: %s",
					strerror(e));
			goto fail;
		}
		xd->t[i].running = 1;
	}
	report_methods(x, xd->dev);
	*slot = free_slot;
	return 0;
fail:
	kvti_errctx("device lane on %s", xd->dev->name);
	x->dev[free_slot] = NULL;
	xdev_free(x, xd);
	return err;
}

/* x->mu held: checks that need the open device. */
int kvti_dev_check(struct kvt_xfer *x, struct kvt_xfer_job *j, int slot)
{
	kvti_dev *d = x->dev[slot]->dev;
	char *p;
	int err;

	if (j->d.wait && kvti_dev_event_dev(j->d.wait) != d)
		return kvti_fail(-EINVAL, "the job waits on an event of another "
				 "device than %s", d->name);
	if (j->method == KVT_XFER_CUDA_BATCH && !(d->caps & KVTI_DEV_CAP_BATCH)) {
		if (!j->method_auto)
			return kvti_fail(KVT_ENOTBUILT, "cuda-batch needs "
					 "cudaMemcpyBatchAsync (CUDA 12.8 or "
					 "later); %s has no batched copies",
					 d->name);
		/* the engine's choice where batches are not built: said
		 * when the device's lanes started, counted per job */
		j->method = KVT_XFER_CUDA_CHUNK;
		atomic_fetch_add_explicit(&x->method_substituted, 1,
					  memory_order_relaxed);
	}
	if ((j->d.flags & XFER_PAGE_SUMS) &&
	    (uint64_t)j->layers * j->sl->kv > d->sum_maxseg)
		return kvti_fail(-EOPNOTSUPP, "whole-page checksums of %u "
				 "chunks exceed what %s's checksum kernel takes "
				 "(%u); use layer sums", j->layers * j->sl->kv,
				 d->name, d->sum_maxseg);
	if ((err = side_base(d, j->d.src, j->sbufs, &p)) ||
	    (err = side_base(d, j->d.dst, j->dbufs, &p)))
		return err;
	return 0;
}

void kvti_dev_kick(struct kvt_xfer *x, int lane)
{
	int i = (lane - LANE_DEV0) / 2;

	if (i >= 0 && i < XFER_MAX_DEVS && x->dev[i])
		pthread_cond_signal(&x->dev[i]->t[(lane - LANE_DEV0) & 1].cv);
}

void kvti_dev_stop(struct kvt_xfer *x)
{
	pthread_mutex_lock(&x->mu);
	for (int i = 0; i < XFER_MAX_DEVS; i++) {
		struct xfer_dev *xd = x->dev[i];

		if (!xd)
			continue;
		x->dev[i] = NULL;
		xdev_free(x, xd);
	}
	pthread_mutex_unlock(&x->mu);
}

int kvt_xfer_devices(kvt_xfer *x, int *ids, struct kvt_dev_stat *st, int max)
{
	int n = 0;

	pthread_mutex_lock(&x->mu);
	for (int i = 0; i < XFER_MAX_DEVS; i++) {
		if (!x->dev[i])
			continue;
		if (n < max) {
			if (ids)
				ids[n] = x->dev[i]->id;
			if (st)
				kvt_dev_stat_get((kvt_dev *)x->dev[i]->dev, &st[n]);
		}
		n++;
	}
	pthread_mutex_unlock(&x->mu);
	return n;
}

int kvti_dev_contig(int id, void *dst, const void *src, uint64_t n,
		    double *seconds)
{
	kvti_dev *d;
	uint64_t t0;
	int err;

	if ((err = kvti_dev_get(id, &d)))
		return err;
	t0 = kvt_now_ns();
	err = kvti_dev_copy_sync(d, dst, src, (size_t)n);
	*seconds = (kvt_now_ns() - t0) / 1e9;
	kvti_dev_put(d);
	return err;
}
