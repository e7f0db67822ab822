/*
 * test_cache_tenants — tenant isolation in the node cache, on test_cache's
 * small cache (cache_small.h): a tenant's keys differ from another's for
 * the same tokens (and are the same in another cache); one tenant's pages
 * are no hit for another's lookups, even under the raw keys, and its
 * loads fail without writing a block; each tenant stores its own and gets
 * its own bytes back; kvt_cache_verify() checks every copy afterwards.
 */
#include "cache_small.h"

/* ---- tenants --------------------------------------------------------------- */

static void test_tenants(void)
{
	kvt_page_key k0[8], k1[8], again[8];
	uint32_t b[8] = { 0, 1, 2, 3, 4, 5, 6, 7 }, failed[8];
	kvt_cache_lookup_result r;
	kvt_cache *c, *c2;
	long nf;
	eng e;

	if (!(c = setup(&e, ENG_KV_OUTER, 0, 0)))
		return;
	CHECK_OK(kvt_cache_tenant_add(c, 1, 0xfeedull));
	CHECK_OK(session_keys(c, 0, 800, 8, k0));
	CHECK_OK(session_keys(c, 1, 800, 8, k1));
	for (int i = 0; i < 8; i++)
		CHECK(k0[i].lo != k1[i].lo || k0[i].hi != k1[i].hi);
	/* the same tokens give the same keys in another cache */
	CHECK_OK(open_cache(&c2, KVT_CACHE_NO_BACKGROUND, 0));
	if (c2) {
		CHECK_OK(kvt_cache_tenant_add(c2, 1, 0xfeedull));
		CHECK_OK(session_keys(c2, 1, 800, 8, again));
		CHECK(!memcmp(again, k1, sizeof(k1)));
	}
	kvt_cache_close(c2);

	eng_fill(&e, k0, 8, 0, b);
	CHECK_OK(cache_store_wait(c, 0, k0, 8, 0, b, NULL));
	lookup_n(c, 0, k0, 8, &r);
	CHECK_EQ(r.pages, 8);
	lookup_n(c, 1, k1, 8, &r);
	CHECK_EQ(r.pages, 0);
	/* an engine's raw block hashes under another tenant: no hit either */
	lookup_n(c, 1, k0, 8, &r);
	CHECK_EQ(r.pages, 0);
	CHECK_EQ(r.inflight, 0);
	for (int i = 0; i < 8; i++)
		eng_poison(&e, b[i]);
	CHECK_ERR(cache_load_wait(c, 1, k0, 8, 0, b, failed, &nf, NULL),
		  KVT_ENOTFOUND);
	CHECK_EQ(nf, 8);
	for (int i = 0; i < 8; i++)
		CHECK(eng_block_poisoned(&e, b[i]));
	/* tenant 1 stores its own; each gets its own bytes back */
	eng_fill(&e, k1, 8, 0, b);
	CHECK_OK(cache_store_wait(c, 1, k1, 8, 0, b, NULL));
	CHECK_OK(cache_store_wait(c, 1, k0, 8, 0, b, NULL)); /* k0 as tenant 1 */
	CHECK_OK(cache_load_wait(c, 0, k0, 8, 0, b, failed, &nf, NULL));
	for (int i = 0; i < 8; i++)
		CHECK(eng_block_is(&e, b[i], k0[i]));
	CHECK_OK(cache_load_wait(c, 1, k1, 8, 0, b, failed, &nf, NULL));
	for (int i = 0; i < 8; i++)
		CHECK(eng_block_is(&e, b[i], k1[i]));
	{
		kvt_cache_check chk;
		CHECK_OK(kvt_cache_verify(c, &chk));
		CHECK_EQ(chk.checked, 24);
		CHECK_EQ(chk.bad, 0);
	}
	kvt_cache_close(c);
	eng_free(&e);
}

int main(void)
{
	char ssd[600];
	int64_t live;

	cache_small_init("cache_tenants", ssd, sizeof(ssd));
	live = kvt_alloc_live();
	test_phase = "tenants";
	test_tenants();
	CHECK_EQ(kvt_alloc_live(), live);
	TEST_DONE();
}
