/*
 * test_sched_decide — kvt_sched_decide(), the scheduler's per-request
 * decisions for an engine's connector (issue 22 item 6), against
 * kvt_sched_plan_step() on the same request: the same cut (load or
 * recompute per tier run) and the same delay-hit wait, on the defining
 * cases and on random requests; kvt_sched_open() from a built-in profile;
 * bad input.
 */
#include "harness.h"
#include "cost_fixture.h"

static kvt_cost cost8; /* llama-3.1-8b on one H200 */
static unsigned nrun, nwait, ncut; /* what agree() compared */

static kvt_sched *mk(uint32_t clear)
{
	kvt_sched_config cfg;
	kvt_sched *s = NULL;

	CHECK_OK(kvt_sched_config_preset(&cfg, KVT_POLICY_KVTIER));
	cfg.features &= ~clear;
	CHECK_OK(kvt_sched_create(&s, &cfg, &cost8));
	return s;
}

/* 8,500 tokens: a dram run of @dram then an ssd run of @ssd */
static kvt_sched_req req2(uint32_t dram, uint32_t ssd)
{
	kvt_sched_req r = { .id = 1, .state = KVT_SREQ_WAITING,
			    .prompt = 8500 };

	r.tier[KVT_TIER_DRAM] = dram;
	r.tier[KVT_TIER_SSD] = ssd;
	r.nruns = 2;
	r.run_tier[0] = KVT_TIER_DRAM;
	r.run_tokens[0] = dram;
	r.run_tier[1] = KVT_TIER_SSD;
	r.run_tokens[1] = ssd;
	return r;
}

static kvt_sched_state st0(void)
{
	kvt_sched_state st = { .now = 0, .free_pages = 1000000 };
	return st;
}

/* decide() and plan_step() say the same about @r */
static void agree(kvt_sched *s, const kvt_sched_state *st, kvt_sched_req r)
{
	kvt_sched_hit h;
	kvt_sched_item it;
	kvt_sched_plan p;
	kvt_sched_req q = r;

	CHECK_OK(kvt_sched_decide(s, st, &r, st->decodes, &h));
	CHECK_OK(kvt_sched_plan_step(s, st, &q, 1, &it, &p));
	if (it.action == KVT_SACT_DEFER && it.reason == KVT_SWHY_TRANSIENT) {
		CHECK_EQ(h.wait, 1);
		nwait++;
		return;
	}
	CHECK_EQ(h.wait, 0);
	if (it.action != KVT_SACT_RUN)
		return;
	nrun++;
	ncut += h.recompute > 0;
	CHECK_EQ(r.hbm + h.load, it.reuse);
	CHECK_EQ(h.recompute, it.recompute);
	for (int t = 0; t < KVT_TIER_COUNT; t++)
		CHECK_EQ(h.recompute_tier[t], it.recompute_tier[t]);
}

static void test_cut(void)
{
	kvt_sched *s = mk(0);
	kvt_sched_state st = st0();
	kvt_sched_req r = req2(4000, 4000);
	kvt_sched_hit h;

	/* ssd slow: its run recomputed (but for what lands in time), dram's
	 * loaded */
	st.tier_gbps[KVT_TIER_DRAM] = 40;
	st.tier_gbps[KVT_TIER_SSD] = 0.5;
	CHECK_OK(kvt_sched_decide(s, &st, &r, 0, &h));
	CHECK(h.load >= 4000 && h.load < 5000);
	CHECK_EQ(h.load % 16, 0);
	CHECK_EQ(h.recompute_tier[KVT_TIER_DRAM], 0);
	CHECK_EQ(h.recompute, h.recompute_tier[KVT_TIER_SSD]);
	CHECK_EQ(h.load + h.recompute, 8000);
	CHECK(h.load_s > 0 && h.compute_s > 0);
	CHECK_EQ(h.wait, 0);
	agree(s, &st, r);

	/* a faster measured rate changes the answer: all loaded */
	st.tier_gbps[KVT_TIER_SSD] = 40;
	CHECK_OK(kvt_sched_decide(s, &st, &r, 0, &h));
	CHECK_EQ(h.load, 8000);
	CHECK_EQ(h.recompute, 0);
	agree(s, &st, r);

	/* a queue ahead on ssd counts like a slow rate */
	st.tier_free_at[KVT_TIER_SSD] = 5.0;
	CHECK_OK(kvt_sched_decide(s, &st, &r, 0, &h));
	CHECK(h.recompute_tier[KVT_TIER_SSD] >= 3500);
	agree(s, &st, r);
	kvt_sched_destroy(s);

	/* without RECOMPUTE: the whole hit, as before */
	s = mk(KVT_SCHED_RECOMPUTE);
	st = st0();
	st.tier_gbps[KVT_TIER_SSD] = 0.5;
	CHECK_OK(kvt_sched_decide(s, &st, &r, 0, &h));
	CHECK_EQ(h.load, 8000);
	CHECK_EQ(h.recompute, 0);
	agree(s, &st, r);
	kvt_sched_destroy(s);
}

static void test_wait(void)
{
	kvt_sched *s = mk(0);
	kvt_sched_state st = st0();
	kvt_sched_req r = { .id = 2, .state = KVT_SREQ_WAITING,
			    .prompt = 3000, .transient = 2900 };
	kvt_sched_hit h;

	/* expected sooner than computing 2,900 tokens: wait */
	r.transient_ready = 0.02;
	CHECK_OK(kvt_sched_decide(s, &st, &r, 0, &h));
	CHECK_EQ(h.wait, 1);
	CHECK(h.wait_s > 0.019 && h.wait_s < 0.021);
	agree(s, &st, r);
	/* expected later than that: compute */
	r.transient_ready = 10;
	CHECK_OK(kvt_sched_decide(s, &st, &r, 0, &h));
	CHECK_EQ(h.wait, 0);
	agree(s, &st, r);
	/* too short a span to wait for (delay_hit_tokens 100) */
	r.transient = 64;
	r.transient_ready = 0.001;
	CHECK_OK(kvt_sched_decide(s, &st, &r, 0, &h));
	CHECK_EQ(h.wait, 0);
	kvt_sched_destroy(s);
	/* DELAYHIT off */
	s = mk(KVT_SCHED_DELAYHIT);
	r.transient = 2900;
	r.transient_ready = 0.02;
	CHECK_OK(kvt_sched_decide(s, &st, &r, 0, &h));
	CHECK_EQ(h.wait, 0);
	kvt_sched_destroy(s);
}

/* random requests: decide() and plan_step() never disagree */
static void test_differential(void)
{
	uint64_t seed = 22;
	kvt_sched *s = mk(0);

	nrun = nwait = ncut = 0;
	for (int n = 0; n < 3000; n++) {
		kvt_sched_state st = st0();
		kvt_sched_req r = { .id = 3, .state = KVT_SREQ_WAITING };
		uint32_t left, k;

		r.prompt = 16 + (uint32_t)(test_rand(&seed) % 20000);
		left = r.prompt;
		r.hbm = (uint32_t)(test_rand(&seed) % (left / 4 + 1)) / 16 * 16;
		left -= r.hbm;
		for (k = 0; k < 1 + test_rand(&seed) % 4 && left > 16; k++) {
			uint32_t t = 1 + (uint32_t)(test_rand(&seed) % 3);
			uint32_t m = (uint32_t)(test_rand(&seed) %
						(left / 2 + 1)) / 16 * 16;

			r.run_tier[k] = t;
			r.run_tokens[k] = m;
			r.tier[t] += m;
			left -= m;
		}
		r.nruns = k;
		if (test_rand(&seed) % 3 == 0) {
			r.transient = (uint32_t)(test_rand(&seed) % (left + 1));
			r.transient_ready = (double)(test_rand(&seed) % 1000) /
					    10000;
		}
		for (int t = 1; t < KVT_TIER_REMOTE; t++) {
			static const double g[] = { 0, 0.05, 0.3, 2, 8, 40 };

			st.tier_gbps[t] = g[test_rand(&seed) % 6];
		}
		st.decodes = (uint32_t)(test_rand(&seed) % 64);
		st.decode_ctx = (uint64_t)st.decodes * 2000;
		agree(s, &st, r);
	}
	/* the random requests covered every kind of answer */
	CHECK(nrun > 500 && nwait > 50 && ncut > 100);
	kvt_sched_destroy(s);
}

static void test_open_and_bad_input(void)
{
	kvt_sched *s = NULL;
	kvt_sched_state st = st0();
	kvt_sched_req r = req2(4000, 4000);
	kvt_sched_hit h;
	kvt_geom g;

	CHECK_OK(kvt_geom_preset(&g, "llama-3.1-8b", 16, 1, 0));
	CHECK_OK(kvt_sched_open(&s, NULL, NULL, NULL, &g));
	CHECK(kvt_sched_get_config(s)->features & KVT_SCHED_RECOMPUTE);
	CHECK_EQ(kvt_sched_get_cost(s)->page_tokens, 16);
	st.tier_gbps[KVT_TIER_SSD] = 0.01;
	CHECK_OK(kvt_sched_decide(s, &st, &r, 0, &h));
	CHECK(h.recompute_tier[KVT_TIER_SSD] > 0);
	kvt_sched_destroy(s);
	CHECK_OK(kvt_sched_open(&s, "vllm", "recompute,-overlap", "h100", &g));
	CHECK_EQ(kvt_sched_get_config(s)->features &
			 (KVT_SCHED_RECOMPUTE | KVT_SCHED_OVERLAP),
		 KVT_SCHED_RECOMPUTE);
	kvt_sched_destroy(s);
	CHECK_ERR(kvt_sched_open(&s, "nope", NULL, NULL, &g), KVT_ECONFIG);
	CHECK(s == NULL);
	CHECK_ERR(kvt_sched_open(&s, NULL, "+bogus", NULL, &g), KVT_ECONFIG);
	CHECK_ERR(kvt_sched_open(&s, NULL, NULL, "no-such-profile", &g),
		  KVT_ENOTFOUND);
	CHECK_ERR(kvt_sched_open(NULL, NULL, NULL, NULL, &g), -EINVAL);
	CHECK_ERR(kvt_sched_open(&s, NULL, NULL, NULL, NULL), -EINVAL);

	s = mk(0);
	CHECK_ERR(kvt_sched_decide(NULL, &st, &r, 0, &h), -EINVAL);
	CHECK_ERR(kvt_sched_decide(s, &st, &r, 0, NULL), -EINVAL);
	r.state = KVT_SREQ_PREFILL;
	CHECK_ERR(kvt_sched_decide(s, &st, &r, 0, &h), -EINVAL);
	r = req2(4000, 4000);
	r.prompt = 100; /* spans past the prompt */
	CHECK_ERR(kvt_sched_decide(s, &st, &r, 0, &h), -EINVAL);
	r = req2(4000, 4000);
	r.run_tokens[1] = 10; /* runs disagree with tier[] */
	CHECK_ERR(kvt_sched_decide(s, &st, &r, 0, &h), -EINVAL);
	kvt_sched_destroy(s);
}

int main(void)
{
	if (fixture_cost(&cost8, "llama-3.1-8b", 1)) {
		fprintf(stderr, "cost fixture: %s\n", kvt_errdetail());
		return 1;
	}
	test_cut();
	test_wait();
	test_differential();
	test_open_and_bad_input();
	TEST_DONE();
}
