/*
 * submit.c — kvt_xfer_submit(): a transfer described, checked, planned
 * and queued.
 *
 *   check_desc (tiers, flags, sums, priority, method, KV shape) ->
 *   check_slots (in range, destinations distinct, no slot both read and
 *   written) -> job_new (slot lists copied) -> pick_path (lane, method,
 *   mover, flow) -> the lane's plan (cpu.c, io.c, dev_lane.c) -> under
 *   x->mu: lane_ready (the io or device lane started, device checks) ->
 *   queued, the lane kicked
 *
 * Invariant: submission checks everything a job could trip on later
 * (tiers, shapes, slots, duplicates, the path between the tiers, the
 * device) so that a queued job can only fail for reasons of the moment:
 * an I/O error, a checksum, a cancel. A refused job leaves nothing
 * behind (job_drop_unsubmitted) and kvt_errdetail() says why.
 *
 * Locking: the checks and the plan run without a lock on the caller's
 * thread; lane start, queueing and the kick under x->mu.
 */
#include "xfer/xfer_impl.h"
#include "core/cuda.h"
#include "dev/dev.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

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
					 d->src_slots[i],
					 kvti_xfer_tier_name(d->src),
					 (unsigned long long)sn);
		if (d->dst_slots[i] >= dn)
			return kvti_fail(-ERANGE, "page %zu: destination slot %u "
					 "out of range (%s has %llu slots)", i,
					 d->dst_slots[i],
					 kvti_xfer_tier_name(d->dst),
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
						kvti_xfer_tier_name(d->src));
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
	if (d->wait && !kvti_xfer_is_gpu(d->src) && !kvti_xfer_is_gpu(d->dst))
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
	int m = j->d.method;
	int sg = kvti_xfer_is_gpu(s), tg = kvti_xfer_is_gpu(t);

	if ((sk == KVT_TIER_SSD && (tk == KVT_TIER_SSD || tg)) ||
	    (tk == KVT_TIER_SSD && sg))
		return kvti_fail(-EOPNOTSUPP, "no path from %s to %s: stage the "
				 "pages through a host tier",
				 kvti_xfer_tier_name(s),
				 kvti_xfer_tier_name(t));
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
					 kvt_xfer_method_name(m),
					 kvti_xfer_tier_name(s),
					 kvti_xfer_tier_name(t));
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
					 kvti_xfer_tier_name(s),
					 kvti_xfer_tier_name(t));
	} else {
		j->lane = LANE_CPU;
		if (m == KVT_XFER_AUTO)
			m = KVT_XFER_CPU;
		if (m != KVT_XFER_CPU)
			return kvti_fail(-EOPNOTSUPP, "%s cannot move pages "
					 "between %s and %s (host tiers: cpu)",
					 kvt_xfer_method_name(m),
					 kvti_xfer_tier_name(s),
					 kvti_xfer_tier_name(t));
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
	kvti_job_put(j);
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
			kvti_cuda_probe(x);
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
		kvti_queue_push(x, j);
		x->unfinished++;
		if (!x->paused)
			kvti_lane_kick(x, j->lane);
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
