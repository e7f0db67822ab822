/*
 * contig.c — kvt_xfer_contig_copy(): the limit the engine is measured
 * against (`kvtier bench xfer`, `bench server --baselines`): the same
 * bytes moved as one contiguous region, host to host by threads, or by
 * one synchronous device copy when either side is a GPU.
 *
 *   src tier's region (bufs[0], carved back to back) --> dst tier's region
 *   1 thread: memcpy()   N threads: 4 MiB pieces taken in turn, each with
 *   the engine's streaming-store copy, then kvti_copy_fence()
 *
 * Invariant: it uses the engine's copy routine and worker count, nothing
 * of its queues or lanes, so it times the copy alone.
 *
 * Locking: none; the pieces are handed out by one atomic counter, the
 * threads are joined before the time is taken.
 */
#include "xfer/xfer_impl.h"

#include <errno.h>
#include <string.h>

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
				 kvti_xfer_tier_name(t));
	if (kvt_layout_region_bytes(l) < bytes)
		return kvti_fail(-EINVAL, "%s holds %llu bytes, less than %llu",
				 kvti_xfer_tier_name(t),
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
	if (kvti_xfer_is_gpu(src) || kvti_xfer_is_gpu(dst))
		return kvti_dev_contig(kvti_xfer_is_gpu(dst) ?
					       dst->spec.device :
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
