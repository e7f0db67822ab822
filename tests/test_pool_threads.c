/*
 * test_pool_threads — many threads on one pool (run under TSan in CI):
 * no slot is ever handed to two owners at once, counts balance, watermark
 * callbacks run one at a time.
 */
#include "harness.h"

#include <pthread.h>
#include <stdatomic.h>

enum { SLOTS = 256, THREADS = 8, ROUNDS = 20000 };

static kvt_pool *pool;
static atomic_int owner[SLOTS];
static atomic_int in_cb, cb_overlap, bad;
static atomic_uint_fast64_t cb_calls;
static pthread_barrier_t start;

static void evict_cb(kvt_pool *p, uint64_t want, void *arg)
{
	if (atomic_fetch_add(&in_cb, 1) != 0)
		atomic_store(&cb_overlap, 1);
	atomic_fetch_add(&cb_calls, 1);
	atomic_fetch_sub(&in_cb, 1);
}

static void *worker(void *arg)
{
	int id = (int)(intptr_t)arg + 1;
	uint64_t r = (uint64_t)id * 7919;
	uint32_t held[64];
	int n = 0;

	/* every thread holds 20 slots before any goes on: the pool passes
	 * its high mark (128) however the threads are scheduled */
	for (; n < 20; n++) {
		int exp = 0;
		if (kvt_pool_alloc(pool, &held[n]) ||
		    !atomic_compare_exchange_strong(&owner[held[n]], &exp, id))
			atomic_store(&bad, 1);
	}
	pthread_barrier_wait(&start);
	for (int i = 0; i < ROUNDS; i++) {
		if (n < 64 && (n == 0 || test_rand(&r) % 5 < 3)) {
			uint32_t s;
			int exp = 0;
			if (kvt_pool_alloc(pool, &s))
				continue; /* full: others hold it all */
			if (!atomic_compare_exchange_strong(&owner[s], &exp, id))
				atomic_store(&bad, 1); /* handed out twice */
			held[n++] = s;
		} else {
			int k = (int)(test_rand(&r) % (uint64_t)n);
			uint32_t s = held[k];
			held[k] = held[--n];
			if (atomic_exchange(&owner[s], 0) != id)
				atomic_store(&bad, 1);
			if (kvt_pool_free(pool, s))
				atomic_store(&bad, 1);
		}
	}
	while (n) {
		uint32_t s = held[--n];
		atomic_store(&owner[s], 0);
		if (kvt_pool_free(pool, s))
			atomic_store(&bad, 1);
	}
	return NULL;
}

int main(void)
{
	pthread_t th[THREADS];
	kvt_pool_stat st;

	CHECK_OK(kvt_pool_create(&pool, SLOTS, 4096));
	CHECK_OK(kvt_pool_set_watermarks(pool, 0.5, 0.4, evict_cb, NULL));
	pthread_barrier_init(&start, NULL, THREADS);
	for (intptr_t i = 0; i < THREADS; i++)
		pthread_create(&th[i], NULL, worker, (void *)i);
	for (int i = 0; i < THREADS; i++)
		pthread_join(th[i], NULL);
	CHECK(!atomic_load(&bad));
	CHECK(!atomic_load(&cb_overlap));
	CHECK(atomic_load(&cb_calls) > 0);
	CHECK_EQ(kvt_pool_used(pool), 0);
	kvt_pool_stat_get(pool, &st);
	CHECK_EQ(st.allocs, st.frees);
	CHECK(st.peak > SLOTS / 2);
	kvt_pool_destroy(pool);
	pthread_barrier_destroy(&start);
	TEST_DONE();
}
