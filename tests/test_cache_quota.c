/*
 * test_cache_quota — per-tenant quotas through the node cache
 * (kvt_cache_tenant_quota): two tenants on a cache with a small dram tier
 * over ssd. Tenant A at its dram quota stores more: its own pages demote
 * to ssd, tenant B's stay in dram, and every page still loads bit-exact;
 * a store larger than A's dram quota puts the rest in ssd, and one that
 * fits in no tier under A's quotas stores its leading pages and fails the
 * rest per block.
 * Then the background demotion with a quota on the lower tier: A's pages
 * pushed down by the watermark stay within A's ssd quota (A's own oldest
 * leave), B's pages demoted there stay. Bad arguments. kvt_cache_verify()
 * and kvt_index_check() after each part.
 */
#include "cache_util.h"

#define P 4
#define NB 32

static kvt_geom geom;
static char spec[1024];

enum { A = 1, B = 2 };

static kvt_cache *setup(eng *e)
{
	kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
	kvt_cache *c = NULL;
	int err;

	cfg.tiers = spec;
	cfg.geom = &geom;
	if ((err = kvt_cache_open(&c, &cfg))) {
		fprintf(stderr, "open: %s (%s)\n", kvt_strerror(err),
			kvt_errdetail());
		kvt_test_failures++;
		return NULL;
	}
	CHECK_OK(eng_init(e, &geom, NB, ENG_KV_OUTER, 64, -1));
	CHECK_OK(eng_register(c, e));
	CHECK_OK(kvt_cache_tenant_add(c, A, 0xa));
	CHECK_OK(kvt_cache_tenant_add(c, B, 0xb));
	return c;
}

/* Store session @s (@n pages) for @tenant from blocks 0..n-1, wait, and
 * let the background settle. */
static void store(kvt_cache *c, eng *e, uint32_t tenant, uint32_t s,
		  size_t n, kvt_page_key *keys)
{
	uint32_t b[16];

	for (size_t i = 0; i < n; i++)
		b[i] = (uint32_t)i;
	CHECK_OK(session_keys(c, tenant, s, n, keys));
	eng_fill(e, keys, n, 0, b);
	CHECK_OK(cache_store_wait(c, tenant, keys, n, 0, b, NULL));
	kvt_cache_quiesce(c);
}

/* Session @s's pages: found, and by fastest tier. */
static void look(kvt_cache *c, uint32_t tenant, uint32_t s, size_t n,
		 kvt_cache_lookup_result *r)
{
	kvt_page_key k[16];

	CHECK_OK(session_keys(c, tenant, s, n, k));
	CHECK_OK(kvt_cache_lookup(c, tenant, k, n, 0, r));
}

/* Load session @s (@n pages) into blocks 16.. and compare the bytes. */
static void load_check(kvt_cache *c, eng *e, uint32_t tenant, uint32_t s,
		       size_t n)
{
	kvt_page_key k[16];
	uint32_t b[16], failed[16];
	long nf = -1;

	CHECK_OK(session_keys(c, tenant, s, n, k));
	for (size_t i = 0; i < n; i++) {
		b[i] = 16 + (uint32_t)i;
		eng_poison(e, b[i]);
	}
	CHECK_OK(cache_load_wait(c, tenant, k, n, 0, b, failed, &nf, NULL));
	CHECK_EQ(nf, 0);
	for (size_t i = 0; i < n; i++)
		CHECK(eng_block_is(e, b[i], k[i]));
}

static void usage(kvt_cache *c, uint32_t tenant, kvt_tenant_usage *u)
{
	kvt_cache_quiesce(c);
	CHECK_OK(kvt_index_tenant_usage(kvt_cache_index(c), tenant, u));
}

static void settle_check(kvt_cache *c)
{
	kvt_cache_check chk;

	kvt_cache_quiesce(c);
	CHECK_OK(kvt_cache_verify(c, &chk));
	CHECK_EQ(chk.bad, 0);
	CHECK_OK(kvt_index_check(kvt_cache_index(c)));
}

/* ---- a store at the quota demotes the tenant's own pages ------------- */

static void test_store_at_quota(void)
{
	kvt_page_key k[16];
	kvt_cache_lookup_result r;
	kvt_tenant_usage u;
	kvt_cache *c;
	eng e;

	if (!(c = setup(&e)))
		return;
	CHECK_OK(kvt_cache_tenant_quota(c, A, KVT_TIER_DRAM, 6));
	store(c, &e, B, 900, 4, k); /* B first: its pages are the oldest */
	store(c, &e, A, 1, 4, k);
	store(c, &e, A, 2, 4, k);   /* 4 + 4 > 6: two of A's go down */
	usage(c, A, &u);
	CHECK_EQ(u.pages[KVT_TIER_DRAM], 6);
	CHECK_EQ(u.pages[KVT_TIER_SSD], 2);
	CHECK_EQ(u.quota[KVT_TIER_DRAM], 6);
	CHECK_EQ(u.quota_evicted[KVT_TIER_DRAM], 2);
	look(c, B, 900, 4, &r);
	CHECK_EQ(r.pages, 4);
	CHECK_EQ(r.tier_pages[KVT_TIER_DRAM], 4);
	look(c, A, 1, 4, &r);  /* its leaves went: pages 2, 3 in ssd */
	CHECK_EQ(r.pages, 4);
	CHECK_EQ(r.tier_pages[KVT_TIER_DRAM], 2);
	CHECK_EQ(r.tier_pages[KVT_TIER_SSD], 2);
	look(c, A, 2, 4, &r);
	CHECK_EQ(r.tier_pages[KVT_TIER_DRAM], 4);
	/* more of A: still only A's pages move */
	store(c, &e, A, 3, 4, k);
	look(c, B, 900, 4, &r);
	CHECK_EQ(r.tier_pages[KVT_TIER_DRAM], 4);
	usage(c, A, &u);
	CHECK_EQ(u.pages[KVT_TIER_DRAM], 6);
	CHECK_EQ(u.pages[KVT_TIER_SSD], 6);
	usage(c, B, &u);
	CHECK_EQ(u.pages[KVT_TIER_DRAM], 4);
	CHECK_EQ(u.pages[KVT_TIER_SSD], 0);
	CHECK_EQ(u.evicted[KVT_TIER_DRAM], 0);
	/* every page loads bit-exact, from whichever tier */
	load_check(c, &e, A, 1, 4);
	load_check(c, &e, A, 3, 4);
	load_check(c, &e, B, 900, 4);
	settle_check(c);
	/* lowering the quota demotes A's excess at once */
	CHECK_OK(kvt_cache_tenant_quota(c, A, KVT_TIER_DRAM, 2));
	usage(c, A, &u);
	CHECK_EQ(u.pages[KVT_TIER_DRAM], 2);
	CHECK_EQ(u.pages[KVT_TIER_SSD], 10);
	look(c, B, 900, 4, &r);
	CHECK_EQ(r.tier_pages[KVT_TIER_DRAM], 4);
	load_check(c, &e, A, 2, 4);
	/* a store larger than the quota: what the quota leaves in dram goes
	 * there (A's older pages making room), the rest into ssd directly */
	store(c, &e, A, 4, 4, k);
	look(c, A, 4, 4, &r);
	CHECK_EQ(r.pages, 4);
	CHECK_EQ(r.tier_pages[KVT_TIER_DRAM], 2);
	CHECK_EQ(r.tier_pages[KVT_TIER_SSD], 2);
	look(c, B, 900, 4, &r);
	CHECK_EQ(r.tier_pages[KVT_TIER_DRAM], 4);
	load_check(c, &e, A, 4, 4);
	/* with a quota in ssd too, what fits in no tier fails per block: the
	 * leading pages are stored, the job lists the rest (KVT_EFULL) */
	CHECK_OK(kvt_cache_tenant_quota(c, A, KVT_TIER_SSD, 3));
	CHECK_OK(session_keys(c, A, 5, 8, k));
	{
		uint32_t b[8] = { 0, 1, 2, 3, 4, 5, 6, 7 }, failed[8];
		kvt_cache_job *j = NULL;

		eng_fill(&e, k, 8, 0, b);
		CHECK_OK(kvt_cache_store(c, A, k, 8, 0, b, &j));
		CHECK_ERR(kvt_cache_job_wait(j, -1), KVT_EFULL);
		CHECK_EQ(kvt_cache_job_failed(j, failed, 8), 3);
		CHECK(failed[0] == 5 && failed[1] == 6 && failed[2] == 7);
		kvt_cache_job_free(j);
		kvt_cache_quiesce(c);
	}
	look(c, A, 5, 8, &r);
	CHECK_EQ(r.pages, 5);
	CHECK_EQ(r.tier_pages[KVT_TIER_DRAM], 2);
	CHECK_EQ(r.tier_pages[KVT_TIER_SSD], 3);
	load_check(c, &e, A, 5, 5);
	usage(c, A, &u);
	CHECK_EQ(u.pages[KVT_TIER_DRAM], 2);
	CHECK_EQ(u.pages[KVT_TIER_SSD], 3);
	/* bad arguments */
	CHECK_ERR(kvt_cache_tenant_quota(c, 7, KVT_TIER_DRAM, 1),
		  KVT_ENOTFOUND);
	CHECK_ERR(kvt_cache_tenant_quota(c, A, KVT_TIER_HBM, 1),
		  KVT_ENOTFOUND);
	CHECK_ERR(kvt_cache_tenant_quota(c, A, KVT_TIER_FABRIC, 1),
		  KVT_ENOTFOUND);
	CHECK_ERR(kvt_cache_tenant_quota(c, A, (kvt_tier_kind)42, 1),
		  KVT_ENOTFOUND);
	settle_check(c);
	kvt_cache_close(c);
	eng_free(&e);
}

/* ---- background demotion into a tier with a quota -------------------- */

static void test_background(void)
{
	kvt_page_key k[16];
	kvt_cache_lookup_result r;
	kvt_tenant_usage u, ua;
	kvt_cache_stat st;
	kvt_cache *c;
	eng e;

	if (!(c = setup(&e)))
		return;
	CHECK_OK(kvt_cache_tenant_quota(c, A, KVT_TIER_SSD, 4));
	store(c, &e, B, 900, 4, k);
	/* A fills dram (16 pages) past its high watermark: the background
	 * (or a store that finds dram full) demotes the least recent pages,
	 * B's first, then A's; A's land in ssd within its quota of 4 */
	for (uint32_t s = 1; s <= 6; s++)
		store(c, &e, A, s, 4, k);
	kvt_cache_stat_get(c, &st);
	CHECK(st.bg_passes > 0);
	usage(c, A, &u);
	CHECK(u.pages[KVT_TIER_SSD] <= 4);
	CHECK(u.pages[KVT_TIER_SSD] > 0);
	CHECK(u.quota_evicted[KVT_TIER_SSD] > 0);
	ua = u;
	usage(c, B, &u);
	CHECK_EQ(u.pages[KVT_TIER_DRAM] + u.pages[KVT_TIER_SSD], 4);
	CHECK_EQ(u.evicted[KVT_TIER_SSD], 0);
	look(c, B, 900, 4, &r);
	CHECK_EQ(r.pages, 4);
	load_check(c, &e, B, 900, 4);
	look(c, A, 1, 4, &r); /* A's oldest session left (quota) */
	CHECK_EQ(r.pages, 0);
	look(c, A, 6, 4, &r);
	CHECK_EQ(r.pages, 4);
	load_check(c, &e, A, 6, 4);
	fprintf(stderr, "background: %llu passes, A ssd %llu pages, %llu "
		"evicted for its ssd quota\n",
		(unsigned long long)st.bg_passes,
		(unsigned long long)ua.pages[KVT_TIER_SSD],
		(unsigned long long)ua.quota_evicted[KVT_TIER_SSD]);
	settle_check(c);
	kvt_cache_close(c);
	eng_free(&e);
}

int main(void)
{
	const char *dir = test_dir("cache_quota");
	int64_t live = kvt_alloc_live();

	small_geom(&geom, 4, P); /* 8 KiB pages */
	/* 16 pages of dram (watermarks 0.90 / 0.75), 128 of ssd */
	snprintf(spec, sizeof(spec), "dram:128K ssd:%s/ssd,1M,temp", dir);
	test_watchdog(120);
	test_phase = "store at quota";
	test_store_at_quota();
	test_phase = "background";
	test_background();
	CHECK_EQ(kvt_alloc_live(), live);
	TEST_DONE();
}
