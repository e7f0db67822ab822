/*
 * test_index_policy — demotion and the write policies with pools that
 * fill, seen through a mover that records every call: write-back copies
 * only on eviction, write-through at once, selective after N hits; the
 * sources and destinations are the slots the index says; a failing mover
 * drops the page and is counted; watermarks make a filling tier evict by
 * itself; release is called for every slot given back.
 */
#include "harness.h"

#define P 2

struct rec {
	kvt_move mv[256];
	int n, fail, released;
	int flushes, unflushed; /* flush calls; copies since the last */
};

static void rec_flush(void *arg)
{
	struct rec *r = arg;

	CHECK(r->unflushed > 0); /* only called when copies were issued */
	r->flushes++;
	r->unflushed = 0;
}

static int rec_copy(void *arg, const kvt_move *mv)
{
	struct rec *r = arg;

	if (r->n < 256)
		r->mv[r->n] = *mv;
	r->n++;
	r->unflushed++;
	return r->fail ? -EIO : 0;
}

static void rec_release(void *arg, kvt_tier_kind tier, uint32_t slot)
{
	struct rec *r = arg;

	(void)tier;
	(void)slot;
	r->released++;
}

static uint32_t tok[256];
static kvt_pool *hbm, *dram;

static kvt_index *mk(int write, uint32_t nhbm, uint32_t ndram, struct rec *r,
		     double high, double low)
{
	kvt_index_config c = { .page_tokens = P, .write = write,
			       .selective_hits = 2, .high = high, .low = low };
	kvt_index *x;

	memset(r, 0, sizeof(*r));
	CHECK_OK(kvt_pool_create(&hbm, nhbm, 64));
	CHECK_OK(kvt_pool_create(&dram, ndram, 64));
	c.pools[KVT_TIER_HBM] = hbm;
	c.pools[KVT_TIER_DRAM] = dram;
	c.mover.copy = rec_copy;
	c.mover.release = rec_release;
	c.mover.flush = rec_flush;
	c.mover.arg = r;
	CHECK_OK(kvt_index_create(&x, &c));
	return x;
}

static void done(kvt_index *x, struct rec *r)
{
	kvt_pool_stat a, b;
	kvt_index_stat st;

	CHECK_OK(kvt_index_check(x));
	kvt_index_stat_get(x, &st);
	kvt_pool_stat_get(hbm, &a);
	kvt_pool_stat_get(dram, &b);
	kvt_index_destroy(x);
	CHECK_EQ(kvt_pool_used(hbm) + kvt_pool_used(dram), 0);
	/* every slot that held a page was released through the mover (the
	 * destinations of failed moves never held one) */
	CHECK_EQ((uint64_t)r->released, a.allocs + b.allocs - st.move_failed);
	kvt_pool_destroy(hbm);
	kvt_pool_destroy(dram);
}

static kvt_prefix pf(int first, int np)
{
	kvt_prefix p = { .tokens = tok + first * P, .ntokens = (size_t)np * P };
	return p;
}

static void test_write_back(void)
{
	struct rec r;
	kvt_index *x = mk(KVT_WRITE_BACK, 4, 8, &r, 0, 0);
	kvt_prefix a = pf(0, 4), b = pf(100, 2);
	kvt_page_info pi[4];
	kvt_index_stat st;
	size_t found;

	CHECK_OK(kvt_index_insert(x, &a, KVT_TIER_HBM, 0, 1, NULL, NULL, 0));
	CHECK_EQ(r.n, 0); /* no copy before eviction */
	CHECK_OK(kvt_index_inspect(x, &a, pi, 4, &found));
	/* b needs two hbm slots: a's last two pages are demoted */
	CHECK_OK(kvt_index_insert(x, &b, KVT_TIER_HBM, 0, 2, NULL, NULL, 0));
	CHECK_EQ(r.n, 2);
	CHECK_EQ(r.flushes, 1); /* one wait for the call's two copies */
	CHECK_EQ(r.unflushed, 0);
	CHECK_EQ(r.mv[0].reason, KVT_MOVE_DEMOTE);
	CHECK_EQ(r.mv[0].src, KVT_TIER_HBM);
	CHECK_EQ(r.mv[0].dst, KVT_TIER_DRAM);
	CHECK_EQ(r.mv[0].src_slot, pi[3].slot[KVT_TIER_HBM]); /* leaf first */
	CHECK_EQ(r.mv[1].src_slot, pi[2].slot[KVT_TIER_HBM]);
	CHECK_OK(kvt_index_inspect(x, &a, pi, 4, &found));
	CHECK_EQ(pi[3].slot[KVT_TIER_DRAM], r.mv[0].dst_slot);
	CHECK_EQ(pi[3].resident, 1u << KVT_TIER_DRAM);
	kvt_index_stat_get(x, &st);
	CHECK_EQ(st.demoted[KVT_TIER_DRAM], 2);
	CHECK_EQ(st.copied[KVT_TIER_DRAM], 0);
	done(x, &r);
}

static void test_write_through(void)
{
	struct rec r;
	kvt_index *x = mk(KVT_WRITE_THROUGH, 4, 3, &r, 0, 0);
	kvt_prefix a = pf(0, 3), b = pf(100, 3);
	kvt_page_info pi[3];
	kvt_index_stat st;
	size_t found;

	CHECK_OK(kvt_index_insert(x, &a, KVT_TIER_HBM, 0, 1, NULL, NULL, 0));
	CHECK_EQ(r.n, 3);
	CHECK_EQ(r.flushes, 1);
	CHECK_EQ(r.mv[0].reason, KVT_MOVE_COPY);
	CHECK_OK(kvt_index_inspect(x, &a, pi, 3, &found));
	CHECK_EQ(pi[0].resident, (1u << KVT_TIER_HBM) | (1u << KVT_TIER_DRAM));
	CHECK_EQ(r.mv[0].src_slot, pi[0].slot[KVT_TIER_HBM]);
	CHECK_EQ(r.mv[0].dst_slot, pi[0].slot[KVT_TIER_DRAM]);
	/* b: hbm evicts two of a's pages (their copies make that free); the
	 * full dram drops a's older copies to take b's */
	CHECK_OK(kvt_index_insert(x, &b, KVT_TIER_HBM, 0, 2, NULL, NULL, 0));
	CHECK_OK(kvt_index_check(x));
	kvt_index_stat_get(x, &st);
	CHECK_EQ(st.demoted[KVT_TIER_DRAM], 0);
	CHECK_EQ(st.copied[KVT_TIER_DRAM], 6);
	CHECK_EQ(st.resident[KVT_TIER_HBM], 4);
	CHECK_EQ(st.resident[KVT_TIER_DRAM], 3);
	done(x, &r);
}

static void test_selective(void)
{
	struct rec r;
	kvt_index *x = mk(KVT_WRITE_SELECTIVE, 8, 8, &r, 0, 0);
	kvt_prefix a = pf(0, 3);
	kvt_match m;

	CHECK_OK(kvt_index_insert(x, &a, KVT_TIER_HBM, 0, 1, NULL, NULL, 0));
	CHECK_EQ(r.n, 0);                       /* 1 hit */
	CHECK_OK(kvt_index_match(x, &a, 0, 2, &m, NULL, 0));
	CHECK_EQ(r.n, 0);                       /* a match without touch */
	CHECK_OK(kvt_index_match(x, &a, KVT_MATCH_TOUCH, 3, &m, NULL, 0));
	CHECK_EQ(r.n, 3);                       /* 2 hits: copied down */
	CHECK_OK(kvt_index_match(x, &a, KVT_MATCH_TOUCH, 4, &m, NULL, 0));
	CHECK_EQ(r.n, 3);                       /* once */
	done(x, &r);
}

static void test_mover_fails(void)
{
	struct rec r;
	kvt_index *x = mk(KVT_WRITE_BACK, 2, 4, &r, 0, 0);
	kvt_prefix a = pf(0, 2), b = pf(100, 2);
	kvt_index_stat st;
	kvt_match m;

	CHECK_OK(kvt_index_insert(x, &a, KVT_TIER_HBM, 0, 1, NULL, NULL, 0));
	r.fail = 1;
	CHECK_OK(kvt_index_insert(x, &b, KVT_TIER_HBM, 0, 2, NULL, NULL, 0));
	kvt_index_stat_get(x, &st);
	CHECK_EQ(st.move_failed, 2);
	CHECK_EQ(st.dropped, 2);
	CHECK_EQ(kvt_pool_used(dram), 0); /* the destination slots came back */
	CHECK_OK(kvt_index_match(x, &a, 0, 3, &m, NULL, 0));
	CHECK_EQ(m.pages, 0);
	done(x, &r);
}

static void test_watermarks(void)
{
	struct rec r;
	kvt_index *x = mk(KVT_WRITE_BACK, 8, 16, &r, 0.75, 0.5);
	kvt_prefix a = pf(0, 7);
	kvt_index_stat st;

	/* 7 of 8 is above 6: the pool asks to come down to 4 */
	CHECK_OK(kvt_index_insert(x, &a, KVT_TIER_HBM, 0, 1, NULL, NULL, 0));
	CHECK(kvt_pool_used(hbm) <= 4);
	CHECK_EQ(r.unflushed, 0); /* watermark demotions flushed too */
	kvt_index_stat_get(x, &st);
	CHECK_EQ(st.demoted[KVT_TIER_DRAM], 7 - kvt_pool_used(hbm));
	CHECK_OK(kvt_index_check(x));
	done(x, &r);
}

int main(void)
{
	for (int i = 0; i < 256; i++)
		tok[i] = (uint32_t)i;
	test_write_back();
	test_write_through();
	test_selective();
	test_mover_fails();
	test_watermarks();
	TEST_DONE();
}
