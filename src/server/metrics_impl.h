/*
 * metrics_impl.h — what the metrics registry's four files share; internal
 * (metrics.h is the manual: the picture, the threading rule, the API).
 *
 *   metrics.c       names, the registry (create, tenants, cache, collect),
 *                   the hot path (relaxed adds into a tenant's block)
 *   metrics_snap.c  the snapshot: under the registry's mutex, the collect
 *                   hook, then one relaxed load of every counter, the
 *                   cache's tiers and totals, the data path's counters
 *   metrics_text.c  the snapshot as Prometheus text exposition 0.0.4
 *   metrics_json.c  the snapshot as the STATS reply's JSON
 *   (metrics_dpath.c, with its own header: the data path's part of the
 *   snapshot and of both renderings)
 *
 * THE INVARIANTS. Every counter is a relaxed atomic in one tenant's block
 * (struct kvtd_mtenant) or the registry's gauges; blocks are made under
 * m->mu, appended to m->t[] and never freed before kvtd_metrics_destroy().
 * Both renderings format one struct snap, plain numbers copied by
 * kvti_metrics_snap_take(): the text and the JSON of one snapshot say the
 * same thing.
 *
 * LOCKING. m->mu guards the tenant array, the cache and collect pointers,
 * and the snapshot (kvti_metrics_snap_take() holds it throughout: one
 * render at a time calls the collect hook). Formatting runs after the mutex is
 * dropped, on the snapshot alone; a snapshot's tenant names point into the
 * blocks, which outlive every render.
 */
#ifndef KVT_SERVER_METRICS_IMPL_H
#define KVT_SERVER_METRICS_IMPL_H

#include "server/metrics.h"
#include "server/metrics_dpath.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define NT KVT_TIER_COUNT
#define NTU (NT + 1) /* the tiers and "unknown" (KVT_TIER_COUNT) */
#define NB (KVTD_HIST_BOUNDS + 1) /* buckets, +Inf last */

typedef _Atomic uint64_t actr;

struct hist {
	actr b[NB];   /* per bucket (not cumulative) */
	actr sum_ns;
};

struct kvtd_mtenant {
	uint32_t id;                      /* the node block: 0, unused */
	char name[KVTD_METRICS_NAME_MAX + 1];
	actr hits[NTU], read_fail[NTU], evict[NTU], demote[NTU], csum[NTU];
	actr misses;
	actr fpconf;                      /* fingerprint conflicts (FPRINT) */
	actr bytes[KVTD_END_COUNT][KVTD_END_COUNT]; /* [from][to] */
	actr lease[KVTD_LEASE_END_COUNT];
	actr perr[KVTD_PERR_COUNT];
	actr used[NT], quota[NT];
	_Atomic unsigned pages_set;       /* bit t: used/quota set for tier t */
	struct hist h[KVTD_OP_COUNT];
};

struct kvtd_metrics {
	pthread_mutex_t mu;  /* guards: tenant array, cache, collect, renders */
	kvtd_mtenant node;
	kvtd_mtenant *t[KVTD_METRICS_MAX_TENANTS];
	int nt;
	actr gauge[KVTD_G_COUNT];
	kvt_cache *cache;
	kvtd_collect_fn collect;
	void *collect_arg;
	double start_time;   /* Unix seconds */
};

/* Label values, indexed by the enums of metrics.h (metrics.c). */
extern const char *const kvti_metrics_op_names[KVTD_OP_COUNT];
extern const char *const kvti_metrics_lease_names[KVTD_LEASE_END_COUNT];
extern const char *const kvti_metrics_perr_names[KVTD_PERR_COUNT];

/* A tier label: the kind's name, "unknown" for KVT_TIER_COUNT. */
static inline const char *kvti_metrics_tier_name(int k)
{
	return k == NT ? "unknown" : kvt_tier_kind_name((kvt_tier_kind)k);
}

/* ---- the snapshot (metrics_snap.c) --------------------------------------- */

struct snap_tenant {
	uint32_t id;
	const char *name;    /* the block's; blocks outlive the render */
	int node;
	uint64_t hits[NTU], read_fail[NTU], evict[NTU], demote[NTU], csum[NTU];
	uint64_t misses;
	uint64_t fpconf;
	uint64_t bytes[KVTD_END_COUNT][KVTD_END_COUNT];
	uint64_t lease[KVTD_LEASE_END_COUNT];
	uint64_t perr[KVTD_PERR_COUNT];
	uint64_t used[NT], quota[NT];
	unsigned pages_set;
	uint64_t cum[KVTD_OP_COUNT][NB]; /* cumulative bucket counts */
	uint64_t sum_ns[KVTD_OP_COUNT];
	int any;             /* some counter is nonzero */
};

struct snap_tier {
	int present;
	uint64_t cap_bytes, used_bytes, cap_pages, used_pages, full;
};

struct snap {
	double now, start;
	uint64_t gauge[KVTD_G_COUNT];
	int have_cache;
	struct snap_tier tier[NT];
	kvt_cache_stat cs;
	int have_remote;     /* the cache has a remote tier: rs is filled */
	kvt_cache_remote_stat rs;
	struct kvtd_dpath dp; /* the data path (metrics_dpath.c) */
	unsigned tiers;      /* bit t: tier t gets per-tier series */
	int nt;              /* tenants, node first */
	struct snap_tenant *t;
};

/*
 * Under m->mu (taken here): run the collect hook and copy every counter
 * into @s (s->t kvt_calloc'ed: the caller frees it, also on error).
 * 0 or -ENOMEM.
 */
int kvti_metrics_snap_take(kvtd_metrics *m, struct snap *s);

/* A registered tenant's series appear from registration; the node block's
 * in a family once it counted something there (@nz). */
static inline int kvti_metrics_shown(const struct snap_tenant *t, uint64_t nz)
{
	return !t->node || nz;
}

/* The cache's totals (kvt_cache_stat) and its remote tier's
 * (kvt_cache_remote_stat): text family and label, JSON key, and the
 * field's offset in its struct. Rows of one family are adjacent; the
 * first carries its help. */
struct kvti_metrics_cache_ctr {
	const char *family, *op, *json, *help;
	size_t off;
	int seconds;  /* a double of seconds, not a count */
};

extern const struct kvti_metrics_cache_ctr kvti_metrics_cache_ctrs[];
extern const size_t kvti_metrics_ncache_ctrs;
extern const struct kvti_metrics_cache_ctr kvti_metrics_remote_ctrs[];
extern const size_t kvti_metrics_nremote_ctrs;

/* Row @r's value in @base, the struct its table describes (a count as a
 * double, or seconds). */
double kvti_metrics_cache_val(const void *base,
			      const struct kvti_metrics_cache_ctr *r);

#endif
