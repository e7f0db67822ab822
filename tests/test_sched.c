/*
 * test_sched — the scheduler's policies on hand-built queues, each on its
 * defining case (SPEC.md part 4, issue 5):
 *   delay-hit   two requests on one prefix: one computes, one waits
 *   balance     a cache-heavy request paired with a compute-heavy one
 *   stall-hide  a load no batch can hide: decodes run while it loads
 *   starve      the bound on passes-over holds under adversarial arrivals
 * plus the FCFS baselines against a plain reference scheduler on random
 * queues, the plan invariants on random queues for every policy, bad
 * input, and failing every allocation of kvt_sched_create().
 */
#include "harness.h"
#include "cost_fixture.h"

static kvt_cost cost8; /* llama-3.1-8b on one H200 */

static kvt_sched *mk(kvt_sched_policy p, uint32_t features_or_all)
{
	kvt_sched_config cfg;
	kvt_sched *s = NULL;

	CHECK_OK(kvt_sched_config_preset(&cfg, p));
	/* the policies other than load-or-recompute, each on its own case
	 * (test_recompute has that one) */
	cfg.features &= ~(uint32_t)KVT_SCHED_RECOMPUTE;
	if (features_or_all != UINT32_MAX)
		cfg.features = features_or_all & ~(uint32_t)KVT_SCHED_RECOMPUTE;
	CHECK_OK(kvt_sched_create(&s, &cfg, &cost8));
	return s;
}

static kvt_sched_req waiting(uint64_t id, uint32_t prompt, uint32_t hbm,
			     uint32_t dram)
{
	kvt_sched_req r = { .id = id, .state = KVT_SREQ_WAITING,
			    .prompt = prompt, .hbm = hbm };

	r.tier[KVT_TIER_DRAM] = dram;
	return r;
}

static kvt_sched_state state(double now, uint32_t decodes)
{
	kvt_sched_state st = { .now = now, .decodes = decodes,
			       .decode_ctx = (uint64_t)decodes * 4000,
			       .free_pages = 1000000 };
	return st;
}

/* delay-hit: A and B share an uncached 8k-token context. */
static void test_delay_hit(void)
{
	kvt_sched_req q[2];
	kvt_sched_item it[2];
	kvt_sched_plan p;
	kvt_sched_state st = state(0, 0);
	kvt_sched *s;

	/* one step: the bundle rule — A computes the context, B waits */
	s = mk(KVT_POLICY_KVTIER, UINT32_MAX);
	q[0] = waiting(1, 3000, 0, 0);
	q[1] = waiting(2, 2950, 0, 0);
	q[0].group = q[1].group = 77;
	q[0].group_tokens = q[1].group_tokens = 2900;
	CHECK_OK(kvt_sched_plan_step(s, &st, q, 2, it, &p));
	CHECK_EQ(it[0].action, KVT_SACT_RUN);
	CHECK_EQ(it[1].action, KVT_SACT_DEFER);
	CHECK_EQ(it[1].reason, KVT_SWHY_TRANSIENT);
	CHECK_EQ(p.nrun, 1);

	/* next step the index reports A's context as transient for B: B
	 * keeps waiting at the head while a later request runs */
	q[0] = q[1];
	q[0].transient = 2900;
	q[0].transient_ready = 0.02; /* sooner than B computes 2900 tokens */
	q[1] = waiting(3, 500, 0, 0);
	CHECK_OK(kvt_sched_plan_step(s, &st, q, 2, it, &p));
	CHECK_EQ(it[0].action, KVT_SACT_DEFER);
	CHECK_EQ(it[1].action, KVT_SACT_RUN);
	CHECK_EQ(q[0].skips, 1);
	/* expected later than B could compute it itself (~80 ms on one
	 * H200): waiting would cost more than recomputing, so B runs */
	q[0].skips = 0;
	q[0].transient_ready = 0.3;
	CHECK(kvt_cost_prefill_s(&cost8, 2900, 0) < 0.3);
	CHECK_OK(kvt_sched_plan_step(s, &st, q, 2, it, &p));
	CHECK_EQ(it[0].action, KVT_SACT_RUN);
	/* already due: wait (it is about to land) */
	q[0].transient_ready = -1;
	CHECK_OK(kvt_sched_plan_step(s, &st, q, 2, it, &p));
	CHECK_EQ(it[0].action, KVT_SACT_DEFER);
	q[0].transient_ready = 0.02;
	q[0].skips = 1;
	/* a small overlap (<= 100 tokens) is not worth waiting for */
	q[0].transient = 100;
	q[0].skips = 0;
	CHECK_OK(kvt_sched_plan_step(s, &st, q, 2, it, &p));
	CHECK_EQ(it[0].action, KVT_SACT_RUN);
	CHECK_EQ(it[0].compute, 2950); /* it computes the overlap itself */
	kvt_sched_destroy(s);

	/* without the policy (and in the FCFS baselines) both compute */
	for (int pol = 0; pol < 3; pol++) {
		s = mk((kvt_sched_policy)pol,
		       pol == KVT_POLICY_KVTIER ?
			       KVT_SCHED_ALL & ~KVT_SCHED_DELAYHIT :
			       UINT32_MAX);
		q[0] = waiting(1, 3000, 0, 0);
		q[1] = waiting(2, 2950, 0, 0);
		q[0].group = q[1].group = 77;
		q[0].group_tokens = q[1].group_tokens = 2900;
		CHECK_OK(kvt_sched_plan_step(s, &st, q, 2, it, &p));
		CHECK_EQ(it[0].action, KVT_SACT_RUN);
		CHECK_EQ(it[1].action, KVT_SACT_RUN);
		CHECK_EQ(it[1].compute, 2950);
		kvt_sched_destroy(s);
	}
}

/* balance: a cache-heavy request (31.9k tokens to load, 100 to compute)
 * cannot hide its load alone; a compute-heavy one further back can. */
static void test_balance(void)
{
	kvt_sched_req q[3];
	kvt_sched_item it[3];
	kvt_sched_plan p;
	kvt_sched_state st = state(0, 0);
	kvt_sched *s = mk(KVT_POLICY_KVTIER, UINT32_MAX);
	double load = kvt_cost_copy_s(&cost8, KVT_COPY_GATHER, cost8.chunk_bytes,
				      31900ull * cost8.token_bytes);

	q[0] = waiting(1, 32000, 0, 31900); /* cache-heavy */
	q[1] = waiting(2, 300, 0, 0);       /* small */
	q[2] = waiting(3, 6000, 0, 0);      /* compute-heavy */
	/* the premise: alone, the load is far longer than the compute */
	CHECK(load > 4 * kvt_cost_prefill_s(&cost8, 100, 31900));
	CHECK(load < kvt_cost_prefill_s(&cost8, 6000, 0));
	CHECK_OK(kvt_sched_plan_step(s, &st, q, 3, it, &p));
	CHECK_EQ(it[0].action, KVT_SACT_RUN); /* paired */
	CHECK_EQ(it[0].load, 31900);
	CHECK_EQ(it[0].reuse, 31900);
	CHECK_EQ(it[0].compute, 100);
	CHECK_EQ(it[1].action, KVT_SACT_RUN);
	CHECK_EQ(it[2].action, KVT_SACT_RUN);
	CHECK_EQ(p.nrun, 3);
	/* the step is not longer than its compute plus one layer of load */
	CHECK(p.est_step_s <= p.est_compute_s + load / cost8.layers + 1e-9);

	/* the same without the compute-heavy partner: the cache-heavy
	 * request waits on I/O (its loads start), the small one runs */
	CHECK_OK(kvt_sched_plan_step(s, &st, q, 2, it, &p));
	CHECK_EQ(it[0].action, KVT_SACT_PREFETCH);
	CHECK_EQ(it[0].reason, KVT_SWHY_IO);
	CHECK_EQ(it[0].load, 31900);
	CHECK_EQ(it[1].action, KVT_SACT_RUN);
	CHECK_EQ(q[0].skips, 1);
	kvt_sched_destroy(s);

	/* lmcache: FCFS, the head runs and the step waits for its load */
	s = mk(KVT_POLICY_LMCACHE, UINT32_MAX);
	q[0].skips = 0;
	CHECK_OK(kvt_sched_plan_step(s, &st, q, 2, it, &p));
	CHECK_EQ(it[0].action, KVT_SACT_RUN);
	CHECK_EQ(it[0].reuse, 31744); /* whole 256-token objects only */
	CHECK_EQ(it[0].compute, 32000 - 31744);
	CHECK(p.est_step_s >= p.est_load_s + p.est_compute_s - 1e-12);
	kvt_sched_destroy(s);
}

/* stall hiding: nothing can hide the load, decodes are running. */
static void test_stall_hide(void)
{
	kvt_sched_req q[1];
	kvt_sched_item it[1];
	kvt_sched_plan p;
	kvt_sched_state st = state(0, 32);
	kvt_sched *s = mk(KVT_POLICY_KVTIER, UINT32_MAX);

	q[0] = waiting(1, 32000, 0, 31900);
	CHECK_OK(kvt_sched_plan_step(s, &st, q, 1, it, &p));
	CHECK(p.decode_only);
	CHECK_EQ(p.decodes, 32);
	CHECK_EQ(p.nrun, 0);
	CHECK_EQ(it[0].action, KVT_SACT_PREFETCH);
	CHECK_EQ(it[0].load, 31900);
	CHECK_EQ(p.est_load_s, 0);
	CHECK(p.est_step_s < 0.05);

	/* a later step: the loads are in flight and done by now */
	q[0].loading = 31900;
	q[0].loading_ready = 0.5;
	st.now = 0.6;
	CHECK_OK(kvt_sched_plan_step(s, &st, q, 1, it, &p));
	CHECK_EQ(it[0].action, KVT_SACT_RUN);
	CHECK_EQ(it[0].load, 0);
	CHECK(!p.decode_only);
	kvt_sched_destroy(s);

	/* without stall hiding the request runs and the step stalls */
	s = mk(KVT_POLICY_KVTIER, KVT_SCHED_ALL & ~KVT_SCHED_STALLHIDE);
	st.now = 0;
	q[0] = waiting(1, 32000, 0, 31900);
	CHECK_OK(kvt_sched_plan_step(s, &st, q, 1, it, &p));
	CHECK_EQ(it[0].action, KVT_SACT_RUN);
	CHECK(p.est_load_s > 0.05);
	kvt_sched_destroy(s);

	/* no decodes to hide behind: the request runs (nothing else to do) */
	s = mk(KVT_POLICY_KVTIER, UINT32_MAX);
	st = state(0, 0);
	CHECK_OK(kvt_sched_plan_step(s, &st, q, 1, it, &p));
	CHECK_EQ(it[0].action, KVT_SACT_RUN);
	kvt_sched_destroy(s);
}

/* starvation: an adversary keeps a transient span over the head request
 * and short requests keep arriving behind it; with STARVE it runs after
 * max_skips passes, without it never does. */
static void test_starve(void)
{
	for (int with = 0; with < 2; with++) {
		kvt_sched *s = mk(KVT_POLICY_KVTIER,
				  with ? KVT_SCHED_ALL :
					 KVT_SCHED_ALL & ~KVT_SCHED_STARVE);
		kvt_sched_req q[4];
		kvt_sched_item it[4];
		kvt_sched_plan p;
		kvt_sched_state st = state(0, 4);
		int ran_at = -1;
		uint32_t max_seen = 0;

		q[0] = waiting(1, 9000, 0, 0);
		for (int step = 0; step < 40 && ran_at < 0; step++) {
			q[0].transient = 8000; /* never resolves */
			q[0].transient_ready = st.now + 0.01;
			for (int k = 1; k < 4; k++)
				q[k] = waiting(100 + step * 4 + k, 200, 0, 0);
			CHECK_OK(kvt_sched_plan_step(s, &st, q, 4, it, &p));
			if (it[0].action == KVT_SACT_RUN)
				ran_at = step;
			if (q[0].skips > max_seen)
				max_seen = q[0].skips;
			st.now += 0.05;
		}
		if (with) {
			CHECK_EQ(ran_at, 8);   /* max_skips = 8 */
			CHECK(max_seen <= 8);
		} else {
			CHECK_EQ(ran_at, -1);
			CHECK(max_seen >= 39);
		}
		kvt_sched_destroy(s);
	}
}

/* A starved request that does not fit blocks everyone behind it. */
static void test_starve_capacity(void)
{
	kvt_sched *s = mk(KVT_POLICY_KVTIER, UINT32_MAX);
	kvt_sched_req q[2];
	kvt_sched_item it[2];
	kvt_sched_plan p;
	kvt_sched_state st = state(0, 0);

	q[0] = waiting(1, 9000, 0, 0);
	q[0].skips = 8;
	q[1] = waiting(2, 100, 0, 0);
	st.free_pages = 100; /* 1600 tokens: q[0] does not fit */
	CHECK_OK(kvt_sched_plan_step(s, &st, q, 2, it, &p));
	CHECK_EQ(it[0].action, KVT_SACT_WAIT);
	CHECK_EQ(it[0].reason, KVT_SWHY_CAPACITY);
	CHECK_EQ(it[1].action, KVT_SACT_WAIT);
	CHECK_EQ(it[1].reason, KVT_SWHY_ORDER);
	CHECK_EQ(q[0].skips, 8);
	kvt_sched_destroy(s);
}

/* Admission takes the whole prompt's pages, minus what the caller already
 * holds; a running prefill never needs new pages; prefetch leaves the
 * head's pages alone. */
static void test_capacity(void)
{
	kvt_sched *s = mk(KVT_POLICY_KVTIER, UINT32_MAX);
	kvt_sched_req q[3];
	kvt_sched_item it[3];
	kvt_sched_plan p;
	kvt_sched_state st = state(0, 0);

	/* 20000 tokens: 1250 pages, though the first chunk is 8192 tokens */
	q[0] = waiting(1, 20000, 0, 0);
	st.free_pages = 1249;
	CHECK_OK(kvt_sched_plan_step(s, &st, q, 1, it, &p));
	CHECK_EQ(it[0].action, KVT_SACT_WAIT);
	CHECK_EQ(it[0].reason, KVT_SWHY_CAPACITY);
	st.free_pages = 1250;
	CHECK_OK(kvt_sched_plan_step(s, &st, q, 1, it, &p));
	CHECK_EQ(it[0].action, KVT_SACT_RUN);
	CHECK_EQ(p.pages, 1250);
	/* pages held already are not taken again */
	q[0].reserved = 1250;
	st.free_pages = 0;
	CHECK_OK(kvt_sched_plan_step(s, &st, q, 1, it, &p));
	CHECK_EQ(it[0].action, KVT_SACT_RUN);
	CHECK_EQ(p.pages, 0);
	/* a running prefill continues with no free page */
	q[0].state = KVT_SREQ_PREFILL;
	q[0].done = 8192;
	q[0].reserved = 1250 - 512;
	CHECK_OK(kvt_sched_plan_step(s, &st, q, 1, it, &p));
	CHECK_EQ(it[0].action, KVT_SACT_RUN);
	CHECK_EQ(it[0].compute, 8192);
	/* the head (cold, nothing to load) needs 600 pages; a cache-heavy
	 * request behind it may prefetch only what is left beyond that */
	q[0] = waiting(1, 9600, 0, 0);   /* 600 pages */
	q[1] = waiting(2, 32000, 0, 31900); /* 2000 pages */
	st = state(0, 8);
	st.free_pages = 2400;
	CHECK_OK(kvt_sched_plan_step(s, &st, q, 2, it, &p));
	CHECK_EQ(it[0].action, KVT_SACT_RUN); /* fits: runs */
	CHECK_EQ(it[1].action, KVT_SACT_WAIT); /* 2400-600 < 2000 */
	CHECK_EQ(it[1].load, 0);
	st.free_pages = 2600;
	CHECK_OK(kvt_sched_plan_step(s, &st, q, 2, it, &p));
	CHECK_EQ(it[0].action, KVT_SACT_RUN);
	CHECK(it[1].action == KVT_SACT_PREFETCH || it[1].action == KVT_SACT_RUN);
	CHECK_EQ(it[1].load, 31900);
	/* with the head unable to fit, nothing behind it takes its pages */
	st.free_pages = 500;
	CHECK_OK(kvt_sched_plan_step(s, &st, q, 2, it, &p));
	CHECK_EQ(it[0].action, KVT_SACT_WAIT);
	CHECK_EQ(it[1].load, 0);
	kvt_sched_destroy(s);
}

/* ---- FCFS against a plain reference ------------------------------------ */

static uint64_t pages_for(uint64_t from, uint64_t to)
{
	uint64_t a = (from + 15) / 16, b = (to + 15) / 16;
	return b > a ? b - a : 0;
}

/* The obvious FCFS: running prefills, then waiting requests in order,
 * chunked by the budget, until one does not fit. */
static void ref_fcfs(const kvt_sched_config *cfg, const kvt_sched_state *st,
		     const kvt_sched_req *q, size_t n, uint32_t *compute)
{
	uint32_t budget = cfg->token_budget, seqs = cfg->max_batch, d;
	uint64_t pages = st->free_pages;

	memset(compute, 0, n * sizeof(*compute));
	d = st->decodes < budget ? st->decodes : budget;
	d = d < seqs ? d : seqs;
	budget -= d;
	seqs -= d;
	for (size_t i = 0; i < n; i++) {
		uint32_t reuse, need, chunk, load = 0, held;
		uint64_t pg;

		compute[i] = 0;
		if (q[i].state == KVT_SREQ_PREFILL) {
			reuse = held = q[i].done;
		} else {
			uint32_t hbm = q[i].hbm < q[i].prompt - 1 ?
					       q[i].hbm : q[i].prompt - 1;

			for (int t = 1; t < KVT_TIER_COUNT; t++)
				load += q[i].tier[t];
			if (load > q[i].prompt - 1 - hbm)
				load = q[i].prompt - 1 - hbm;
			if (cfg->hit_align) {
				uint32_t top = (hbm + load) / cfg->hit_align *
					       cfg->hit_align;
				load = top > hbm ? top - hbm : 0;
			}
			reuse = hbm + load;
			held = hbm + (q[i].loading < load ? q[i].loading : load);
		}
		need = q[i].prompt - reuse;
		chunk = need < budget ? need : budget;
		if (!chunk || !seqs)
			return;
		pg = pages_for(held, q[i].prompt);
		pg = pg > q[i].reserved ? pg - q[i].reserved : 0;
		if (pg > pages)
			return;
		compute[i] = chunk;
		budget -= chunk;
		seqs--;
		pages -= pg;
	}
}

static void random_queue(uint64_t *seed, kvt_sched_req *q, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		uint32_t prompt = (uint32_t)(1 + test_rand(seed) % 20000);
		uint32_t rest;

		memset(&q[i], 0, sizeof(q[i]));
		q[i].id = i;
		q[i].prompt = prompt;
		if (i < 2 && test_rand(seed) % 2) {
			q[i].state = KVT_SREQ_PREFILL;
			q[i].done = (uint32_t)(test_rand(seed) % prompt);
			/* a running prefill holds its remainder */
			q[i].reserved = (prompt + 15) / 16 -
					(q[i].done + 15) / 16;
			continue;
		}
		q[i].hbm = (uint32_t)(test_rand(seed) % (prompt + 1)) / 16 * 16;
		rest = prompt - q[i].hbm;
		q[i].tier[KVT_TIER_DRAM] = (uint32_t)(test_rand(seed) % (rest + 1));
		rest -= q[i].tier[KVT_TIER_DRAM];
		q[i].tier[KVT_TIER_SSD] = (uint32_t)(test_rand(seed) % (rest + 1));
		rest -= q[i].tier[KVT_TIER_SSD];
		if (test_rand(seed) % 4 == 0) {
			q[i].transient = (uint32_t)(test_rand(seed) % (rest + 1));
			q[i].transient_ready = 0.1;
		}
		if (test_rand(seed) % 3 == 0) {
			q[i].loading = q[i].tier[KVT_TIER_DRAM];
			q[i].loading_ready = (double)(test_rand(seed) % 100) / 1000;
		}
		if (test_rand(seed) % 5 == 0) {
			q[i].group = 1 + test_rand(seed) % 3;
			q[i].group_tokens = (uint32_t)(test_rand(seed) % prompt);
		}
		q[i].skips = (uint32_t)(test_rand(seed) % 10);
		q[i].reserved = (uint32_t)(test_rand(seed) % 4 ?
			0 : test_rand(seed) % (prompt / 16 + 1));
	}
}

static void test_fcfs_differential(void)
{
	uint64_t seed = 42;

	for (int pol = KVT_POLICY_LMCACHE; pol <= KVT_POLICY_HICACHE; pol++) {
		kvt_sched *s = mk((kvt_sched_policy)pol, UINT32_MAX);
		const kvt_sched_config *cfg = kvt_sched_get_config(s);

		for (int round = 0; round < 2000; round++) {
			kvt_sched_req q[12];
			kvt_sched_item it[12];
			uint32_t want[12];
			kvt_sched_plan p;
			kvt_sched_state st = state(0, (uint32_t)(test_rand(&seed) % 300));
			size_t n = 1 + test_rand(&seed) % 12;
			int bad = 0;

			st.free_pages = test_rand(&seed) % 5000;
			random_queue(&seed, q, n);
			ref_fcfs(cfg, &st, q, n, want);
			CHECK_OK(kvt_sched_plan_step(s, &st, q, n, it, &p));
			for (size_t i = 0; i < n; i++) {
				uint32_t got = it[i].action == KVT_SACT_RUN ?
						       it[i].compute : 0;
				bad |= got != want[i];
				bad |= it[i].action == KVT_SACT_DEFER ||
				       it[i].action == KVT_SACT_PREFETCH;
			}
			CHECK(!bad);
			if (bad)
				break;
		}
		kvt_sched_destroy(s);
	}
}

/* Plan invariants for every policy and feature mix on random queues. */
static void test_invariants(void)
{
	uint64_t seed = 4242;

	for (int round = 0; round < 3000; round++) {
		uint32_t feats = (uint32_t)(test_rand(&seed) % (KVT_SCHED_ALL + 1));
		kvt_sched *s = mk((kvt_sched_policy)(round % 3),
				  round % 3 == 2 ? feats : UINT32_MAX);
		const kvt_sched_config *cfg = kvt_sched_get_config(s);
		kvt_sched_req q[16];
		kvt_sched_item it[16];
		kvt_sched_plan p;
		kvt_sched_state st = state((double)(test_rand(&seed) % 100) / 1000,
					   (uint32_t)(test_rand(&seed) % 300));
		size_t n = test_rand(&seed) % 16;
		uint64_t tokens = 0, pages = 0;
		uint32_t runs = 0;

		st.free_pages = test_rand(&seed) % 8000;
		st.link_free_at = (double)(test_rand(&seed) % 100) / 1000;
		random_queue(&seed, q, n);
		CHECK_OK(kvt_sched_plan_step(s, &st, q, n, it, &p));
		for (size_t i = 0; i < n; i++) {
			if (it[i].action == KVT_SACT_RUN) {
				CHECK(it[i].compute >= 1);
				CHECK(it[i].compute + it[i].reuse <= q[i].prompt);
				tokens += it[i].compute;
				runs++;
				CHECK_EQ(q[i].skips, 0);
			}
			if (it[i].action != KVT_SACT_RUN &&
			    it[i].action != KVT_SACT_PREFETCH &&
			    it[i].action != KVT_SACT_DEFER)
				CHECK_EQ(it[i].load, 0);
		}
		CHECK_EQ(runs, p.nrun);
		CHECK_EQ(tokens, p.compute_tokens);
		CHECK(tokens + p.decodes <= cfg->token_budget);
		CHECK(runs + p.decodes <= cfg->max_batch);
		pages = p.pages;
		CHECK(pages <= st.free_pages);
		CHECK(p.est_step_s >= p.est_compute_s - 1e-12);
		kvt_sched_destroy(s);
	}
}

static void test_bad_input(void)
{
	kvt_sched *s = mk(KVT_POLICY_KVTIER, UINT32_MAX);
	kvt_sched_req q[2];
	kvt_sched_item it[2];
	kvt_sched_plan p;
	kvt_sched_state st = state(0, 0);
	kvt_sched_config cfg;
	uint32_t f = 0;

	q[0] = waiting(1, 100, 0, 10);
	q[1] = waiting(2, 100, 60, 50);
	CHECK_ERR(kvt_sched_plan_step(s, &st, q, 2, it, &p), -EINVAL);
	CHECK(strstr(kvt_errdetail(), "request 1") != NULL);
	q[1] = waiting(2, 0, 0, 0);
	CHECK_ERR(kvt_sched_plan_step(s, &st, q, 2, it, &p), -EINVAL);
	q[1] = waiting(2, 100, 0, 10);
	q[1].loading = 20;
	CHECK_ERR(kvt_sched_plan_step(s, &st, q, 2, it, &p), -EINVAL);
	CHECK_ERR(kvt_sched_plan_step(s, NULL, q, 2, it, &p), -EINVAL);
	CHECK_OK(kvt_sched_plan_step(s, &st, NULL, 0, it, &p));
	CHECK_EQ(p.nrun, 0);
	kvt_sched_destroy(s);

	CHECK_OK(kvt_sched_config_preset(&cfg, KVT_POLICY_KVTIER));
	cfg.token_budget = 0;
	CHECK_ERR(kvt_sched_create(&s, &cfg, &cost8), KVT_ECONFIG);
	CHECK_OK(kvt_sched_config_preset(&cfg, KVT_POLICY_KVTIER));
	cfg.balance_ratio = 0;
	CHECK_ERR(kvt_sched_create(&s, &cfg, &cost8), KVT_ECONFIG);
	CHECK_ERR(kvt_sched_config_preset(&cfg, KVT_POLICY_COUNT), -EINVAL);
	{
		kvt_cost c = cost8;

		c.copy[KVT_COPY_GATHER].n = 0;
		CHECK_OK(kvt_sched_config_preset(&cfg, KVT_POLICY_KVTIER));
		CHECK_ERR(kvt_sched_create(&s, &cfg, &c), KVT_ECONFIG);
		CHECK(strstr(kvt_errdetail(), "gather") != NULL);
	}

	CHECK_OK(kvt_sched_features_parse("delay-hit,+starve", &f));
	CHECK_EQ(f, KVT_SCHED_DELAYHIT | KVT_SCHED_STARVE);
	CHECK_OK(kvt_sched_features_parse("all,-balance", &f));
	CHECK_EQ(f, KVT_SCHED_ALL & ~KVT_SCHED_BALANCE);
	CHECK_ERR(kvt_sched_features_parse("all,-telepathy", &f), KVT_ECONFIG);
	CHECK(strstr(kvt_errdetail(), "telepathy") != NULL);
	CHECK_EQ(f, KVT_SCHED_ALL & ~KVT_SCHED_BALANCE); /* unchanged */
	CHECK(!strcmp(kvt_sched_feature_name(KVT_SCHED_STALLHIDE), "stall-hide"));
	CHECK(kvt_sched_feature_name(3) == NULL);
}

/* Fail every allocation of create and of a big plan in turn. */
static void test_alloc_faults(void)
{
	kvt_sched_config cfg;
	kvt_sched *s = NULL;
	kvt_sched_req *q = calloc(600, sizeof(*q));
	kvt_sched_item *it = calloc(600, sizeof(*it));
	kvt_sched_plan p;
	kvt_sched_state st = state(0, 0);
	int ok = 0;

	CHECK_OK(kvt_sched_config_preset(&cfg, KVT_POLICY_KVTIER));
	for (uint64_t n = 1; n < 10 && !ok; n++) {
		int64_t live = kvt_alloc_live();
		int err;

		kvt_alloc_fail_at(n);
		err = kvt_sched_create(&s, &cfg, &cost8);
		kvt_alloc_fail_at(0);
		if (!err) {
			ok = 1;
			break;
		}
		CHECK_ERR(err, -ENOMEM);
		CHECK_EQ(kvt_alloc_live(), live);
	}
	CHECK(ok);
	for (int i = 0; i < 600; i++)
		q[i] = waiting((uint64_t)i, 100, 0, 0);
	for (uint64_t n = 1; n <= 2; n++) {
		int64_t live = kvt_alloc_live();

		kvt_alloc_fail_at(n);
		CHECK_ERR(kvt_sched_plan_step(s, &st, q, 600, it, &p), -ENOMEM);
		kvt_alloc_fail_at(0);
		CHECK_EQ(kvt_alloc_live(), live);
	}
	CHECK_OK(kvt_sched_plan_step(s, &st, q, 600, it, &p));
	CHECK_EQ(p.nrun, 82); /* the budget: 81 x 100 tokens + 92 */
	kvt_sched_destroy(s);
	free(q);
	free(it);
}

/* load or recompute, per tier run: 8000 cached tokens, the first 4000 in
 * dram, the next 4000 in ssd, then 500 new ones. A slow tier's run is
 * recomputed, a fast one's loaded; the decision is counted per tier, the
 * load priced at the caller's measured rates. */
static kvt_sched_req split_req(void)
{
	kvt_sched_req r = waiting(1, 8500, 0, 4000);

	r.tier[KVT_TIER_SSD] = 4000;
	r.nruns = 2;
	r.run_tier[0] = KVT_TIER_DRAM;
	r.run_tokens[0] = 4000;
	r.run_tier[1] = KVT_TIER_SSD;
	r.run_tokens[1] = 4000;
	return r;
}

static void test_recompute(void)
{
	kvt_sched_req q[1];
	kvt_sched_item it[1];
	kvt_sched_plan p;
	kvt_sched_state st = state(0, 0);
	kvt_sched_config cfg;
	kvt_sched *s;
	uint32_t lone, crowded;

	CHECK_OK(kvt_sched_config_preset(&cfg, KVT_POLICY_KVTIER));
	CHECK(cfg.features & KVT_SCHED_RECOMPUTE);
	CHECK_OK(kvt_sched_create(&s, &cfg, &cost8));
	/* dram at 40 GB/s, ssd at 0.5: the ssd run would take 1 s to land,
	 * computing it ~0.15 s: recomputed but for the part that lands while
	 * the rest computes (~500 tokens); the dram run loaded */
	st.tier_gbps[KVT_TIER_DRAM] = 40;
	st.tier_gbps[KVT_TIER_SSD] = 0.5;
	q[0] = split_req();
	CHECK_OK(kvt_sched_plan_step(s, &st, q, 1, it, &p));
	CHECK_EQ(it[0].action, KVT_SACT_RUN);
	CHECK_EQ(it[0].recompute_tier[KVT_TIER_DRAM], 0);
	CHECK(it[0].recompute_tier[KVT_TIER_SSD] >= 3000);
	CHECK(it[0].recompute_tier[KVT_TIER_SSD] < 4000);
	CHECK_EQ(it[0].recompute, it[0].recompute_tier[KVT_TIER_SSD]);
	CHECK_EQ(it[0].reuse + it[0].recompute, 8000);
	CHECK_EQ(it[0].load, it[0].reuse);
	CHECK(it[0].load >= 4000);
	CHECK_EQ(it[0].load % 16, 0);
	CHECK_EQ(p.recompute_tokens, it[0].recompute);
	lone = it[0].recompute;

	/* both fast: everything is loaded */
	st.tier_gbps[KVT_TIER_SSD] = 40;
	q[0] = split_req();
	CHECK_OK(kvt_sched_plan_step(s, &st, q, 1, it, &p));
	CHECK_EQ(it[0].recompute, 0);
	CHECK_EQ(it[0].load, 8000);

	/* the slow tier with a long queue ahead: recomputed too */
	st.tier_gbps[KVT_TIER_SSD] = 40;
	st.tier_free_at[KVT_TIER_SSD] = 5.0;
	q[0] = split_req();
	CHECK_OK(kvt_sched_plan_step(s, &st, q, 1, it, &p));
	CHECK(it[0].recompute_tier[KVT_TIER_SSD] >= 3500);
	CHECK_EQ(it[0].recompute_tier[KVT_TIER_DRAM], 0);
	st.tier_free_at[KVT_TIER_SSD] = 0;

	/* the first run slow instead (the rates, not the tier names,
	 * decide): most of dram's run is computed, and the fast run after
	 * it with it (a loaded prefix is contiguous) */
	st.tier_gbps[KVT_TIER_DRAM] = 0.5;
	st.tier_gbps[KVT_TIER_SSD] = 40;
	q[0] = split_req();
	CHECK_OK(kvt_sched_plan_step(s, &st, q, 1, it, &p));
	CHECK(it[0].recompute_tier[KVT_TIER_DRAM] >= 1000);
	CHECK_EQ(it[0].recompute_tier[KVT_TIER_SSD], 4000);

	/* sharing the GPU with 200 decodes makes recomputing dearer */
	st.tier_gbps[KVT_TIER_DRAM] = 40;
	st.tier_gbps[KVT_TIER_SSD] = 2;
	q[0] = split_req();
	CHECK_OK(kvt_sched_plan_step(s, &st, q, 1, it, &p));
	lone = it[0].recompute;
	st = state(0, 200);
	st.tier_gbps[KVT_TIER_DRAM] = 40;
	st.tier_gbps[KVT_TIER_SSD] = 2;
	q[0] = split_req();
	CHECK_OK(kvt_sched_plan_step(s, &st, q, 1, it, &p));
	crowded = it[0].recompute;
	CHECK(crowded < lone);
	kvt_sched_destroy(s);

	/* without the policy (or in a baseline) the whole hit is loaded */
	for (int pol = 0; pol < KVT_POLICY_COUNT; pol++) {
		CHECK_OK(kvt_sched_config_preset(&cfg, (kvt_sched_policy)pol));
		cfg.features &= ~(uint32_t)KVT_SCHED_RECOMPUTE;
		cfg.hit_align = 0;
		CHECK_OK(kvt_sched_create(&s, &cfg, &cost8));
		st = state(0, 0);
		st.tier_gbps[KVT_TIER_SSD] = 0.5;
		q[0] = split_req();
		CHECK_OK(kvt_sched_plan_step(s, &st, q, 1, it, &p));
		CHECK_EQ(it[0].recompute, 0);
		CHECK(it[0].action == KVT_SACT_RUN ||
		      it[0].action == KVT_SACT_WAIT ||
		      it[0].action == KVT_SACT_PREFETCH);
		CHECK_EQ(it[0].load, 8000);
		kvt_sched_destroy(s);
	}

	/* runs that disagree with tier[] are refused */
	CHECK_OK(kvt_sched_config_preset(&cfg, KVT_POLICY_KVTIER));
	CHECK_OK(kvt_sched_create(&s, &cfg, &cost8));
	q[0] = split_req();
	q[0].run_tokens[1] = 3000;
	CHECK_ERR(kvt_sched_plan_step(s, &st, q, 1, it, &p), -EINVAL);
	q[0] = split_req();
	q[0].run_tier[1] = KVT_TIER_HBM;
	CHECK_ERR(kvt_sched_plan_step(s, &st, q, 1, it, &p), -EINVAL);
	q[0] = split_req();
	q[0].nruns = KVT_SCHED_RUNS + 1;
	CHECK_ERR(kvt_sched_plan_step(s, &st, q, 1, it, &p), -EINVAL);
	kvt_sched_destroy(s);
	(void)lone;
}

/* wait_loads (the demo's vllm policy): a request whose loads are not home
 * never runs; it does not block the one behind it; its loads start. */
static void test_wait_loads(void)
{
	kvt_sched_req q[2];
	kvt_sched_item it[2];
	kvt_sched_plan p;
	kvt_sched_state st = state(0, 0);
	kvt_sched_config cfg;
	kvt_sched *s;

	CHECK_OK(kvt_sched_config_preset(&cfg, KVT_POLICY_VLLM));
	cfg.wait_loads = 1;
	CHECK_OK(kvt_sched_create(&s, &cfg, &cost8));
	q[0] = waiting(1, 8000, 0, 7000);
	q[1] = waiting(2, 600, 0, 0);
	CHECK_OK(kvt_sched_plan_step(s, &st, q, 2, it, &p));
	CHECK_EQ(it[0].action, KVT_SACT_PREFETCH);
	CHECK_EQ(it[0].load, 7000);
	CHECK_EQ(it[1].action, KVT_SACT_RUN);
	/* its loads in flight: still waiting */
	q[0].loading = 7000;
	q[0].loading_ready = 0.05;
	CHECK_OK(kvt_sched_plan_step(s, &st, q, 1, it, &p));
	CHECK(it[0].action != KVT_SACT_RUN);
	CHECK_EQ(it[0].load, 0);
	/* home: it runs, computing only its tail */
	q[0].loading_ready = 0;
	CHECK_OK(kvt_sched_plan_step(s, &st, q, 1, it, &p));
	CHECK_EQ(it[0].action, KVT_SACT_RUN);
	CHECK_EQ(it[0].compute, 1000);
	kvt_sched_destroy(s);
}

int main(void)
{
	/* the fixture is built in: failing to build it is a regression,
	 * not a reason to skip */
	if (fixture_cost(&cost8, "llama-3.1-8b", 1)) {
		fprintf(stderr, "cost fixture: %s\n", kvt_errdetail());
		return 1;
	}
	test_delay_hit();
	test_balance();
	test_stall_hide();
	test_starve();
	test_starve_capacity();
	test_capacity();
	test_fcfs_differential();
	test_invariants();
	test_bad_input();
	test_alloc_faults();
	test_recompute();
	test_wait_loads();
	TEST_DONE();
}
