/*
 * metrics_snap.c — the metrics snapshot: every counter of the registry,
 * the cache's tiers and totals and the data path's counters copied into
 * one plain struct snap that both renderings format (metrics_text.c,
 * metrics_json.c); and the table of the cache's totals they both name.
 *
 *   render --lock m->mu--> collect hook --> relaxed load of each counter
 *          (gauges, node block, tenant blocks), kvt_cache_stat_get(),
 *          pool counters per tier, kvtd_dpath_snap() --unlock--> format
 *
 * Invariants: each counter is read exactly once per snapshot, so a
 * histogram's count is its last cumulative bucket and a family's samples
 * agree with each other; the set of tiers with per-tier series (s->tiers)
 * is the cache's tiers plus any tier a tenant counted in.
 *
 * Locking: kvti_metrics_snap_take() takes m->mu for the whole snapshot:
 * one collect hook at a time, the tenant array stable. The cache's
 * and the transfer engine's counters are safe to read from this thread.
 */
#include "server/metrics_impl.h"

#include "core/core.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

static inline uint64_t ld(actr *c)
{
	return atomic_load_explicit(c, memory_order_relaxed);
}

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
	s->have_remote = kvt_cache_remote_stat_get(c, &s->rs) == 0;
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
static int snap_locked(kvtd_metrics *m, struct snap *s)
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

int kvti_metrics_snap_take(kvtd_metrics *m, struct snap *s)
{
	int err;

	pthread_mutex_lock(&m->mu);
	err = snap_locked(m, s);
	pthread_mutex_unlock(&m->mu);
	return err;
}

/* ---- the cache's totals ------------------------------------------------- */

const struct kvti_metrics_cache_ctr kvti_metrics_cache_ctrs[] = {
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

const size_t kvti_metrics_ncache_ctrs = KVT_ARRAY_SIZE(kvti_metrics_cache_ctrs);

/* The remote tier (present only with --remote): what a forged or corrupt
 * value (bad_values: failed its MAC or checksum, never served) and a sick
 * Redis (node errors, write failures, dropped write-through) look like to
 * an operator. Pages are counted once per call that asks. */
const struct kvti_metrics_cache_ctr kvti_metrics_remote_ctrs[] = {
#define RS(f) offsetof(kvt_cache_remote_stat, f)
	{ "kvtier_remote_pages_total", "hit", "hits",
	  "Remote tier pages: hit (fetched and verified), miss (absent, bad "
	  "or lost), stored (taken by the server), write_failed (refused or "
	  "lost by it).", RS(remote.hits), 0 },
	{ "kvtier_remote_pages_total", "miss", "misses", NULL,
	  RS(remote.misses), 0 },
	{ "kvtier_remote_pages_total", "stored", "stored", NULL,
	  RS(remote.stored), 0 },
	{ "kvtier_remote_pages_total", "write_failed", "write_failures", NULL,
	  RS(remote.write_failures), 0 },
	{ "kvtier_remote_bad_values_total", NULL, "bad_values",
	  "Remote values that failed their MAC or checksum (forged, written "
	  "under another key, or corrupt): never served.",
	  RS(remote.bad_values), 0 },
	{ "kvtier_remote_read_failures_total", NULL, "read_failures",
	  "Remote pages lost to a node's error on read.",
	  RS(remote.read_failures), 0 },
	{ "kvtier_remote_node_errors_total", NULL, "node_errors",
	  "Remote node connection errors, timeouts and error replies.",
	  RS(remote.node_errors), 0 },
	{ "kvtier_remote_bytes_total", "read", "bytes_read",
	  "Remote value bytes received and sent.", RS(remote.bytes_read), 0 },
	{ "kvtier_remote_bytes_total", "write", "bytes_written", NULL,
	  RS(remote.bytes_written), 0 },
	{ "kvtier_remote_writethrough_pages_total", "queued", "queued",
	  "Pages queued for write-through to the remote tier, and of those "
	  "written, already present (not sent) and dropped (queue full, page "
	  "gone, cache closed).", RS(queued), 0 },
	{ "kvtier_remote_writethrough_pages_total", "written", "written",
	  NULL, RS(written), 0 },
	{ "kvtier_remote_writethrough_pages_total", "present", "present",
	  NULL, RS(present), 0 },
	{ "kvtier_remote_writethrough_pages_total", "dropped", "dropped",
	  NULL, RS(dropped), 0 },
	{ "kvtier_remote_lookup_pages_total", NULL, "lookup_pages",
	  "Pages lookups found in the remote tier.", RS(lookup_pages), 0 },
	{ "kvtier_remote_prefetched_pages_total", NULL, "prefetched",
	  "Pages brought in from the remote tier by prefetch.",
	  RS(prefetched), 0 },
	{ "kvtier_remote_probe_dropped_total", NULL, "probe_dropped",
	  "Pages not asked about off the lookup path: the probe queue was "
	  "full.", RS(probe_dropped), 0 },
#undef RS
};

const size_t kvti_metrics_nremote_ctrs =
	KVT_ARRAY_SIZE(kvti_metrics_remote_ctrs);

double kvti_metrics_cache_val(const void *base,
			      const struct kvti_metrics_cache_ctr *r)
{
	const char *p = (const char *)base + r->off;

	return r->seconds ? *(const double *)p : (double)*(const uint64_t *)p;
}
