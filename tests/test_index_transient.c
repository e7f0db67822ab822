/*
 * test_index_transient — the life of transient pages: queued -> in flight
 * -> resident, cancellation, tickets that do not own a mark, loads in
 * flight from a lower tier, and what a match reports at each step.
 */
#include "harness.h"

#define P 4

static uint32_t tok[64];
static kvt_index *x;
static kvt_pool *hbm, *dram;

static kvt_prefix pf(int first_page, int np)
{
	kvt_prefix p = { .tokens = tok + first_page * P,
			 .ntokens = (size_t)np * P };
	return p;
}

static kvt_match mt(int np, kvt_page_loc *loc)
{
	kvt_prefix p = pf(0, np);
	kvt_match m;

	p.ntokens += 3; /* a partial page is always computed */
	CHECK_OK(kvt_index_match(x, &p, 0, 0, &m, loc, loc ? 16 : 0));
	CHECK_OK(kvt_index_check(x));
	return m;
}

int main(void)
{
	kvt_index_config c = { .page_tokens = P };
	kvt_prefix a = pf(0, 2), ab = pf(0, 5), abc = pf(0, 8);
	kvt_page_loc loc[16];
	kvt_index_stat st;
	uint64_t n;
	kvt_match m;

	for (int i = 0; i < 64; i++)
		tok[i] = (uint32_t)i * 7 + 1;
	CHECK_OK(kvt_pool_create(&hbm, 16, 64));
	CHECK_OK(kvt_pool_create(&dram, 16, 64));
	c.pools[KVT_TIER_HBM] = hbm;
	c.pools[KVT_TIER_DRAM] = dram;
	CHECK_OK(kvt_index_create(&x, &c));

	CHECK_OK(kvt_index_insert(x, &a, KVT_TIER_HBM, 0, 10, NULL, NULL, 0));
	/* queued: request 1 will compute pages 2..4 */
	CHECK_OK(kvt_index_queue(x, &ab, 1, 20, &n));
	CHECK_EQ(n, 3);
	m = mt(5, loc);
	CHECK_EQ(m.pages, 5);
	CHECK_EQ(m.tier_tokens[KVT_TIER_HBM], 8);
	CHECK_EQ(m.queued_tokens, 12);
	CHECK_EQ(m.inflight_tokens, 0);
	CHECK_EQ(m.ticket, 1);
	CHECK_EQ(m.compute_tokens, 3);
	CHECK_EQ(loc[3].state, KVT_PAGE_QUEUED);
	CHECK_EQ(loc[3].tier, KVT_TIER_COUNT);
	CHECK_EQ(loc[3].slot, KVT_SLOT_NONE);
	/* a placeholder holds no copy: it cannot be pinned */
	CHECK_ERR(kvt_index_pin(x, &ab), KVT_ENOTFOUND);
	/* request 2 queues the same: nothing new to mark */
	CHECK_OK(kvt_index_queue(x, &ab, 2, 21, &n));
	CHECK_EQ(n, 0);
	/* request 1 starts: in flight, ready at 500 */
	CHECK_OK(kvt_index_start(x, &ab, 1, 500, 30, &n));
	CHECK_EQ(n, 3);
	m = mt(5, NULL);
	CHECK_EQ(m.inflight_tokens, 12);
	CHECK_EQ(m.queued_tokens, 0);
	CHECK_EQ(m.ready_ns, 500);
	/* request 2 cannot take it over; request 1 can move its time */
	CHECK_OK(kvt_index_start(x, &ab, 2, 900, 31, &n));
	CHECK_EQ(n, 0);
	CHECK_OK(kvt_index_start(x, &ab, 1, 600, 32, &n));
	CHECK_EQ(n, 3);
	CHECK_EQ(mt(5, NULL).ready_ns, 600);
	CHECK_OK(kvt_index_cancel(x, &ab, 2, &n));
	CHECK_EQ(n, 0); /* ticket 2 owns nothing */
	/* the bytes arrive: resident, marks gone */
	CHECK_OK(kvt_index_insert(x, &ab, KVT_TIER_HBM, 0, 600, NULL, NULL, 0));
	m = mt(5, NULL);
	CHECK_EQ(m.tier_tokens[KVT_TIER_HBM], 20);
	CHECK_EQ(m.inflight_tokens + m.queued_tokens, 0);
	CHECK_EQ(m.ticket, 0);
	kvt_index_stat_get(x, &st);
	CHECK_EQ(st.transient, 0);

	/* cancellation: placeholders vanish, a shorter cancel leaves the
	 * tail marked */
	CHECK_OK(kvt_index_queue(x, &abc, 3, 700, &n));
	CHECK_EQ(n, 3);
	kvt_index_stat_get(x, &st);
	CHECK_EQ(st.pages, 8);
	CHECK_EQ(st.transient, 3);
	{
		kvt_prefix ab6 = pf(0, 6);
		CHECK_OK(kvt_index_cancel(x, &ab6, 3, &n));
		CHECK_EQ(n, 1);
		m = mt(8, NULL);
		CHECK_EQ(m.pages, 5); /* page 5 is empty now: the walk stops */
		kvt_index_stat_get(x, &st);
		CHECK_EQ(st.pages, 8); /* kept: marked pages below it */
	}
	CHECK_OK(kvt_index_cancel(x, &abc, 3, &n));
	CHECK_EQ(n, 2);
	kvt_index_stat_get(x, &st);
	CHECK_EQ(st.pages, 5);
	CHECK_EQ(st.transient, 0);
	CHECK_OK(kvt_index_check(x));

	/* a load in flight: pages in dram being brought to hbm */
	CHECK_OK(kvt_index_evict_pages(x, KVT_TIER_HBM, 2, NULL));
	m = mt(5, NULL);
	CHECK_EQ(m.tier_tokens[KVT_TIER_DRAM], 8);
	CHECK_OK(kvt_index_start(x, &ab, 9, 800, 750, &n));
	CHECK_EQ(n, 2); /* only the pages not in hbm */
	m = mt(5, loc);
	CHECK_EQ(m.tier_tokens[KVT_TIER_HBM], 12);
	CHECK_EQ(m.inflight_tokens, 8);
	CHECK_EQ(m.ticket, 9);
	CHECK_EQ(loc[4].state, KVT_PAGE_INFLIGHT);
	CHECK_EQ(loc[4].tier, KVT_TIER_DRAM); /* load it from here */
	CHECK(loc[4].slot != KVT_SLOT_NONE);
	{
		kvt_insert_result r;
		CHECK_OK(kvt_index_insert(x, &ab, KVT_TIER_HBM, 0, 800, &r,
					  loc, 16));
		CHECK_EQ(r.fresh, 2);
		CHECK_EQ(loc[4].fresh, 1);
		CHECK_EQ(loc[4].src_tier, KVT_TIER_DRAM);
	}
	m = mt(5, NULL);
	CHECK_EQ(m.tier_tokens[KVT_TIER_HBM], 20);
	CHECK_EQ(m.inflight_tokens, 0);
	CHECK_OK(kvt_index_check(x));

	kvt_index_destroy(x);
	CHECK_EQ(kvt_pool_used(hbm), 0);
	CHECK_EQ(kvt_pool_used(dram), 0);
	kvt_pool_destroy(hbm);
	kvt_pool_destroy(dram);
	TEST_DONE();
}
