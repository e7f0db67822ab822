/*
 * cache_remote.h — the node cache's remote tier (cache_remote.c), as
 * cache.c calls it. Built on the cache's public calls (attach, load_ex,
 * store_ex, lookup) and kvtier/remote.h; cache.c keeps one pointer.
 *
 * Order at close: kvti_cache_remote_stop() before the cache cancels its
 * jobs (the writer thread ends its own), kvti_cache_remote_free() after
 * the cache is freed (the staging memory outlives every copy into it).
 */
#ifndef KVT_CACHE_REMOTE_H
#define KVT_CACHE_REMOTE_H

#include "core/core.h"

struct kvti_cremote;

/* Connect (kvt_remote_open: a server down is no error), attach the staging
 * areas, start the writer thread. 0 or an error (bad spec, -ENOMEM). */
int kvti_cache_remote_open(kvt_cache *c, const char *spec,
			   struct kvti_cremote **out);
void kvti_cache_remote_stop(struct kvti_cremote *cr);
void kvti_cache_remote_free(struct kvti_cremote *cr);

/* Add the remote run after the local one to r->tier_pages[REMOTE]. */
void kvti_cache_remote_lookup(struct kvti_cremote *cr,
			      const kvt_page_key *keys, size_t nkeys,
			      kvt_cache_lookup_result *r);

/* Does a store with @io go through kvti_cache_remote_store() (which calls
 * kvt_cache_store_ex() again with its own progress hook)? */
int kvti_cache_remote_wants(const struct kvti_cremote *cr,
			    const kvt_cache_io *io);
int kvti_cache_remote_store(struct kvti_cremote *cr, uint32_t tenant,
			    const kvt_page_key *keys, size_t nkeys,
			    size_t first, const uint32_t *blocks,
			    const kvt_cache_io *io, kvt_cache_job **out);

int kvti_cache_remote_prefetch(struct kvti_cremote *cr, uint32_t tenant,
			       const kvt_page_key *keys, size_t nkeys,
			       size_t first, uint64_t *pages);
int kvti_cache_remote_fetch_start(struct kvti_cremote *cr, uint32_t tenant,
				  const kvt_page_key *keys, size_t nkeys,
				  size_t first, kvt_cache_fetch **out);
int kvti_cache_remote_flush(struct kvti_cremote *cr, int64_t timeout_ns);
void kvti_cache_remote_stat(struct kvti_cremote *cr,
			    kvt_cache_remote_stat *st);

#endif
