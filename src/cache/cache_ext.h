/*
 * cache_ext.h — the narrow interface between the node cache and an
 * extension built on top of it (inside; not installed). The one extension
 * is the remote tier (cache_remote.c): it uses the cache's public calls
 * (kvtier/cache.h) and this header, and nothing of the cache's insides;
 * the cache knows it only through the hooks below (and names its opener
 * once, for kvt_cache_config.remote). Dependencies point one way:
 *
 *   cache_remote.c --public calls, kvti_cache_ext_*--> the cache
 *   the cache ------------hooks (struct kvti_cache_ext)--> cache_remote.c
 *
 * The hooks are set once, at the end of kvt_cache_open(), and never change.
 */
#ifndef KVT_CACHE_EXT_H
#define KVT_CACHE_EXT_H

#include "core/core.h"

/* What the cache tells an extension. Every member is required. */
struct kvti_cache_ext {
	/*
	 * @stored: a store job committed with every page in place: pages
	 * first..nkeys-1 of the prefix keys[0..nkeys) of @tenant (first <
	 * nkeys) are visible. Called from a worker thread with the job's
	 * lock held, before the job is seen done (so a flush after waiting
	 * for the job sees it): record and wake only, never call the cache.
	 * Not called for KVT_CACHE_IO_EACH stores (one-page prefixes) nor
	 * for stores out of memory marked with kvti_cache_ext_quiet().
	 */
	void (*stored)(void *arg, uint32_t tenant, const kvt_page_key *keys,
		       size_t nkeys, size_t first);
	/*
	 * @lookup: kvt_cache_lookup() found @r locally (not for
	 * KVT_LOOKUP_EACH); add what the extension holds after it. No lock
	 * of the cache is held: it may block (network) and call the cache.
	 */
	void (*lookup)(void *arg, const kvt_page_key *keys, size_t nkeys,
		       kvt_cache_lookup_result *r);
	/* @stop: kvt_cache_close(), first: end the extension's own jobs.
	 * @free: kvt_cache_close(), last, after every copy is over. */
	void (*stop)(void *arg);
	void (*free)(void *arg);
};

/* Install @ops with @arg (an extension's opener, once, before the cache
 * is handed out). */
void kvti_cache_ext_set(kvt_cache *c, const struct kvti_cache_ext *ops,
			void *arg);
/* The argument installed with @ops, or NULL when @ops is not installed. */
void *kvti_cache_ext_arg(const kvt_cache *c, const struct kvti_cache_ext *ops);
/* Stores out of @m are not reported to @stored (an extension's own
 * staging memory). Before any job on @m. */
void kvti_cache_ext_quiet(kvt_cache_mem *m);

/* The remote tier (cache_remote.c): connect (a server down is no error),
 * attach its staging areas, start its writer, install its hooks. 0, or an
 * error (bad spec, -ENOMEM): nothing installed. */
int kvti_cache_remote_open(kvt_cache *c, const char *spec);

#endif
