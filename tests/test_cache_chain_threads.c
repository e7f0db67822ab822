/*
 * test_cache_chain_threads — a demotion chain writes one slot several
 * times in one batch, and the slot is served only once its last write has
 * landed (run under TSan in CI).
 *
 * fabric holds one session of SP pages, dram two pages. Each round stores
 * a new session; making room in fabric evicts the previous session's pages
 * into dram, and each of them needs room in dram, so one batch writes the
 * same two dram slots again and again (page a in, a out to ssd, b in, b
 * out, ...). From the moment the batch is decided, the index and each
 * slot's sums name the last page written there. Meanwhile a second thread
 * loads the evicted session over and over: a page whose copy is still on
 * its way must fail as not loadable yet (KVT_EBUSY), never load another
 * page's bytes; once the store is over the whole session loads. Every
 * loaded block is checked against its page's image, and no copy may fail
 * its checksum. (When a chain's slot went OK at its first
 * write, a load in the rest of the batch read an earlier page's bytes:
 * KVT_ECORRUPT, counted corrupt, in most runs of this test.)
 */
#include "cache_util.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#define P 4
#define SP 16      /* pages per session: fabric's size */
#define ROUNDS 30

static kvt_geom geom;
static kvt_cache *cache;
static eng engine;
static kvt_page_key keys[ROUNDS][SP];
static atomic_int round_on = -1, store_done = -1, ack;
static atomic_long n_loads, n_pages, n_busy;

/* Load session @s into blocks SP..2SP-1, check what landed; the result,
 * *@copied the pages loaded. */
static int load_check(int s, unsigned char *img, uint64_t *copied)
{
	uint32_t b[SP], failed[SP];
	kvt_cache_job_stat st;
	kvt_cache_job *j;
	long nf;
	int err;

	*copied = 0;
	for (int i = 0; i < SP; i++) {
		b[i] = (uint32_t)(SP + i);
		eng_poison(&engine, b[i]);
	}
	err = kvt_cache_load(cache, 0, keys[s], SP, 0, b, &j);
	TCHECK(err == 0);
	if (err)
		return err;
	err = kvt_cache_job_wait(j, -1);
	nf = kvt_cache_job_failed(j, failed, SP);
	kvt_cache_job_stat_get(j, &st);
	kvt_cache_job_free(j);
	if (err && err != KVT_ENOTFOUND && err != KVT_EBUSY)
		fprintf(stderr, "load of session %d: %d (%s)\n", s, err,
			kvt_strerror(err));
	TCHECK(err == 0 || err == KVT_ENOTFOUND || err == KVT_EBUSY);
	TCHECK(nf >= 0 && nf <= SP);
	atomic_fetch_add(&n_loads, 1);
	atomic_fetch_add(&n_pages, (long)st.copied);
	if (err == KVT_EBUSY)
		atomic_fetch_add(&n_busy, 1);
	for (int i = 0, f = 0; i < SP; i++) {
		if (f < nf && failed[f] == b[i]) {
			f++;
			TCHECK(eng_block_poisoned(&engine, b[i]));
			continue;
		}
		page_img(&engine, keys[s][i], img);
		for (uint32_t l = 0; l < engine.L; l++)
			TCHECK(eng_layer_is(&engine, b[i], l, img));
	}
	*copied = st.copied;
	return err;
}

/* Round r's store evicts session r - 1: load it over and over from the
 * moment its eviction is decided (a lease taken before would keep its pages
 * in fabric; a lookup takes none) until the store is over, once more after;
 * then let the next round start (a lease on r - 1 in dram would keep the
 * next chain out of dram). */
static void *loader(void *arg)
{
	unsigned char *img = malloc(engine.page);
	kvt_cache_lookup_result lr;
	uint64_t n;

	(void)arg;
	for (int r = 1; r < ROUNDS; r++) {
		while (atomic_load(&round_on) < r)
			sched_yield();
		while (atomic_load(&store_done) < r) {
			TCHECK(kvt_cache_lookup(cache, 0, keys[r - 1], SP, 0,
						&lr) == 0);
			if (lr.pages < SP)
				break; /* decided: being moved */
		}
		while (atomic_load(&store_done) < r)
			load_check(r - 1, img, &n);
		/* every copy landed: the whole session loads */
		TCHECK(load_check(r - 1, img, &n) == 0 && n == SP);
		atomic_store(&ack, r);
	}
	free(img);
	return NULL;
}

int main(void)
{
	const char *dir = test_dir("cache_chain");
	int64_t live = kvt_alloc_live();
	kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
	kvt_cache_check chk;
	kvt_cache_stat st;
	uint32_t sb[SP];
	pthread_t th;
	char spec[600];

	test_watchdog(200);
	small_geom(&geom, 4, P); /* 8 KiB pages */
	/* fabric: one session; dram: two pages; ssd: 16 sessions */
	snprintf(spec, sizeof(spec), "fabric:memfd,128K dram:16K "
		 "ssd:%s/ssd,2M,temp", dir);
	cfg.tiers = spec;
	cfg.geom = &geom;
	/* the store's own job makes room: the whole chain is its batch */
	cfg.flags = KVT_CACHE_NO_BACKGROUND;
	CHECK_OK(kvt_cache_open(&cache, &cfg));
	if (!cache)
		TEST_DONE();
	CHECK_OK(eng_init(&engine, &geom, 2 * SP, ENG_BLOCK_OUTER, 16, -1));
	CHECK_OK(eng_register(cache, &engine));
	for (int s = 0; s < ROUNDS; s++)
		CHECK_OK(session_keys(cache, 0, (uint32_t)s, SP, keys[s]));
	for (int i = 0; i < SP; i++)
		sb[i] = (uint32_t)i;
	CHECK(pthread_create(&th, NULL, loader, NULL) == 0);
	for (int r = 0; r < ROUNDS; r++) {
		kvt_cache_job_stat js;

		eng_fill(&engine, keys[r], SP, 0, sb);
		atomic_store(&round_on, r);
		TCHECK(cache_store_wait(cache, 0, keys[r], SP, 0, sb, &js) == 0);
		TCHECK(js.copied + js.skipped == SP);
		atomic_store(&store_done, r);
		while (r > 0 && atomic_load(&ack) < r)
			sched_yield();
	}
	pthread_join(th, NULL);

	kvt_cache_stat_get(cache, &st);
	fprintf(stderr, "%d rounds: %ld loads, %ld pages, %ld not loadable "
		"yet; %llu pages moved, %llu evicted, %llu corrupt\n", ROUNDS,
		atomic_load(&n_loads), atomic_load(&n_pages),
		atomic_load(&n_busy), (unsigned long long)st.move_pages,
		(unsigned long long)st.evicted,
		(unsigned long long)st.corrupt);
	CHECK(atomic_load(&n_loads) > 0);
	/* each round after the first: SP pages into dram, SP - 2 out of it */
	CHECK(st.move_pages >= (uint64_t)(ROUNDS - 1) * (2 * SP - 2));
	CHECK_EQ(st.corrupt, 0);
	CHECK_EQ(st.move_errors, 0);
	CHECK_OK(kvt_cache_verify(cache, &chk));
	CHECK_EQ(chk.bad, 0);
	CHECK(eng_gaps_intact(&engine));
	kvt_cache_close(cache);
	eng_free(&engine);
	CHECK_EQ(kvt_alloc_live(), live);
	TEST_DONE();
}
