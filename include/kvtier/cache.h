/*
 * kvtier/cache.h — the node cache: tiers, pools, the index and the
 * transfer engine wired together. Included by <kvtier.h>.
 *
 * The parts below it each do one thing: tiers hold slots, the index decides
 * and records, the transfer engine moves bytes. A kvt_cache is the glue an
 * engine (or the demo, or the daemon) uses so that every decision of the
 * index is carried out with real bytes, and every byte is checked:
 *
 *        kvt_cache_acquire(prefix)                kvt_cache_put()
 *                 |                                      |
 *                 v                                      v
 *        index: insert into hbm  ---- fresh slots ----> computed pages
 *                 |  (evicts, demotes)                   (caller's bytes)
 *                 v
 *        mover.copy(src, dst)  --- collected, then at mover.flush: one
 *                 |                transfer job per (source, destination)
 *                 |                tier pair and dependency wave, waited on
 *                 v
 *        loads: one job per source tier into hbm, checksums verified
 *
 * CHECKSUMS. The cache keeps, for every slot of every tier, the XXH3-64 of
 * the page it should hold (page-first byte order, as the transfer engine
 * computes it). A page gets its sum when it is put (computed) into hbm; the
 * sum follows the page on every demotion, copy and load, and every one of
 * those moves verifies it (KVT_XFER_VERIFY): a page that does not match is
 * never reported loaded. kvt_cache_verify() re-reads every resident copy.
 *
 * ORDER OF COPIES. Inside one index call a demotion can free a slot that a
 * later demotion of the same call writes (hbm -> fabric reuses the fabric
 * slot whose page just went fabric -> dram). The mover therefore runs the
 * copies of one call in dependency waves: a copy that writes a slot an
 * earlier copy reads, or reads a slot an earlier copy writes, goes in a
 * later wave; each wave is one job per tier pair, and waits for the one
 * before.
 *
 * THREADS. A kvt_cache is used by one thread at a time (like the index it
 * owns); the transfer engine's threads work underneath.
 *
 * TIME. Calls take the caller's @now (ns) for the index's recency, so the
 * cache can run on a wall clock or a virtual one.
 */
#ifndef KVTIER_CACHE_H
#define KVTIER_CACHE_H

#include <kvtier.h>
#include <kvtier/index.h>
#include <kvtier/xfer.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvt_cache kvt_cache;

/**
 * struct kvt_cache_config - how to build a cache (zero = defaults).
 * @tiers:     tier spec (include/kvtier/tier.h); must name one hbm or
 *             hostdev tier (the fastest, where pages are used) and at most
 *             one tier of each kind.
 * @geom:      the KV geometry (page_tokens is the index's P).
 * @evict, @write, @selective_hits: the index's policies (index.h).
 * @high, @low: watermarks of every tier (0: 0.95 and 0.85).
 * @xfer:      transfer engine settings (zero: defaults).
 * @no_verify: 1: keep no checksums (faster, unchecked).
 * @stage_ssd: 1: stage ssd -> hbm loads through the bounce tier even when
 *             a direct path exists (tests); automatic for CUDA hbm.
 */
typedef struct kvt_cache_config {
	const char *tiers;
	kvt_geom geom;
	int evict;
	int write;
	uint32_t selective_hits;
	double high, low;
	kvt_xfer_config xfer;
	int no_verify;
	int stage_ssd;
} kvt_cache_config;

/**
 * kvt_cache_open() - build the tiers, the index (token keys) and the
 * transfer engine. Returns 0 and *@out; KVT_ESPEC for a spec without a
 * fastest tier or with two tiers of one kind; any error of
 * kvt_tier_spec_parse(), kvt_tier_open(), kvt_index_create() and
 * kvt_xfer_create(). On failure nothing is left open. Free with
 * kvt_cache_close().
 */
KVT_API int kvt_cache_open(kvt_cache **out, const kvt_cache_config *cfg);
/** Stop the engine, destroy the index, close (and for temp tiers remove)
 *  the tiers. NULL is fine. */
KVT_API void kvt_cache_close(kvt_cache *c);

/**
 * kvt_cache_reset() - forget every page (the index is rebuilt empty with
 * policies @evict and @write, every slot goes back to its pool, every sum
 * and counter is cleared) while the tiers stay mapped and the engine stays
 * up: a second run on warm memory. Nothing may be leased. Returns 0, or the
 * error of kvt_index_create() (then the cache has no index and only
 * kvt_cache_close() may follow).
 */
KVT_API int kvt_cache_reset(kvt_cache *c, int evict, int write);

KVT_API kvt_index *kvt_cache_index(kvt_cache *c);
KVT_API kvt_xfer *kvt_cache_xfer(kvt_cache *c);
/** The tier of kind @k, or NULL if the cache has none. hbm and hostdev are
 *  both KVT_TIER_HBM. */
KVT_API kvt_tier *kvt_cache_tier(kvt_cache *c, kvt_tier_kind k);
KVT_API const kvt_geom *kvt_cache_geom(const kvt_cache *c);

/** What one kvt_cache_acquire() did. */
typedef struct kvt_cache_fill {
	uint64_t pages;                     /* pages of the prefix in hbm */
	uint64_t from[KVT_TIER_COUNT];      /* pages found in each tier
					       (hbm: already there; others:
					       loaded from there) */
	uint64_t compute;                   /* pages with no copy anywhere:
					       the caller computes and puts
					       them (kvt_cache_put()) */
	uint64_t bytes_loaded;
	uint64_t verified;                  /* pages whose checksum matched */
	double load_s;                      /* wall time of the loads */
	double evict_s;                     /* wall time of the copies the
					       insert's evictions issued */
} kvt_cache_fill;

/**
 * kvt_cache_acquire() - make every whole page of @px present in the
 * fastest tier and lease it: pages already there stay, pages held by a
 * lower tier are loaded from the fastest copy (checksums verified), pages
 * nowhere get a fresh slot for the caller to fill. Making room evicts and
 * demotes other pages (their copies run before this returns).
 *
 * @locs: optional, @nlocs entries: per page, its hbm slot and whether it
 *        still needs computing (locs[i].fresh && locs[i].src_tier ==
 *        KVT_TIER_COUNT).
 *
 * The pages stay pinned until kvt_cache_release() of the same prefix.
 * Returns 0; KVT_EFULL if the fastest tier cannot hold the prefix even
 * after eviction (nothing leased); KVT_ECORRUPT if a loaded page failed its
 * checksum or a copy it depends on had failed (kvt_errdetail() names the
 * page; nothing is leased; the hbm slots of the failed pages are marked bad
 * and every later acquire of them fails the same way); the errors of
 * kvt_index_insert() and kvt_xfer_submit(). A prefix whose length is not
 * whole pages is cut to whole pages.
 *
 * ssd -> hbm: the transfer engine has no direct path from ssd to a CUDA
 * pool; such loads are staged through a small page-first bounce tier the
 * cache owns (also used for hostdev when @stage_ssd is set, for tests).
 */
KVT_API int kvt_cache_acquire(kvt_cache *c, const kvt_prefix *px,
			      uint64_t now, kvt_cache_fill *f,
			      kvt_page_loc *locs, size_t nlocs);

/**
 * kvt_cache_put() - write one computed page (page_bytes, page-first order)
 * into hbm slot @slot and record its checksum. @slot must be a slot the
 * caller leased with kvt_cache_acquire(). Returns 0, -ERANGE, or the
 * error of the tier's write.
 */
KVT_API int kvt_cache_put(kvt_cache *c, uint32_t slot, const void *page);

/** End the lease kvt_cache_acquire() took on @px (same prefix). Returns as
 *  kvt_index_unpin(). */
KVT_API int kvt_cache_release(kvt_cache *c, const kvt_prefix *px);

/** What kvt_cache_verify() found. */
typedef struct kvt_cache_check {
	uint64_t checked;   /* page copies read back and hashed */
	uint64_t bad;       /* of which did not match (or a copy had failed) */
	uint64_t unsummed;  /* slots in use with no sum: acquired for
			       computing but never put */
	uint64_t per_tier[KVT_TIER_COUNT]; /* checked, by tier */
} kvt_cache_check;

/**
 * kvt_cache_verify() - read back every page copy the index holds, in every
 * tier, and check it against its recorded sum. Returns 0 when every copy
 * matched (and fills @r), KVT_ECORRUPT naming the first bad (tier, slot),
 * or the error of a tier read.
 */
KVT_API int kvt_cache_verify(kvt_cache *c, kvt_cache_check *r);

/** Running totals of the data the cache moved. */
typedef struct kvt_cache_stat {
	uint64_t loads, load_pages, load_bytes;       /* into hbm */
	uint64_t moves, move_pages, move_bytes;       /* demotions + copies */
	uint64_t move_waves;
	uint64_t move_errors;    /* copies that failed (pages dropped) */
	uint64_t verified;       /* pages verified in flight, all moves */
	uint64_t corrupt;        /* pages that failed verification */
	uint64_t puts;
	double load_s, move_s;   /* wall time spent waiting on jobs */
} kvt_cache_stat;
KVT_API void kvt_cache_stat_get(kvt_cache *c, kvt_cache_stat *st);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_CACHE_H */
