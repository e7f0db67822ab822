/*
 * metrics.h — the node daemon's metrics: counters, gauges and latency
 * histograms that the daemon's threads update cheaply, rendered on demand
 * as Prometheus text exposition (format 0.0.4) for GET /metrics and as JSON
 * for the STATS message (`kvtier stat`). Internal to libkvtier (not
 * installed); docs/METRICS.md lists every metric for operators.
 *
 * THE PICTURE
 *
 *   daemon threads (hot path)           render (HTTP thread, STATS handler)
 *   -------------------------           -----------------------------------
 *   kvtd_metrics_hit(t, tier, n) --+    collect hook (daemon: gauges, deltas)
 *   kvtd_metrics_observe(t, op, ns)|    snapshot: relaxed loads of every
 *   ...                            v    counter, the cache's tiers and stats
 *            +---------------------------+            |
 *   tenants: | node (tenant="")           |            v
 *   (slots)  | tenant 7 "alice"          |   text 0.0.4  or  JSON (same
 *            | tenant 9 "bob"            |   content, one snapshot)
 *            +---------------------------+
 *
 * A tenant's counters live in one block (kvtd_mtenant) made when the tenant
 * is first registered (at HELLO) and kept until kvtd_metrics_destroy():
 * counters never go back, and a tenant that reconnects continues its
 * series. Every update is one relaxed atomic add on the caller's tenant
 * block: no lock, no allocation, safe from any thread. The "node" block
 * (tenant="" in the exposition, id null in JSON) takes what belongs to no
 * tenant: messages before HELLO, background demotion, eviction under
 * global pressure. Every call that takes a kvtd_mtenant * accepts NULL for
 * the node block.
 *
 * GAUGES are read when rendering: tier capacity and occupancy straight from
 * the cache given to kvtd_metrics_set_cache() (kvt_cache_tier(), pool
 * counters, kvt_cache_stat_get(): all safe from another thread), node
 * gauges (clients, leases, ...) and per-tenant pages from the values the
 * daemon last set, and whatever the collect hook sets just before the
 * snapshot (the place to copy values that need the daemon's own locks,
 * e.g. the index's statistics, which are not safe to read unlocked).
 *
 * HISTOGRAMS have fixed log-spaced bucket bounds in seconds, a 1-2-5 series
 * from 1 us to 10 s (KVTD_HIST_BOUNDS of them, plus +Inf); observations are
 * in nanoseconds (kvt_now_ns() differences), their sum kept in nanoseconds
 * and rendered in seconds. Prometheus buckets are cumulative; the counters
 * here are per bucket and accumulated when rendering.
 *
 * THREADS. Updates: any thread, any time between create and destroy.
 * kvtd_metrics_tenant(): any thread (one mutex, not the hot path). Render:
 * any thread; the collect hook and the snapshot run under the registry's
 * mutex (one at a time), the formatting after it, outside. A snapshot is not atomic across counters
 * (each counter is read once, relaxed): a scrape that races an update may
 * see a hit before its histogram observation, never a torn value.
 * set_cache/set_collect: before the first render (or with renders stopped),
 * and the cache must outlive every render: stop the HTTP endpoint before
 * closing the cache.
 *
 * ERRORS. 0 or -errno / KVT_E* with kvt_errdetail() saying why.
 */
#ifndef KVT_SERVER_METRICS_H
#define KVT_SERVER_METRICS_H

#include <kvtier.h>
#include <kvtier/cache.h>
#include <kvtier/tier.h>

#include <stddef.h>
#include <stdint.h>

typedef struct kvtd_metrics kvtd_metrics;
typedef struct kvtd_mtenant kvtd_mtenant;

/** Tenants a registry holds, the node block excluded. */
#define KVTD_METRICS_MAX_TENANTS 256
/** Longest tenant name, bytes, without the NUL. */
#define KVTD_METRICS_NAME_MAX 63
/** Histogram bucket upper bounds (1-2-5 series, 1e-6 .. 10 s), +Inf apart. */
#define KVTD_HIST_BOUNDS 22
/** The JSON document's "format" field; bump on incompatible changes. */
#define KVTD_METRICS_JSON_VERSION 1

/**
 * Ends of a byte transfer: the tiers by kind (KVT_TIER_*, same values) and
 * the client engine's registered memory. Rendered as from="dram",
 * to="engine" (kvt_tier_kind_name() names, and "engine").
 */
enum kvtd_end {
	KVTD_END_HBM = KVT_TIER_HBM,
	KVTD_END_FABRIC = KVT_TIER_FABRIC,
	KVTD_END_DRAM = KVT_TIER_DRAM,
	KVTD_END_SSD = KVT_TIER_SSD,
	KVTD_END_REMOTE = KVT_TIER_REMOTE,
	KVTD_END_ENGINE = KVT_TIER_COUNT,
	KVTD_END_COUNT
};

/** Timed operations (histograms kvtier_<op>_duration_seconds). */
enum kvtd_op {
	KVTD_OP_LOOKUP = 0, /* LOOKUP: request received -> reply sent */
	KVTD_OP_LOAD,       /* LOAD: request received -> last layer in place */
	KVTD_OP_STORE,      /* STORE: request received -> committed */
	KVTD_OP_COUNT
};

/** Why a lease (pin) ended without a RELEASE (label reason=...). */
enum kvtd_lease_end {
	KVTD_LEASE_DEADLINE = 0, /* "deadline": its deadline passed */
	KVTD_LEASE_DISCONNECT,   /* "disconnect": its client went away */
	KVTD_LEASE_END_COUNT
};

/** Why a message was refused (kvtier_protocol_errors_total reason=...). */
enum kvtd_proto_err {
	KVTD_PERR_MALFORMED = 0, /* "malformed": fields that do not decode */
	KVTD_PERR_TRUNCATED,     /* "truncated": shorter than its header says,
				    or the peer vanished mid-message */
	KVTD_PERR_OVERSIZED,     /* "oversized": over the protocol's limits */
	KVTD_PERR_VERSION,       /* "version": unsupported protocol version */
	KVTD_PERR_UNKNOWN_OP,    /* "unknown_op" */
	KVTD_PERR_ORDER,         /* "out_of_order": e.g. LOAD before HELLO */
	KVTD_PERR_NOT_OWNER,     /* "not_owner": blocks/slots/jobs not the
				    client's */
	KVTD_PERR_GEOMETRY,      /* "geometry": geometry mismatch */
	KVTD_PERR_AUTH,          /* "auth": peer not on the allow-list */
	KVTD_PERR_IDLE,          /* "idle": connected and sent nothing */
	KVTD_PERR_OTHER,         /* "other" */
	KVTD_PERR_COUNT
};

/** Node gauges the daemon sets (kvtd_metrics_gauge_set()). */
enum kvtd_gauge {
	KVTD_G_CLIENTS = 0,   /* kvtier_clients: connected clients */
	KVTD_G_LEASES,        /* kvtier_leases: leases (pins) held now */
	KVTD_G_PINNED_PAGES,  /* kvtier_pinned_pages: pages under a lease */
	KVTD_G_JOBS,          /* kvtier_jobs_in_flight: loads and stores
				 not done */
	KVTD_G_REGISTERED_BYTES, /* kvtier_registered_memory_bytes: engine
				    memory clients registered */
	KVTD_G_COUNT
};

/**
 * Called at the start of every render, under the registry's mutex, before
 * the snapshot: set gauges and bring counters up to date from state that
 * needs the daemon's own locks. Must not render or register tenants; and
 * since it runs under the registry's mutex, never call
 * kvtd_metrics_tenant() while holding a lock this hook takes.
 */
typedef void (*kvtd_collect_fn)(kvtd_metrics *m, void *arg);

/* ---- the registry ------------------------------------------------------ */

/**
 * kvtd_metrics_create() - an empty registry: the node block, no tenants,
 * every counter 0, start time now. 0 or -ENOMEM. Free with
 * kvtd_metrics_destroy() (NULL is fine), after every updater and renderer
 * has stopped.
 */
int kvtd_metrics_create(kvtd_metrics **out);
void kvtd_metrics_destroy(kvtd_metrics *m);

/**
 * kvtd_metrics_set_cache() - render tier capacity/occupancy
 * (kvtier_tier_*) for every tier @c holds, and the cache's own totals
 * (kvtier_cache_*). NULL: none. Not owned; see THREADS for lifetime.
 */
void kvtd_metrics_set_cache(kvtd_metrics *m, kvt_cache *c);
/** kvtd_metrics_set_collect() - the hook run before each snapshot (NULL:
 *  none). */
void kvtd_metrics_set_collect(kvtd_metrics *m, kvtd_collect_fn fn, void *arg);

/**
 * kvtd_metrics_tenant() - the counter block of tenant @id (the daemon's
 * tenant id, any value), made on first use and named @name (printable,
 * 1..KVTD_METRICS_NAME_MAX bytes; escaped when rendered). Registering an
 * existing id with the same name returns the same block (several clients
 * of one tenant share it).
 * Returns 0 and *@out (valid until kvtd_metrics_destroy()), or -EINVAL
 * (empty or over-long name, control characters),
 * KVT_EBUSY (@id is registered under another name, or @name under another
 * id), KVT_EFULL (KVTD_METRICS_MAX_TENANTS registered), -ENOMEM.
 */
int kvtd_metrics_tenant(kvtd_metrics *m, uint32_t id, const char *name,
			kvtd_mtenant **out);
/** The node block (what NULL stands for in the calls below). */
kvtd_mtenant *kvtd_metrics_node(kvtd_metrics *m);

/* ---- the hot path: one relaxed atomic add each, any thread -------------
 * @m: the registry; @t: a block from kvtd_metrics_tenant() of @m, or NULL
 * for the node block. @tier KVT_TIER_COUNT: a tier not known (say, a load's
 * failed pages, whose source tier the job does not report), rendered as
 * tier="unknown". Tiers and enum values beyond are counted nowhere. */

/** Pages a LOOKUP found, by the tier that holds them (kvtier_hits_total). */
void kvtd_metrics_hit(kvtd_metrics *m, kvtd_mtenant *t, kvt_tier_kind tier,
		      uint64_t pages);
/** Pages a LOOKUP asked for and no tier holds (kvtier_misses_total). */
void kvtd_metrics_miss(kvtd_metrics *m, kvtd_mtenant *t, uint64_t pages);
/** An engine published a page-hash fingerprint (FPRINT) that differs
 *  from one its tenant published before (kvtier_fingerprint_conflicts_total). */
void kvtd_metrics_fp_conflict(kvtd_metrics *m, kvtd_mtenant *t);
/** Pages a LOAD could not read from @tier although it held them: I/O error,
 *  checksum, gone meanwhile (kvtier_read_failures_total). Not a miss. */
void kvtd_metrics_read_failure(kvtd_metrics *m, kvtd_mtenant *t,
			       kvt_tier_kind tier, uint64_t pages);
/** Bytes moved @from -> @to (kvtier_transfer_bytes_total). */
void kvtd_metrics_bytes(kvtd_metrics *m, kvtd_mtenant *t, enum kvtd_end from,
			enum kvtd_end to, uint64_t bytes);
/** Pages that left @tier to make room (kvtier_evictions_total). */
void kvtd_metrics_eviction(kvtd_metrics *m, kvtd_mtenant *t,
			   kvt_tier_kind tier, uint64_t pages);
/** Pages moved out of @tier into a slower one (kvtier_demotions_total). */
void kvtd_metrics_demotion(kvtd_metrics *m, kvtd_mtenant *t,
			   kvt_tier_kind tier, uint64_t pages);
/** Leases that ended for @why (kvtier_lease_expiries_total). */
void kvtd_metrics_lease_expiry(kvtd_metrics *m, kvtd_mtenant *t,
			       enum kvtd_lease_end why, uint64_t leases);
/** Page copies in @tier that failed their checksum and were dropped
 *  (kvtier_checksum_failures_total). */
void kvtd_metrics_checksum_failure(kvtd_metrics *m, kvtd_mtenant *t,
				   kvt_tier_kind tier, uint64_t pages);
/** One refused message (kvtier_protocol_errors_total). */
void kvtd_metrics_protocol_error(kvtd_metrics *m, kvtd_mtenant *t,
				 enum kvtd_proto_err why);
/** One operation that took @ns nanoseconds
 *  (kvtier_<op>_duration_seconds histogram). */
void kvtd_metrics_observe(kvtd_metrics *m, kvtd_mtenant *t, enum kvtd_op op,
			  uint64_t ns);

/* ---- gauges the daemon sets (any thread; last write wins) -------------- */

/** Set node gauge @g to @v. */
void kvtd_metrics_gauge_set(kvtd_metrics *m, enum kvtd_gauge g, uint64_t v);
/** A tenant's pages in @tier now and its quota there (0: no quota)
 *  (kvtier_tenant_used_pages, kvtier_tenant_quota_pages). */
void kvtd_metrics_tenant_pages(kvtd_metrics *m, kvtd_mtenant *t,
			       kvt_tier_kind tier, uint64_t used,
			       uint64_t quota);

/* ---- rendering ---------------------------------------------------------- */

/**
 * kvtd_metrics_render_text() - Prometheus text exposition format 0.0.4
 * (serve as "text/plain; version=0.0.4; charset=utf-8") into a
 * NUL-terminated kvt_malloc'ed buffer *@out of *@len bytes (NUL not
 * counted; @len may be NULL). Free with kvt_free(). 0 or -ENOMEM.
 */
int kvtd_metrics_render_text(kvtd_metrics *m, char **out, size_t *len);
/**
 * kvtd_metrics_render_json() - the same snapshot as one JSON object
 * (docs/METRICS.md "JSON"), compact, NUL-terminated, kvt_malloc'ed; free
 * with kvt_free(). 0 or -ENOMEM.
 */
int kvtd_metrics_render_json(kvtd_metrics *m, char **out, size_t *len);
/** The same with the "tenants" array scoped to tenant block @only (its
 *  own figures, nothing of any other tenant's), NULL for every tenant. */
int kvtd_metrics_render_json_for(kvtd_metrics *m, const kvtd_mtenant *only,
				 char **out, size_t *len);

/** Upper bound of histogram bucket @i (0..KVTD_HIST_BOUNDS-1), seconds. */
double kvtd_hist_bound(int i);

/* Label values as rendered: "lookup", "deadline", "not_owner", "engine" or
 * a tier name, ... ("?" out of range). */
const char *kvtd_op_name(enum kvtd_op op);
const char *kvtd_lease_end_name(enum kvtd_lease_end why);
const char *kvtd_proto_err_name(enum kvtd_proto_err why);
const char *kvtd_end_name(enum kvtd_end e);

/* ---- the HTTP endpoint (src/server/http.c, libmicrohttpd) --------------- */

typedef struct kvtd_http kvtd_http;

/** The default metrics address: loopback, Prometheus' port for kvtier. */
#define KVTD_METRICS_ADDR_DEFAULT "127.0.0.1:9464"

/**
 * Makes the body of one GET: a NUL-terminated kvt_malloc'ed buffer of *@len
 * bytes, which the endpoint frees with kvt_free(). 0 or -errno (answered
 * 500). Runs on the endpoint's thread.
 */
typedef int (*kvtd_render_fn)(void *arg, char **body, size_t *len);

/** A kvtd_render_fn over a registry (@arg: the kvtd_metrics *). */
int kvtd_metrics_render_cb(void *arg, char **body, size_t *len);

/**
 * kvtd_http_parse_addr() - check an address as kvtd_http_start() takes it:
 * "HOST:PORT", HOST an IPv4 literal, "[IPv6]" or "localhost", PORT 0..65535
 * (0: any free port); a bare "PORT" means 127.0.0.1:PORT. Fills @sa (room
 * for a struct sockaddr_in6) and *@salen. 0 or KVT_ECONFIG naming what is
 * wrong (kvt_errdetail()). No name resolution.
 */
struct sockaddr;
int kvtd_http_parse_addr(const char *addr, struct sockaddr *sa,
			 unsigned *salen);

/**
 * kvtd_http_start() - serve GET (and HEAD) /metrics on @addr from a thread
 * of its own: 200 with @render's body as text/plain; version=0.0.4, 404 for
 * any other path, 405 (Allow: GET, HEAD) for other methods, 500 when
 * @render fails. At most 64 connections, 8 from one address, 5 s idle,
 * and a request must arrive whole within 3 s of the accept or of the last
 * reply, or the connection is shut down (slow clients: http.c). A non-loopback
 * address is served (it was asked for) with a warning in the log.
 * Returns 0 and *@out, or KVT_ECONFIG (malformed address), -EADDRINUSE,
 * -EACCES, -errno when the socket cannot be bound, KVT_ENOTBUILT (a build
 * without libmicrohttpd), -ENOMEM.
 */
int kvtd_http_start(kvtd_http **out, const char *addr, kvtd_render_fn render,
		    void *arg);
/** The port it listens on (the chosen one for port 0). */
unsigned kvtd_http_port(const kvtd_http *h);
/** Stop serving, wait for the thread, free. NULL is fine. */
void kvtd_http_stop(kvtd_http *h);

#endif /* KVT_SERVER_METRICS_H */
