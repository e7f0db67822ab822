/*
 * cache_small.h — the small cache test_cache.c, test_cache_faults.c and
 * test_cache_tenants.c share: a 4-layer model with 4-token pages (8 KiB
 * pages), tiers of 32 pages of fabric (memfd), 64 of dram and 512 of ssd
 * (a temp file in the program's own scratch directory), an engine of NB
 * blocks of host memory, and the calls they all make on it. Include it
 * once, from the test program itself (it defines the program's geometry
 * and tier spec).
 */
#ifndef KVT_TEST_CACHE_SMALL_H
#define KVT_TEST_CACHE_SMALL_H

#include "cache_util.h"

#define P 4
#define NB 64 /* engine blocks */

static kvt_geom geom;
static char spec[1024];

static inline int open_cache(kvt_cache **c, unsigned flags, int write)
{
	kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;

	cfg.tiers = spec;
	cfg.geom = &geom;
	cfg.flags = flags;
	cfg.write = write;
	return kvt_cache_open(c, &cfg);
}

/* An open cache with registered host memory, or a failed check. */
static inline kvt_cache *setup(eng *e, int outer, unsigned flags,
				int write)
{
	kvt_cache *c = NULL;
	int err;

	if ((err = open_cache(&c, flags, write))) {
		fprintf(stderr, "open: %s (%s)\n", kvt_strerror(err),
			kvt_errdetail());
		kvt_test_failures++;
		return NULL;
	}
	CHECK_OK(eng_init(e, &geom, NB, outer, 64, -1));
	CHECK_OK(eng_register(c, e));
	return c;
}

static inline void lookup_n(kvt_cache *c, uint32_t tenant,
			    const kvt_page_key *k, size_t n,
			    kvt_cache_lookup_result *r)
{
	memset(r, 0xff, sizeof(*r));
	CHECK_OK(kvt_cache_lookup(c, tenant, k, n, 0, r));
}

/* The geometry and tiers above, the ssd file under the scratch directory
 * test_dir(@name) (each program its own: ctest runs them side by side);
 * the ssd path in @ssd; the watchdog started (240 s); returns the
 * directory. */
static inline const char *cache_small_init(const char *name, char *ssd,
					   size_t len)
{
	const char *dir = test_dir(name);

	small_geom(&geom, 4, P); /* 8 KiB pages */
	snprintf(ssd, len, "%s/ssd", dir);
	/* 32 pages of fabric, 64 of dram, 512 of ssd */
	snprintf(spec, sizeof(spec), "fabric:memfd,256K dram:512K "
		 "ssd:%s,4M,temp", ssd);
	test_watchdog(240);
	return dir;
}

#endif
