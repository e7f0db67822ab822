/*
 * test_cache_reclaim — copies that fail give their room back at once. A
 * cache of a small dram tier over an ssd tier, a working set twice dram:
 *
 *   disk full   every ssd write fails (-ENOSPC, the transfer engine's test
 *               hook): the demotions that dram pressure starts fail, and
 *               so do the pages a store places in ssd directly (their
 *               blocks on the failed list). No failed slot counts as a
 *               page's copy or holds ssd room: the ssd pool and the
 *               tenant's ssd usage stay at 0, lookups never see ssd.
 *   disk freed  writes succeed again: the same working set, stored and
 *               used again, demotes into ssd as before (moves, ssd pages),
 *               and every page restores bit-exact from dram or ssd.
 *
 * Then a page whose dram copy is corrupted: the load that catches it
 * fails its block, and its slot is back in the dram pool when the job is
 * done (not held until eviction); storing the page again works.
 */
#include "cache_util.h"
#include "xfer/xfer_impl.h"

#define P 16
#define NS 4               /* sessions */
#define SP 16              /* pages a session */
#define DRAM 32            /* pages: half the working set */
#define SSD 128

static kvt_geom geom;
static kvt_page_key keys[NS][SP];

static void tiny_geom(kvt_geom *g)
{
	const char *json = "{\"num_hidden_layers\":2,\"num_attention_heads\":1,"
			   "\"hidden_size\":16,\"num_key_value_heads\":1,"
			   "\"torch_dtype\":\"bfloat16\"}";

	CHECK_OK(kvt_geom_from_json(g, json, "tiny", P, 1, 0));
}

static uint64_t pool_used(kvt_cache *c, kvt_tier_kind t)
{
	return kvt_pool_used(kvt_tier_pool(kvt_cache_tier(c, t)));
}

/* Store session @s out of blocks s*SP.. (its bytes put there first);
 * returns the job's result, *@nfailed its failed blocks. */
static int store(kvt_cache *c, eng *e, int s, long *nfailed)
{
	uint32_t b[SP], failed[SP];
	kvt_cache_job *j;
	int err;

	for (int i = 0; i < SP; i++)
		b[i] = (uint32_t)(s * SP + i);
	eng_fill(e, keys[s], SP, 0, b);
	if ((err = kvt_cache_store(c, 0, keys[s], SP, 0, b, &j)))
		return err;
	return job_finish(j, failed, SP, nfailed);
}

/* Load session @s into blocks NS*SP.. and check every byte. */
static void restore_check(kvt_cache *c, eng *e, int s)
{
	uint32_t b[SP], failed[SP];
	long nf = -1;

	for (int i = 0; i < SP; i++) {
		b[i] = (uint32_t)(NS * SP + i);
		eng_poison(e, b[i]);
	}
	CHECK_OK(cache_load_wait(c, 0, keys[s], SP, 0, b, failed, &nf, NULL));
	CHECK_EQ(nf, 0);
	for (int i = 0; i < SP; i++)
		CHECK(eng_block_is(e, b[i], keys[s][i]));
}

static void test_disk_full(const char *dir)
{
	kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
	uint64_t pb = kvt_geom_page_bytes(&geom), moved0, full_failed = 0;
	kvt_cache_lookup_result r;
	kvt_tenant_usage u;
	kvt_cache_stat st;
	kvt_cache_check chk;
	kvt_cache *c = NULL;
	char spec[512];
	eng e;

	snprintf(spec, sizeof(spec), "dram:%llu ssd:%s/ssd,%llu,temp",
		 (unsigned long long)(DRAM * pb), dir,
		 (unsigned long long)(SSD * 4096));
	cfg.tiers = spec;
	cfg.geom = &geom;
	CHECK_OK(kvt_cache_open(&c, &cfg));
	if (!c)
		return;
	CHECK_OK(eng_init(&e, &geom, (NS + 1) * SP, ENG_KV_OUTER, 64, -1));
	CHECK_OK(eng_register(c, &e));
	for (int s = 0; s < NS; s++)
		CHECK_OK(session_keys(c, 0, 100 + (uint32_t)s, SP, keys[s]));

	test_phase = "disk full: every ssd write fails";
	kvti_xfer_io_fail_writes(kvt_cache_xfer(c), -ENOSPC);
	for (int round = 0; round < 3; round++)
		for (int s = 0; s < NS; s++) {
			long nf = 0;
			int err = store(c, &e, s, &nf);

			CHECK(err == 0 || err == -ENOSPC);
			full_failed += (uint64_t)nf;
			kvt_cache_quiesce(c);
		}
	kvt_cache_stat_get(c, &st);
	fprintf(stderr, "disk full: %llu failed moves, %llu store blocks "
		"failed; ssd pool %llu used, dram %llu\n",
		(unsigned long long)st.move_errors,
		(unsigned long long)full_failed,
		(unsigned long long)pool_used(c, KVT_TIER_SSD),
		(unsigned long long)pool_used(c, KVT_TIER_DRAM));
	CHECK(st.move_errors + full_failed > 0);
	CHECK_EQ(pool_used(c, KVT_TIER_SSD), 0);
	CHECK_OK(kvt_index_tenant_usage(kvt_cache_index(c), 0, &u));
	CHECK_EQ(u.pages[KVT_TIER_SSD], 0);
	for (int s = 0; s < NS; s++) {
		CHECK_OK(kvt_cache_lookup(c, 0, keys[s], SP, 0, &r));
		CHECK_EQ(r.tier_pages[KVT_TIER_SSD], 0);
	}
	CHECK_OK(kvt_index_check(kvt_cache_index(c)));

	test_phase = "disk freed: the working set demotes again";
	kvti_xfer_io_fail_writes(kvt_cache_xfer(c), 0);
	moved0 = st.move_pages;
	for (int round = 0; round < 3; round++)
		for (int s = 0; s < NS; s++) {
			long nf = -1;

			CHECK_OK(store(c, &e, s, &nf));
			CHECK_EQ(nf, 0);
			kvt_cache_quiesce(c);
		}
	kvt_cache_stat_get(c, &st);
	CHECK_OK(kvt_index_tenant_usage(kvt_cache_index(c), 0, &u));
	fprintf(stderr, "disk freed: %llu pages moved since, ssd %llu pages, "
		"dram %llu\n", (unsigned long long)(st.move_pages - moved0),
		(unsigned long long)u.pages[KVT_TIER_SSD],
		(unsigned long long)u.pages[KVT_TIER_DRAM]);
	CHECK(st.move_pages > moved0);
	CHECK(u.pages[KVT_TIER_SSD] > 0);
	CHECK_EQ(u.pages[KVT_TIER_SSD] + u.pages[KVT_TIER_DRAM], NS * SP);
	for (int s = 0; s < NS; s++)
		restore_check(c, &e, s);
	kvt_cache_quiesce(c);
	CHECK_OK(kvt_cache_verify(c, &chk));
	CHECK_EQ(chk.bad, 0);
	CHECK_OK(kvt_index_check(kvt_cache_index(c)));
	kvt_cache_close(c);
	eng_free(&e);
}

static void test_bad_load(const char *dir)
{
	kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
	uint64_t pb = kvt_geom_page_bytes(&geom), used;
	uint32_t b[SP], failed[SP];
	kvt_cache_lookup_result r;
	kvt_page_info in[SP];
	kvt_prefix px = { .keys = keys[0], .nkeys = SP };
	kvt_cache *c = NULL;
	unsigned char *p;
	size_t found;
	char spec[256];
	long nf = -1;
	eng e;

	test_phase = "a corrupted copy found by a load";
	(void)dir;
	snprintf(spec, sizeof(spec), "dram:%llu",
		 (unsigned long long)(2 * SP * pb));
	cfg.tiers = spec;
	cfg.geom = &geom;
	CHECK_OK(kvt_cache_open(&c, &cfg));
	if (!c)
		return;
	CHECK_OK(eng_init(&e, &geom, (NS + 1) * SP, ENG_BLOCK_OUTER, 16, -1));
	CHECK_OK(eng_register(c, &e));
	CHECK_OK(session_keys(c, 0, 7, SP, keys[0]));
	CHECK_OK(store(c, &e, 0, &nf));
	used = pool_used(c, KVT_TIER_DRAM);
	CHECK_EQ(used, SP);
	CHECK_OK(kvt_index_inspect(kvt_cache_index(c), &px, in, SP, &found));
	p = kvt_tier_slot_ptr(kvt_cache_tier(c, KVT_TIER_DRAM),
			      in[SP - 1].slot[KVT_TIER_DRAM]);
	CHECK(p != NULL);
	if (p)
		p[pb / 2] ^= 0x5a;
	for (int i = 0; i < SP; i++)
		b[i] = (uint32_t)(NS * SP + i);
	CHECK_ERR(cache_load_wait(c, 0, keys[0], SP, 0, b, failed, &nf, NULL),
		  KVT_ECORRUPT);
	CHECK_EQ(nf, 1);
	/* the bad copy is out of the index and its slot free at once */
	CHECK_EQ(pool_used(c, KVT_TIER_DRAM), used - 1);
	CHECK_OK(kvt_cache_lookup(c, 0, keys[0], SP, 0, &r));
	CHECK_EQ(r.pages, SP - 1);
	CHECK_OK(store(c, &e, 0, &nf));
	CHECK_EQ(pool_used(c, KVT_TIER_DRAM), used);
	restore_check(c, &e, 0);
	CHECK_OK(kvt_index_check(kvt_cache_index(c)));
	kvt_cache_close(c);
	eng_free(&e);
}

int main(void)
{
	const char *dir = test_dir("cache_reclaim");
	int64_t live = kvt_alloc_live();

	test_watchdog(120);
	tiny_geom(&geom);
	test_disk_full(dir);
	test_bad_load(dir);
	CHECK_EQ(kvt_alloc_live(), live);
	TEST_DONE();
}
