/*
 * emu_stream.c — the emulated device's streams (emu.c has the design). A
 * stream is a thread running a FIFO of operations in order: copies and
 * batches (counted as copy engine), gather (counted as kernel), sum (xxh3.h,
 * the CUDA checksum kernel's function), event records, waits on events and
 * on 32-bit values (futex, bounded by the wait limit), host functions and
 * syncs. Every operation checks what it touches when it runs, holding the
 * device's ranges read-locked (emu.c: THE ACCESS CHECK), and spends its
 * "DMA time" (delay) before its bytes land. The first failure since a
 * record completes that record with the error. Locking: s->mu guards the
 * queue, stop and the sync handshake; the stream thread holds no lock while
 * it runs an operation except e->rw (read).
 */
#include "dev/emu_impl.h"

/* ---- streams ------------------------------------------------------------- */

static void stream_fail(kvti_dev_stream *s, int err)
{
	if (s->err)
		return;
	s->err = err;
	snprintf(s->detail, sizeof(s->detail), "%s", kvt_errdetail());
}

static void delay(struct emu *e, uint64_t bytes)
{
	uint64_t per = atomic_load_explicit(&e->delay, memory_order_relaxed);
	struct timespec ts;
	uint64_t ns;

	if (!per || !bytes)
		return;
	ns = (uint64_t)((double)bytes * (double)per / (1024.0 * 1024.0));
	ts.tv_sec = (time_t)(ns / 1000000000u);
	ts.tv_nsec = (long)(ns % 1000000000u);
	nanosleep(&ts, NULL);
}

/* Take one damaged landing if any is left (DAMAGE above). */
static int damage_one(struct emu *e)
{
	uint64_t n = atomic_load_explicit(&e->damage, memory_order_relaxed);

	while (n && !atomic_compare_exchange_weak(&e->damage, &n, n - 1))
		;
	return n != 0;
}

static int do_copy(kvti_dev_stream *s, void *dst, const void *src, size_t n)
{
	int err;

	if ((err = kvti_emu_access_ok(s->d, src, n, 0)) ||
	    (err = kvti_emu_access_ok(s->d, dst, n, 1)))
		return err;
	memcpy(dst, src, n);
	if (n && damage_one(s->e))
		*(volatile unsigned char *)dst ^= 0x5a;
	return 0;
}

/* A synchronous copy: device memory on one side at least, the other may
 * be any host memory (pageable, as CUDA allows). */
int kvti_emu_copy_sync(kvti_dev *d, void *dst, const void *src, size_t n)
{
	struct emu *e = E(d);
	struct emu_range *rs, *rd;
	int err = 0;

	pthread_rwlock_rdlock(&e->rw);
	rs = kvti_emu_range_of(e, src, n);
	rd = kvti_emu_range_of(e, dst, n);
	if ((!rs || rs->kind >= R_HOST) && (!rd || rd->kind >= R_HOST))
		err = kvti_fail(-EINVAL, "%s: a copy between two host buffers "
				"(%p -> %p) is not the device's", d->name, src,
				dst);
	else if (rd && (rd->flags & KVTI_DEV_HOST_READONLY))
		err = kvti_emu_access_ok(d, dst, n, 1);
	if (!err)
		memcpy(dst, src, n);
	pthread_rwlock_unlock(&e->rw);
	if (!err) {
		kvti_dev_count(d, DST_CE_BYTES, n);
		kvti_dev_count(d, DST_CE_OPS, 1);
	}
	return err;
}

static int run_sum(kvti_dev_stream *s, const kvti_dev_sum *g)
{
	int err;

	if (g->nseg == 0 || g->nseg > s->d->sum_maxseg || !g->seg_len)
		return kvti_fail(-EINVAL, "%s: sum of %u segments of %llu bytes",
				 s->d->name, g->nseg,
				 (unsigned long long)g->seg_len);
	if ((err = kvti_emu_access_ok(s->d, g->out, g->nitems * sizeof(uint64_t), 1)))
		return err;
	for (size_t i = 0; i < g->nitems; i++) {
		const uint8_t *const *segs =
			(const uint8_t *const *)(g->seg + i * g->nseg);
		kvt_xxh3_src src = { .seg = segs, .seg_len = g->seg_len,
				     .nseg = g->nseg };

		for (uint32_t k = 0; k < g->nseg; k++)
			if ((err = kvti_emu_access_ok(s->d, segs[k], g->seg_len, 0)))
				return err;
		g->out[i] = kvt_xxh3_src_64(&src, 0, NULL);
	}
	kvti_dev_count(s->d, DST_SUM_BYTES, g->nitems * g->nseg * g->seg_len);
	kvti_dev_count(s->d, DST_SUM_ITEMS, g->nitems);
	return 0;
}

/* Wait (stream thread) until @ready; -ETIMEDOUT after the wait limit, or
 * when the stream is being destroyed. */
static int wait_event(kvti_dev_stream *s, struct emu_shev *sh, uint64_t target)
{
	uint64_t end = kvt_now_ns() + atomic_load(&s->e->wait_limit);

	while (atomic_load(&sh->completed) < target) {
		uint32_t f = atomic_load(&sh->futex);
		int stop;

		if (atomic_load(&sh->completed) >= target)
			break;
		pthread_mutex_lock(&s->mu);
		stop = s->stop;
		pthread_mutex_unlock(&s->mu);
		if (stop || kvt_now_ns() >= end)
			return kvti_fail(-ETIMEDOUT, "%s: stream wait for an "
					 "event: %s", s->d->name, stop ?
					 "the stream is being destroyed" :
					 "not complete within the wait limit");
		fwait(&sh->futex, f, 10 * 1000 * 1000);
	}
	return 0;
}

static int wait_value(kvti_dev_stream *s, const uint32_t *addr, uint32_t value)
{
	uint64_t end = kvt_now_ns() + atomic_load(&s->e->wait_limit);
	int err;

	pthread_rwlock_rdlock(&s->e->rw);
	err = kvti_emu_access_ok(s->d, addr, sizeof(*addr), 0);
	pthread_rwlock_unlock(&s->e->rw);
	if (err)
		return err;
	for (;;) {
		uint32_t v = __atomic_load_n(addr, __ATOMIC_ACQUIRE);
		int stop;

		if ((int32_t)(v - value) >= 0)
			return 0;
		pthread_mutex_lock(&s->mu);
		stop = s->stop;
		pthread_mutex_unlock(&s->mu);
		if (stop || kvt_now_ns() >= end)
			return kvti_fail(-ETIMEDOUT, "%s: stream wait for the "
					 "value at %p to reach %u (it is %u): %s",
					 s->d->name, (const void *)addr, value, v,
					 stop ? "the stream is being destroyed" :
					 "not within the wait limit");
		/* the daemon wakes the word's futex; poll too, a writer
		 * need not */
		fwait(addr, v, 2 * 1000 * 1000);
	}
}

static void ev_complete(kvti_dev_stream *s, kvti_dev_event *ev, uint64_t seq)
{
	struct emu_shev *sh = ev->sh;
	uint64_t c = atomic_load(&sh->completed);

	snprintf(sh->detail, sizeof(sh->detail), "%s", s->err ? s->detail : "");
	atomic_store(&sh->status, s->err);
	s->err = 0;
	while (c < seq && !atomic_compare_exchange_weak(&sh->completed, &c, seq))
		;
	atomic_fetch_add(&sh->futex, 1);
	fwake(&sh->futex);
}

static void run_op(kvti_dev_stream *s, struct emu_op *op)
{
	struct emu *e = s->e;
	uint64_t bytes = 0;
	int err = 0;

	switch (op->type) {
	case OP_COPY:
		/* a copy takes its time, then its bytes land (a peer that
		 * does not wait for it reads the old bytes) */
		delay(e, op->u.copy.n);
		pthread_rwlock_rdlock(&e->rw);
		err = do_copy(s, op->u.copy.dst, op->u.copy.src, op->u.copy.n);
		pthread_rwlock_unlock(&e->rw);
		if (!err) {
			kvti_dev_count(s->d, DST_CE_BYTES, op->u.copy.n);
			kvti_dev_count(s->d, DST_CE_OPS, 1);
		}
		break;
	case OP_BATCH:
		for (size_t i = 0; i < op->u.batch.count; i++)
			bytes += op->u.batch.n[i];
		delay(e, bytes);
		pthread_rwlock_rdlock(&e->rw);
		for (size_t i = 0; i < op->u.batch.count && !err; i++)
			err = do_copy(s, op->u.batch.dst[i], op->u.batch.src[i],
				      op->u.batch.n[i]);
		pthread_rwlock_unlock(&e->rw);
		if (!err) {
			kvti_dev_count(s->d, DST_CE_BYTES, bytes);
			kvti_dev_count(s->d, DST_CE_OPS, op->u.batch.count);
		}
		break;
	case OP_GATHER: {
		const kvti_dev_gather *g = &op->u.gather;

		delay(e, g->n * g->bytes);
		pthread_rwlock_rdlock(&e->rw);
		for (size_t i = 0; i < g->n && !err; i++)
			err = do_copy(s, g->dst[i], g->src[i], g->bytes);
		pthread_rwlock_unlock(&e->rw);
		if (!err) {
			kvti_dev_count(s->d, DST_KERNEL_BYTES, g->n * g->bytes);
			kvti_dev_count(s->d, DST_KERNEL_OPS, 1);
		}
		break;
	}
	case OP_SUM:
		pthread_rwlock_rdlock(&e->rw);
		err = run_sum(s, &op->u.sum);
		pthread_rwlock_unlock(&e->rw);
		break;
	case OP_RECORD:
		ev_complete(s, op->u.ev.e, op->u.ev.seq);
		kvti_emu_event_put(op->u.ev.e);
		break;
	case OP_WAIT_EVENT:
		err = wait_event(s, op->u.ev.e->sh, op->u.ev.seq);
		kvti_emu_event_put(op->u.ev.e);
		break;
	case OP_WAIT_VALUE:
		err = wait_value(s, op->u.wv.addr, op->u.wv.value);
		break;
	case OP_FN:
		op->u.fn.fn(op->u.fn.arg);
		break;
	case OP_SYNC:
		pthread_mutex_lock(&s->mu);
		op->u.sync->err = s->err;
		snprintf(op->u.sync->detail, sizeof(op->u.sync->detail), "%s",
			 s->detail);
		s->err = 0;
		op->u.sync->done = 1;
		pthread_cond_broadcast(&s->cv);
		pthread_mutex_unlock(&s->mu);
		break;
	}
	if (err)
		stream_fail(s, err);
}

static void *stream_main(void *arg)
{
	kvti_dev_stream *s = arg;

	pthread_mutex_lock(&s->mu);
	for (;;) {
		struct emu_op *op = s->head;

		if (!op) {
			if (s->stop)
				break;
			pthread_cond_wait(&s->cv, &s->mu);
			continue;
		}
		s->head = op->next;
		if (!s->head)
			s->tail = NULL;
		pthread_mutex_unlock(&s->mu);
		run_op(s, op);
		kvt_free(op);
		pthread_mutex_lock(&s->mu);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

static int push(kvti_dev_stream *s, const struct emu_op *o)
{
	struct emu_op *op = kvt_malloc(sizeof(*op));

	if (!op)
		return -ENOMEM;
	*op = *o;
	op->next = NULL;
	pthread_mutex_lock(&s->mu);
	if (s->tail)
		s->tail->next = op;
	else
		s->head = op;
	s->tail = op;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	return 0;
}

int kvti_emu_stream_create(kvti_dev *d, int high_prio, kvti_dev_stream **out)
{
	kvti_dev_stream *s = kvt_calloc(1, sizeof(*s));
	int e;

	(void)high_prio; /* threads of equal priority: recorded only */
	if (!s)
		return -ENOMEM;
	s->d = d;
	s->e = E(d);
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	e = kvti_fault() ? EAGAIN : pthread_create(&s->th, NULL, stream_main, s);
	if (e) {
		pthread_cond_destroy(&s->cv);
		pthread_mutex_destroy(&s->mu);
		kvt_free(s);
		return kvti_fail(-e, "%s: stream thread: %s", d->name,
				 strerror(e));
	}
	*out = s;
	return 0;
}

void kvti_emu_stream_destroy(kvti_dev_stream *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->mu);
	s->stop = 1; /* the thread runs what is queued, then leaves */
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	pthread_join(s->th, NULL);
	pthread_cond_destroy(&s->cv);
	pthread_mutex_destroy(&s->mu);
	kvt_free(s);
}

int kvti_emu_stream_sync(kvti_dev_stream *s)
{
	struct emu_sync sy = { 0 };
	struct emu_op op = { .type = OP_SYNC, .u.sync = &sy };
	int err;

	if ((err = push(s, &op)))
		return err;
	pthread_mutex_lock(&s->mu);
	while (!sy.done)
		pthread_cond_wait(&s->cv, &s->mu);
	pthread_mutex_unlock(&s->mu);
	if (sy.err)
		return kvti_fail(sy.err, "%s", sy.detail);
	return 0;
}

int kvti_emu_copy(kvti_dev_stream *s, void *dst, const void *src, size_t n)
{
	struct emu_op op = { .type = OP_COPY };

	op.u.copy.dst = dst;
	op.u.copy.src = src;
	op.u.copy.n = n;
	return push(s, &op);
}

int kvti_emu_copy_batch(kvti_dev_stream *s, void *const *dst,
			  const void *const *src, const size_t *n, size_t count)
{
	struct emu_op op = { .type = OP_BATCH };

	op.u.batch.dst = dst;
	op.u.batch.src = src;
	op.u.batch.n = n;
	op.u.batch.count = count;
	return push(s, &op);
}

int kvti_emu_gather(kvti_dev_stream *s, const kvti_dev_gather *g)
{
	struct emu_op op = { .type = OP_GATHER };

	op.u.gather = *g;
	return push(s, &op);
}

int kvti_emu_sum(kvti_dev_stream *s, const kvti_dev_sum *g)
{
	struct emu_op op = { .type = OP_SUM };

	op.u.sum = *g;
	return push(s, &op);
}

int kvti_emu_event_record(kvti_dev_event *ev, kvti_dev_stream *s)
{
	struct emu_op op = { .type = OP_RECORD };
	int err;

	if (ev->imported)
		return kvti_fail(-EINVAL, "%s: recording an imported event "
				 "(only its owner records it)", ev->d->name);
	atomic_fetch_add(&ev->refs, 1);
	op.u.ev.e = ev;
	op.u.ev.seq = atomic_fetch_add(&ev->sh->recorded, 1) + 1;
	if ((err = push(s, &op))) {
		/* nothing will complete this record: complete it failed */
		atomic_store(&ev->sh->status, err);
		atomic_store(&ev->sh->completed, op.u.ev.seq);
		kvti_emu_event_put(ev);
	}
	return err;
}

int kvti_emu_stream_wait_event(kvti_dev_stream *s, kvti_dev_event *ev)
{
	struct emu_op op = { .type = OP_WAIT_EVENT };
	int err;

	atomic_fetch_add(&ev->refs, 1);
	op.u.ev.e = ev;
	op.u.ev.seq = atomic_load(&ev->sh->recorded);
	if ((err = push(s, &op)))
		kvti_emu_event_put(ev);
	return err;
}

int kvti_emu_stream_wait_value(kvti_dev_stream *s, const uint32_t *addr,
				 uint32_t value)
{
	struct emu_op op = { .type = OP_WAIT_VALUE };

	op.u.wv.addr = addr;
	op.u.wv.value = value;
	return push(s, &op);
}

int kvti_emu_host_fn(kvti_dev_stream *s, void (*fn)(void *), void *arg)
{
	struct emu_op op = { .type = OP_FN };

	op.u.fn.fn = fn;
	op.u.fn.arg = arg;
	return push(s, &op);
}

