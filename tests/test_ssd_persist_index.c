/*
 * test_ssd_persist_index — kvt_index_restore(), the index call a restart
 * rebuilds with: pages put back at the slots given (shared prefixes
 * once), all or nothing on every error (a slot in use, a slot out of
 * range, a page already at another slot, NULL slots, an unknown tenant
 * or tier), no hit counted and no eviction, and the restored pages
 * behave like inserted ones afterwards (match, pin, evict, check).
 */
#include "harness.h"

#define P 4

static kvt_page_key key(uint64_t chain, uint64_t i)
{
	kvt_page_key k = { chain * 1000 + i + 1, 0x5eed ^ chain };
	return k;
}

static void chain(kvt_page_key *k, uint64_t c, size_t n)
{
	for (size_t i = 0; i < n; i++)
		k[i] = key(c, i);
}

static uint64_t used(kvt_pool *p)
{
	kvt_pool_stat st;

	kvt_pool_stat_get(p, &st);
	return st.used;
}

int main(void)
{
	kvt_index_config cfg = { .page_tokens = P, .key_mode = KVT_KEY_HASH };
	kvt_pool *dram, *ssd;
	kvt_index *x;
	kvt_page_key a[6], b[6];
	kvt_page_info info[6];
	uint32_t sa[6] = { 10, 11, 12, 13, 14, 15 };
	uint32_t sb[6] = { 10, 11, 12, 40, 41, 42 };
	kvt_prefix pa = { .keys = a, .nkeys = 6 }, pb = { .keys = b, .nkeys = 6 };
	kvt_match m;
	kvt_index_stat st;
	uint64_t added = 99, freed;
	size_t found;

	CHECK_OK(kvt_pool_create(&dram, 8, 4096));
	CHECK_OK(kvt_pool_create(&ssd, 64, 4096));
	cfg.pools[KVT_TIER_DRAM] = dram;
	cfg.pools[KVT_TIER_SSD] = ssd;
	CHECK_OK(kvt_index_create(&x, &cfg));
	chain(a, 1, 6);
	memcpy(b, a, 3 * sizeof(*a)); /* b shares a's first three pages */
	for (int i = 3; i < 6; i++)
		b[i] = key(2, (uint64_t)i);

	/* a whole chain, then one sharing its first half */
	CHECK_OK(kvt_index_restore(x, &pa, KVT_TIER_SSD, sa, 100, &added));
	CHECK_EQ(added, 6);
	CHECK_OK(kvt_index_restore(x, &pb, KVT_TIER_SSD, sb, 101, &added));
	CHECK_EQ(added, 3);
	CHECK_EQ(used(ssd), 9);
	CHECK_OK(kvt_index_inspect(x, &pb, info, 6, &found));
	CHECK_EQ(found, 6);
	for (int i = 0; i < 6; i++) {
		CHECK_EQ(info[i].slot[KVT_TIER_SSD], sb[i]);
		CHECK_EQ(info[i].hits, 0);
		CHECK_EQ(info[i].pins, 0);
	}
	CHECK_OK(kvt_index_match(x, &pa, 0, 0, &m, NULL, 0));
	CHECK_EQ(m.pages, 6);
	CHECK_EQ(m.tier_tokens[KVT_TIER_SSD], 6 * P);
	CHECK_OK(kvt_index_check(x));
	/* the same chain again: nothing to add, nothing changes */
	CHECK_OK(kvt_index_restore(x, &pa, KVT_TIER_SSD, sa, 102, &added));
	CHECK_EQ(added, 0);
	CHECK_EQ(used(ssd), 9);

	/* refusals: all or nothing */
	{
		kvt_page_key c[3];
		uint32_t busy[3] = { 50, 51, 12 };  /* 12 is a's */
		uint32_t twice[3] = { 50, 51, 51 };
		uint32_t range[3] = { 50, 51, 64 };
		uint32_t other[6] = { 10, 11, 20, 13, 14, 15 };
		kvt_prefix pc = { .keys = c, .nkeys = 3 };

		chain(c, 3, 3);
		CHECK_ERR(kvt_index_restore(x, &pc, KVT_TIER_SSD, busy, 0, NULL),
			  KVT_EBUSY);
		CHECK_ERR(kvt_index_restore(x, &pc, KVT_TIER_SSD, twice, 0, NULL),
			  KVT_EBUSY);
		CHECK_ERR(kvt_index_restore(x, &pc, KVT_TIER_SSD, range, 0, NULL),
			  -EINVAL);
		CHECK_ERR(kvt_index_restore(x, &pa, KVT_TIER_SSD, other, 0, NULL),
			  -EEXIST);
		CHECK_ERR(kvt_index_restore(x, &pc, KVT_TIER_SSD, NULL, 0, NULL),
			  -EINVAL);
		CHECK_ERR(kvt_index_restore(x, &pc, KVT_TIER_FABRIC, busy, 0,
					    NULL), KVT_ENOTFOUND);
		pc.tenant = 9;
		CHECK_ERR(kvt_index_restore(x, &pc, KVT_TIER_SSD, busy, 0, NULL),
			  KVT_ENOTFOUND);
		pc.tenant = 0;
		CHECK_EQ(used(ssd), 9);
		CHECK_OK(kvt_index_match(x, &pc, 0, 0, &m, NULL, 0));
		CHECK_EQ(m.pages, 0);
		CHECK_OK(kvt_index_check(x));
	}

	/* restored pages behave like inserted ones: pinned ones stay,
	 * the rest are evicted leaves first; more restores into a tier
	 * with pages in another one */
	CHECK_OK(kvt_index_pin(x, &pa));
	CHECK_ERR(kvt_index_evict_pages(x, KVT_TIER_SSD, 9, &freed), KVT_EBUSY);
	CHECK_EQ(freed, 3); /* b's own tail */
	CHECK_OK(kvt_index_unpin(x, &pa));
	CHECK_OK(kvt_index_insert(x, &pa, KVT_TIER_DRAM, 0, 200, NULL, NULL, 0));
	kvt_index_stat_get(x, &st);
	CHECK_EQ(st.resident[KVT_TIER_DRAM], 6);
	CHECK_EQ(st.resident[KVT_TIER_SSD], 6);
	CHECK_OK(kvt_index_restore(x, &pb, KVT_TIER_SSD, sb, 300, &added));
	CHECK_EQ(added, 3);
	CHECK_OK(kvt_index_check(x));
	CHECK_OK(kvt_index_evict_pages(x, KVT_TIER_SSD, 9, &freed));
	CHECK_EQ(used(ssd), 0);
	CHECK_OK(kvt_index_check(x));

	kvt_index_destroy(x);
	kvt_pool_destroy(dram);
	kvt_pool_destroy(ssd);
	TEST_DONE();
}
