/*
 * test_ssd_persist_rebuild — how long the open of a full persistent ssd
 * tier takes to rebuild the index, and that it rebuilds all of it.
 *
 * Fills an ssd-only cache (no background demotion, so to 100 %) with
 * chains of 64 small pages (1 layer, 1 token: 512-byte pages in 4 KiB
 * slots, so a tier of a few GiB has a million slots), closes it, and
 * opens it again twice: warm (the record area in the page cache) and cold
 * (its pages dropped with posix_fadvise first). Prints the slots, the
 * rebuild time and slots per second; checks every page came back and a
 * sample of chains loads bit-exact.
 *
 * Size: KVT_REBUILD_MIB (default 64 MiB = 16384 slots, about 2 s here);
 * the figures in docs/PERFORMANCE.md come from KVT_REBUILD_MIB=4096.
 * KVT_REBUILD_DIR puts the tier elsewhere (default: the build tree) and
 * keeps it; with KVT_REBUILD_REUSE=1 too, a second run skips the fill and
 * measures the first open of a fresh process over it, cold (what a daemon
 * restart does). KVT_REBUILD_PLAIN=1 fills a tier without 'persist' and
 * stops: the store path's cost of keeping records, side by side.
 */
#include "cache_util.h"

#include <fcntl.h>

#define CHAIN 64
#define PIPE 8

static kvt_geom geom;
static char spec[1024];

static int open_cache(kvt_cache **c)
{
	kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;

	cfg.tiers = spec;
	cfg.geom = &geom;
	cfg.flags = KVT_CACHE_NO_BACKGROUND;
	return kvt_cache_open(c, &cfg);
}

/* Store sessions 0..nchains-1, PIPE stores in flight. */
static void fill(kvt_cache *c, const eng *e, uint64_t nchains)
{
	kvt_page_key keys[PIPE][CHAIN];
	kvt_cache_job *jobs[PIPE] = { NULL };
	uint32_t blocks[CHAIN];

	for (uint64_t s = 0; s < nchains + PIPE; s++) {
		int n = (int)(s % PIPE);

		if (jobs[n]) {
			CHECK_OK(kvt_cache_job_wait(jobs[n], -1));
			kvt_cache_job_free(jobs[n]);
			jobs[n] = NULL;
		}
		if (s >= nchains)
			continue;
		for (uint32_t i = 0; i < CHAIN; i++)
			blocks[i] = (uint32_t)n * CHAIN + i;
		CHECK_OK(session_keys(c, 0, (uint32_t)s, CHAIN, keys[n]));
		eng_fill(e, keys[n], CHAIN, 0, blocks);
		CHECK_OK(kvt_cache_store(c, 0, keys[n], CHAIN, 0, blocks,
					 &jobs[n]));
	}
}

static void drop_cached(const char *dir)
{
	char path[700];
	int fd;

	snprintf(path, sizeof(path), "%s/kvtier-ssd-index.kvt", dir);
	fd = open(path, O_RDONLY);
	CHECK(fd >= 0);
	if (fd < 0)
		return;
	CHECK_EQ(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
	close(fd);
}

/* Open, check what came back; returns the open's wall time. */
static double reopen(const char *what, uint64_t want, uint64_t nchains)
{
	kvt_cache_restore r;
	kvt_page_key k[CHAIN];
	uint32_t d[CHAIN];
	kvt_cache *c;
	uint64_t t0 = kvt_now_ns(), seed = 7;
	double open_s;
	eng e;
	int err;

	if ((err = open_cache(&c))) {
		fprintf(stderr, "open: %s (%s)\n", kvt_strerror(err),
			kvt_errdetail());
		kvt_test_failures++;
		return 0;
	}
	open_s = (double)(kvt_now_ns() - t0) / 1e9;
	CHECK_OK(kvt_cache_restore_info(c, &r));
	CHECK_EQ(r.records, want);
	CHECK_EQ(r.restored, want);
	CHECK_EQ(r.bad_records + r.orphans + r.duplicates + r.failed, 0);
	fprintf(stderr, "%s open: %llu slots restored; rebuild %.3f s (scan "
		"%.3f s), %.2f M slots/s; whole open %.3f s\n", what,
		(unsigned long long)r.restored, r.rebuild_s, r.scan_s,
		(double)r.restored / r.rebuild_s / 1e6, open_s);
	/* a sample of chains loads bit-exact */
	CHECK_OK(eng_init(&e, &geom, CHAIN, ENG_KV_OUTER, 0, -1));
	CHECK_OK(eng_register(c, &e));
	for (int i = 0; i < 8; i++) {
		uint32_t s = (uint32_t)(test_rand(&seed) % nchains);

		for (uint32_t j = 0; j < CHAIN; j++)
			d[j] = j;
		CHECK_OK(session_keys(c, 0, s, CHAIN, k));
		CHECK_OK(cache_load_wait(c, 0, k, CHAIN, 0, d, NULL, NULL, NULL));
		for (uint32_t j = 0; j < CHAIN; j++)
			CHECK(eng_block_is(&e, d[j], k[j]));
	}
	kvt_cache_close(c);
	eng_free(&e);
	return open_s;
}

int main(void)
{
	const char *env = getenv("KVT_REBUILD_MIB");
	const char *where = getenv("KVT_REBUILD_DIR");
	int reuse = where && getenv("KVT_REBUILD_REUSE");
	int plain = getenv("KVT_REBUILD_PLAIN") != NULL;
	uint64_t mib = env ? strtoull(env, NULL, 10) : 64, nslots, nchains;
	char dir[600];
	kvt_cache *c;
	uint64_t t0;
	double fill_s, close_s;
	eng e;

	if (!mib || mib > (1u << 20))
		SKIP("KVT_REBUILD_MIB out of range");
	snprintf(dir, sizeof(dir), "%s/ssd",
		 where ? where : test_dir("ssd_persist_rebuild"));
	small_geom(&geom, 1, 1); /* 512-byte pages, 4 KiB slots */
	snprintf(spec, sizeof(spec), "ssd:%s,%lluM%s%s", dir,
		 (unsigned long long)mib, plain ? "" : ",persist",
		 reuse ? "" : ",fresh");
	if (reuse) {
		/* filled by an earlier run: the first open of a fresh process
		 * (a daemon restart), cold; 4 KiB slots */
		nslots = mib << 8;
		nchains = nslots / CHAIN;
		drop_cached(dir);
		reopen("cold, fresh process", nchains * CHAIN, nchains);
		TEST_DONE();
	}
	test_watchdog(60 + (unsigned)(mib / 8));
	if (open_cache(&c)) {
		fprintf(stderr, "open: %s\n", kvt_errdetail());
		return 1;
	}
	nslots = kvt_pool_slots(kvt_tier_pool(kvt_cache_tier(c,
							     KVT_TIER_SSD)));
	nchains = nslots / CHAIN;
	CHECK_OK(eng_init(&e, &geom, PIPE * CHAIN, ENG_KV_OUTER, 0, -1));
	CHECK_OK(eng_register(c, &e));
	t0 = kvt_now_ns();
	fill(c, &e, nchains);
	fill_s = (double)(kvt_now_ns() - t0) / 1e9;
	t0 = kvt_now_ns();
	kvt_cache_close(c);
	close_s = (double)(kvt_now_ns() - t0) / 1e9;
	eng_free(&e);
	fprintf(stderr, "%llu MiB ssd tier: %llu slots, %llu filled in %.1f s, "
		"clean close %.3f s, record area %llu MiB\n",
		(unsigned long long)mib, (unsigned long long)nslots,
		(unsigned long long)(nchains * CHAIN), fill_s, close_s,
		(unsigned long long)(KVT_SSD_REC_BYTES(1) * nslots >> 20));
	if (plain) /* the fill without 'persist', for the A/B of its cost */
		goto out;

	snprintf(spec, sizeof(spec), "ssd:%s,%lluM,persist", dir,
		 (unsigned long long)mib);
	reopen("warm", nchains * CHAIN, nchains);
	drop_cached(dir);
	reopen("cold", nchains * CHAIN, nchains);
out:
	if (!where) { /* the scratch tier is not kept */
		char cmd[700];

		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
		CHECK_EQ(system(cmd), 0);
	}
	TEST_DONE();
}
