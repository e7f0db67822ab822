/*
 * rate.c — the transfer engine's measured rates (kvt_xfer_rate_get()).
 *
 * Per (source kind, destination kind): the bytes of jobs that ended well
 * (and of runs other parts note whole, kvti_xfer_rate_add(): the cache's
 * staged ssd transfers, two jobs of other pairs),
 * over the union of the times they ran. A job that ends at t adds its
 * bytes and the part of [t_start, t] not yet counted (after @mark: the
 * union of intervals, exactly when they end in the order they started,
 * slightly short when a long job outlives a short one it started before).
 * Both sums decay as exp(-dt / 2 s), so the rate follows the machine:
 *
 *     busy:  |==A==|   |=====B=====|
 *                        |==C==|          C ends: + (its end - B's start)
 *     mark:        ^A end        ^C end  ^B end
 *
 * Locking: x->rmu, a leaf taken by whichever lane thread finishes a job and
 * by readers.
 */
#include "xfer/xfer_impl.h"
#include "xfer/xfer_int.h"

#include <errno.h>
#include <math.h>

#define TAU_S 2.0

static void decay(struct xfer_rate *r, uint64_t now)
{
	if (now > r->decay_ns) {
		double f = exp(-(double)(now - r->decay_ns) / 1e9 / TAU_S);

		r->bytes *= f;
		r->busy *= f;
	}
	r->decay_ns = now;
}

void kvti_xfer_rate_add(kvt_xfer *x, kvt_tier_kind src, kvt_tier_kind dst,
			uint64_t bytes, uint64_t t_start, uint64_t t_end)
{
	struct xfer_rate *r;
	uint64_t from;

	if (!x || (unsigned)src >= KVT_TIER_COUNT ||
	    (unsigned)dst >= KVT_TIER_COUNT || !bytes || t_end < t_start)
		return;
	r = &x->rates[src][dst];
	pthread_mutex_lock(&x->rmu);
	decay(r, t_end);
	from = KVT_MAX(r->mark_ns, t_start);
	if (t_end > from)
		r->busy += (double)(t_end - from) / 1e9;
	r->mark_ns = KVT_MAX(r->mark_ns, t_end);
	r->bytes += (double)bytes;
	r->total += (double)bytes;
	r->jobs++;
	pthread_mutex_unlock(&x->rmu);
}

void kvti_rate_job_done(struct kvt_xfer *x, const struct kvt_xfer_job *j)
{
	kvti_xfer_rate_add(x, kvt_tier_kind_of(j->d.src),
			   kvt_tier_kind_of(j->d.dst), j->bytes, j->t_start,
			   j->t_end);
}

int kvt_xfer_rate_get(kvt_xfer *x, kvt_tier_kind src, kvt_tier_kind dst,
		      kvt_xfer_rate *out)
{
	struct xfer_rate r;

	if (!x || !out || (unsigned)src >= KVT_TIER_COUNT ||
	    (unsigned)dst >= KVT_TIER_COUNT)
		return kvti_fail(-EINVAL, "kvt_xfer_rate_get: bad arguments");
	pthread_mutex_lock(&x->rmu);
	decay(&x->rates[src][dst], kvt_now_ns());
	r = x->rates[src][dst];
	pthread_mutex_unlock(&x->rmu);
	out->bytes = r.bytes;
	out->busy_s = r.busy;
	out->gbps = r.busy > 0 ? r.bytes / r.busy / 1e9 : 0;
	out->jobs = r.jobs;
	out->total_bytes = r.total;
	return 0;
}
