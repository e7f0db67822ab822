/*
 * test_index_quota — per-tenant capacity quotas per tier
 * (kvt_index_tenant_quota, kvt_index_tenant_usage): a tenant at its quota
 * evicts its own least valuable pages (LRU and LFU), never another
 * tenant's (residency of the others compared page by page before and
 * after); all of its pages pinned -> KVT_EFULL with nothing inserted;
 * demotion cascades down the tiers within the tenant; write-through copies
 * count in both tiers; full tiers take tenants over their quota first;
 * accounting after tenant removal; bad arguments. Then a bounded random
 * run (three tenants, three tiers, quotas changing) checked after every
 * step against a recount of every page (inspect), the quotas, isolation
 * (with room in every pool, an insert changes no other tenant's page) and
 * kvt_index_check(). The exact eviction order under quotas is also
 * followed page by page by the model in test_index_fuzz.
 *
 * Usage: test_index_quota [STEPS [SEED]] (default 3000 1).
 */
#include "harness.h"

#define P 2

static kvt_pool *pools[KVT_TIER_COUNT];

/* An index over hbm (+ dram, + ssd where the size is not 0), keys hashed
 * from tokens with each tenant's salt; tenants 1 and 2 added. */
static kvt_index *mk(uint32_t nh, uint32_t nd, uint32_t ns, int write,
		     int evict)
{
	kvt_index_config c = { .page_tokens = P, .key_mode = KVT_KEY_HASH,
			       .write = write, .evict = evict };
	uint32_t n[3] = { nh, nd, ns };
	kvt_tier_kind k[3] = { KVT_TIER_HBM, KVT_TIER_DRAM, KVT_TIER_SSD };
	kvt_index *x = NULL;

	memset(pools, 0, sizeof(pools));
	for (int i = 0; i < 3; i++)
		if (n[i]) {
			CHECK_OK(kvt_pool_create(&pools[k[i]], n[i], 64));
			c.pools[k[i]] = pools[k[i]];
		}
	CHECK_OK(kvt_index_create(&x, &c));
	CHECK_OK(kvt_index_tenant_add(x, 1, 11));
	CHECK_OK(kvt_index_tenant_add(x, 2, 22));
	return x;
}

static void done(kvt_index *x)
{
	CHECK_OK(kvt_index_check(x));
	kvt_index_destroy(x);
	for (int t = 0; t < KVT_TIER_COUNT; t++) {
		if (pools[t])
			CHECK_EQ(kvt_pool_used(pools[t]), 0);
		kvt_pool_destroy(pools[t]);
		pools[t] = NULL;
	}
}

/* Sequence @id of @np pages: tokens id*1000 + i (the same for every
 * tenant: only the salt tells them apart). */
static kvt_prefix seq(uint32_t tenant, uint32_t id, uint32_t np)
{
	static uint32_t tok[16][64];
	static int k;
	uint32_t *t = tok[k++ % 16];
	kvt_prefix px = { .tenant = tenant, .tokens = t, .ntokens = np * P };

	for (uint32_t i = 0; i < np * P; i++)
		t[i] = id * 1000 + i;
	return px;
}

static int ins(kvt_index *x, uint32_t tenant, uint32_t id, uint32_t np,
	       kvt_tier_kind tier, unsigned flags, uint64_t now)
{
	kvt_prefix px = seq(tenant, id, np);

	return kvt_index_insert(x, &px, tier, flags, now, NULL, NULL, 0);
}

/* The residency mask of the last page of sequence @id (@np pages) of
 * @tenant; 0 when it is not in the tree or has no copy. */
static uint32_t where(kvt_index *x, uint32_t tenant, uint32_t id, uint32_t np)
{
	kvt_prefix px = seq(tenant, id, np);
	kvt_page_info pi[64];
	size_t found = 0;

	CHECK_OK(kvt_index_inspect(x, &px, pi, 64, &found));
	return found == np ? pi[np - 1].resident : 0;
}

static uint64_t used(kvt_index *x, uint32_t tenant, kvt_tier_kind t)
{
	kvt_tenant_usage u;

	CHECK_OK(kvt_index_tenant_usage(x, tenant, &u));
	return u.pages[t];
}

#define H (1u << KVT_TIER_HBM)
#define D (1u << KVT_TIER_DRAM)
#define S (1u << KVT_TIER_SSD)

/* ---- own pages leave, by the policy; the others stay ----------------- */

static void test_own_pages(int evict)
{
	kvt_index *x = mk(16, 0, 0, KVT_WRITE_BACK, evict);
	uint32_t before[2][8];
	kvt_tenant_usage u;
	uint64_t now = 1;

	/* tenants 0 and 2: older pages than tenant 1's; tenant 0 has the
	 * same tokens as tenant 1 (sequences 1..4) */
	for (uint32_t id = 1; id <= 4; id++)
		CHECK_OK(ins(x, 0, id, 1, KVT_TIER_HBM, 0, now++));
	for (uint32_t id = 1; id <= 3; id++)
		CHECK_OK(ins(x, 2, 50 + id, 1, KVT_TIER_HBM, 0, now++));
	CHECK_OK(kvt_index_tenant_quota(x, 1, KVT_TIER_HBM, 4));
	for (uint32_t id = 1; id <= 4; id++)
		CHECK_OK(ins(x, 1, id, 1, KVT_TIER_HBM, 0, now++));
	CHECK_EQ(used(x, 1, KVT_TIER_HBM), 4);
	/* LFU: page 1 hit twice more, 2 once more; LRU: 1 most recent */
	{
		kvt_prefix px = seq(1, 1, 1);
		kvt_match m;
		CHECK_OK(kvt_index_match(x, &px, KVT_MATCH_TOUCH, now++, &m,
					 NULL, 0));
		CHECK_OK(kvt_index_match(x, &px, KVT_MATCH_TOUCH, now++, &m,
					 NULL, 0));
		px = seq(1, 2, 1);
		CHECK_OK(kvt_index_match(x, &px, KVT_MATCH_TOUCH, now++, &m,
					 NULL, 0));
	}
	for (uint32_t id = 1; id <= 4; id++) {
		before[0][id] = where(x, 0, id, 1);
		before[1][id] = where(x, 2, 50 + id, 1);
	}
	/* at its quota with 9 of 16 slots free: its own page 3 goes (LRU:
	 * least recent; LFU: fewest hits, then least recent) */
	CHECK_OK(ins(x, 1, 5, 1, KVT_TIER_HBM, 0, now++));
	CHECK_EQ(used(x, 1, KVT_TIER_HBM), 4);
	CHECK_EQ(where(x, 1, 3, 1), 0);
	CHECK_EQ(where(x, 1, 5, 1), H);
	CHECK_EQ(where(x, 1, 1, 1), H);
	CHECK_EQ(where(x, 1, 2, 1), H);
	CHECK_OK(ins(x, 1, 6, 1, KVT_TIER_HBM, 0, now++));
	/* LRU: 4 (then 1, 2 touched later, 5, 6); LFU: 4 too (one hit) */
	CHECK_EQ(where(x, 1, 4, 1), 0);
	for (uint32_t id = 1; id <= 4; id++) {
		CHECK_EQ(where(x, 0, id, 1), before[0][id]);
		if (id <= 3)
			CHECK_EQ(where(x, 2, 50 + id, 1), before[1][id]);
		CHECK_EQ(where(x, 0, id, 1), H); /* same tokens, own copy */
	}
	CHECK_OK(kvt_index_tenant_usage(x, 1, &u));
	CHECK_EQ(u.quota[KVT_TIER_HBM], 4);
	CHECK_EQ(u.evicted[KVT_TIER_HBM], 2);
	CHECK_EQ(u.quota_evicted[KVT_TIER_HBM], 2);
	CHECK_EQ(used(x, 0, KVT_TIER_HBM), 4);
	CHECK_EQ(used(x, 2, KVT_TIER_HBM), 3);
	/* a 3-page prefix with room for 2 under a raised quota: one more
	 * of its own goes (LRU: 1, the least recent; LFU: 5, one hit and
	 * older than 6) */
	CHECK_OK(kvt_index_tenant_quota(x, 1, KVT_TIER_HBM, 6));
	CHECK_OK(ins(x, 1, 7, 3, KVT_TIER_HBM, 0, now++)); /* 4 + 3 > 6 */
	CHECK_EQ(used(x, 1, KVT_TIER_HBM), 6);
	CHECK_EQ(where(x, 1, 7, 3), H);
	CHECK_EQ(where(x, 1, evict == KVT_EVICT_LRU ? 1 : 5, 1), 0);
	CHECK_EQ(where(x, 1, evict == KVT_EVICT_LRU ? 5 : 1, 1), H);
	CHECK_EQ(where(x, 0, 1, 1), H);
	CHECK_OK(kvt_index_check(x));
	done(x);
}

/* ---- everything of its own pinned: KVT_EFULL, nothing inserted ------- */

static void test_pinned(void)
{
	kvt_index *x = mk(16, 0, 0, KVT_WRITE_BACK, KVT_EVICT_LRU);
	kvt_prefix px = seq(1, 1, 3);
	kvt_insert_result r;
	kvt_match m;

	CHECK_OK(kvt_index_tenant_quota(x, 1, KVT_TIER_HBM, 3));
	CHECK_OK(ins(x, 0, 9, 2, KVT_TIER_HBM, 0, 1));
	CHECK_OK(ins(x, 1, 1, 3, KVT_TIER_HBM, 0, 2));
	CHECK_OK(kvt_index_pin(x, &px));
	CHECK_ERR(ins(x, 1, 2, 1, KVT_TIER_HBM, 0, 3), KVT_EFULL);
	CHECK(strstr(kvt_errdetail(), "quota") != NULL);
	CHECK_ERR(ins(x, 1, 2, 1, KVT_TIER_HBM, KVT_INSERT_PARTIAL, 3),
		  KVT_EFULL);
	px = seq(1, 2, 1);
	CHECK_OK(kvt_index_match(x, &px, 0, 0, &m, NULL, 0));
	CHECK_EQ(m.pages, 0);
	CHECK_EQ(used(x, 1, KVT_TIER_HBM), 3);
	CHECK_EQ(where(x, 0, 9, 2), H); /* 11 free slots; nobody else paid */
	CHECK_OK(kvt_index_check(x));
	px = seq(1, 1, 3);
	CHECK_OK(kvt_index_unpin(x, &px));
	CHECK_OK(ins(x, 1, 2, 1, KVT_TIER_HBM, 0, 4));
	CHECK_EQ(where(x, 1, 1, 3), 0); /* its leaf went */
	CHECK_EQ(where(x, 1, 1, 2), H);
	/* more missing pages than the quota: refused at once, nothing
	 * evicted; partial keeps the leading pages that fit */
	CHECK_ERR(ins(x, 1, 3, 4, KVT_TIER_HBM, 0, 5), KVT_EFULL);
	CHECK_EQ(where(x, 1, 1, 2), H);
	CHECK_EQ(where(x, 1, 2, 1), H);
	px = seq(1, 3, 4);
	CHECK_OK(kvt_index_insert(x, &px, KVT_TIER_HBM, KVT_INSERT_PARTIAL,
				  6, &r, NULL, 0));
	CHECK_EQ(r.pages, 3);
	CHECK_EQ(used(x, 1, KVT_TIER_HBM), 3);
	CHECK_EQ(where(x, 1, 3, 3), H);
	CHECK_EQ(where(x, 0, 9, 2), H);
	/* a pinned insert (KVT_INSERT_PIN) holds its pages like a pin */
	CHECK_OK(kvt_index_tenant_quota(x, 1, KVT_TIER_HBM, 1));
	CHECK_EQ(used(x, 1, KVT_TIER_HBM), 1); /* at once, leaves first */
	CHECK_EQ(where(x, 1, 3, 1), H);
	CHECK_OK(ins(x, 1, 4, 1, KVT_TIER_HBM, KVT_INSERT_PIN, 7));
	CHECK_EQ(where(x, 1, 3, 1), 0);
	CHECK_ERR(ins(x, 1, 5, 1, KVT_TIER_HBM, 0, 8), KVT_EFULL);
	px = seq(1, 4, 1);
	CHECK_OK(kvt_index_unpin(x, &px));
	CHECK_OK(ins(x, 1, 5, 1, KVT_TIER_HBM, 0, 9));
	CHECK_EQ(where(x, 1, 4, 1), 0);
	done(x);
}

/* ---- demotion cascades within the tenant ----------------------------- */

static void test_cascade(void)
{
	kvt_index *x = mk(8, 8, 8, KVT_WRITE_BACK, KVT_EVICT_LRU);
	kvt_index_stat st;
	kvt_tenant_usage u;
	uint64_t now = 1;

	/* the others hold pages in every tier, older than tenant 1's */
	CHECK_OK(ins(x, 0, 90, 2, KVT_TIER_HBM, 0, now++));
	CHECK_OK(ins(x, 0, 91, 2, KVT_TIER_DRAM, 0, now++));
	CHECK_OK(ins(x, 2, 92, 2, KVT_TIER_SSD, 0, now++));
	CHECK_OK(kvt_index_tenant_quota(x, 1, KVT_TIER_HBM, 2));
	CHECK_OK(kvt_index_tenant_quota(x, 1, KVT_TIER_DRAM, 2));
	CHECK_OK(kvt_index_tenant_quota(x, 1, KVT_TIER_SSD, 1));
	for (uint32_t id = 1; id <= 6; id++) {
		CHECK_OK(ins(x, 1, id, 1, KVT_TIER_HBM, 0, now++));
		CHECK_OK(kvt_index_check(x));
	}
	/* 6, 5 in hbm; 4, 3 in dram; 2 in ssd; 1 gone */
	CHECK_EQ(where(x, 1, 6, 1), H);
	CHECK_EQ(where(x, 1, 5, 1), H);
	CHECK_EQ(where(x, 1, 4, 1), D);
	CHECK_EQ(where(x, 1, 3, 1), D);
	CHECK_EQ(where(x, 1, 2, 1), S);
	CHECK_EQ(where(x, 1, 1, 1), 0);
	CHECK_OK(kvt_index_tenant_usage(x, 1, &u));
	CHECK_EQ(u.pages[KVT_TIER_HBM], 2);
	CHECK_EQ(u.pages[KVT_TIER_DRAM], 2);
	CHECK_EQ(u.pages[KVT_TIER_SSD], 1);
	CHECK_EQ(u.quota_evicted[KVT_TIER_HBM], 4);
	CHECK_EQ(u.quota_evicted[KVT_TIER_DRAM], 2);
	CHECK_EQ(u.quota_evicted[KVT_TIER_SSD], 1);
	kvt_index_stat_get(x, &st);
	CHECK_EQ(st.demoted[KVT_TIER_DRAM], 4);
	CHECK_EQ(st.demoted[KVT_TIER_SSD], 2);
	CHECK_EQ(st.dropped, 1);
	/* the others' pages where they were */
	CHECK_EQ(where(x, 0, 90, 2), H);
	CHECK_EQ(where(x, 0, 91, 2), D);
	CHECK_EQ(where(x, 2, 92, 2), S);
	CHECK_EQ(used(x, 0, KVT_TIER_HBM), 2);
	CHECK_EQ(used(x, 0, KVT_TIER_DRAM), 2);
	CHECK_EQ(used(x, 2, KVT_TIER_SSD), 2);
	/* a tier full of another tenant's pages below: the global rule
	 * applies there (documented), the tenant's own quota still holds */
	CHECK_OK(kvt_index_tenant_quota(x, 1, KVT_TIER_SSD, 0));
	for (uint32_t id = 0; id < 6; id++)
		CHECK_OK(ins(x, 2, 100 + id, 1, KVT_TIER_SSD, 0, now++));
	CHECK_EQ(kvt_pool_used(pools[KVT_TIER_SSD]), 8);
	CHECK_OK(ins(x, 1, 7, 1, KVT_TIER_HBM, 0, now++));
	CHECK_EQ(where(x, 1, 3, 1), S); /* dram quota: 3 went down */
	CHECK_EQ(used(x, 1, KVT_TIER_DRAM), 2);
	CHECK_EQ(used(x, 1, KVT_TIER_SSD), 2);
	CHECK_EQ(where(x, 2, 92, 2), 0); /* the ssd's least recent leaf */
	done(x);
}

/* ---- write-through: a page in two tiers counts in both --------------- */

static void test_write_through(void)
{
	kvt_index *x = mk(8, 8, 0, KVT_WRITE_THROUGH, KVT_EVICT_LRU);
	kvt_tenant_usage u;

	CHECK_OK(kvt_index_tenant_quota(x, 1, KVT_TIER_DRAM, 2));
	CHECK_OK(ins(x, 0, 1, 3, KVT_TIER_HBM, 0, 1));
	CHECK_OK(ins(x, 1, 1, 1, KVT_TIER_HBM, 0, 2));
	CHECK_EQ(where(x, 1, 1, 1), H | D);
	CHECK_OK(ins(x, 1, 2, 1, KVT_TIER_HBM, 0, 3));
	CHECK_OK(ins(x, 1, 3, 1, KVT_TIER_HBM, 0, 4));
	/* the third copy down displaced its own oldest dram copy, which
	 * just gives up its dram slot (its hbm copy stays) */
	CHECK_EQ(where(x, 1, 1, 1), H);
	CHECK_EQ(where(x, 1, 2, 1), H | D);
	CHECK_EQ(where(x, 1, 3, 1), H | D);
	CHECK_OK(kvt_index_tenant_usage(x, 1, &u));
	CHECK_EQ(u.pages[KVT_TIER_HBM], 3);
	CHECK_EQ(u.pages[KVT_TIER_DRAM], 2);
	CHECK_EQ(u.quota_evicted[KVT_TIER_DRAM], 1);
	CHECK_EQ(where(x, 0, 1, 3), H | D);
	CHECK_EQ(used(x, 0, KVT_TIER_DRAM), 3);
	/* an hbm quota of 3 and a fourth page: 1 (only in hbm) is demoted
	 * to dram, where at quota 2's dram copy gives way; then 4's copy
	 * down displaces 1 again, now its only copy: gone */
	CHECK_OK(kvt_index_tenant_quota(x, 1, KVT_TIER_HBM, 3));
	CHECK_OK(ins(x, 1, 4, 1, KVT_TIER_HBM, 0, 5));
	CHECK_EQ(where(x, 1, 1, 1), 0);
	CHECK_EQ(where(x, 1, 2, 1), H);
	CHECK_EQ(where(x, 1, 3, 1), H | D);
	CHECK_EQ(where(x, 1, 4, 1), H | D);
	CHECK_EQ(used(x, 1, KVT_TIER_HBM), 3);
	CHECK_EQ(used(x, 1, KVT_TIER_DRAM), 2);
	CHECK_EQ(where(x, 0, 1, 3), H | D);
	CHECK_OK(kvt_index_check(x));
	done(x);
}

/* ---- full tiers take over-quota tenants first; lowering a quota ------ */

static void test_over_first(void)
{
	kvt_index *x = mk(8, 0, 0, KVT_WRITE_BACK, KVT_EVICT_LRU);
	kvt_prefix px;

	CHECK_OK(ins(x, 0, 1, 1, KVT_TIER_HBM, 0, 1));
	CHECK_OK(ins(x, 0, 2, 1, KVT_TIER_HBM, 0, 2));
	for (uint32_t id = 1; id <= 4; id++)
		CHECK_OK(ins(x, 1, id, 1, KVT_TIER_HBM, KVT_INSERT_PIN,
			     10 + id));
	/* lowered under pinned pages: it stays over */
	CHECK_OK(kvt_index_tenant_quota(x, 1, KVT_TIER_HBM, 2));
	CHECK_EQ(used(x, 1, KVT_TIER_HBM), 4);
	CHECK_OK(kvt_index_check(x));
	for (uint32_t id = 1; id <= 4; id++) {
		px = seq(1, id, 1);
		CHECK_OK(kvt_index_unpin(x, &px));
	}
	CHECK_OK(ins(x, 2, 1, 2, KVT_TIER_HBM, 0, 20)); /* 8 of 8 */
	CHECK_EQ(kvt_pool_used(pools[KVT_TIER_HBM]), 8);
	/* the tier is full: tenant 1's pages go first though tenant 0's
	 * are older, until it is back at its quota */
	CHECK_OK(ins(x, 2, 2, 1, KVT_TIER_HBM, 0, 21));
	CHECK_EQ(where(x, 1, 1, 1), 0);
	CHECK_EQ(where(x, 0, 1, 1), H);
	CHECK_OK(ins(x, 2, 3, 1, KVT_TIER_HBM, 0, 22));
	CHECK_EQ(where(x, 1, 2, 1), 0);
	CHECK_EQ(used(x, 1, KVT_TIER_HBM), 2);
	CHECK_OK(ins(x, 2, 4, 1, KVT_TIER_HBM, 0, 23));
	CHECK_EQ(where(x, 0, 1, 1), 0); /* now plain LRU */
	CHECK_EQ(where(x, 1, 3, 1), H);
	/* lowering a quota with nothing pinned evicts at once */
	CHECK_OK(kvt_index_tenant_quota(x, 1, KVT_TIER_HBM, 1));
	CHECK_EQ(used(x, 1, KVT_TIER_HBM), 1);
	CHECK_EQ(where(x, 1, 4, 1), H);
	CHECK_EQ(where(x, 0, 2, 1), H);
	/* kvt_index_evict_pages: over-quota first as well */
	px = seq(2, 1, 2);
	CHECK_OK(kvt_index_pin(x, &px));
	CHECK_OK(kvt_index_tenant_quota(x, 2, KVT_TIER_HBM, 1));
	CHECK_EQ(used(x, 2, KVT_TIER_HBM), 2); /* its pinned pages */
	CHECK_OK(kvt_index_unpin(x, &px));
	CHECK_OK(kvt_index_evict_pages(x, KVT_TIER_HBM, 1, NULL));
	CHECK_EQ(where(x, 2, 1, 2), 0);
	CHECK_EQ(where(x, 2, 1, 1), H);
	CHECK_EQ(where(x, 0, 2, 1), H);
	CHECK_OK(kvt_index_check(x));
	done(x);
}

/* ---- tenant removal; bad arguments ----------------------------------- */

static void test_remove_and_errors(void)
{
	kvt_index *x = mk(8, 8, 0, KVT_WRITE_BACK, KVT_EVICT_LRU);
	kvt_index_stat a, b;
	kvt_tenant_usage u;
	kvt_prefix px = seq(1, 1, 1);

	CHECK_OK(kvt_index_tenant_quota(x, 1, KVT_TIER_HBM, 2));
	CHECK_OK(kvt_index_tenant_quota(x, 1, KVT_TIER_DRAM, 3));
	for (uint32_t id = 1; id <= 5; id++)
		CHECK_OK(ins(x, 1, id, 1, KVT_TIER_HBM, 0, id));
	CHECK_OK(ins(x, 0, 1, 2, KVT_TIER_HBM, 0, 9));
	CHECK_OK(ins(x, 2, 1, 1, KVT_TIER_DRAM, 0, 10));
	CHECK_EQ(used(x, 1, KVT_TIER_HBM), 2);
	CHECK_EQ(used(x, 1, KVT_TIER_DRAM), 3);
	px = seq(1, 5, 1);
	CHECK_OK(kvt_index_pin(x, &px));
	CHECK_ERR(kvt_index_tenant_remove(x, 1), KVT_EBUSY);
	CHECK_EQ(used(x, 1, KVT_TIER_HBM), 2);
	CHECK_OK(kvt_index_unpin(x, &px));
	kvt_index_stat_get(x, &a);
	CHECK_OK(kvt_index_tenant_remove(x, 1));
	kvt_index_stat_get(x, &b);
	CHECK_EQ(a.resident[KVT_TIER_HBM] - b.resident[KVT_TIER_HBM], 2);
	CHECK_EQ(a.resident[KVT_TIER_DRAM] - b.resident[KVT_TIER_DRAM], 3);
	CHECK_EQ(kvt_pool_used(pools[KVT_TIER_HBM]), 2);
	CHECK_EQ(kvt_pool_used(pools[KVT_TIER_DRAM]), 1);
	CHECK_EQ(used(x, 0, KVT_TIER_HBM), 2);
	CHECK_EQ(used(x, 2, KVT_TIER_DRAM), 1);
	CHECK_ERR(kvt_index_tenant_usage(x, 1, &u), KVT_ENOTFOUND);
	CHECK_OK(kvt_index_check(x));
	/* back, with nothing and no quota */
	CHECK_OK(kvt_index_tenant_add(x, 1, 11));
	CHECK_OK(kvt_index_tenant_usage(x, 1, &u));
	for (int t = 0; t < KVT_TIER_COUNT; t++)
		CHECK(!u.pages[t] && !u.quota[t] && !u.evicted[t] &&
		      !u.quota_evicted[t]);
	for (uint32_t id = 1; id <= 5; id++)
		CHECK_OK(ins(x, 1, id, 1, KVT_TIER_HBM, 0, 20 + id));
	CHECK_EQ(used(x, 1, KVT_TIER_HBM), 5); /* no quota any more */
	CHECK_OK(kvt_index_check(x));
	/* bad arguments */
	CHECK_ERR(kvt_index_tenant_quota(x, 7, KVT_TIER_HBM, 1), KVT_ENOTFOUND);
	CHECK(strstr(kvt_errdetail(), "tenant 7") != NULL);
	CHECK_ERR(kvt_index_tenant_quota(x, 1, KVT_TIER_SSD, 1), KVT_ENOTFOUND);
	CHECK(strstr(kvt_errdetail(), "ssd") != NULL);
	CHECK_ERR(kvt_index_tenant_quota(x, 1, (kvt_tier_kind)99, 1),
		  KVT_ENOTFOUND);
	CHECK_ERR(kvt_index_tenant_usage(x, 7, &u), KVT_ENOTFOUND);
	CHECK_ERR(kvt_index_tenant_usage(x, 1, NULL), -EINVAL);
	/* a quota over the tier's size is no limit in effect */
	CHECK_OK(kvt_index_tenant_quota(x, 1, KVT_TIER_HBM, 1000));
	CHECK_EQ(used(x, 1, KVT_TIER_HBM), 5);
	done(x);
}

/* ---- rollbacks: a failed allocation, a failing mover ----------------- */

static int fail_copy(void *arg, const kvt_move *mv)
{
	(void)mv;
	return *(int *)arg ? -EIO : 0;
}

static void usage_all(kvt_index *x, kvt_tenant_usage u[3])
{
	for (uint32_t tn = 0; tn < 3; tn++)
		CHECK_OK(kvt_index_tenant_usage(x, tn, &u[tn]));
}

static void test_rollbacks(void)
{
	uint64_t injected = 0;
	int failing = 0;

	/* an insert at its quota failing its N-th allocation, every N:
	 * -ENOMEM, and every tenant's usage as it was */
	for (uint64_t n = 1; n < 64; n++) {
		kvt_index *x = mk(64, 64, 0, KVT_WRITE_THROUGH, KVT_EVICT_LRU);
		kvt_tenant_usage a[3], b[3];
		int err;

		CHECK_OK(kvt_index_tenant_quota(x, 1, KVT_TIER_HBM, 3));
		CHECK_OK(kvt_index_tenant_quota(x, 1, KVT_TIER_DRAM, 2));
		for (uint32_t id = 1; id <= 3; id++) {
			CHECK_OK(ins(x, 1, id, 1, KVT_TIER_HBM, 0, id));
			CHECK_OK(ins(x, 2, id, 3, KVT_TIER_DRAM, 0, 10 + id));
		}
		/* 16 nodes of tenant 0, last: its heaps are full, and grow
		 * when any tenant adds a node */
		for (uint32_t id = 1; id <= 16; id++)
			CHECK_OK(ins(x, 0, id, 1, KVT_TIER_HBM, 0, 20 + id));
		usage_all(x, a);
		kvt_alloc_fail_at(n);
		err = kvt_index_insert(x, &(kvt_prefix){ .tenant = 1,
				       .tokens = seq(1, 1, 4).tokens,
				       .ntokens = 4 * P }, KVT_TIER_HBM,
				       KVT_INSERT_PARTIAL, 40, NULL, NULL, 0);
		kvt_alloc_fail_at(0);
		usage_all(x, b);
		CHECK_OK(kvt_index_check(x));
		if (err) {
			CHECK_ERR(err, -ENOMEM);
			CHECK(!memcmp(a, b, sizeof(a)));
			injected++;
		} else {
			CHECK_EQ(b[1].pages[KVT_TIER_HBM], 3);
			CHECK(!memcmp(&a[0], &b[0], sizeof(a[0])));
			CHECK(!memcmp(&a[2], &b[2], sizeof(a[2])));
		}
		done(x);
		if (!err)
			break;
	}
	CHECK(injected > 0);
	fprintf(stderr, "rollbacks: %llu allocation failures injected\n",
		(unsigned long long)injected);

	/* a mover that fails: the demoted page is dropped, usage exact */
	{
		kvt_index_config c = { .page_tokens = P,
				       .key_mode = KVT_KEY_HASH };
		kvt_index_stat st;
		kvt_index *x = NULL;

		memset(pools, 0, sizeof(pools));
		CHECK_OK(kvt_pool_create(&pools[KVT_TIER_HBM], 8, 64));
		CHECK_OK(kvt_pool_create(&pools[KVT_TIER_DRAM], 8, 64));
		c.pools[KVT_TIER_HBM] = pools[KVT_TIER_HBM];
		c.pools[KVT_TIER_DRAM] = pools[KVT_TIER_DRAM];
		c.mover.copy = fail_copy;
		c.mover.arg = &failing;
		CHECK_OK(kvt_index_create(&x, &c));
		CHECK_OK(kvt_index_tenant_add(x, 1, 11));
		CHECK_OK(kvt_index_tenant_add(x, 2, 22));
		CHECK_OK(kvt_index_tenant_quota(x, 1, KVT_TIER_HBM, 2));
		CHECK_OK(ins(x, 1, 1, 1, KVT_TIER_HBM, 0, 1));
		CHECK_OK(ins(x, 1, 2, 1, KVT_TIER_HBM, 0, 2));
		CHECK_OK(ins(x, 1, 3, 1, KVT_TIER_HBM, 0, 3)); /* 1 -> dram */
		CHECK_EQ(where(x, 1, 1, 1), D);
		failing = 1;
		CHECK_OK(ins(x, 1, 4, 1, KVT_TIER_HBM, 0, 4)); /* 2 dropped */
		CHECK_EQ(where(x, 1, 2, 1), 0);
		CHECK_EQ(used(x, 1, KVT_TIER_HBM), 2);
		CHECK_EQ(used(x, 1, KVT_TIER_DRAM), 1);
		kvt_index_stat_get(x, &st);
		CHECK_EQ(st.move_failed, 1);
		CHECK_OK(kvt_index_check(x));
		done(x);
	}
}

/* ---- a bounded random run against a recount -------------------------- */

#define NT 3     /* tenants 0..2 */
#define AL 3     /* page letters */
#define DEP 3    /* prefix depth */

static const kvt_tier_kind tiers[3] = { KVT_TIER_HBM, KVT_TIER_DRAM,
					KVT_TIER_SSD };

/* Prefix number @code (base AL digits, @d of them) as tokens. */
static void letters(uint32_t code, int d, uint32_t *tok)
{
	for (int i = 0; i < d; i++) {
		tok[2 * i] = tok[2 * i + 1] = code % AL;
		code /= AL;
	}
}

/* Every possible page of every tenant: its residency mask (0: none). */
static void snapshot(kvt_index *x, uint32_t m[NT][DEP + 1][27])
{
	for (uint32_t tn = 0; tn < NT; tn++)
		for (int d = 1, n = AL; d <= DEP; d++, n *= AL)
			for (int c = 0; c < n; c++) {
				uint32_t tok[2 * DEP];
				kvt_prefix px = { .tenant = tn, .tokens = tok,
						  .ntokens = (size_t)d * P };
				kvt_page_info pi[DEP];
				size_t found = 0;

				letters((uint32_t)c, d, tok);
				CHECK_OK(kvt_index_inspect(x, &px, pi, DEP,
							   &found));
				m[tn][d][c] = found == (size_t)d ?
					      pi[d - 1].resident : 0;
			}
}

static void test_random(int steps, uint64_t seed)
{
	static const uint32_t caps[3] = { 24, 28, 32 };
	kvt_index *x = mk(caps[0], caps[1], caps[2],
			  (int)(seed % 3), (int)(seed / 3 % 2));
	static uint32_t pre[NT][DEP + 1][27], post[NT][DEP + 1][27];
	uint64_t r = seed * 0x9e3779b97f4a7c15ull + 7, now = 1;
	uint64_t quota[NT][3] = { { 0 } }, isolated = 0;
	uint32_t leases[64][2 + 2 * DEP];
	int nleases = 0, leased[NT] = { 0 }, failures = kvt_test_failures;
	uint64_t full = 0, removed = 0;

	/* quotas of about a sixth of each tier: room left for isolation */
	for (uint32_t tn = 0; tn < NT; tn++)
		for (int t = 0; t < 3; t++) {
			quota[tn][t] = 1 + test_rand(&r) % (caps[t] / 6);
			CHECK_OK(kvt_index_tenant_quota(x, tn, tiers[t],
							quota[tn][t]));
		}

	for (int s = 0; s < steps && kvt_test_failures == failures; s++) {
		uint32_t tn = (uint32_t)(test_rand(&r) % NT), tok[2 * DEP];
		int d = 1 + (int)(test_rand(&r) % DEP), ti, op;
		kvt_prefix px = { .tenant = tn, .tokens = tok,
				  .ntokens = (size_t)d * P };
		int room = 1, err;

		letters((uint32_t)(test_rand(&r) % 27), d, tok);
		ti = (int)(test_rand(&r) % 3);
		op = (int)(test_rand(&r) % 10);
		now += test_rand(&r) % 3;
		for (int t = 0; t < 3; t++)
			room &= kvt_pool_slots(pools[tiers[t]]) -
				kvt_pool_used(pools[tiers[t]]) >=
				3 * (uint64_t)DEP;
		snapshot(x, pre);
		switch (op) {
		case 0: case 1: case 2: case 3:
			err = kvt_index_insert(x, &px, tiers[ti],
					       test_rand(&r) % 4 ? 0 :
					       KVT_INSERT_PARTIAL, now, NULL,
					       NULL, 0);
			CHECK(!err || err == KVT_EFULL);
			full += err == KVT_EFULL;
			/* with room in every pool, nobody else's page
			 * moved */
			snapshot(x, post);
			if (room) {
				isolated++;
				for (uint32_t o = 0; o < NT; o++)
					if (o != tn)
						CHECK(!memcmp(pre[o], post[o],
							      sizeof(pre[o])));
			}
			break;
		case 4:
			{
				kvt_match m;
				CHECK_OK(kvt_index_match(x, &px,
							 KVT_MATCH_TOUCH, now,
							 &m, NULL, 0));
			}
			break;
		case 5:
			if (nleases < 64 && !kvt_index_pin(x, &px)) {
				leases[nleases][0] = tn;
				leases[nleases][1] = (uint32_t)d;
				memcpy(&leases[nleases][2], tok,
				       sizeof(uint32_t) * 2 * (size_t)d);
				nleases++;
				leased[tn]++;
			}
			break;
		case 6:
			if (nleases) {
				uint32_t *l = leases[--nleases];
				kvt_prefix lp = { .tenant = l[0],
						  .tokens = &l[2],
						  .ntokens = l[1] * P };
				CHECK_OK(kvt_index_unpin(x, &lp));
				leased[l[0]]--;
			}
			break;
		case 7:
			/* a new quota (0: none), only for a tenant with no
			 * leases: then no tenant is ever over its quota */
			if (!leased[tn]) {
				uint64_t q = test_rand(&r) % 8 == 0 ? 0 :
					     1 + test_rand(&r) % (caps[ti] / 6);
				kvt_tenant_usage u;
				CHECK_OK(kvt_index_tenant_usage(x, tn, &u));
				CHECK_OK(kvt_index_tenant_quota(x, tn,
								tiers[ti], q));
				quota[tn][ti] = q;
				snapshot(x, post);
				for (uint32_t o = 0; o < NT; o++)
					if (o != tn)
						CHECK(!memcmp(pre[o], post[o],
							      sizeof(pre[o])) ||
						      !room);
			}
			break;
		case 8:
			{
				uint64_t freed;
				err = kvt_index_evict_pages(x, tiers[ti],
							    1 + test_rand(&r) %
							    3, &freed);
				CHECK(!err || err == KVT_EBUSY);
			}
			break;
		default:
			/* tenant 2 leaves and comes back (no leases) */
			if (tn == 2 && !leased[2] && test_rand(&r) % 4 == 0) {
				kvt_index_stat a, b;
				kvt_tenant_usage u;
				kvt_index_stat_get(x, &a);
				CHECK_OK(kvt_index_tenant_usage(x, 2, &u));
				CHECK_OK(kvt_index_tenant_remove(x, 2));
				kvt_index_stat_get(x, &b);
				for (int t = 0; t < 3; t++)
					CHECK_EQ(a.resident[tiers[t]] -
						 b.resident[tiers[t]],
						 u.pages[tiers[t]]);
				CHECK_OK(kvt_index_tenant_add(x, 2, 22));
				memset(quota[2], 0, sizeof(quota[2]));
				CHECK_OK(kvt_index_tenant_usage(x, 2, &u));
				for (int t = 0; t < 3; t++)
					CHECK(!u.pages[tiers[t]] &&
					      !u.quota[tiers[t]]);
				removed++;
			} else {
				kvt_match m;
				CHECK_OK(kvt_index_match(x, &px, 0, now, &m,
							 NULL, 0));
			}
			break;
		}
		/* every tenant's usage equals the recount, within quota */
		snapshot(x, post);
		for (uint32_t o = 0; o < NT; o++) {
			kvt_tenant_usage u;
			CHECK_OK(kvt_index_tenant_usage(x, o, &u));
			for (int t = 0; t < 3; t++) {
				uint64_t n = 0;
				for (int dd = 1, c = AL; dd <= DEP; dd++,
				     c *= AL)
					for (int k = 0; k < c; k++)
						n += post[o][dd][k] >>
						     tiers[t] & 1;
				CHECK_EQ(u.pages[tiers[t]], n);
				CHECK_EQ(u.quota[tiers[t]], quota[o][t]);
				CHECK(!quota[o][t] || n <= quota[o][t]);
			}
		}
		CHECK_OK(kvt_index_check(x));
		if (kvt_test_failures != failures)
			fprintf(stderr, "seed %llu step %d op %d tenant %u: "
				"%s\n", (unsigned long long)seed, s, op, tn,
				kvt_errdetail());
	}
	while (nleases) {
		uint32_t *l = leases[--nleases];
		kvt_prefix lp = { .tenant = l[0], .tokens = &l[2],
				  .ntokens = l[1] * P };
		CHECK_OK(kvt_index_unpin(x, &lp));
	}
	fprintf(stderr, "random seed %llu: %d steps, %llu inserts with room "
		"checked for isolation, %llu refused full, %llu removals\n",
		(unsigned long long)seed, steps, (unsigned long long)isolated,
		(unsigned long long)full, (unsigned long long)removed);
	CHECK(isolated > (uint64_t)steps / 20);
	done(x);
}

int main(int argc, char **argv)
{
	int steps = argc > 1 ? atoi(argv[1]) : 3000;
	uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 0) : 1;
	int64_t live = kvt_alloc_live();

	test_own_pages(KVT_EVICT_LRU);
	test_own_pages(KVT_EVICT_LFU);
	test_pinned();
	test_cascade();
	test_write_through();
	test_over_first();
	test_remove_and_errors();
	test_rollbacks();
	for (uint64_t s = seed; s < seed + 6; s++)
		test_random(steps / 6, s);
	CHECK_EQ(kvt_alloc_live(), live);
	TEST_DONE();
}
