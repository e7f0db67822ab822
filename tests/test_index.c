/*
 * test_index — the radix index's basic contract: config errors, insert and
 * match in both key modes, page locations, splits, bad prefixes, pins,
 * tenant isolation, eviction leaves first with demotion down the tiers.
 * kvt_index_check() runs after every change.
 */
#include "harness.h"

#include <xxhash.h>

#define P 4

static kvt_pool *pools[KVT_TIER_COUNT];

static void pools_make(uint64_t hbm, uint64_t dram, uint64_t ssd)
{
	memset(pools, 0, sizeof(pools));
	if (hbm)
		CHECK_OK(kvt_pool_create(&pools[KVT_TIER_HBM], hbm, 4096));
	if (dram)
		CHECK_OK(kvt_pool_create(&pools[KVT_TIER_DRAM], dram, 4096));
	if (ssd)
		CHECK_OK(kvt_pool_create(&pools[KVT_TIER_SSD], ssd, 4096));
}

static void pools_free(void)
{
	for (int t = 0; t < KVT_TIER_COUNT; t++)
		kvt_pool_destroy(pools[t]);
	memset(pools, 0, sizeof(pools));
}

static kvt_index *mk(int mode, int evict)
{
	kvt_index_config c = { .page_tokens = P, .key_mode = mode,
			       .evict = evict };
	kvt_index *x = NULL;

	memcpy(c.pools, pools, sizeof(pools));
	CHECK_OK(kvt_index_create(&x, &c));
	return x;
}

#define CHK(x) CHECK_OK(kvt_index_check(x))

static kvt_prefix tp(uint32_t tenant, const uint32_t *t, size_t n)
{
	kvt_prefix p = { .tenant = tenant, .tokens = t, .ntokens = n };
	return p;
}

static void test_config(void)
{
	kvt_index_config c = { .page_tokens = 16 };
	kvt_index *x;

	pools_make(8, 0, 0);
	CHECK_ERR(kvt_index_create(&x, &c), -EINVAL); /* no pool */
	memcpy(c.pools, pools, sizeof(pools));
	c.page_tokens = 0;
	CHECK_ERR(kvt_index_create(&x, &c), -EINVAL);
	c.page_tokens = 70000;
	CHECK_ERR(kvt_index_create(&x, &c), -EINVAL);
	c.page_tokens = 16;
	c.key_mode = 7;
	CHECK_ERR(kvt_index_create(&x, &c), -EINVAL);
	CHECK(strstr(kvt_errdetail(), "key_mode") != NULL);
	c.key_mode = 0;
	c.evict = 3;
	CHECK_ERR(kvt_index_create(&x, &c), -EINVAL);
	c.evict = 0;
	c.write = 9;
	CHECK_ERR(kvt_index_create(&x, &c), -EINVAL);
	c.write = 0;
	c.high = 0.5;
	c.low = 0.9;
	CHECK_ERR(kvt_index_create(&x, &c), -EINVAL);
	c.high = 0;
	c.pools[KVT_TIER_DRAM] = c.pools[KVT_TIER_HBM];
	CHECK_ERR(kvt_index_create(&x, &c), -EINVAL);
	CHECK(strstr(kvt_errdetail(), "share one pool") != NULL);
	c.pools[KVT_TIER_DRAM] = NULL;
	CHECK_OK(kvt_index_create(&x, &c));
	CHK(x);
	kvt_index_destroy(x);
	pools_free();
}

static void test_basic(void)
{
	uint32_t a[32], b[32];
	kvt_page_loc loc[8];
	kvt_insert_result r;
	kvt_match m;
	kvt_prefix p;
	kvt_index *x;

	for (int i = 0; i < 32; i++)
		a[i] = b[i] = (uint32_t)i + 100;
	b[13] = 7; /* b diverges from a in its 4th page */
	pools_make(64, 0, 0);
	x = mk(KVT_KEY_TOKENS, KVT_EVICT_LRU);

	p = tp(0, a, 30); /* 7 pages and 2 tokens */
	CHECK_OK(kvt_index_match(x, &p, 0, 0, &m, NULL, 0));
	CHECK_EQ(m.pages, 0);
	CHECK_EQ(m.compute_tokens, 30);
	CHECK_ERR(kvt_index_insert(x, &p, KVT_TIER_HBM, 0, 1, &r, NULL, 0),
		  -EINVAL); /* not whole pages */
	CHECK(strstr(kvt_errdetail(), "30 tokens") != NULL);
	p.ntokens = 28;
	CHECK_OK(kvt_index_insert(x, &p, KVT_TIER_HBM, 0, 1, &r, loc, 8));
	CHK(x);
	CHECK_EQ(r.pages, 7);
	CHECK_EQ(r.fresh, 7);
	CHECK_EQ(loc[0].fresh, 1);
	CHECK_EQ(loc[0].src_tier, KVT_TIER_COUNT);
	CHECK_EQ(kvt_pool_used(pools[KVT_TIER_HBM]), 7);

	p.ntokens = 30;
	CHECK_OK(kvt_index_match(x, &p, 0, 2, &m, loc, 8));
	CHECK_EQ(m.pages, 7);
	CHECK_EQ(m.tier_tokens[KVT_TIER_HBM], 28);
	CHECK_EQ(m.compute_tokens, 2);
	CHECK_EQ(m.tokens, 30);
	CHECK_EQ(loc[3].tier, KVT_TIER_HBM);
	CHECK_EQ(loc[3].state, KVT_PAGE_RESIDENT);
	CHECK(loc[3].slot < 64);

	/* b shares 3 pages: a split, one new branch */
	p = tp(0, b, 32);
	CHECK_OK(kvt_index_match(x, &p, 0, 3, &m, NULL, 0));
	CHECK_EQ(m.pages, 3);
	CHECK_OK(kvt_index_insert(x, &p, KVT_TIER_HBM, 0, 3, &r, loc, 8));
	CHK(x);
	CHECK_EQ(r.pages, 8);
	CHECK_EQ(r.fresh, 5);
	CHECK_EQ(loc[2].fresh, 0);
	CHECK_EQ(loc[3].fresh, 1);
	CHECK_EQ(kvt_pool_used(pools[KVT_TIER_HBM]), 12);
	/* again: nothing fresh */
	CHECK_OK(kvt_index_insert(x, &p, KVT_TIER_HBM, 0, 4, &r, NULL, 0));
	CHECK_EQ(r.fresh, 0);
	CHK(x);

	/* a shorter prefix of a ends mid-edge: a touch splits it there */
	p = tp(0, a, 20);
	CHECK_OK(kvt_index_match(x, &p, KVT_MATCH_TOUCH, 5, &m, NULL, 0));
	CHECK_EQ(m.pages, 5);
	CHK(x);
	{
		kvt_page_info pi[8];
		size_t found;
		p.ntokens = 28;
		CHECK_OK(kvt_index_inspect(x, &p, pi, 8, &found));
		CHECK_EQ(found, 7);
		CHECK_EQ(pi[4].atime, 5);
		CHECK_EQ(pi[5].atime, 1);
		CHECK_EQ(pi[4].hits, 2);
		CHECK_EQ(pi[5].hits, 1);
		CHECK_EQ(pi[0].hits, 4); /* a, b, b again, the touch */
		CHECK_EQ(pi[0].resident, 1u << KVT_TIER_HBM);
	}
	kvt_index_destroy(x);
	CHECK_EQ(kvt_pool_used(pools[KVT_TIER_HBM]), 0);
	pools_free();
}

static void test_bad_prefix(void)
{
	uint32_t a[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
	kvt_page_key keys[2] = { { 1, 2 }, { 3, 4 } };
	kvt_prefix p = tp(0, a, 8);
	kvt_match m;
	kvt_index *x;

	pools_make(8, 0, 0);
	x = mk(KVT_KEY_TOKENS, KVT_EVICT_LRU);
	CHECK_ERR(kvt_index_match(x, NULL, 0, 0, &m, NULL, 0), -EINVAL);
	p.tenant = 9;
	CHECK_ERR(kvt_index_match(x, &p, 0, 0, &m, NULL, 0), KVT_ENOTFOUND);
	CHECK(strstr(kvt_errdetail(), "tenant 9") != NULL);
	CHECK_ERR(kvt_index_insert(x, &p, KVT_TIER_HBM, 0, 0, NULL, NULL, 0),
		  KVT_ENOTFOUND);
	p.tenant = 0;
	p.keys = keys;
	p.nkeys = 2;
	CHECK_ERR(kvt_index_match(x, &p, 0, 0, &m, NULL, 0), -EINVAL);
	p.tokens = NULL;
	p.ntokens = 0;
	CHECK_ERR(kvt_index_match(x, &p, 0, 0, &m, NULL, 0), -EINVAL);
	p = tp(0, NULL, 8);
	CHECK_ERR(kvt_index_match(x, &p, 0, 0, &m, NULL, 0), -EINVAL);
	p = tp(0, a, 0);
	CHECK_ERR(kvt_index_insert(x, &p, KVT_TIER_HBM, 0, 0, NULL, NULL, 0),
		  -EINVAL);
	CHECK_OK(kvt_index_match(x, &p, 0, 0, &m, NULL, 0));
	p = tp(0, a, (size_t)KVT_INDEX_MAX_PAGES * P + P);
	CHECK_ERR(kvt_index_match(x, &p, 0, 0, &m, NULL, 0), -E2BIG);
	p = tp(0, a, 8);
	CHECK_ERR(kvt_index_insert(x, &p, KVT_TIER_DRAM, 0, 0, NULL, NULL, 0),
		  KVT_ENOTFOUND);
	CHECK_ERR(kvt_index_insert(x, &p, (kvt_tier_kind)42, 0, 0, NULL, NULL,
				   0), KVT_ENOTFOUND);
	CHECK_ERR(kvt_index_evict_pages(x, KVT_TIER_SSD, 1, NULL),
		  KVT_ENOTFOUND);
	CHECK_ERR(kvt_index_queue(x, &p, 0, 0, NULL), -EINVAL); /* ticket 0 */
	CHK(x);
	CHECK_EQ(kvt_pool_used(pools[KVT_TIER_HBM]), 0);
	kvt_index_destroy(x);
	pools_free();
}

static void test_pins(void)
{
	uint32_t a[16];
	kvt_prefix p;
	kvt_index *x;
	uint64_t freed;

	for (int i = 0; i < 16; i++)
		a[i] = (uint32_t)i;
	pools_make(4, 0, 0);
	x = mk(KVT_KEY_TOKENS, KVT_EVICT_LRU);
	p = tp(0, a, 16);
	CHECK_ERR(kvt_index_pin(x, &p), KVT_ENOTFOUND); /* nothing cached */
	CHECK_OK(kvt_index_insert(x, &p, KVT_TIER_HBM, 0, 1, NULL, NULL, 0));
	p.ntokens = 8;
	CHECK_OK(kvt_index_pin(x, &p));
	CHK(x);
	CHECK_ERR(kvt_index_pin(x, &(kvt_prefix){ .tokens = a, .ntokens = 6 }),
		  -EINVAL);
	/* two pages can go, the pinned two cannot */
	CHECK_ERR(kvt_index_evict_pages(x, KVT_TIER_HBM, 4, &freed), KVT_EBUSY);
	CHECK_EQ(freed, 2);
	CHK(x);
	p.ntokens = 16;
	CHECK_ERR(kvt_index_pin(x, &p), KVT_ENOTFOUND); /* pages gone */
	CHECK(strstr(kvt_errdetail(), "page 2") != NULL);
	CHECK_ERR(kvt_index_unpin(x, &p), -EINVAL);
	p.ntokens = 4;
	CHECK_ERR(kvt_index_unpin(x, &p), -EINVAL); /* lease ends at page 1 */
	CHECK(strstr(kvt_errdetail(), "longer") != NULL);
	CHECK_OK(kvt_index_pin(x, &p)); /* nested lease */
	p.ntokens = 8;
	CHECK_OK(kvt_index_unpin(x, &p));
	CHK(x);
	CHECK_OK(kvt_index_evict_pages(x, KVT_TIER_HBM, 1, &freed));
	CHECK_EQ(freed, 1); /* page 1 went, page 0 still pinned */
	CHECK_ERR(kvt_index_evict_pages(x, KVT_TIER_HBM, 1, &freed), KVT_EBUSY);
	CHK(x);
	CHECK_ERR(kvt_index_unpin(x, &p), -EINVAL); /* page 1 gone */
	p.ntokens = 4;
	CHECK_OK(kvt_index_unpin(x, &p));
	CHECK_ERR(kvt_index_unpin(x, &p), -EINVAL);
	CHECK_OK(kvt_index_evict_pages(x, KVT_TIER_HBM, 1, &freed));
	CHECK_EQ(kvt_pool_used(pools[KVT_TIER_HBM]), 0);
	CHK(x);
	kvt_index_destroy(x);
	pools_free();
}

static void test_tenants(void)
{
	uint32_t a[8] = { 9, 9, 9, 9, 8, 8, 8, 8 };
	kvt_prefix p = tp(0, a, 8), q = tp(1, a, 8);
	kvt_page_key k0[2], k1[2];
	kvt_match m;
	kvt_index *x;

	for (int mode = 0; mode < 2; mode++) {
		pools_make(16, 0, 0);
		x = mk(mode, KVT_EVICT_LRU);
		CHECK_ERR(kvt_index_insert(x, &q, KVT_TIER_HBM, 0, 0, NULL, NULL,
					   0), KVT_ENOTFOUND);
		CHECK_OK(kvt_index_tenant_add(x, 1, 0x1234));
		CHECK_ERR(kvt_index_tenant_add(x, 1, 5), -EEXIST);
		CHECK_OK(kvt_index_insert(x, &p, KVT_TIER_HBM, 0, 0, NULL, NULL,
					  0));
		CHECK_OK(kvt_index_match(x, &q, 0, 0, &m, NULL, 0));
		CHECK_EQ(m.pages, 0); /* same tokens, other tenant */
		CHECK_OK(kvt_index_insert(x, &q, KVT_TIER_HBM, 0, 0, NULL, NULL,
					  0));
		CHECK_EQ(kvt_pool_used(pools[KVT_TIER_HBM]), 4);
		CHK(x);
		if (mode == KVT_KEY_HASH) {
			CHECK_OK(kvt_index_hash_tokens(x, 0, a, 8, k0));
			CHECK_OK(kvt_index_hash_tokens(x, 1, a, 8, k1));
			CHECK(k0[0].lo != k1[0].lo || k0[0].hi != k1[0].hi);
			CHECK(k0[1].lo != k0[0].lo);
			/* keys computed outside find what tokens inserted */
			kvt_prefix kp = { .tenant = 1, .keys = k1, .nkeys = 2 };
			CHECK_OK(kvt_index_match(x, &kp, 0, 0, &m, NULL, 0));
			CHECK_EQ(m.pages, 2);
			kp.tenant = 0;
			CHECK_OK(kvt_index_match(x, &kp, 0, 0, &m, NULL, 0));
			CHECK_EQ(m.pages, 0);
			CHECK_ERR(kvt_index_hash_tokens(x, 5, a, 8, k0),
				  KVT_ENOTFOUND);
		}
		CHECK_OK(kvt_index_pin(x, &q));
		CHECK_ERR(kvt_index_tenant_remove(x, 1), KVT_EBUSY);
		CHECK_OK(kvt_index_unpin(x, &q));
		CHECK_OK(kvt_index_tenant_remove(x, 1));
		CHECK_ERR(kvt_index_tenant_remove(x, 1), KVT_ENOTFOUND);
		CHECK_EQ(kvt_pool_used(pools[KVT_TIER_HBM]), 2);
		CHECK_OK(kvt_index_match(x, &p, 0, 0, &m, NULL, 0));
		CHECK_EQ(m.pages, 2);
		CHK(x);
		kvt_index_destroy(x);
		pools_free();
	}
}

/* Leaves first, demotion hbm -> dram -> ssd -> gone. */
static void test_demotion(void)
{
	uint32_t a[12], b[12];
	kvt_prefix pa, pb;
	kvt_page_info pi[3];
	kvt_match m;
	kvt_index *x;
	kvt_index_stat st;
	size_t found;

	for (int i = 0; i < 12; i++) {
		a[i] = (uint32_t)i;
		b[i] = i < 4 ? (uint32_t)i : 1000u + (uint32_t)i;
	}
	pa = tp(0, a, 12);
	pb = tp(0, b, 12);
	pools_make(5, 2, 2);
	x = mk(KVT_KEY_TOKENS, KVT_EVICT_LRU);
	CHECK_OK(kvt_index_insert(x, &pa, KVT_TIER_HBM, 0, 1, NULL, NULL, 0));
	CHECK_OK(kvt_index_insert(x, &pb, KVT_TIER_HBM, 0, 2, NULL, NULL, 0));
	CHK(x); /* 5 pages: a0 shared, a1 a2, b1 b2 */
	/* a is older: its leaf a2 goes first, to dram */
	CHECK_OK(kvt_index_evict_pages(x, KVT_TIER_HBM, 1, NULL));
	CHK(x);
	CHECK_OK(kvt_index_inspect(x, &pa, pi, 3, &found));
	CHECK_EQ(found, 3);
	CHECK_EQ(pi[2].resident, 1u << KVT_TIER_DRAM);
	CHECK_EQ(pi[1].resident, 1u << KVT_TIER_HBM);
	CHECK_OK(kvt_index_match(x, &pa, 0, 3, &m, NULL, 0));
	CHECK_EQ(m.tier_tokens[KVT_TIER_HBM], 8);
	CHECK_EQ(m.tier_tokens[KVT_TIER_DRAM], 4);
	/* three more: a1 (a's leaf in hbm), then b2, b1; a0 stays (b1 was
	 * below it until last) -- dram fills, pushes a2 then a1 to ssd */
	CHECK_OK(kvt_index_evict_pages(x, KVT_TIER_HBM, 3, NULL));
	CHK(x);
	CHECK_OK(kvt_index_inspect(x, &pa, pi, 3, &found));
	CHECK_EQ(pi[0].resident, 1u << KVT_TIER_HBM);
	CHECK_EQ(kvt_pool_used(pools[KVT_TIER_HBM]), 1);
	CHECK_EQ(kvt_pool_used(pools[KVT_TIER_DRAM]), 2);
	CHECK_EQ(kvt_pool_used(pools[KVT_TIER_SSD]), 2);
	/* everything out of hbm: a0 goes to dram, dram to ssd, ssd drops */
	CHECK_OK(kvt_index_evict_pages(x, KVT_TIER_HBM, 1, NULL));
	CHK(x);
	kvt_index_stat_get(x, &st);
	CHECK_EQ(st.resident[KVT_TIER_HBM], 0);
	CHECK_EQ(st.dropped, 1);
	CHECK_EQ(st.evicted[KVT_TIER_HBM], 5);
	CHECK_ERR(kvt_index_evict_pages(x, KVT_TIER_HBM, 1, NULL), KVT_EBUSY);
	/* drain the rest: all gone, the tree empties */
	CHECK_OK(kvt_index_evict_pages(x, KVT_TIER_DRAM, 2, NULL));
	CHECK_OK(kvt_index_evict_pages(x, KVT_TIER_SSD, 2, NULL));
	CHK(x);
	kvt_index_stat_get(x, &st);
	CHECK_EQ(st.nodes, 0);
	CHECK_EQ(st.pages, 0);
	kvt_index_destroy(x);
	pools_free();
}

/* The chained page keys against a plain one-shot XXH3-128 reference, for
 * a page size under and over the one-shot buffer's limit. */
static void test_hash_keys(void)
{
	static const uint32_t sizes[] = { 4, 300 };

	for (int z = 0; z < 2; z++) {
		uint32_t p = sizes[z], *tok = malloc(3 * p * sizeof(*tok));
		unsigned char *buf = malloc(16 + 4 * p);
		kvt_index_config c = { .page_tokens = p,
				       .key_mode = KVT_KEY_HASH };
		kvt_page_key k[3], prev = { 0, 0 };
		kvt_index *x;

		pools_make(8, 0, 0);
		memcpy(c.pools, pools, sizeof(pools));
		CHECK_OK(kvt_index_create(&x, &c));
		CHECK_OK(kvt_index_tenant_add(x, 3, 0xabcdef));
		for (uint32_t i = 0; i < 3 * p; i++)
			tok[i] = i * 31 + 7;
		CHECK_OK(kvt_index_hash_tokens(x, 3, tok, 3 * p + 1, k));
		for (int i = 0; i < 3; i++) {
			XXH128_hash_t h;
			memcpy(buf, &prev, 16);
			memcpy(buf + 16, tok + i * p, 4 * p);
			h = XXH3_128bits_withSeed(buf, 16 + 4 * p, 0xabcdef);
			CHECK(k[i].lo == h.low64 && k[i].hi == h.high64);
			prev.lo = h.low64;
			prev.hi = h.high64;
		}
		kvt_index_destroy(x);
		pools_free();
		free(tok);
		free(buf);
	}
}

int main(void)
{
	int64_t live = kvt_alloc_live();

	test_config();
	test_basic();
	test_bad_prefix();
	test_pins();
	test_tenants();
	test_demotion();
	test_hash_keys();
	CHECK_EQ(kvt_alloc_live(), live);
	TEST_DONE();
}
