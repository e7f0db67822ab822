/*
 * test_cache_room_threads — a store into a full top tier does not wait for
 * its room on the caller's thread. On test_cache's small cache
 * (cache_small.h: 32 pages of fabric over dram and ssd), without the
 * background thread so that every store into a full fabric demotes:
 *
 *   returns at once   with the room thread held (kvt_fault_hold_jobs(),
 *                     KVT_FAULT_ROOM | KVT_FAULT_STUCK: nothing ends the
 *                     hold but disarming it), kvt_cache_store() into the
 *                     full fabric returns — if it waited for its room the
 *                     test would hang (the watchdog) — with its job in
 *                     flight and its pages reported in flight, not served;
 *                     once the hold is off the job is done, its wait for
 *                     room counted, and every page, stored and demoted,
 *                     loads bit-exact and verifies;
 *   in order          several stores queued behind the hold, from several
 *                     threads at once, demoting down to ssd: all finish, every
 *                     page of every prefix loads right (the batches ran in
 *                     the order they were decided: a demotion chain run
 *                     out of order serves one page's bytes as another's);
 *   cancelled         a store cancelled while it waits for room ends
 *                     -ECANCELED, nothing of it visible, its slots back in
 *                     the pools; the demotions it decided still ran (the
 *                     pages they moved load right);
 *   closed            kvt_cache_close() with a store waiting for room
 *                     cancels it (the hold, not stuck, ends at the cancel)
 *                     and the job handle stays valid until freed.
 */
#include "cache_small.h"

#include <pthread.h>

#define PP 4 /* pages a prefix */

static uint32_t blk(uint32_t s, uint32_t i)
{
	return (s * PP + i) % NB;
}

/* Store prefix @s (PP pages, blocks blk(s, ...)) and return its job. */
static kvt_cache_job *store_start(kvt_cache *c, const eng *e,
				  kvt_page_key *k, uint32_t s)
{
	uint32_t b[PP];
	kvt_cache_job *j = NULL;

	for (uint32_t i = 0; i < PP; i++)
		b[i] = blk(s, i);
	CHECK_OK(session_keys(c, 0, s, PP, k));
	eng_fill(e, k, PP, 0, b);
	CHECK_OK(kvt_cache_store(c, 0, k, PP, 0, b, &j));
	return j;
}

/* Prefix @s loads whole and bit-exact into blocks far from its own. */
static void load_ok(kvt_cache *c, const eng *e, const kvt_page_key *k,
		    uint32_t s)
{
	uint32_t b[PP];
	long nfailed = -1;

	for (uint32_t i = 0; i < PP; i++) {
		b[i] = (blk(s, i) + NB / 2) % NB;
		eng_poison(e, b[i]);
	}
	CHECK_OK(cache_load_wait(c, 0, k, PP, 0, b, NULL, &nfailed, NULL));
	CHECK_EQ(nfailed, 0);
	for (uint32_t i = 0; i < PP; i++)
		if (!eng_block_is(e, b[i], k[i])) {
			fprintf(stderr, "prefix %u page %u differs\n", s, i);
			kvt_test_failures++;
			return;
		}
}

/* Fill the fabric: 8 prefixes of 4 pages, each stored and done. */
static void fill(kvt_cache *c, const eng *e, kvt_page_key k[][PP])
{
	for (uint32_t s = 0; s < 8; s++) {
		kvt_cache_job *j = store_start(c, e, k[s], s);

		if (j)
			CHECK_OK(job_finish(j, NULL, 0, NULL));
	}
	CHECK_EQ(kvt_pool_used(kvt_tier_pool(kvt_cache_tier(c,
		 KVT_TIER_FABRIC))), 32);
}

static void test_returns_at_once(void)
{
	static kvt_page_key k[16][PP];
	kvt_cache_lookup_result r;
	kvt_cache_job_stat st;
	kvt_cache_job *j;
	kvt_cache *c;
	eng e;

	test_phase = "returns at once";
	if (!(c = setup(&e, ENG_KV_OUTER, KVT_CACHE_NO_BACKGROUND, 0)))
		return;
	fill(c, &e, k);
	kvt_fault_hold_jobs(600000, KVT_FAULT_ROOM | KVT_FAULT_STUCK);
	j = store_start(c, &e, k[8], 8); /* would hang if it waited */
	if (!j)
		goto out;
	CHECK_ERR(kvt_cache_job_poll(j), -EINPROGRESS);
	lookup_n(c, 0, k[8], PP, &r);
	CHECK_EQ(r.pages, 0);       /* not served before it is done */
	CHECK_EQ(r.inflight, PP);   /* but known to be on its way */
	usleep(20000);
	CHECK_ERR(kvt_cache_job_poll(j), -EINPROGRESS); /* still held */
	kvt_fault_hold_jobs(0, 0);
	CHECK_OK(kvt_cache_job_wait(j, -1));
	kvt_cache_job_stat_get(j, &st);
	CHECK_EQ(st.copied, PP);
	CHECK_EQ(st.failed, 0);
	CHECK(st.wait_s >= 0.015); /* the hold and the demotions it waited */
	kvt_cache_job_free(j);
	lookup_n(c, 0, k[8], PP, &r);
	CHECK_EQ(r.pages, PP);
	CHECK_EQ(r.tier_pages[KVT_TIER_FABRIC], PP);
	for (uint32_t s = 0; s <= 8; s++)
		load_ok(c, &e, k[s], s);
out:
	kvt_fault_hold_jobs(0, 0);
	kvt_cache_close(c);
	eng_free(&e);
}

struct storer {
	kvt_cache *c;
	const eng *e;
	kvt_page_key (*k)[PP];
	uint32_t s0, n;
	kvt_cache_job *j[8];
};

static void *storer_main(void *arg)
{
	struct storer *t = arg;

	for (uint32_t i = 0; i < t->n; i++)
		t->j[i] = store_start(t->c, t->e, t->k[t->s0 + i], t->s0 + i);
	return NULL;
}

static void test_in_order(void)
{
	static kvt_page_key k[32][PP];
	struct storer t[3];
	pthread_t th[3];
	int held = 0;
	kvt_cache_check chk;
	kvt_cache *c;
	eng e;

	test_phase = "in order";
	if (!(c = setup(&e, ENG_KV_OUTER, KVT_CACHE_NO_BACKGROUND, 0)))
		return;
	fill(c, &e, k);
	kvt_fault_hold_jobs(600000, KVT_FAULT_ROOM | KVT_FAULT_STUCK);
	/* 3 threads x 5 prefixes = 60 pages (each its own engine blocks:
	 * they must not change until the store is done) into a full 32-page
	 * fabric over 32 of dram (the spec below): the first stores demote,
	 * the later ones find the fabric held by the stores still waiting
	 * and spill into dram, then ssd, demoting there too */
	for (int i = 0; i < 3; i++) {
		t[i] = (struct storer){ .c = c, .e = &e, .k = k,
					.s0 = 8 + 5 * (uint32_t)i, .n = 5 };
		CHECK(pthread_create(&th[i], NULL, storer_main, &t[i]) == 0);
	}
	for (int i = 0; i < 3; i++)
		pthread_join(th[i], NULL);
	/* the ones that demoted wait (those spilling into free slots below
	 * need no room and may be done) */
	for (int i = 0; i < 3; i++)
		for (uint32_t n = 0; n < 5; n++)
			held += t[i].j[n] &&
				kvt_cache_job_poll(t[i].j[n]) == -EINPROGRESS;
	CHECK(held >= 1);
	kvt_fault_hold_jobs(0, 0);
	for (int i = 0; i < 3; i++)
		for (uint32_t n = 0; n < 5; n++)
			if (t[i].j[n])
				CHECK_OK(job_finish(t[i].j[n], NULL, 0, NULL));
	for (uint32_t s = 0; s < 23; s++)
		load_ok(c, &e, k[s], s);
	CHECK_OK(kvt_cache_verify(c, &chk));
	CHECK_EQ(chk.bad, 0);
	CHECK_EQ(chk.checked, 23 * PP);
	CHECK(chk.per_tier[KVT_TIER_SSD] > 0);
	kvt_cache_close(c);
	eng_free(&e);
}

static void test_cancelled(void)
{
	static kvt_page_key k[16][PP];
	kvt_cache_lookup_result r;
	kvt_cache_check chk;
	kvt_cache_job *j;
	kvt_cache *c;
	uint64_t used;
	eng e;

	test_phase = "cancelled";
	if (!(c = setup(&e, ENG_KV_OUTER, KVT_CACHE_NO_BACKGROUND, 0)))
		return;
	fill(c, &e, k);
	used = cache_used(c);
	kvt_fault_hold_jobs(600000, KVT_FAULT_ROOM | KVT_FAULT_STUCK);
	j = store_start(c, &e, k[8], 8);
	if (!j)
		goto out;
	CHECK_OK(kvt_cache_job_cancel(j));
	CHECK_ERR(kvt_cache_job_poll(j), -EINPROGRESS); /* stuck: no end */
	kvt_fault_hold_jobs(0, 0);
	CHECK_ERR(kvt_cache_job_wait(j, -1), -ECANCELED);
	kvt_cache_job_free(j);
	lookup_n(c, 0, k[8], PP, &r);
	CHECK_EQ(r.pages, 0);
	CHECK_EQ(r.inflight, 0);
	/* its own slots went back; the pages it demoted moved (a fabric
	 * slot each gave up for a dram one: the same count) */
	CHECK_EQ(cache_used(c), used);
	CHECK(kvt_pool_used(kvt_tier_pool(kvt_cache_tier(c,
	      KVT_TIER_FABRIC))) < 32);
	for (uint32_t s = 0; s < 8; s++)
		load_ok(c, &e, k[s], s);
	CHECK_OK(kvt_cache_verify(c, &chk));
	CHECK_EQ(chk.bad, 0);
	CHECK_EQ(chk.checked, 8 * PP);
	/* and the same store, again, works */
	if ((j = store_start(c, &e, k[8], 8)))
		CHECK_OK(job_finish(j, NULL, 0, NULL));
	load_ok(c, &e, k[8], 8);
out:
	kvt_fault_hold_jobs(0, 0);
	kvt_cache_close(c);
	eng_free(&e);
}

static void test_closed(void)
{
	static kvt_page_key k[16][PP];
	kvt_cache_job *j;
	kvt_cache *c;
	eng e;

	test_phase = "closed";
	if (!(c = setup(&e, ENG_KV_OUTER, KVT_CACHE_NO_BACKGROUND, 0)))
		return;
	fill(c, &e, k);
	kvt_fault_hold_jobs(600000, KVT_FAULT_ROOM); /* a cancel ends it */
	j = store_start(c, &e, k[8], 8);
	kvt_cache_close(c); /* cancels it, waits for it */
	if (j) {
		CHECK_ERR(kvt_cache_job_poll(j), -ECANCELED);
		kvt_cache_job_free(j);
	}
	kvt_fault_hold_jobs(0, 0);
	eng_free(&e);
}

int main(void)
{
	char ssd[512];

	cache_small_init("test_cache_room_threads", ssd, sizeof(ssd));
	/* dram as small as the fabric (32 pages): test_in_order reaches ssd */
	snprintf(spec, sizeof(spec), "fabric:memfd,256K dram:256K "
		 "ssd:%s,4M,temp", ssd);
	test_returns_at_once();
	test_in_order();
	test_cancelled();
	test_closed();
	TEST_DONE();
}
