/*
 * test_cache_threads — one cache, several engine threads at once (run under
 * TSan in CI): each thread stores sessions out of its own engine blocks,
 * looks sessions up (touching them) and loads them into other blocks of
 * its own, while the background thread demotes fabric -> dram -> ssd ->
 * gone (tiers far smaller than the sessions, so it always has work), and
 * some stores and loads are cancelled as they start. Then again without
 * the background thread: every store that finds no room demotes in its
 * own call, the threads' eviction batches running in turn. Every byte a load
 * reports is checked against the page's image; a block may fail only as
 * absent (evicted since the lookup, or not stored yet), and then nothing is
 * written to it. At the end no copy is corrupt (kvt_cache_verify()).
 */
#include "cache_util.h"

#include <pthread.h>
#include <stdatomic.h>

#define P 4
#define NT 4        /* engine threads */
#define BPT 16      /* blocks per thread: 8 to store from, 8 to load into */
#define NS 40       /* sessions */
#define SP 8        /* pages per session */

#ifdef KVT_SANITIZED
#define OPS 200
#else
#define OPS 600
#endif

static kvt_geom geom;
static kvt_cache *cache;
static eng engine;
static kvt_page_key keys[NS][SP];
static atomic_long n_stores, n_loads, n_load_pages, n_absent, n_full,
	n_cancelled, from_low;

static void do_store(uint32_t *b, uint64_t *seed)
{
	int s = (int)(test_rand(seed) % NS), cancel = test_rand(seed) % 16 == 0;
	kvt_cache_job_stat st;
	kvt_cache_job *j;
	int err;

	eng_fill(&engine, keys[s], SP, 0, b);
	err = kvt_cache_store(cache, 0, keys[s], SP, 0, b, &j);
	if (err == KVT_EFULL) { /* everything else leased: allowed, counted */
		atomic_fetch_add(&n_full, 1);
		return;
	}
	TCHECK(err == 0);
	if (err)
		return;
	if (cancel) {
		err = kvt_cache_job_cancel(j);
		TCHECK(err == 0 || err == -EALREADY);
	}
	err = kvt_cache_job_wait(j, -1);
	kvt_cache_job_stat_get(j, &st);
	kvt_cache_job_free(j);
	if (err == -ECANCELED && cancel) {
		atomic_fetch_add(&n_cancelled, 1);
		return;
	}
	TCHECK(err == 0);
	TCHECK(st.copied + st.skipped == SP);
	atomic_fetch_add(&n_stores, 1);
}

static void do_load(uint32_t *b, uint64_t *seed)
{
	int s = (int)(test_rand(seed) % NS), cancel = test_rand(seed) % 16 == 0;
	kvt_cache_lookup_result r;
	kvt_cache_job_stat st;
	kvt_cache_job *j;
	uint32_t failed[SP];
	unsigned char *img = malloc(engine.page);
	long nf;
	int err;

	err = kvt_cache_lookup(cache, 0, keys[s], SP, KVT_LOOKUP_TOUCH, &r);
	TCHECK(err == 0);
	if (err || r.pages == 0)
		goto out;
	TCHECK(r.pages <= SP);
	TCHECK(r.tier_pages[KVT_TIER_FABRIC] + r.tier_pages[KVT_TIER_DRAM] +
	       r.tier_pages[KVT_TIER_SSD] == r.pages);
	for (uint64_t i = 0; i < r.pages; i++)
		eng_poison(&engine, b[i]);
	err = kvt_cache_load(cache, 0, keys[s], r.pages, 0, b, &j);
	TCHECK(err == 0);
	if (err)
		goto out;
	if (cancel) {
		err = kvt_cache_job_cancel(j);
		TCHECK(err == 0 || err == -EALREADY);
	}
	for (uint32_t l = 0; l < engine.L && !cancel; l++) {
		err = kvt_cache_job_wait_layer(j, l, -1);
		TCHECK(err == 0 || err == KVT_ENOTFOUND || err == KVT_EBUSY);
	}
	err = kvt_cache_job_wait(j, -1);
	nf = kvt_cache_job_failed(j, failed, SP);
	kvt_cache_job_stat_get(j, &st);
	kvt_cache_job_free(j);
	if (cancel && err == -ECANCELED) {
		atomic_fetch_add(&n_cancelled, 1);
		goto check; /* blocks not failed did land */
	}
	/* absent (evicted since the lookup) or not loadable yet (being
	 * stored or moved by another thread): never anything else */
	TCHECK(err == 0 || err == KVT_ENOTFOUND || err == KVT_EBUSY);
	TCHECK((err == 0) == (nf == 0));
	atomic_fetch_add(&n_loads, 1);
	atomic_fetch_add(&n_load_pages, (long)st.copied);
	atomic_fetch_add(&n_absent, nf);
	atomic_fetch_add(&from_low, (long)(st.from[KVT_TIER_DRAM] +
					   st.from[KVT_TIER_SSD]));
check:
	TCHECK(nf >= 0 && nf <= (long)r.pages);
	for (uint64_t i = 0, f = 0; i < r.pages; i++) {
		if (f < (uint64_t)nf && failed[f] == b[i]) {
			f++;
			if (err == KVT_ENOTFOUND || err == KVT_EBUSY)
				TCHECK(eng_block_poisoned(&engine, b[i]));
			continue;
		}
		page_img(&engine, keys[s][i], img);
		for (uint32_t l = 0; l < engine.L; l++)
			TCHECK(eng_layer_is(&engine, b[i], l, img));
	}
out:
	free(img);
}

static void *worker(void *arg)
{
	int t = (int)(intptr_t)arg;
	uint64_t seed = 0x1234567ull * (uint64_t)(t + 1);
	uint32_t sb[SP], lb[SP];

	for (int i = 0; i < SP; i++) {
		sb[i] = (uint32_t)(t * BPT + i);
		lb[i] = (uint32_t)(t * BPT + SP + (SP - 1 - i));
	}
	for (int op = 0; op < OPS; op++) {
		if (test_rand(&seed) % 5 < 2)
			do_store(sb, &seed);
		else
			do_load(lb, &seed);
	}
	return NULL;
}

/* The whole scenario on a fresh cache: with background demotion, or
 * without (KVT_CACHE_NO_BACKGROUND: every store that finds no room
 * demotes in its own call, and the threads' eviction batches run in turn,
 * without the cache's lock). */
static void run(const char *dir, unsigned flags)
{
	kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
	pthread_t th[NT];
	kvt_cache_stat st;
	kvt_cache_check chk;
	char spec[700];
	int bg = !(flags & KVT_CACHE_NO_BACKGROUND);

	atomic_store(&n_stores, 0);
	atomic_store(&n_loads, 0);
	atomic_store(&n_load_pages, 0);
	atomic_store(&n_absent, 0);
	atomic_store(&n_full, 0);
	atomic_store(&n_cancelled, 0);
	atomic_store(&from_low, 0);
	test_phase = bg ? "threads storing, looking up and loading" :
		     "threads storing (evicting in their calls), looking up "
		     "and loading";
	/* 32 + 64 + 128 pages for 320: demotion and drops all the time */
	snprintf(spec, sizeof(spec), "fabric:memfd,256K dram:512K "
		 "ssd:%s/ssd,1M,temp", dir);
	cfg.tiers = spec;
	cfg.geom = &geom;
	cfg.flags = flags;
	CHECK_OK(kvt_cache_open(&cache, &cfg));
	if (!cache)
		return;
	CHECK_OK(eng_init(&engine, &geom, NT * BPT, ENG_BLOCK_OUTER, 16, -1));
	CHECK_OK(eng_register(cache, &engine));
	for (int s = 0; s < NS; s++)
		CHECK_OK(session_keys(cache, 0, (uint32_t)s, SP, keys[s]));
	for (int t = 0; t < NT; t++)
		CHECK(pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t) == 0);
	for (int t = 0; t < NT; t++)
		pthread_join(th[t], NULL);

	test_phase = "quiesce and verify";
	kvt_cache_quiesce(cache);
	kvt_cache_stat_get(cache, &st);
	fprintf(stderr, "%s: stores %ld (full %ld), loads %ld: %ld pages, "
		"%ld from dram/ssd, %ld absent; %ld cancelled; %llu background "
		"passes, %llu pages moved, %llu evicted, wait %.3f s\n",
		bg ? "background" : "no background",
		atomic_load(&n_stores), atomic_load(&n_full),
		atomic_load(&n_loads), atomic_load(&n_load_pages),
		atomic_load(&from_low), atomic_load(&n_absent),
		atomic_load(&n_cancelled), (unsigned long long)st.bg_passes,
		(unsigned long long)st.move_pages,
		(unsigned long long)st.evicted, st.wait_s);
	CHECK(atomic_load(&n_stores) > NT * OPS / 5);
	CHECK(atomic_load(&n_load_pages) > 0);
	CHECK(atomic_load(&from_low) > 0);
	if (bg)
		CHECK(st.bg_passes > 0);
	else
		CHECK(st.bg_passes == 0 && st.wait_s > 0);
	CHECK(st.move_pages > 0);
	CHECK(st.evicted > 0);
	CHECK_EQ(st.corrupt, 0);
	CHECK_EQ(st.move_errors, 0);
	CHECK_OK(kvt_cache_verify(cache, &chk));
	CHECK_EQ(chk.bad, 0);
	CHECK(chk.checked > 0);
	CHECK(eng_gaps_intact(&engine));
	kvt_cache_close(cache);
	cache = NULL;
	eng_free(&engine);
}

int main(void)
{
	const char *dir = test_dir("cache_threads");
	int64_t live = kvt_alloc_live();

	/* a deadlock is a failure, not a CI timeout */
	test_watchdog(200);
	small_geom(&geom, 4, P); /* 8 KiB pages */
	run(dir, 0);
	run(dir, KVT_CACHE_NO_BACKGROUND);
	CHECK_EQ(kvt_alloc_live(), live);
	TEST_DONE();
}
