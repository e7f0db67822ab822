/*
 * test_cache_faults — the node cache's answers to bad input and to a
 * failing allocator, on test_cache's small cache (cache_small.h): loads
 * and stores before memory is registered, and lookups, loads, stores,
 * hashing and tenant calls with bad arguments (NULLs, a bad start, blocks
 * twice or out of range, unknown or existing tenants) fail with their
 * codes, reserve nothing and show nothing, and then the right calls work;
 * and a failed allocation at every point of open, register, store and
 * load leaves no leak, no crash and nothing half-visible.
 */
#include "cache_small.h"

/* ---- bad arguments ---------------------------------------------------- */

static void test_bad_args(void)
{
	kvt_page_key k[4];
	uint32_t b[4] = { 0, 1, 2, 3 }, twice[4] = { 0, 1, 1, 3 };
	uint32_t out_of_range[4] = { 0, 1, NB, 3 }, tok[8] = { 0 };
	kvt_cache_lookup_result r;
	kvt_cache_job *j = NULL;
	kvt_cache *c;
	eng e;

	CHECK_OK(open_cache(&c, 0, 0));
	if (!c)
		return;
	CHECK_OK(eng_init(&e, &geom, NB, ENG_KV_OUTER, 0, -1));
	CHECK_OK(session_keys(c, 0, 700, 4, k));
	eng_fill(&e, k, 4, 0, b);
	/* no memory registered */
	CHECK_ERR(kvt_cache_load(c, 0, k, 4, 0, b, &j), KVT_EBUSY);
	CHECK_ERR(kvt_cache_store(c, 0, k, 4, 0, b, &j), KVT_EBUSY);
	lookup_n(c, 0, k, 4, &r);
	CHECK_EQ(r.pages, 0);
	CHECK_OK(eng_register(c, &e));

	CHECK_ERR(kvt_cache_lookup(c, 0, NULL, 4, 0, &r), -EINVAL);
	CHECK_ERR(kvt_cache_lookup(c, 0, k, 4, 0, NULL), -EINVAL);
	CHECK_ERR(kvt_cache_lookup(c, 5, k, 4, 0, &r), KVT_ENOTFOUND);
	for (int store = 0; store < 2; store++) {
		int (*fn)(kvt_cache *, uint32_t, const kvt_page_key *, size_t,
			  size_t, const uint32_t *, kvt_cache_job **) =
			store ? kvt_cache_store : kvt_cache_load;
		CHECK_ERR(fn(c, 0, k, 4, 5, b, &j), -EINVAL);
		CHECK_ERR(fn(c, 0, NULL, 4, 0, b, &j), -EINVAL);
		CHECK_ERR(fn(c, 0, k, 4, 0, NULL, &j), -EINVAL);
		CHECK_ERR(fn(c, 0, k, 4, 0, b, NULL), -EINVAL);
		CHECK_ERR(fn(c, 0, k, 4, 0, twice, &j), -EINVAL);
		CHECK_ERR(fn(c, 0, k, 4, 0, out_of_range, &j), -EINVAL);
		CHECK_ERR(fn(c, 5, k, 4, 0, b, &j), KVT_ENOTFOUND);
		CHECK(j == NULL);
	}
	CHECK_ERR(kvt_cache_hash_tokens(c, 5, tok, 8, k), KVT_ENOTFOUND);
	CHECK_ERR(kvt_cache_hash_tokens(c, 0, NULL, 8, k), -EINVAL);
	CHECK_ERR(kvt_cache_tenant_add(c, 0, 1), -EEXIST);
	CHECK_OK(kvt_cache_tenant_add(c, 5, 1));
	CHECK_ERR(kvt_cache_tenant_add(c, 5, 2), -EEXIST);
	/* nothing of the refused calls is reserved or visible */
	CHECK_EQ(cache_used(c), 0);
	lookup_n(c, 0, k, 4, &r);
	CHECK_EQ(r.pages, 0);
	CHECK_EQ(r.inflight, 0);
	/* and the same calls, right, work */
	CHECK_OK(cache_store_wait(c, 0, k, 4, 0, b, NULL));
	CHECK_ERR(kvt_cache_store(c, 0, k, 4, 0, twice, &j), -EINVAL);
	lookup_n(c, 0, k, 4, &r);
	CHECK_EQ(r.pages, 4);
	kvt_cache_close(c);
	eng_free(&e);
}

/* ---- failed allocations ------------------------------------------------ */

static void test_open_faults(const char *ssd)
{
	uint64_t before = kvt_alloc_count(), points;
	kvt_cache *c;
	int failed = 0;

	CHECK_OK(open_cache(&c, 0, 0));
	points = kvt_alloc_count() - before;
	kvt_cache_close(c);
	for (uint64_t n = 1; n <= points; n++) {
		int64_t live = kvt_alloc_live();
		int err;

		kvt_alloc_fail_at(n);
		err = open_cache(&c, 0, 0);
		kvt_alloc_fail_at(0);
		if (!err) {
			kvt_cache_close(c);
			continue;
		}
		failed++;
		CHECK(err == -ENOMEM || err == -ENOSPC || err == -EAGAIN);
		CHECK_EQ(kvt_alloc_live(), live);
		CHECK(test_count_entries(ssd) <= 0); /* gone or empty */
	}
	CHECK(failed > 5);
	fprintf(stderr, "open: %llu allocations, %d failures injected\n",
		(unsigned long long)points, failed);
}

/* Fail every allocation of register, store+wait and load+wait in turn. */
static void test_op_faults(void)
{
	kvt_cache_lookup_result r;
	uint32_t b[6] = { 2, 4, 6, 8, 10, 12 }, d[6] = { 1, 3, 5, 7, 9, 11 };
	uint32_t failed[6];
	kvt_page_key k[6];
	kvt_cache *c;
	uint64_t before, points;
	int injected = 0;
	eng e;

	CHECK_OK(open_cache(&c, KVT_CACHE_NO_BACKGROUND, 0));
	if (!c)
		return;
	CHECK_OK(eng_init(&e, &geom, NB, ENG_KV_OUTER, 16, -1));
	for (uint64_t n = 1; n < 64; n++) {
		kvt_alloc_fail_at(n);
		int err = eng_register(c, &e);
		kvt_alloc_fail_at(0);
		if (!err)
			break;
		CHECK_ERR(err, -ENOMEM);
	}
	CHECK_ERR(eng_register(c, &e), KVT_EBUSY);

	/* store */
	CHECK_OK(session_keys(c, 0, 900, 6, k));
	eng_fill(&e, k, 6, 0, b);
	before = kvt_alloc_count();
	CHECK_OK(cache_store_wait(c, 0, k, 6, 0, b, NULL));
	points = kvt_alloc_count() - before + 2;
	for (uint64_t n = 1; n <= points; n++) {
		int err;

		CHECK_OK(session_keys(c, 0, 1000 + (uint32_t)n, 6, k));
		eng_fill(&e, k, 6, 0, b);
		kvt_alloc_fail_at(n);
		err = cache_store_wait(c, 0, k, 6, 0, b, NULL);
		kvt_alloc_fail_at(0);
		lookup_n(c, 0, k, 6, &r);
		CHECK_EQ(r.inflight, 0);
		if (err) {
			injected++;
			CHECK(err == -ENOMEM || err == -EAGAIN);
			CHECK_EQ(r.pages, 0);
		} else {
			CHECK_EQ(r.pages, 6);
		}
	}
	/* load: session 900 again (a failed allocation in a demotion may
	 * have dropped it: a cache may drop pages), now in the top tier */
	CHECK_OK(session_keys(c, 0, 900, 6, k));
	eng_fill(&e, k, 6, 0, b);
	CHECK_OK(cache_store_wait(c, 0, k, 6, 0, b, NULL));
	before = kvt_alloc_count();
	CHECK_OK(cache_load_wait(c, 0, k, 6, 0, d, NULL, NULL, NULL));
	points = kvt_alloc_count() - before + 2;
	for (uint64_t n = 1; n <= points; n++) {
		kvt_cache_job *j = NULL;
		long nf = 0;
		int err;

		for (int i = 0; i < 6; i++)
			eng_poison(&e, d[i]);
		kvt_alloc_fail_at(n);
		err = kvt_cache_load(c, 0, k, 6, 0, d, &j);
		if (!err)
			err = job_finish(j, failed, 6, &nf);
		kvt_alloc_fail_at(0);
		if (err)
			injected++;
		if (err && !j) { /* the call failed: nothing started */
			CHECK_ERR(err, -ENOMEM);
			for (int i = 0; i < 6; i++)
				CHECK(eng_block_poisoned(&e, d[i]));
			continue;
		}
		/* the job ran: every block not on the failed list is right */
		for (int i = 0, f = 0; i < 6; i++) {
			if (f < nf && failed[f] == d[i]) {
				f++;
				continue;
			}
			CHECK(eng_block_is(&e, d[i], k[i]));
		}
	}
	/* everything still whole and served */
	CHECK_OK(cache_load_wait(c, 0, k, 6, 0, d, NULL, NULL, NULL));
	for (int i = 0; i < 6; i++)
		CHECK(eng_block_is(&e, d[i], k[i]));
	{
		kvt_cache_check chk;
		CHECK_OK(kvt_cache_verify(c, &chk));
		CHECK_EQ(chk.bad, 0);
		CHECK_OK(kvt_index_check(kvt_cache_index(c)));
	}
	CHECK(injected > 2);
	fprintf(stderr, "store/load: %d failures injected\n", injected);
	kvt_cache_close(c);
	eng_free(&e);
}

int main(void)
{
	char ssd[600];
	int64_t live;

	cache_small_init("cache_faults", ssd, sizeof(ssd));
	live = kvt_alloc_live();
	test_phase = "bad args";
	test_bad_args();
	test_phase = "open faults";
	test_open_faults(ssd);
	test_phase = "op faults";
	test_op_faults();
	CHECK_EQ(kvt_alloc_live(), live);
	TEST_DONE();
}
