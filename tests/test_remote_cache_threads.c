/*
 * test_remote_cache_threads.c — the node cache with a remote tier below its dram,
 * against a real redis-server on loopback (skipped without one). ~2 s.
 *
 *   process A   stores a prompt's pages out of its engine memory; the
 *               cache writes them through to Redis in the background
 *   process B   its own cache and dram: lookup finds the prefix remotely
 *               (tier_pages[remote]), prefetch brings it into dram, load
 *               puts it into B's engine blocks: byte-identical, verified
 *   background  a prefetch in its own thread, waited for or cut off:
 *               what arrived is loadable; a cache closed under it
 *   write       a later store writes only the new pages
 *   faults      the server killed: lookups, stores and loads of the local
 *               tiers still work; remote writes and prefetches fail,
 *               counted
 *   config      a bad remote spec fails kvt_cache_open(); an unreachable
 *               server does not
 */
#include "cache_util.h"
#include "remote_util.h"

#define NP 12
#define NB 64

static kvt_geom g;

static kvt_cache *open_cache(const char *remote)
{
	kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
	kvt_cache *c = NULL;

	cfg.tiers = "dram:4M";
	cfg.geom = &g;
	cfg.remote = remote;
	CHECK_OK(kvt_cache_open(&c, &cfg));
	return c;
}

static void prompt_keys(kvt_cache *c, kvt_page_key *keys, size_t n)
{
	uint32_t tok[64 * 8];

	for (size_t i = 0; i < n * g.page_tokens; i++)
		tok[i] = (uint32_t)(i * 7919 + 13);
	CHECK_OK(kvt_cache_hash_tokens(c, 0, tok, n * g.page_tokens, keys));
}

static int run_job(kvt_cache_job *j)
{
	int err = kvt_cache_job_wait(j, 10000000000ll);

	kvt_cache_job_free(j);
	return err;
}

/* Process A: store NP pages, wait for the write-through. */
static int node_a(const char *spec)
{
	kvt_cache_remote_stat st;
	kvt_page_key keys[NP];
	uint32_t blocks[NP];
	kvt_cache_job *j;
	kvt_cache *c;
	eng e;

	if (!(c = open_cache(spec)) ||
	    eng_init(&e, &g, NB, ENG_KV_OUTER, 64, -1))
		return 1;
	CHECK_OK(eng_register(c, &e));
	prompt_keys(c, keys, NP);
	for (int i = 0; i < NP; i++)
		blocks[i] = (uint32_t)(3 * i + 1);
	eng_fill(&e, keys, NP, 0, blocks);
	CHECK_OK(kvt_cache_store(c, 0, keys, NP, 0, blocks, &j));
	CHECK_OK(run_job(j));
	CHECK_OK(kvt_cache_remote_flush(c, 10000000000ll));
	CHECK_OK(kvt_cache_remote_stat_get(c, &st));
	CHECK_EQ(st.queued, NP);
	CHECK_EQ(st.written, NP);
	CHECK_EQ(st.dropped + st.failed + st.present, 0);
	CHECK_EQ(st.remote.stored, NP);
	kvt_cache_close(c);
	eng_free(&e);
	return kvt_test_failures ? 1 : 0;
}

int main(void)
{
	struct rt_server srv;
	char spec[200], dead[200];
	kvt_page_key keys[NP + 8];
	uint32_t blocks[NP + 8];
	kvt_cache_lookup_result lr;
	kvt_cache_remote_stat st;
	kvt_cache_job *j;
	kvt_cache_fetch *j2;
	kvt_cache *c, *cd;
	uint64_t got;
	int port, status;
	pid_t a;
	eng e;

	rt_need_redis();
	small_geom(&g, 4, 8);
	port = rt_free_port(0);
	snprintf(spec, sizeof(spec), "remote:redis://127.0.0.1:%d,timeout=500",
		 port);
	if (rt_start(&srv, test_dir("remote_cache"), port, NULL))
		return 1;

	/* config: bad spec fails, a dead server does not */
	{
		kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;

		cfg.tiers = "dram:4M";
		cfg.geom = &g;
		cfg.remote = "remote:redis://127.0.0.1:0";
		CHECK_ERR(kvt_cache_open(&cd, &cfg), KVT_ESPEC);
		cfg.tiers = "dram:4M remote:redis://127.0.0.1:1";
		cfg.remote = NULL;
		CHECK_ERR(kvt_cache_open(&cd, &cfg), KVT_ESPEC);
		snprintf(dead, sizeof(dead), "redis://127.0.0.1:%d,timeout=200",
			 rt_free_port(0));
		cd = open_cache(dead);
		if (cd) {
			prompt_keys(cd, keys, NP);
			CHECK_OK(kvt_cache_lookup(cd, 0, keys, NP, 0, &lr));
			CHECK_EQ(lr.pages + lr.tier_pages[KVT_TIER_REMOTE], 0);
			CHECK_OK(kvt_cache_prefetch(cd, 0, keys, NP, 0, &got));
			CHECK_EQ(got, 0);
			kvt_cache_close(cd);
		}
	}

	/* A stores; B finds, prefetches, loads */
	a = fork();
	if (a == 0)
		_exit(node_a(spec));
	CHECK(waitpid(a, &status, 0) == a && WIFEXITED(status) &&
	      WEXITSTATUS(status) == 0);
	if (!(c = open_cache(spec)) ||
	    eng_init(&e, &g, NB, ENG_BLOCK_OUTER, 32, -1))
		return 1;
	CHECK_OK(eng_register(c, &e));
	prompt_keys(c, keys, NP + 8);
	/* a lookup answers from what is known; the prober learns the rest
	 * for the next one (within a few of them) */
	for (int i = 0; i < 200; i++) {
		CHECK_OK(kvt_cache_lookup(c, 0, keys, NP + 8, 0, &lr));
		if (lr.tier_pages[KVT_TIER_REMOTE] == NP)
			break;
		rt_sleep_ms(10);
	}
	CHECK_EQ(lr.pages, 0);
	CHECK_EQ(lr.tier_pages[KVT_TIER_REMOTE], NP);
	CHECK_OK(kvt_cache_prefetch(c, 0, keys, NP + 8, 0, &got));
	CHECK_EQ(got, NP);
	CHECK_OK(kvt_cache_lookup(c, 0, keys, NP + 8, 0, &lr));
	CHECK_EQ(lr.pages, NP);
	CHECK_EQ(lr.tier_pages[KVT_TIER_DRAM], NP);
	CHECK_EQ(lr.tier_pages[KVT_TIER_REMOTE], 0);
	for (int i = 0; i < NP; i++) {
		blocks[i] = (uint32_t)(NB - 1 - 2 * i);
		eng_poison(&e, blocks[i]);
	}
	CHECK_OK(kvt_cache_load(c, 0, keys, NP, 0, blocks, &j));
	{
		kvt_cache_job_stat js;

		CHECK_OK(kvt_cache_job_wait(j, 10000000000ll));
		kvt_cache_job_stat_get(j, &js);
		CHECK_EQ(js.verified, NP);
		CHECK_EQ(js.from[KVT_TIER_DRAM], NP);
		kvt_cache_job_free(j);
	}
	for (int i = 0; i < NP; i++)
		CHECK(eng_block_is(&e, blocks[i], keys[i]));
	CHECK(eng_gaps_intact(&e));
	/* the prefetch wrote nothing back; a new store writes its new pages */
	CHECK_OK(kvt_cache_remote_stat_get(c, &st));
	CHECK_EQ(st.queued, 0);
	CHECK_EQ(st.prefetched, NP);
	CHECK_EQ(st.remote.hits, NP);
	CHECK_EQ(st.remote.bad_values, 0);
	for (int i = 0; i < 4; i++)
		blocks[i] = (uint32_t)i;
	eng_fill(&e, keys, NP + 4, NP, blocks);
	CHECK_OK(kvt_cache_store(c, 0, keys, NP + 4, NP, blocks, &j));
	CHECK_OK(run_job(j));
	CHECK_OK(kvt_cache_remote_flush(c, 10000000000ll));
	CHECK_OK(kvt_cache_remote_stat_get(c, &st));
	CHECK_EQ(st.queued, 4);
	CHECK_EQ(st.written, 4);

	/* prefetch in the background: waited for, and cut off at once */
	for (int cut = 0; cut < 2; cut++) {
		kvt_cache *c2 = open_cache(spec);
		kvt_cache_fetch *f;
		kvt_page_key k2[NP];

		if (!c2)
			break;
		prompt_keys(c2, k2, NP);
		CHECK_OK(kvt_cache_prefetch_start(c2, 0, k2, NP, 0, &f));
		got = 99;
		CHECK_OK(kvt_cache_prefetch_end(f, cut, &got));
		CHECK(got <= NP);
		if (!cut)
			CHECK_EQ(got, NP);
		/* whatever arrived is committed and loadable (a cut-off
		 * batch may still land after the end) */
		if (cut)
			rt_sleep_ms(200);
		CHECK_OK(kvt_cache_lookup(c2, 0, k2, NP, 0, &lr));
		CHECK(lr.pages >= got);
		CHECK_EQ(lr.tier_pages[KVT_TIER_DRAM], lr.pages);
		/* close with a prefetch running: it stops, the handle ends */
		CHECK_OK(kvt_cache_prefetch_start(c2, 0, k2, NP, 0, &f));
		kvt_cache_close(c2);
		CHECK_OK(kvt_cache_prefetch_end(f, 1, &got));
	}
	CHECK_ERR(kvt_cache_prefetch_start(c, 0, keys, NP, NP + 1, &j2),
		  -EINVAL);

	/* the server dies: local tiers keep working, remote work is counted */
	rt_stop(&srv, SIGKILL);
	CHECK_OK(kvt_cache_lookup(c, 0, keys, NP + 8, 0, &lr));
	CHECK_EQ(lr.pages, NP + 4);
	CHECK_EQ(lr.tier_pages[KVT_TIER_REMOTE], 0);
	for (int i = 0; i < 2; i++)
		blocks[i] = (uint32_t)(10 + i);
	eng_fill(&e, keys, NP + 6, NP + 4, blocks);
	CHECK_OK(kvt_cache_store(c, 0, keys, NP + 6, NP + 4, blocks, &j));
	CHECK_OK(run_job(j));
	CHECK_OK(kvt_cache_remote_flush(c, 10000000000ll));
	CHECK_OK(kvt_cache_prefetch(c, 0, keys, NP + 8, NP + 6, &got));
	CHECK_EQ(got, 0);
	for (int i = 0; i < NP + 6; i++) {
		blocks[i] = (uint32_t)(20 + i);
		eng_poison(&e, blocks[i]);
	}
	CHECK_OK(kvt_cache_load(c, 0, keys, NP + 6, 0, blocks, &j));
	CHECK_OK(run_job(j));
	for (int i = 0; i < NP + 6; i++)
		CHECK(eng_block_is(&e, blocks[i], keys[i]));
	CHECK_OK(kvt_cache_remote_stat_get(c, &st));
	CHECK_EQ(st.queued, 6);
	CHECK_EQ(st.written, 4);
	CHECK_EQ(st.dropped + st.failed, 2);
	CHECK(st.remote.read_failures > 0);
	CHECK_EQ(st.remote.nodes_up, 0);
	kvt_cache_close(c);
	eng_free(&e);
	TEST_DONE();
}
