/*
 * metrics.c — the daemon's metrics registry: names, the registry (create,
 * tenants, the cache and the collect hook) and the hot path (metrics.h
 * has the picture, the threading rule and the API; metrics_impl.h how the
 * four files split the work).
 *
 * Layout: one struct kvtd_mtenant per tenant holds every counter of that
 * tenant as a relaxed atomic; the registry keeps the node block inline and
 * the tenant blocks in an array appended under its mutex. An update is one
 * relaxed add on the caller's block: no lock, any thread. A render
 * (metrics_snap.c) copies everything into a plain snapshot under the
 * mutex and formats it as text (metrics_text.c) or JSON (metrics_json.c):
 * both renderings come from the same numbers.
 *
 * Locking: m->mu guards the tenant array and the cache/collect pointers;
 * the counters take no lock.
 */
#include "server/metrics_impl.h"

#include "core/core.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

/* 1-2-5 series: 1 us .. 10 s, in nanoseconds */
static const uint64_t bound_ns[KVTD_HIST_BOUNDS] = {
	1000ull, 2000ull, 5000ull,
	10000ull, 20000ull, 50000ull,
	100000ull, 200000ull, 500000ull,
	1000000ull, 2000000ull, 5000000ull,
	10000000ull, 20000000ull, 50000000ull,
	100000000ull, 200000000ull, 500000000ull,
	1000000000ull, 2000000000ull, 5000000000ull,
	10000000000ull,
};

const char *const kvti_metrics_op_names[KVTD_OP_COUNT] = {
	"lookup", "load", "store",
};
const char *const kvti_metrics_lease_names[KVTD_LEASE_END_COUNT] = {
	"deadline", "disconnect",
};
const char *const kvti_metrics_perr_names[KVTD_PERR_COUNT] = {
	"malformed", "truncated", "oversized", "version", "unknown_op",
	"out_of_order", "not_owner", "geometry", "auth", "idle", "other",
};

const char *kvtd_op_name(enum kvtd_op op)
{
	return (unsigned)op < KVTD_OP_COUNT ? kvti_metrics_op_names[op] : "?";
}

const char *kvtd_lease_end_name(enum kvtd_lease_end why)
{
	return (unsigned)why < KVTD_LEASE_END_COUNT ?
		       kvti_metrics_lease_names[why] : "?";
}

const char *kvtd_proto_err_name(enum kvtd_proto_err why)
{
	return (unsigned)why < KVTD_PERR_COUNT ?
		       kvti_metrics_perr_names[why] : "?";
}

const char *kvtd_end_name(enum kvtd_end e)
{
	if (e == KVTD_END_ENGINE)
		return "engine";
	return (unsigned)e < KVTD_END_ENGINE ?
		       kvt_tier_kind_name((kvt_tier_kind)e) : "?";
}

double kvtd_hist_bound(int i)
{
	return i >= 0 && i < KVTD_HIST_BOUNDS ? (double)bound_ns[i] / 1e9 :
						  0;
}

/* ---- registry ------------------------------------------------------------ */

int kvtd_metrics_create(kvtd_metrics **out)
{
	kvtd_metrics *m = kvt_calloc(1, sizeof(*m));
	struct timespec ts;
	int err;

	*out = NULL;
	if (!m)
		return -ENOMEM;
	err = -pthread_mutex_init(&m->mu, NULL);
	if (err) {
		kvt_free(m);
		return err;
	}
	clock_gettime(CLOCK_REALTIME, &ts);
	m->start_time = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
	*out = m;
	return 0;
}

void kvtd_metrics_destroy(kvtd_metrics *m)
{
	if (!m)
		return;
	for (int i = 0; i < m->nt; i++)
		kvt_free(m->t[i]);
	pthread_mutex_destroy(&m->mu);
	kvt_free(m);
}

void kvtd_metrics_set_cache(kvtd_metrics *m, kvt_cache *c)
{
	pthread_mutex_lock(&m->mu);
	m->cache = c;
	pthread_mutex_unlock(&m->mu);
}

void kvtd_metrics_set_collect(kvtd_metrics *m, kvtd_collect_fn fn, void *arg)
{
	pthread_mutex_lock(&m->mu);
	m->collect = fn;
	m->collect_arg = arg;
	pthread_mutex_unlock(&m->mu);
}

static int check_name(const char *name)
{
	size_t n;

	if (!name || !*name)
		return kvti_fail(-EINVAL, "metrics: empty tenant name");
	n = strlen(name);
	if (n > KVTD_METRICS_NAME_MAX)
		return kvti_fail(-EINVAL, "metrics: tenant name of %zu bytes "
				 "(at most %d)", n, KVTD_METRICS_NAME_MAX);
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f)
			return kvti_fail(-EINVAL, "metrics: tenant name has a "
					 "control character at byte %zu", i);
	return 0;
}

int kvtd_metrics_tenant(kvtd_metrics *m, uint32_t id, const char *name,
			kvtd_mtenant **out)
{
	kvtd_mtenant *t;
	int err;

	*out = NULL;
	err = check_name(name);
	if (err)
		return err;
	pthread_mutex_lock(&m->mu);
	for (int i = 0; i < m->nt; i++) {
		t = m->t[i];
		if (t->id == id && !strcmp(t->name, name)) {
			*out = t;
			goto out;
		}
		if (t->id == id || !strcmp(t->name, name)) {
			err = kvti_fail(KVT_EBUSY, "metrics: tenant %" PRIu32
					" '%s' is registered as %" PRIu32
					" '%s'", id, name, t->id, t->name);
			goto out;
		}
	}
	if (m->nt == KVTD_METRICS_MAX_TENANTS) {
		err = kvti_fail(KVT_EFULL, "metrics: %d tenants registered "
				"already", KVTD_METRICS_MAX_TENANTS);
		goto out;
	}
	t = kvt_calloc(1, sizeof(*t));
	if (!t) {
		err = -ENOMEM;
		goto out;
	}
	t->id = id;
	kvti_strlcpy(t->name, name, sizeof(t->name));
	m->t[m->nt++] = t;
	*out = t;
out:
	pthread_mutex_unlock(&m->mu);
	return err;
}

kvtd_mtenant *kvtd_metrics_node(kvtd_metrics *m)
{
	return &m->node;
}

/* ---- hot path ------------------------------------------------------------ */

static inline void add(actr *c, uint64_t v)
{
	atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

#define BLOCK(m, t) ((t) ? (t) : &(m)->node)

void kvtd_metrics_hit(kvtd_metrics *m, kvtd_mtenant *t, kvt_tier_kind tier,
		      uint64_t pages)
{
	if ((unsigned)tier < NTU)
		add(&BLOCK(m, t)->hits[tier], pages);
}

void kvtd_metrics_miss(kvtd_metrics *m, kvtd_mtenant *t, uint64_t pages)
{
	add(&BLOCK(m, t)->misses, pages);
}

void kvtd_metrics_fp_conflict(kvtd_metrics *m, kvtd_mtenant *t)
{
	add(&BLOCK(m, t)->fpconf, 1);
}

void kvtd_metrics_read_failure(kvtd_metrics *m, kvtd_mtenant *t,
			       kvt_tier_kind tier, uint64_t pages)
{
	if ((unsigned)tier < NTU)
		add(&BLOCK(m, t)->read_fail[tier], pages);
}

void kvtd_metrics_bytes(kvtd_metrics *m, kvtd_mtenant *t, enum kvtd_end from,
			enum kvtd_end to, uint64_t bytes)
{
	if ((unsigned)from < KVTD_END_COUNT && (unsigned)to < KVTD_END_COUNT)
		add(&BLOCK(m, t)->bytes[from][to], bytes);
}

void kvtd_metrics_eviction(kvtd_metrics *m, kvtd_mtenant *t,
			   kvt_tier_kind tier, uint64_t pages)
{
	if ((unsigned)tier < NTU)
		add(&BLOCK(m, t)->evict[tier], pages);
}

void kvtd_metrics_demotion(kvtd_metrics *m, kvtd_mtenant *t,
			   kvt_tier_kind tier, uint64_t pages)
{
	if ((unsigned)tier < NTU)
		add(&BLOCK(m, t)->demote[tier], pages);
}

void kvtd_metrics_lease_expiry(kvtd_metrics *m, kvtd_mtenant *t,
			       enum kvtd_lease_end why, uint64_t leases)
{
	if ((unsigned)why < KVTD_LEASE_END_COUNT)
		add(&BLOCK(m, t)->lease[why], leases);
}

void kvtd_metrics_checksum_failure(kvtd_metrics *m, kvtd_mtenant *t,
				   kvt_tier_kind tier, uint64_t pages)
{
	if ((unsigned)tier < NTU)
		add(&BLOCK(m, t)->csum[tier], pages);
}

void kvtd_metrics_protocol_error(kvtd_metrics *m, kvtd_mtenant *t,
				 enum kvtd_proto_err why)
{
	if ((unsigned)why < KVTD_PERR_COUNT)
		add(&BLOCK(m, t)->perr[why], 1);
}

/* The first bucket whose bound is >= @ns (le is inclusive); NB-1: +Inf. */
static int bucket_of(uint64_t ns)
{
	int lo = 0, hi = KVTD_HIST_BOUNDS;

	while (lo < hi) {
		int mid = (lo + hi) / 2;

		if (ns <= bound_ns[mid])
			hi = mid;
		else
			lo = mid + 1;
	}
	return lo;
}

void kvtd_metrics_observe(kvtd_metrics *m, kvtd_mtenant *t, enum kvtd_op op,
			  uint64_t ns)
{
	struct hist *h;

	if ((unsigned)op >= KVTD_OP_COUNT)
		return;
	h = &BLOCK(m, t)->h[op];
	add(&h->b[bucket_of(ns)], 1);
	add(&h->sum_ns, ns);
}

void kvtd_metrics_gauge_set(kvtd_metrics *m, enum kvtd_gauge g, uint64_t v)
{
	if ((unsigned)g < KVTD_G_COUNT)
		atomic_store_explicit(&m->gauge[g], v, memory_order_relaxed);
}

void kvtd_metrics_tenant_pages(kvtd_metrics *m, kvtd_mtenant *t,
			       kvt_tier_kind tier, uint64_t used,
			       uint64_t quota)
{
	kvtd_mtenant *b = BLOCK(m, t);

	if ((unsigned)tier >= NT)
		return;
	atomic_store_explicit(&b->used[tier], used, memory_order_relaxed);
	atomic_store_explicit(&b->quota[tier], quota, memory_order_relaxed);
	atomic_fetch_or_explicit(&b->pages_set, 1u << tier,
				 memory_order_relaxed);
}

