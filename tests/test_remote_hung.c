/*
 * test_remote_hung — a Redis that stops answering (SIGSTOP: a hung server,
 * a black-holed network) must never stall a lookup (issue 21, finding 8:
 * kvt_remote_exists() ran on the lookup path, so with Redis stopped every
 * lookup waited the remote timeout, 1000 lookups/s fell to 159-367/s with
 * 2 s stalls). Against a real redis-server on loopback (skipped without):
 *
 *   node A stores a prompt (written through); node B learns it is there
 *   (its prober; lookups see the remote run);
 *   Redis stopped (timeout=1500 ms): 40 lookups on B, half of known
 *   prefixes (still reported remote), half of prefixes never seen (no
 *   remote run: nothing known) — each returns far below the remote
 *   timeout (under 500 ms: a lookup that waited on the network takes
 *   1.5 s), and a prefetch cut off at once does not wait for its batch
 *   either;
 *   Redis back: B learns a new prefix again.
 */
#include "cache_util.h"
#include "remote_util.h"

#define NP 8
#define NB 32

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

static void prompt_keys(kvt_cache *c, uint32_t seed, kvt_page_key *keys)
{
	uint32_t tok[NP * 8];

	for (size_t i = 0; i < NP * g.page_tokens; i++)
		tok[i] = (uint32_t)(i * 7919 + 13 + seed * 104729);
	CHECK_OK(kvt_cache_hash_tokens(c, 0, tok, NP * g.page_tokens, keys));
}

/* Look up until the remote run is @want (at most ~5 s): the last result. */
static kvt_cache_lookup_result until_remote(kvt_cache *c,
					    const kvt_page_key *keys,
					    uint64_t want)
{
	kvt_cache_lookup_result r = { 0 };

	for (int i = 0; i < 500; i++) {
		CHECK_OK(kvt_cache_lookup(c, 0, keys, NP, 0, &r));
		if (r.tier_pages[KVT_TIER_REMOTE] == want)
			break;
		rt_sleep_ms(10);
	}
	return r;
}

int main(void)
{
	kvt_page_key ka[NP], kn[NP];
	uint32_t blocks[NP];
	struct rt_server srv;
	kvt_cache_lookup_result r;
	kvt_cache *a, *b;
	kvt_cache_job *j;
	uint64_t worst = 0;
	char spec[200];
	int port;
	eng e;

	rt_need_redis();
	small_geom(&g, 4, 8);
	port = rt_free_port(0);
	snprintf(spec, sizeof(spec), "remote:redis://127.0.0.1:%d,timeout=1500",
		 port);
	if (rt_start(&srv, test_dir("remote_hung"), port, NULL))
		SKIP("redis-server would not start here");
	a = open_cache(spec);
	b = open_cache(spec);
	if (!a || !b || eng_init(&e, &g, NB, ENG_KV_OUTER, 64, -1))
		return 1;
	CHECK_OK(eng_register(a, &e));
	prompt_keys(a, 1, ka);
	for (int i = 0; i < NP; i++)
		blocks[i] = (uint32_t)i;
	eng_fill(&e, ka, NP, 0, blocks);
	CHECK_OK(kvt_cache_store(a, 0, ka, NP, 0, blocks, &j));
	CHECK_OK(kvt_cache_job_wait(j, 10000000000ll));
	kvt_cache_job_free(j);
	CHECK_OK(kvt_cache_remote_flush(a, 10000000000ll));
	r = until_remote(b, ka, NP);
	CHECK_EQ(r.tier_pages[KVT_TIER_REMOTE], NP);

	/* Redis hangs */
	kill(srv.pid, SIGSTOP);
	for (int i = 0; i < 40; i++) {
		uint64_t t0 = kvt_now_ns(), dt;

		if (i % 2)
			prompt_keys(b, 100 + (uint32_t)i, kn);
		CHECK_OK(kvt_cache_lookup(b, 0, i % 2 ? kn : ka, NP, 0, &r));
		dt = kvt_now_ns() - t0;
		worst = dt > worst ? dt : worst;
		CHECK_EQ(r.tier_pages[KVT_TIER_REMOTE], i % 2 ? 0 : NP);
	}
	fprintf(stderr, "Redis stopped: the slowest of 40 lookups took %.3f "
		"ms\n", (double)worst / 1e6);
	if (worst > 500000000ull) {
		fprintf(stderr, "a lookup waited on a hung Redis (%.0f ms, the "
			"remote timeout is 1500)\n", (double)worst / 1e6);
		kvt_test_failures++;
	}
	{
		kvt_cache_fetch *f;
		uint64_t got = 99, t0 = kvt_now_ns();

		CHECK_OK(kvt_cache_prefetch_start(b, 0, ka, NP, 0, &f));
		rt_sleep_ms(50); /* its first batch is on the network */
		CHECK_OK(kvt_cache_prefetch_end(f, 1, &got));
		CHECK_EQ(got, 0);
		if (kvt_now_ns() - t0 > 500000000ull) {
			fprintf(stderr, "a cut-off prefetch waited on a hung "
				"Redis\n");
			kvt_test_failures++;
		}
	}

	/* Redis back: a new prefix is learnt again */
	kill(srv.pid, SIGCONT);
	prompt_keys(a, 2, kn);
	eng_fill(&e, kn, NP, 0, blocks);
	CHECK_OK(kvt_cache_store(a, 0, kn, NP, 0, blocks, &j));
	CHECK_OK(kvt_cache_job_wait(j, 10000000000ll));
	kvt_cache_job_free(j);
	CHECK_OK(kvt_cache_remote_flush(a, 10000000000ll));
	r = until_remote(b, kn, NP);
	CHECK_EQ(r.tier_pages[KVT_TIER_REMOTE], NP);

	kvt_cache_close(a);
	kvt_cache_close(b);
	eng_free(&e);
	rt_stop(&srv, SIGTERM);
	TEST_DONE();
}
