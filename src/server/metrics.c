/*
 * metrics.c — the daemon's metrics registry and its two renderings
 * (metrics.h has the picture, the threading rule and the API).
 *
 * Layout: one struct kvtd_mtenant per tenant holds every counter of that
 * tenant as a relaxed atomic; the registry keeps the node block inline and
 * the tenant blocks in an array appended under its mutex. A render takes
 * the mutex, runs the collect hook, copies everything into a plain
 * snapshot (struct snap), drops nothing while formatting, and formats the
 * snapshot as text or JSON: both renderings come from the same numbers.
 */
#include "server/metrics.h"
#include "server/metrics_dpath.h"

#include "core/core.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

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

static const char *const op_names[KVTD_OP_COUNT] = { "lookup", "load",
						     "store" };
static const char *const lease_names[KVTD_LEASE_END_COUNT] = { "deadline",
							      "disconnect" };
static const char *const perr_names[KVTD_PERR_COUNT] = {
	"malformed", "truncated", "oversized", "version", "unknown_op",
	"out_of_order", "not_owner", "geometry", "auth", "idle", "other",
};
static const char *const gauge_names[KVTD_G_COUNT] = {
	"kvtier_clients", "kvtier_leases", "kvtier_pinned_pages",
	"kvtier_jobs_in_flight", "kvtier_registered_memory_bytes",
};
static const char *const gauge_json[KVTD_G_COUNT] = {
	"clients", "leases", "pinned_pages", "jobs_in_flight",
	"registered_memory_bytes",
};
static const char *const gauge_help[KVTD_G_COUNT] = {
	"Clients connected to the daemon.",
	"Leases (pins) held by clients now.",
	"Pages under a lease now.",
	"Loads and stores submitted and not done.",
	"Engine memory registered by clients, bytes.",
};

const char *kvtd_op_name(enum kvtd_op op)
{
	return (unsigned)op < KVTD_OP_COUNT ? op_names[op] : "?";
}

const char *kvtd_lease_end_name(enum kvtd_lease_end why)
{
	return (unsigned)why < KVTD_LEASE_END_COUNT ? lease_names[why] : "?";
}

const char *kvtd_proto_err_name(enum kvtd_proto_err why)
{
	return (unsigned)why < KVTD_PERR_COUNT ? perr_names[why] : "?";
}

const char *kvtd_end_name(enum kvtd_end e)
{
	if (e == KVTD_END_ENGINE)
		return "engine";
	return (unsigned)e < KVTD_END_ENGINE ?
		       kvt_tier_kind_name((kvt_tier_kind)e) : "?";
}

/* A tier label: the kind's name, "unknown" for KVT_TIER_COUNT. */
static const char *tier_name(int k)
{
	return k == NT ? "unknown" : kvt_tier_kind_name((kvt_tier_kind)k);
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

static inline uint64_t ld(actr *c)
{
	return atomic_load_explicit(c, memory_order_relaxed);
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

/* ---- snapshot ------------------------------------------------------------ */

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
	struct kvtd_dpath dp; /* the data path (metrics_dpath.c) */
	unsigned tiers;      /* bit t: tier t gets per-tier series */
	int nt;              /* tenants, node first */
	struct snap_tenant *t;
};

static void snap_block(struct snap_tenant *s, kvtd_mtenant *b)
{
	uint64_t any = 0;

	s->id = b->id;
	s->name = b->name;
	for (int k = 0; k < NTU; k++) {
		any |= s->hits[k] = ld(&b->hits[k]);
		any |= s->read_fail[k] = ld(&b->read_fail[k]);
		any |= s->evict[k] = ld(&b->evict[k]);
		any |= s->demote[k] = ld(&b->demote[k]);
		any |= s->csum[k] = ld(&b->csum[k]);
	}
	for (int k = 0; k < NT; k++) {
		s->used[k] = ld(&b->used[k]);
		s->quota[k] = ld(&b->quota[k]);
	}
	s->pages_set = atomic_load_explicit(&b->pages_set,
					    memory_order_relaxed);
	any |= s->misses = ld(&b->misses);
	any |= s->fpconf = ld(&b->fpconf);
	for (int i = 0; i < KVTD_END_COUNT; i++)
		for (int j = 0; j < KVTD_END_COUNT; j++)
			any |= s->bytes[i][j] = ld(&b->bytes[i][j]);
	for (int i = 0; i < KVTD_LEASE_END_COUNT; i++)
		any |= s->lease[i] = ld(&b->lease[i]);
	for (int i = 0; i < KVTD_PERR_COUNT; i++)
		any |= s->perr[i] = ld(&b->perr[i]);
	for (int o = 0; o < KVTD_OP_COUNT; o++) {
		uint64_t c = 0;

		for (int i = 0; i < NB; i++)
			s->cum[o][i] = c += ld(&b->h[o].b[i]);
		any |= c;
		s->sum_ns[o] = ld(&b->h[o].sum_ns);
	}
	s->any = any != 0;
}

static void snap_cache(struct snap *s, kvt_cache *c)
{
	s->have_cache = 1;
	kvt_cache_stat_get(c, &s->cs);
	kvtd_dpath_snap(c, &s->dp);
	/* the hbm kind is the engines' own memory, not the daemon's to count
	 * (and it is attached while the daemon runs) */
	for (int k = KVT_TIER_FABRIC; k < NT; k++) {
		kvt_tier *t = kvt_cache_tier(c, (kvt_tier_kind)k);
		struct snap_tier *st = &s->tier[k];
		kvt_tier_desc d;
		kvt_pool_stat ps;

		if (!t)
			continue;
		kvt_tier_info(t, &d);
		if (d.backing == KVT_BACK_ENGINE || !kvt_tier_pool(t))
			continue;
		kvt_pool_stat_get(kvt_tier_pool(t), &ps);
		st->present = 1;
		st->cap_pages = ps.slots;
		st->used_pages = ps.used;
		st->cap_bytes = ps.slots * d.page_bytes;
		st->used_bytes = ps.used * d.page_bytes;
		st->full = ps.full;
		s->tiers |= 1u << k;
	}
}

/* Under m->mu. */
static int snap_take(kvtd_metrics *m, struct snap *s)
{
	struct timespec ts;

	memset(s, 0, sizeof(*s));
	if (m->collect)
		m->collect(m, m->collect_arg);
	clock_gettime(CLOCK_REALTIME, &ts);
	s->now = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
	s->start = m->start_time;
	for (int g = 0; g < KVTD_G_COUNT; g++)
		s->gauge[g] = ld(&m->gauge[g]);
	if (m->cache)
		snap_cache(s, m->cache);
	s->t = kvt_calloc((size_t)m->nt + 1, sizeof(*s->t));
	if (!s->t)
		return -ENOMEM;
	s->nt = m->nt + 1;
	snap_block(&s->t[0], &m->node);
	s->t[0].node = 1;
	for (int i = 0; i < m->nt; i++)
		snap_block(&s->t[i + 1], m->t[i]);
	/* per-tier series for the cache's tiers and any tier counted in */
	for (int i = 0; i < s->nt; i++) {
		struct snap_tenant *t = &s->t[i];

		for (int k = 0; k < NTU; k++)
			if (t->hits[k] || t->read_fail[k] || t->evict[k] ||
			    t->demote[k] || t->csum[k] ||
			    (t->pages_set & (1u << k)))
				s->tiers |= 1u << k;
	}
	return 0;
}

/* A registered tenant's series appear from registration; the node block's
 * in a family once it counted something there (@nz). */
static int shown(const struct snap_tenant *t, uint64_t nz)
{
	return !t->node || nz;
}

/* ---- text exposition 0.0.4 ----------------------------------------------- */

struct sb {
	char *p;
	size_t len, cap;
	int err;
};

static void sb_printf(struct sb *b, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void sb_printf(struct sb *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (b->err)
		return;
	for (;;) {
		size_t room = b->cap - b->len;

		va_start(ap, fmt);
		n = vsnprintf(b->p ? b->p + b->len : NULL, room, fmt, ap);
		va_end(ap);
		if (n < 0) {
			b->err = -EINVAL;
			return;
		}
		if ((size_t)n < room) {
			b->len += (size_t)n;
			return;
		}
		if (kvti_grow((void **)&b->p, &b->cap, b->len + (size_t)n + 1,
			      1, 16384)) {
			b->err = -ENOMEM;
			return;
		}
	}
}

static void sb_put(struct sb *b, const char *s, size_t n)
{
	if (b->err)
		return;
	if (b->cap - b->len <= n &&
	    kvti_grow((void **)&b->p, &b->cap, b->len + n + 1, 1, 16384)) {
		b->err = -ENOMEM;
		return;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = 0;
}

/* A label value, escaped as the format wants: \\, \" and \n. */
static void sb_label(struct sb *b, const char *v)
{
	for (;;) {
		size_t n = strcspn(v, "\\\"\n");

		sb_put(b, v, n);
		v += n;
		if (!*v)
			return;
		sb_put(b, *v == '\n' ? "\\n" : *v == '"' ? "\\\"" : "\\\\", 2);
		v++;
	}
}

static void sb_str(struct sb *b, const char *s)
{
	sb_put(b, s, strlen(s));
}

/* " <v>\n" */
static void sb_value(struct sb *b, uint64_t v)
{
	char d[24], *p = d + sizeof(d);

	*--p = '\n';
	do
		*--p = (char)('0' + v % 10);
	while ((v /= 10));
	*--p = ' ';
	sb_put(b, p, (size_t)(d + sizeof(d) - p));
}

static void family(struct sb *b, const char *name, const char *type,
		   const char *help)
{
	sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* name{tenant="..."[,<more>]} value — @more is "" or 'k="v"' pairs. */
static void sample_t(struct sb *b, const char *name,
		     const struct snap_tenant *t, const char *more, uint64_t v)
{
	sb_str(b, name);
	sb_put(b, "{tenant=\"", 9);
	sb_label(b, t->name);
	sb_put(b, "\"", 1);
	if (*more) {
		sb_put(b, ",", 1);
		sb_str(b, more);
	}
	sb_put(b, "}", 1);
	sb_value(b, v);
}

/* Which label values a family shows (see label_family()). */
enum { SEL_TIERS, SEL_PAGES, SEL_ALL, SEL_SEEN };

/*
 * A per-tenant family with one more label, @key="names[k]" for k < @n, of
 * the uint64_t array at @off in struct snap_tenant. @sel picks the k:
 * SEL_TIERS the snapshot's tier set, SEL_PAGES the tiers where the daemon
 * set the tenant's pages, SEL_ALL every k, SEL_SEEN the nonzero ones.
 * @names NULL: tier names.
 */
static void label_family(struct sb *b, const struct snap *s, const char *name,
			 const char *type, const char *help, const char *key,
			 const char *const *names, int n, size_t off, int sel)
{
	char lab[64];

	family(b, name, type, help);
	for (int i = 0; i < s->nt; i++) {
		const struct snap_tenant *t = &s->t[i];
		const uint64_t *v = (const uint64_t *)((const char *)t + off);
		uint64_t nz = 0;

		for (int k = 0; k < n; k++)
			nz |= v[k];
		if (!shown(t, nz | (sel == SEL_PAGES)))
			continue;
		for (int k = 0; k < n; k++) {
			if ((sel == SEL_TIERS && !(s->tiers & (1u << k))) ||
			    (sel == SEL_PAGES && !(t->pages_set & (1u << k))) ||
			    (sel == SEL_SEEN && !v[k]))
				continue;
			snprintf(lab, sizeof(lab), "%s=\"%s\"", key,
				 names ? names[k] : tier_name(k));
			sample_t(b, name, t, lab, v[k]);
		}
	}
}

static void tier_family(struct sb *b, const struct snap *s, const char *name,
			const char *help, size_t off)
{
	label_family(b, s, name, "counter", help, "tier", NULL, NTU, off,
		     SEL_TIERS);
}

static void text_node(struct sb *b, const struct snap *s)
{
	family(b, "kvtier_info", "gauge",
	       "The kvtier daemon's version (always 1).");
	sb_printf(b, "kvtier_info{version=\"");
	sb_label(b, kvt_version());
	sb_printf(b, "\"} 1\n");
	family(b, "kvtier_start_time_seconds", "gauge",
	       "When the metrics registry was made, Unix time in seconds.");
	sb_printf(b, "kvtier_start_time_seconds %.3f\n", s->start);
	for (int g = 0; g < KVTD_G_COUNT; g++) {
		family(b, gauge_names[g], "gauge", gauge_help[g]);
		sb_printf(b, "%s %" PRIu64 "\n", gauge_names[g], s->gauge[g]);
	}
}

static void text_tiers(struct sb *b, const struct snap *s)
{
	static const struct {
		const char *name, *type, *help;
		size_t off;
	} f[] = {
		{ "kvtier_tier_capacity_bytes", "gauge",
		  "Page data a tier can hold, bytes.",
		  offsetof(struct snap_tier, cap_bytes) },
		{ "kvtier_tier_used_bytes", "gauge",
		  "Page data a tier holds now, bytes.",
		  offsetof(struct snap_tier, used_bytes) },
		{ "kvtier_tier_capacity_pages", "gauge",
		  "Page slots in a tier.",
		  offsetof(struct snap_tier, cap_pages) },
		{ "kvtier_tier_used_pages", "gauge",
		  "Page slots in use in a tier.",
		  offsetof(struct snap_tier, used_pages) },
		{ "kvtier_tier_alloc_failures_total", "counter",
		  "Slot allocations a full tier refused.",
		  offsetof(struct snap_tier, full) },
	};

	if (!s->have_cache)
		return;
	for (size_t i = 0; i < KVT_ARRAY_SIZE(f); i++) {
		family(b, f[i].name, f[i].type, f[i].help);
		for (int k = 0; k < NT; k++) {
			const struct snap_tier *t = &s->tier[k];

			if (!t->present)
				continue;
			sb_printf(b, "%s{tier=\"%s\"} %" PRIu64 "\n", f[i].name,
				  kvt_tier_kind_name((kvt_tier_kind)k),
				  *(const uint64_t *)((const char *)t +
						      f[i].off));
		}
	}
}

/* The cache's totals (kvt_cache_stat): text family and label, JSON key.
 * Rows of one family are adjacent; the first carries its help. */
static const struct cache_ctr {
	const char *family, *op, *json, *help;
	size_t off;
	int seconds;  /* a double of seconds, not a count */
} cache_ctrs[] = {
#define CS(f) offsetof(kvt_cache_stat, f)
	{ "kvtier_cache_pages_total", "load", "load_pages",
	  "Pages the cache copied: load (into engine memory), store (out of "
	  "it), move (between its tiers).", CS(load_pages), 0 },
	{ "kvtier_cache_pages_total", "store", "store_pages", NULL,
	  CS(store_pages), 0 },
	{ "kvtier_cache_pages_total", "move", "move_pages", NULL,
	  CS(move_pages), 0 },
	{ "kvtier_cache_bytes_total", "load", "load_bytes",
	  "Bytes the cache copied, by operation as for pages.",
	  CS(load_bytes), 0 },
	{ "kvtier_cache_bytes_total", "store", "store_bytes", NULL,
	  CS(store_bytes), 0 },
	{ "kvtier_cache_bytes_total", "move", "move_bytes", NULL,
	  CS(move_bytes), 0 },
	{ "kvtier_cache_evicted_pages_total", NULL, "evicted_pages",
	  "Pages that left a tier of the cache, all tenants and causes.",
	  CS(evicted), 0 },
	{ "kvtier_cache_move_errors_total", NULL, "move_errors",
	  "Page copies between tiers that failed with an I/O error.",
	  CS(move_errors), 0 },
	{ "kvtier_cache_verified_copies_total", NULL, "verified_copies",
	  "Page copies whose checksums were verified.", CS(verified), 0 },
	{ "kvtier_cache_checksum_failures_total", NULL, "checksum_failures",
	  "Page copies that failed verification, all tenants.", CS(corrupt),
	  0 },
	{ "kvtier_cache_failed_blocks_total", NULL, "failed_blocks",
	  "Engine blocks put on a load's failed list.", CS(failed_blocks), 0 },
	{ "kvtier_cache_wait_seconds_total", NULL, "wait_seconds",
	  "Time loads and stores waited for room, seconds.", CS(wait_s), 1 },
#undef CS
};

static double cache_val(const kvt_cache_stat *c, const struct cache_ctr *r)
{
	const char *p = (const char *)c + r->off;

	return r->seconds ? *(const double *)p : (double)*(const uint64_t *)p;
}

static void text_cache(struct sb *b, const struct snap *s)
{
	if (!s->have_cache)
		return;
	for (size_t i = 0; i < KVT_ARRAY_SIZE(cache_ctrs); i++) {
		const struct cache_ctr *r = &cache_ctrs[i];

		if (r->help)
			family(b, r->family, "counter", r->help);
		sb_str(b, r->family);
		if (r->op)
			sb_printf(b, "{op=\"%s\"}", r->op);
		if (r->seconds)
			sb_printf(b, " %.9f\n", cache_val(&s->cs, r));
		else
			sb_value(b, *(const uint64_t *)((const char *)&s->cs +
							r->off));
	}
}

static void text_tenants(struct sb *b, const struct snap *s)
{
	char lab[96];

	tier_family(b, s, "kvtier_hits_total",
		    "Pages a lookup found, by the tier holding them.",
		    offsetof(struct snap_tenant, hits));
	family(b, "kvtier_misses_total", "counter",
	       "Pages a lookup asked for that no tier holds.");
	for (int i = 0; i < s->nt; i++)
		if (shown(&s->t[i], s->t[i].misses))
			sample_t(b, "kvtier_misses_total", &s->t[i], "",
				 s->t[i].misses);
	family(b, "kvtier_fingerprint_conflicts_total", "counter",
	       "Engines of a tenant that published page-hash fingerprints "
	       "differing from one already published: their pages never "
	       "match.");
	for (int i = 0; i < s->nt; i++)
		if (shown(&s->t[i], s->t[i].fpconf))
			sample_t(b, "kvtier_fingerprint_conflicts_total",
				 &s->t[i], "", s->t[i].fpconf);
	tier_family(b, s, "kvtier_read_failures_total",
		    "Pages a tier held but a load could not read (not misses).",
		    offsetof(struct snap_tenant, read_fail));
	tier_family(b, s, "kvtier_evictions_total",
		    "Pages that left a tier to make room.",
		    offsetof(struct snap_tenant, evict));
	tier_family(b, s, "kvtier_demotions_total",
		    "Pages moved out of a tier into a slower one.",
		    offsetof(struct snap_tenant, demote));
	tier_family(b, s, "kvtier_checksum_failures_total",
		    "Page copies that failed their checksum and were dropped.",
		    offsetof(struct snap_tenant, csum));
	family(b, "kvtier_transfer_bytes_total", "counter",
	       "Bytes moved, by link: from and to are tiers or the engine.");
	for (int i = 0; i < s->nt; i++)
		for (int f = 0; f < KVTD_END_COUNT; f++)
			for (int to = 0; to < KVTD_END_COUNT; to++) {
				if (!s->t[i].bytes[f][to])
					continue;
				snprintf(lab, sizeof(lab),
					 "from=\"%s\",to=\"%s\"",
					 kvtd_end_name((enum kvtd_end)f),
					 kvtd_end_name((enum kvtd_end)to));
				sample_t(b, "kvtier_transfer_bytes_total",
					 &s->t[i], lab, s->t[i].bytes[f][to]);
			}
	label_family(b, s, "kvtier_lease_expiries_total", "counter",
		     "Leases that ended without a release: deadline or "
		     "disconnect.", "reason", lease_names, KVTD_LEASE_END_COUNT,
		     offsetof(struct snap_tenant, lease), SEL_ALL);
	label_family(b, s, "kvtier_protocol_errors_total", "counter",
		     "Messages refused, by reason.", "reason", perr_names,
		     KVTD_PERR_COUNT, offsetof(struct snap_tenant, perr),
		     SEL_SEEN);
	label_family(b, s, "kvtier_tenant_used_pages", "gauge",
		     "Pages a tenant holds in a tier.", "tier", NULL, NT,
		     offsetof(struct snap_tenant, used), SEL_PAGES);
	label_family(b, s, "kvtier_tenant_quota_pages", "gauge",
		     "A tenant's page quota in a tier (0: none).", "tier", NULL,
		     NT, offsetof(struct snap_tenant, quota), SEL_PAGES);
}

static void text_hists(struct sb *b, const struct snap *s)
{
	static const char *const help[KVTD_OP_COUNT] = {
		"LOOKUP latency (request to reply), seconds.",
		"LOAD latency (request to all layers in place), seconds.",
		"STORE latency (request to committed), seconds.",
	};
	char name[64], les[NB][24];

	for (int k = 0; k < NB; k++)
		if (k < KVTD_HIST_BOUNDS)
			snprintf(les[k], sizeof(les[k]), "le=\"%.6g\"",
				 kvtd_hist_bound(k));
		else
			snprintf(les[k], sizeof(les[k]), "le=\"+Inf\"");
	for (int o = 0; o < KVTD_OP_COUNT; o++) {
		snprintf(name, sizeof(name), "kvtier_%s_duration_seconds",
			 op_names[o]);
		family(b, name, "histogram", help[o]);
		for (int i = 0; i < s->nt; i++) {
			const struct snap_tenant *t = &s->t[i];

			if (!shown(t, t->cum[o][NB - 1]))
				continue;
			snprintf(name, sizeof(name),
				 "kvtier_%s_duration_seconds_bucket",
				 op_names[o]);
			for (int k = 0; k < NB; k++)
				sample_t(b, name, t, les[k], t->cum[o][k]);
			sb_printf(b, "kvtier_%s_duration_seconds_sum{tenant=\"",
				  op_names[o]);
			sb_label(b, t->name);
			sb_printf(b, "\"} %.9f\n", (double)t->sum_ns[o] / 1e9);
			snprintf(name, sizeof(name),
				 "kvtier_%s_duration_seconds_count",
				 op_names[o]);
			sample_t(b, name, t, "", t->cum[o][NB - 1]);
		}
	}
}

int kvtd_metrics_render_text(kvtd_metrics *m, char **out, size_t *len)
{
	struct sb b = { 0 };
	struct snap s;
	int err;

	*out = NULL;
	pthread_mutex_lock(&m->mu);
	err = snap_take(m, &s);
	pthread_mutex_unlock(&m->mu);
	if (err)
		goto out;
	text_node(&b, &s);
	text_tiers(&b, &s);
	text_cache(&b, &s);
	{
		char *dp = NULL;

		if ((err = kvtd_dpath_text(&s.dp, &dp)))
			goto out;
		if (dp)
			sb_str(&b, dp);
		kvt_free(dp);
	}
	text_tenants(&b, &s);
	text_hists(&b, &s);
	err = b.err;
out:
	kvt_free(s.t);
	if (err) {
		kvt_free(b.p);
		return err;
	}
	*out = b.p;
	if (len)
		*len = b.len;
	return 0;
}

/* ---- JSON ---------------------------------------------------------------- */

/* cJSON allocates with malloc and reports failure as NULL: every add below
 * is checked once at the end through the tree's completeness (a failed
 * add leaves the tree smaller, so failures are tracked in @ok). */
struct jb {
	int ok;
};

static cJSON *jnum(struct jb *j, cJSON *o, const char *k, double v)
{
	cJSON *n = cJSON_AddNumberToObject(o, k, v);

	if (!n)
		j->ok = 0;
	return n;
}

static cJSON *jobj(struct jb *j, cJSON *o, const char *k)
{
	cJSON *n = o ? cJSON_AddObjectToObject(o, k) : NULL;

	if (!n)
		j->ok = 0;
	return n;
}

static cJSON *jarr(struct jb *j, cJSON *o, const char *k)
{
	cJSON *n = o ? cJSON_AddArrayToObject(o, k) : NULL;

	if (!n)
		j->ok = 0;
	return n;
}

static cJSON *jitem(struct jb *j, cJSON *arr, cJSON *it)
{
	if (!it || !arr || !cJSON_AddItemToArray(arr, it)) {
		cJSON_Delete(it);
		j->ok = 0;
		return NULL;
	}
	return it;
}

static void json_tenant(struct jb *j, cJSON *arr, const struct snap *s,
			const struct snap_tenant *t)
{
	cJSON *o = jitem(j, arr, cJSON_CreateObject()), *x, *y;

	if (!o)
		return;
	if (t->node ? !cJSON_AddNullToObject(o, "id") :
		      !cJSON_AddNumberToObject(o, "id", t->id))
		j->ok = 0;
	if (!cJSON_AddStringToObject(o, "name", t->name))
		j->ok = 0;
	jnum(j, o, "misses", (double)t->misses);
	jnum(j, o, "fingerprint_conflicts", (double)t->fpconf);
	x = jobj(j, o, "tiers");
	for (int k = 0; x && k < NTU; k++) {
		if (!(s->tiers & (1u << k)))
			continue;
		y = jobj(j, x, tier_name(k));
		if (!y)
			break;
		jnum(j, y, "hits", (double)t->hits[k]);
		jnum(j, y, "read_failures", (double)t->read_fail[k]);
		jnum(j, y, "evictions", (double)t->evict[k]);
		jnum(j, y, "demotions", (double)t->demote[k]);
		jnum(j, y, "checksum_failures", (double)t->csum[k]);
		if (t->pages_set & (1u << k)) {
			jnum(j, y, "used_pages", (double)t->used[k]);
			jnum(j, y, "quota_pages", (double)t->quota[k]);
		}
	}
	x = jarr(j, o, "transfer_bytes");
	for (int f = 0; x && f < KVTD_END_COUNT; f++)
		for (int to = 0; to < KVTD_END_COUNT; to++) {
			if (!t->bytes[f][to])
				continue;
			y = jitem(j, x, cJSON_CreateObject());
			if (!y)
				break;
			if (!cJSON_AddStringToObject(
				    y, "from", kvtd_end_name((enum kvtd_end)f)) ||
			    !cJSON_AddStringToObject(
				    y, "to", kvtd_end_name((enum kvtd_end)to)))
				j->ok = 0;
			jnum(j, y, "bytes", (double)t->bytes[f][to]);
		}
	x = jobj(j, o, "lease_expiries");
	for (int r = 0; x && r < KVTD_LEASE_END_COUNT; r++)
		jnum(j, x, lease_names[r], (double)t->lease[r]);
	x = jobj(j, o, "protocol_errors");
	for (int r = 0; x && r < KVTD_PERR_COUNT; r++)
		if (t->perr[r])
			jnum(j, x, perr_names[r], (double)t->perr[r]);
	x = jobj(j, o, "latency");
	for (int op = 0; x && op < KVTD_OP_COUNT; op++) {
		cJSON *h = jobj(j, x, op_names[op]), *c;

		if (!h)
			break;
		jnum(j, h, "count", (double)t->cum[op][NB - 1]);
		jnum(j, h, "sum_seconds", (double)t->sum_ns[op] / 1e9);
		c = jarr(j, h, "cumulative");
		for (int k = 0; c && k < NB; k++)
			jitem(j, c, cJSON_CreateNumber((double)t->cum[op][k]));
	}
}

static cJSON *json_build(const struct snap *s, const kvtd_mtenant *only)
{
	struct jb j = { 1 };
	cJSON *root = cJSON_CreateObject(), *x, *y;

	if (!root)
		return NULL;
	jnum(&j, root, "format", KVTD_METRICS_JSON_VERSION);
	if (!cJSON_AddStringToObject(root, "version", kvt_version()))
		j.ok = 0;
	jnum(&j, root, "time", s->now);
	jnum(&j, root, "start_time", s->start);
	x = jobj(&j, root, "gauges");
	for (int g = 0; x && g < KVTD_G_COUNT; g++)
		jnum(&j, x, gauge_json[g], (double)s->gauge[g]);
	x = jarr(&j, root, "tiers");
	for (int k = 0; x && k < NT; k++) {
		const struct snap_tier *t = &s->tier[k];

		if (!t->present)
			continue;
		y = jitem(&j, x, cJSON_CreateObject());
		if (!y)
			break;
		if (!cJSON_AddStringToObject(y, "tier",
					     kvt_tier_kind_name((kvt_tier_kind)k)))
			j.ok = 0;
		jnum(&j, y, "capacity_bytes", (double)t->cap_bytes);
		jnum(&j, y, "used_bytes", (double)t->used_bytes);
		jnum(&j, y, "capacity_pages", (double)t->cap_pages);
		jnum(&j, y, "used_pages", (double)t->used_pages);
		jnum(&j, y, "alloc_failures", (double)t->full);
	}
	if (s->have_cache) {
		x = jobj(&j, root, "cache");
		for (size_t i = 0; x && i < KVT_ARRAY_SIZE(cache_ctrs); i++)
			jnum(&j, x, cache_ctrs[i].json,
			     cache_val(&s->cs, &cache_ctrs[i]));
	} else if (!cJSON_AddNullToObject(root, "cache")) {
		j.ok = 0;
	}
	if (kvtd_dpath_json(&s->dp, root))
		j.ok = 0;
	x = jarr(&j, root, "buckets");
	for (int k = 0; x && k < KVTD_HIST_BOUNDS; k++)
		jitem(&j, x, cJSON_CreateNumber(kvtd_hist_bound(k)));
	x = jarr(&j, root, "tenants");
	for (int i = 0; x && i < s->nt; i++)
		if (only ? !s->t[i].node && s->t[i].id == only->id :
			   shown(&s->t[i], s->t[i].any))
			json_tenant(&j, x, s, &s->t[i]);
	if (!j.ok) {
		cJSON_Delete(root);
		return NULL;
	}
	return root;
}

int kvtd_metrics_render_json(kvtd_metrics *m, char **out, size_t *len)
{
	return kvtd_metrics_render_json_for(m, NULL, out, len);
}

int kvtd_metrics_render_json_for(kvtd_metrics *m, const kvtd_mtenant *only,
				 char **out, size_t *len)
{
	struct snap s;
	cJSON *root = NULL;
	char *txt = NULL;
	size_t n;
	int err;

	*out = NULL;
	pthread_mutex_lock(&m->mu);
	err = snap_take(m, &s);
	pthread_mutex_unlock(&m->mu);
	if (err)
		goto out;
	err = -ENOMEM;
	root = json_build(&s, only);
	if (!root)
		goto out;
	txt = cJSON_PrintUnformatted(root);
	if (!txt)
		goto out;
	n = strlen(txt);
	*out = kvt_malloc(n + 1);
	if (!*out)
		goto out;
	memcpy(*out, txt, n + 1);
	if (len)
		*len = n;
	err = 0;
out:
	cJSON_free(txt);
	cJSON_Delete(root);
	kvt_free(s.t);
	return err;
}

int kvtd_metrics_render_cb(void *arg, char **body, size_t *len)
{
	return kvtd_metrics_render_text(arg, body, len);
}
