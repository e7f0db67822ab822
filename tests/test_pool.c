/*
 * test_pool — page pools: exhaustion, double free, reserve, watermarks,
 * all-or-nothing batches, and a random differential run against a bitmap.
 */
#include "harness.h"

static void test_fill(void)
{
	enum { N = 100 };
	kvt_pool *p;
	kvt_pool_stat st;
	uint32_t s[N], extra;
	int seen[N] = { 0 };

	CHECK_ERR(kvt_pool_create(&p, 0, 4096), -EINVAL);
	CHECK_ERR(kvt_pool_create(&p, 10, 0), -EINVAL);
	CHECK_ERR(kvt_pool_create(&p, (uint64_t)UINT32_MAX + 5, 1), -E2BIG);
	CHECK_OK(kvt_pool_create(&p, N, 4096));
	for (int i = 0; i < N; i++) {
		CHECK_OK(kvt_pool_alloc(p, &s[i]));
		CHECK(s[i] < N);
		if (s[i] < N) {
			CHECK(!seen[s[i]]);
			seen[s[i]] = 1;
		}
	}
	CHECK_EQ(s[0], 0); /* fresh pools hand out lowest first */
	CHECK_EQ(kvt_pool_used(p), N);
	CHECK_ERR(kvt_pool_alloc(p, &extra), KVT_EFULL);
	CHECK_ERR(kvt_pool_alloc(p, &extra), KVT_EFULL);
	kvt_pool_stat_get(p, &st);
	CHECK_EQ(st.full, 2);
	CHECK_EQ(st.peak, N);

	CHECK_OK(kvt_pool_free(p, s[37]));
	CHECK_ERR(kvt_pool_free(p, s[37]), -EINVAL); /* double free */
	CHECK_ERR(kvt_pool_free(p, N), -EINVAL);      /* out of range */
	CHECK_ERR(kvt_pool_free(p, KVT_SLOT_NONE), -EINVAL);
	CHECK_OK(kvt_pool_alloc(p, &extra));
	CHECK_EQ(extra, s[37]); /* freed slot reused first */
	for (int i = 0; i < N; i++)
		CHECK_OK(kvt_pool_free(p, s[i]));
	CHECK_EQ(kvt_pool_used(p), 0);
	kvt_pool_stat_get(p, &st);
	CHECK_EQ(st.allocs, st.frees);
	kvt_pool_destroy(p);
}

static void test_reserve_batch(void)
{
	kvt_pool *p;
	uint32_t s[8], x;

	CHECK_OK(kvt_pool_create(&p, 8, 1));
	CHECK_OK(kvt_pool_reserve(p, 5));
	CHECK_ERR(kvt_pool_reserve(p, 5), KVT_EBUSY);
	CHECK_ERR(kvt_pool_reserve(p, 8), -EINVAL);
	CHECK(kvt_pool_is_used(p, 5));
	CHECK(!kvt_pool_is_used(p, 4));
	CHECK_ERR(kvt_pool_alloc_n(p, s, 8), KVT_EFULL); /* only 7 free */
	CHECK_EQ(kvt_pool_used(p), 1);                   /* nothing taken */
	CHECK_OK(kvt_pool_alloc_n(p, s, 7));
	for (int i = 0; i < 7; i++)
		CHECK(s[i] != 5);
	CHECK_ERR(kvt_pool_alloc(p, &x), KVT_EFULL);
	CHECK_OK(kvt_pool_alloc_n(p, s, 0));
	CHECK_OK(kvt_pool_free(p, 5));
	CHECK_OK(kvt_pool_alloc(p, &x));
	CHECK_EQ(x, 5);
	kvt_pool_destroy(p);
}

/* The eviction callback frees the oldest held slots. */
struct owner {
	uint32_t held[100];
	int n;
	uint64_t calls, last_want;
	int free_on_call;
};

static void evict_cb(kvt_pool *p, uint64_t want, void *arg)
{
	struct owner *o = arg;

	o->calls++;
	o->last_want = want;
	if (!o->free_on_call)
		return;
	for (uint64_t i = 0; i < want && o->n > 0; i++) {
		CHECK_OK(kvt_pool_free(p, o->held[0]));
		memmove(o->held, o->held + 1, (size_t)--o->n * sizeof(uint32_t));
	}
}

static void test_watermarks(void)
{
	struct owner o = { .free_on_call = 1 };
	kvt_pool *p;
	uint32_t s;

	CHECK_OK(kvt_pool_create(&p, 100, 1));
	CHECK_ERR(kvt_pool_set_watermarks(p, 0.5, 0.9, evict_cb, &o), -EINVAL);
	CHECK_ERR(kvt_pool_set_watermarks(p, 1.5, 0.5, evict_cb, &o), -EINVAL);
	CHECK_ERR(kvt_pool_set_watermarks(p, 0.9, 0, evict_cb, &o), -EINVAL);
	CHECK_OK(kvt_pool_set_watermarks(p, 0.9, 0.7, evict_cb, &o));
	for (int i = 0; i < 90; i++) {
		CHECK_OK(kvt_pool_alloc(p, &s));
		o.held[o.n++] = s;
	}
	CHECK_EQ(o.calls, 0); /* at the high mark, not above */
	CHECK_OK(kvt_pool_alloc(p, &s));
	o.held[o.n++] = s;
	CHECK_EQ(o.calls, 1); /* 91 > 90: asked to come down to 70 */
	CHECK_EQ(o.last_want, 21);
	CHECK_EQ(kvt_pool_used(p), 70);

	/* an owner that cannot free: alloc fails cleanly when empty */
	o.free_on_call = 0;
	while (kvt_pool_alloc(p, &s) == 0)
		o.held[o.n++] = s;
	CHECK_EQ(kvt_pool_used(p), 100);
	CHECK_ERR(kvt_pool_alloc(p, &s), KVT_EFULL);
	/* an owner that frees when empty: the alloc retries and succeeds */
	o.free_on_call = 1;
	CHECK_OK(kvt_pool_alloc(p, &s));
	CHECK(kvt_pool_used(p) <= 71);
	kvt_pool_destroy(p);
}

/* Random operations against a trivially correct model (a bitmap). */
static void test_differential(void)
{
	enum { N = 257 };
	for (uint64_t seed = 1; seed <= 20; seed++) {
		uint64_t r = seed;
		unsigned char model[N] = { 0 };
		int used = 0;
		kvt_pool *p;

		CHECK_OK(kvt_pool_create(&p, N, 64));
		for (int step = 0; step < 20000; step++) {
			uint32_t s = (uint32_t)(test_rand(&r) % (N + 2));
			int op = (int)(test_rand(&r) % 4), err;

			if (op == 0) {
				err = kvt_pool_alloc(p, &s);
				if (used == N) {
					CHECK_ERR(err, KVT_EFULL);
				} else {
					CHECK_OK(err);
					CHECK(s < N && !model[s]);
					model[s] = 1, used++;
				}
			} else if (op == 1 || op == 2) {
				err = kvt_pool_free(p, s);
				if (s < N && model[s]) {
					CHECK_OK(err);
					model[s] = 0, used--;
				} else {
					CHECK_ERR(err, -EINVAL);
				}
			} else {
				err = kvt_pool_reserve(p, s);
				if (s >= N)
					CHECK_ERR(err, -EINVAL);
				else if (model[s])
					CHECK_ERR(err, KVT_EBUSY);
				else {
					CHECK_OK(err);
					model[s] = 1, used++;
				}
			}
			CHECK_EQ(kvt_pool_used(p), used);
			if (kvt_test_failures)
				break;
		}
		for (uint32_t s = 0; s < N; s++)
			CHECK_EQ(kvt_pool_is_used(p, s), model[s]);
		kvt_pool_destroy(p);
	}
}

int main(void)
{
	int64_t live = kvt_alloc_live();

	test_fill();
	test_reserve_batch();
	test_watermarks();
	test_differential();
	CHECK_EQ(kvt_alloc_live(), live);
	TEST_DONE();
}
