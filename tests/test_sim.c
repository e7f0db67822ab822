/*
 * test_sim — the serving simulator end to end, on small runs:
 *   conservation   every request finishes; every link lets out what it
 *                  took in; loads and stores add up on the GPU links
 *   invariants     the index passes kvt_index_check() after every step,
 *                  for every policy and workload
 *   determinism    the same seed gives the same result, bit for bit
 *   monotonicity   more link bandwidth never hurts the baseline
 *   policies       on the calibration case: fabric beats dram, stressors
 *                  hurt dram only, kvtier <= lmcache; delay-hit defers
 *   host time      engine.host_prefill_us charges steps with prefills
 *   trace replay   a generated Mooncake-format excerpt
 *   bad input      clear errors naming the bad part
 *   failures       failing every allocation of a small run's setup
 */
#include "harness.h"

#include <math.h>

static kvt_hw testbed_a, testbed_b;

static void small_agentic(kvt_sim_config *c, kvt_sched_policy p)
{
	kvt_sim_config_init(c);
	c->hw = testbed_a;
	snprintf(c->model, sizeof(c->model), "qwen2.5-32b");
	c->tp = 4;
	kvt_sim_config_policy(c, p);
	c->sessions = 4;
	c->turns = 3;
	c->context = 8192;
	c->append = 512;
	c->output = 32;
	c->think_s = 1;
}

static void small_docs(kvt_sim_config *c, kvt_sched_policy p,
		       kvt_workload w)
{
	kvt_sim_config_init(c);
	c->hw = testbed_b;
	snprintf(c->model, sizeof(c->model), "llama-3.1-8b");
	kvt_sim_config_policy(c, p);
	c->workload = w;
	c->requests = 120;
	c->rate = 2;
	c->cache_distance = 8;
	c->context = w == KVT_WL_SHAREGPT ? 0 : 6000;
}

static double link_bytes(const kvt_sim_result *r, const char *suffix,
			 int in)
{
	double sum = 0;
	size_t n = strlen(suffix);

	for (uint32_t i = 0; i < r->nlinks; i++) {
		size_t m = strlen(r->links[i].name);

		if (m >= n && !strcmp(r->links[i].name + m - n, suffix) &&
		    !strncmp(r->links[i].name, "gpu", 3))
			sum += in ? r->links[i].bytes_in : r->links[i].bytes_out;
	}
	return sum;
}

static void conservation(const kvt_sim_config *c, const kvt_sim_result *r)
{
	double loads = 0, stores = 0;

	CHECK_EQ(r->finished, r->requests);
	CHECK(r->requests > 0);
	for (uint32_t i = 0; i < r->nlinks; i++)
		CHECK(fabs(r->links[i].bytes_in - r->links[i].bytes_out) <=
		      1e-6 * r->links[i].bytes_in + 1);
	for (int t = 1; t < KVT_TIER_COUNT; t++)
		loads += r->load_bytes[t];
	for (int t = 1; t < KVT_TIER_COUNT; t++)
		stores += r->store_bytes[t];
	/* every load crosses one GPU's h2d link once; with one offload tier
	 * every store comes from hbm and crosses one GPU's d2h link once */
	CHECK(fabs(link_bytes(r, ".h2d", 1) - loads) <= 1e-6 * loads + 1);
	if (c->noffload == 1)
		CHECK(fabs(link_bytes(r, ".d2h", 1) - stores) <=
		      1e-6 * stores + 1);
	/* prompt tokens are computed or reused, never lost */
	{
		uint64_t hits = 0;

		for (int t = 0; t < KVT_TIER_COUNT; t++)
			hits += r->hit_tokens[t];
		if (r->measured == r->finished)
			CHECK(hits + r->computed_tokens >= r->prompt_tokens);
	}
	CHECK(r->ttft_ms.n == r->measured);
	CHECK(r->ttft_ms.p50 <= r->ttft_ms.p90 && r->ttft_ms.p90 <= r->ttft_ms.p99);
	CHECK(r->gpu_busy > 0 && r->gpu_busy <= 1.0 + 1e-9);
}

/* Small pools keep kvt_index_check() (it walks every slot) cheap. */
static void small_pools(kvt_sim_config *c)
{
	c->check = 1;
	c->hw.hbm_bytes = c->tp > 1 ? 34e9 : 30e9;
	c->offload_bytes[0] = 20e9;
	if (c->workload != KVT_WL_AGENTIC && c->context)
		c->context = 1500;
}

static void test_policies_workloads(void)
{
	static const kvt_workload wls[] = { KVT_WL_LOOGLE, KVT_WL_NARRATIVEQA,
					    KVT_WL_REVIEWMT, KVT_WL_SHAREGPT };

	for (int p = 0; p < KVT_POLICY_COUNT; p++) {
		kvt_sim_config c;
		kvt_sim_result r;

		small_agentic(&c, (kvt_sched_policy)p);
		small_pools(&c);
		CHECK_OK(kvt_sim_run(&c, &r));
		conservation(&c, &r);
		CHECK_EQ(r.warm_ttft_ms.n, 4 * 2);
		/* warm turns restore their prefix from dram */
		CHECK(r.hit_tokens[KVT_TIER_DRAM] > 0);
		CHECK(r.load_bytes[KVT_TIER_DRAM] > 0);
		for (size_t w = 0; w < sizeof(wls) / sizeof(wls[0]); w++) {
			small_docs(&c, (kvt_sched_policy)p, wls[w]);
			small_pools(&c);
			CHECK_OK(kvt_sim_run(&c, &r));
			conservation(&c, &r);
			if (wls[w] != KVT_WL_SHAREGPT)
				CHECK(r.hit_tokens[KVT_TIER_HBM] +
				      r.hit_tokens[KVT_TIER_DRAM] > 0);
		}
	}
}

static void test_determinism(void)
{
	kvt_sim_config c;
	kvt_sim_result a, b;

	small_docs(&c, KVT_POLICY_KVTIER, KVT_WL_LOOGLE);
	c.stress = 8;
	CHECK_OK(kvt_sim_run(&c, &a));
	CHECK_OK(kvt_sim_run(&c, &b));
	a.wall_s = b.wall_s = 0;
	CHECK(!memcmp(&a, &b, sizeof(a)));
	c.seed = 2;
	CHECK_OK(kvt_sim_run(&c, &b));
	CHECK(a.ttft_ms.mean != b.ttft_ms.mean);
	CHECK(a.prompt_tokens != b.prompt_tokens);
}

/* Scale every host-link figure of the profile by @k. */
static void scale_links(kvt_hw *hw, double k)
{
	hw->link_gbps *= k;
	hw->uplink_gbps *= k;
	hw->fabric_link_gbps *= k;
	for (int m = 0; m < KVT_COPY_COUNT; m++)
		for (uint32_t i = 0; i < hw->copy[m].n; i++)
			hw->copy[m].gbps[i] *= k;
}

static void test_monotonic(void)
{
	for (int p = KVT_POLICY_LMCACHE; p <= KVT_POLICY_HICACHE; p++) {
		double prev = INFINITY;

		for (double k = 0.25; k <= 4; k *= 2) {
			kvt_sim_config c;
			kvt_sim_result r;

			small_agentic(&c, (kvt_sched_policy)p);
			scale_links(&c.hw, k);
			CHECK_OK(kvt_sim_run(&c, &r));
			if (r.warm_ttft_ms.mean > prev * (1 + 1e-9))
				fprintf(stderr, "%s: x%g bandwidth: warm TTFT "
					"%.2f > %.2f\n",
					kvt_sched_policy_name(p), k,
					r.warm_ttft_ms.mean, prev);
			CHECK(r.warm_ttft_ms.mean <= prev * (1 + 1e-9));
			prev = r.warm_ttft_ms.mean;
		}
	}
}

/* The calibration case, shortened: its orderings hold. */
static void test_orderings(void)
{
	double ttft[2][2][KVT_POLICY_COUNT]; /* [fabric?][stress?][policy] */

	for (int fab = 0; fab < 2; fab++)
		for (int st = 0; st < 2; st++)
			for (int p = 0; p < KVT_POLICY_COUNT; p++) {
				kvt_sim_config c;
				kvt_sim_result r;

				small_agentic(&c, (kvt_sched_policy)p);
				c.context = 16384;
				c.offload[0] = fab ? KVT_TIER_FABRIC :
						     KVT_TIER_DRAM;
				c.stress = st ? 32 : 0;
				c.cpu_mem_latency = 0; /* links alone */
				CHECK_OK(kvt_sim_run(&c, &r));
				ttft[fab][st][p] = r.warm_ttft_ms.mean;
			}
	for (int p = 0; p < KVT_POLICY_COUNT; p++) {
		CHECK(ttft[1][0][p] <= ttft[0][0][p]);       /* fabric wins */
		CHECK(ttft[0][1][p] >= ttft[0][0][p]);       /* stress hurts */
		CHECK(fabs(ttft[1][1][p] - ttft[1][0][p]) <= /* not fabric */
		      1e-9 * ttft[1][0][p]);
	}
	CHECK(ttft[0][0][KVT_POLICY_KVTIER] < ttft[0][0][KVT_POLICY_LMCACHE]);
	CHECK(ttft[1][0][KVT_POLICY_KVTIER] < ttft[1][0][KVT_POLICY_LMCACHE]);
}

/* The engine's CPU time per step follows DRAM latency: stressors then
 * slow the fabric case too (whose bytes never touch DRAM), by no more
 * than the extra CPU time can explain; off, or with no memory-stalled
 * share, they do not. */
static void test_cpu_latency(void)
{
	double t[3][2];

	for (int mode = 0; mode < 3; mode++)
		for (int st = 0; st < 2; st++) {
			kvt_sim_config c;
			kvt_sim_result r;

			small_agentic(&c, KVT_POLICY_KVTIER);
			c.sessions = 1; /* no batching effects between turns */
			c.offload[0] = KVT_TIER_FABRIC;
			c.stress = st ? 32 : 0;
			c.cpu_mem_latency = mode != 1;
			if (mode == 2)
				c.hw.step_mem_frac = 0;
			CHECK_OK(kvt_sim_run(&c, &r));
			t[mode][st] = r.warm_ttft_ms.mean;
		}
	CHECK(testbed_a.step_mem_frac > 0);
	CHECK(t[0][1] > t[0][0] * 1.01);              /* on: stress hurts */
	CHECK(t[0][0] == t[1][0]);                    /* idle: no effect */
	CHECK(fabs(t[1][1] - t[1][0]) <= 1e-9 * t[1][0]); /* off */
	CHECK(fabs(t[2][1] - t[2][0]) <= 1e-9 * t[2][0]); /* frac 0 */
}

/* engine.host_prefill_us: a step with prefills costs its own host time,
 * decode-only steps engine.host_us; unset (0) or equal to host_us it
 * changes nothing. One session: no step mixes turns, so the prefill's
 * host time lands in TTFT whole and not in TPOT. */
static void test_host_prefill(void)
{
	static const double us[][2] = {
		/* host_us, host_prefill_us */
		{ 100, 0 }, { 100, 100 }, { 0, 0 }, { 0, 5000 },
	};
	kvt_sim_result r[4];

	for (int k = 0; k < 4; k++) {
		kvt_sim_config c;

		small_agentic(&c, KVT_POLICY_KVTIER);
		c.sessions = 1;
		c.hw.host_us = us[k][0];
		c.hw.host_prefill_us = us[k][1];
		CHECK_OK(kvt_sim_run(&c, &r[k]));
	}
	CHECK(r[0].ttft_ms.mean == r[1].ttft_ms.mean);
	CHECK(r[0].tpot_ms.mean == r[1].tpot_ms.mean);
	CHECK(r[0].ttft_ms.mean > r[2].ttft_ms.mean);
	/* every first token waits for at least one prefill step */
	CHECK(r[3].ttft_ms.mean >= r[2].ttft_ms.mean + 5.0 - 1e-6);
	CHECK(fabs(r[3].tpot_ms.mean - r[2].tpot_ms.mean) <=
	      1e-9 * r[2].tpot_ms.mean);
}

/* Questions arriving together on one document: with delay-hit, the
 * later ones wait for the first instead of computing it again. */
static void test_delay_hit(void)
{
	kvt_sim_result r[2];

	for (int with = 0; with < 2; with++) {
		kvt_sim_config c;

		small_docs(&c, KVT_POLICY_KVTIER, KVT_WL_LOOGLE);
		c.cache_distance = 0; /* every question on one document */
		c.questions = 6;
		c.rate = 20;
		if (!with)
			c.sched.features &= ~(uint32_t)KVT_SCHED_DELAYHIT;
		CHECK_OK(kvt_sim_run(&c, &r[with]));
	}
	CHECK_EQ(r[0].deferred, 0);
	CHECK(r[1].deferred > 0);
	CHECK(r[1].computed_tokens < r[0].computed_tokens);
}

static void test_trace(void)
{
	const char *dir = test_dir("sim-trace");
	char path[600];
	FILE *f;
	kvt_sim_config c;
	kvt_sim_result r;
	uint64_t seed = 5;

	/* a Mooncake-format excerpt made here: 60 requests over 6 shared
	 * 4-block prefixes, 200 ms apart */
	snprintf(path, sizeof(path), "%s/trace.jsonl", dir);
	f = fopen(path, "w");
	CHECK(f != NULL);
	for (int i = 0; f && i < 60; i++) {
		int root = (int)(test_rand(&seed) % 6);

		fprintf(f, "{\"timestamp\": %d, \"input_length\": %d, "
			   "\"output_length\": %d, \"hash_ids\": [%d, %d, %d, "
			   "%d, %d]}\n", i * 200, 4 * 512 + 300, 20,
			root * 10, root * 10 + 1, root * 10 + 2, root * 10 + 3,
			1000 + i);
	}
	if (f)
		fclose(f);
	kvt_sim_config_init(&c);
	c.hw = testbed_b;
	c.workload = KVT_WL_TRACE;
	snprintf(c.trace_path, sizeof(c.trace_path), "%s", path);
	small_pools(&c);
	CHECK_OK(kvt_sim_run(&c, &r));
	conservation(&c, &r);
	CHECK_EQ(r.requests, 60);
	/* later requests on a prefix reuse its 4 blocks from hbm */
	CHECK(r.hit_tokens[KVT_TIER_HBM] >= (60 - 6) * 2048ull * 9 / 10);
	CHECK(r.makespan_s >= 11.8); /* arrivals span 11.8 s */
	c.trace_speed = 10;
	CHECK_OK(kvt_sim_run(&c, &r));
	CHECK(r.makespan_s < 2.0);
	snprintf(c.trace_path, sizeof(c.trace_path), "%s/none.jsonl", dir);
	CHECK_ERR(kvt_sim_run(&c, &r), -ENOENT);
}

/* Regression (issue 10): a request whose output is one token finishes at
 * its first token and is freed there; the engine step went on reading it
 * (heap use-after-free, caught by the ASan build). Every request must still
 * be accounted once, with and without sync stores (the held first token). */
static void test_short_output(void)
{
	const char *dir = test_dir("sim-short");
	char path[600];
	FILE *f;
	kvt_sim_config c;
	kvt_sim_result r;

	for (int sync = 0; sync < 2; sync++) {
		small_agentic(&c, KVT_POLICY_KVTIER);
		c.output = 1;
		c.sched.sync_store = sync;
		CHECK_OK(kvt_sim_run(&c, &r));
		CHECK_EQ(r.finished, r.requests);
		CHECK_EQ(r.requests, 4 * 3);
	}
	/* a trace mixing one-token outputs with longer ones */
	snprintf(path, sizeof(path), "%s/trace.jsonl", dir);
	f = fopen(path, "w");
	CHECK(f != NULL);
	for (int i = 0; f && i < 20; i++)
		fprintf(f, "{\"timestamp\": %d, \"input_length\": %d, "
			   "\"output_length\": %d, \"hash_ids\": [%d, %d]}\n",
			i * 50, 2 * 512 + 5, i % 3 ? 1 : 8, i % 2, 100 + i);
	if (f)
		fclose(f);
	for (int sync = 0; sync < 2; sync++) {
		kvt_sim_config_init(&c);
		c.hw = testbed_b;
		c.workload = KVT_WL_TRACE;
		c.sched.sync_store = sync;
		snprintf(c.trace_path, sizeof(c.trace_path), "%s", path);
		small_pools(&c);
		CHECK_OK(kvt_sim_run(&c, &r));
		CHECK_EQ(r.requests, 20);
		CHECK_EQ(r.finished, 20);
		CHECK_EQ(r.tpot_ms.n, 7); /* only the 8-token outputs */
	}
}

/* Three tiers: a dram too small for the rotation demotes to ssd, and
 * later questions load from there. */
static void test_ssd(void)
{
	kvt_sim_config c;
	kvt_sim_result r;

	small_docs(&c, KVT_POLICY_KVTIER, KVT_WL_LOOGLE);
	c.hw.ssd_bytes = 2e12;
	c.hw.ssd_read_gbps = 12;
	c.hw.ssd_write_gbps = 8;
	c.hw.hbm_bytes = 30e9;          /* ~8k pages of hbm */
	c.noffload = 2;
	c.offload[1] = KVT_TIER_SSD;
	c.offload_bytes[0] = 10e9;      /* ~4.8k pages of dram */
	c.cache_distance = 40;          /* 41 x 250 pages: beyond both */
	c.context = 4000;
	c.requests = 250;
	c.check = 1;
	CHECK_OK(kvt_sim_run(&c, &r));
	conservation(&c, &r);
	CHECK(r.hit_tokens[KVT_TIER_SSD] > 0);
	CHECK(r.load_bytes[KVT_TIER_SSD] > 0);
	CHECK(r.store_bytes[KVT_TIER_SSD] > 0);
	c.noffload = 1;
	c.offload[0] = KVT_TIER_SSD;    /* ssd alone, the profile's 2 TB */
	c.offload_bytes[0] = 0;
	CHECK_OK(kvt_sim_run(&c, &r));
	conservation(&c, &r);
	CHECK(r.load_bytes[KVT_TIER_SSD] > 0);
}

/* Documents over dram (10 GB) and an ssd, beyond both: 41 x 250 pages
 * between two questions on one document; ssd rates in GB/s. */
static void dram_ssd_docs(kvt_sim_config *c, double rd, double wr)
{
	small_docs(c, KVT_POLICY_KVTIER, KVT_WL_LOOGLE);
	c->hw.ssd_bytes = 2e12;
	c->hw.ssd_read_gbps = rd;
	c->hw.ssd_write_gbps = wr;
	c->hw.hbm_bytes = 30e9;         /* ~8k pages of hbm */
	c->noffload = 2;
	c->offload[1] = KVT_TIER_SSD;
	c->offload_bytes[0] = 10e9;     /* ~4.8k pages of dram */
	c->cache_distance = 40;
	c->context = 4000;
	c->requests = 250;
	c->check = 1;
}

/* The cache's background demotion (bg_high, bg_low): a tier kept under
 * its high watermark pushes pages below it sooner, so more of the reuse
 * comes from the tier below and more bytes are stored there; without it
 * the index fills the tier and demotes only on demand. */
static void test_watermarks(void)
{
	kvt_sim_result r[2];

	for (int bg = 0; bg < 2; bg++) {
		kvt_sim_config c;

		dram_ssd_docs(&c, 12, 8);
		if (bg) {
			c.bg_high = 0.5; /* far from full: the effect is plain */
			c.bg_low = 0.4;
		}
		CHECK_OK(kvt_sim_run(&c, &r[bg]));
		conservation(&c, &r[bg]);
	}
	CHECK_EQ(r[0].bg_passes, 0);
	CHECK(r[1].bg_passes > 0);
	CHECK(r[1].store_bytes[KVT_TIER_SSD] > r[0].store_bytes[KVT_TIER_SSD]);
	CHECK(r[1].hit_tokens[KVT_TIER_DRAM] < r[0].hit_tokens[KVT_TIER_DRAM]);
}

/* On a host that copies with the CPU (lanes), an ssd load through the
 * cache's bounce takes a second hop on the cpu lane: every staged load
 * counts one, and first tokens come no sooner than without it. */
static void test_stage_hop(void)
{
	kvt_sim_result r[2];

	for (int staged = 0; staged < 2; staged++) {
		kvt_sim_config c;

		dram_ssd_docs(&c, 2, 2);
		c.hw.copy_gbps = 8;   /* the lanes: the demo's machine */
		c.ssd_stage_pages = staged ? 64 : 0;
		CHECK_OK(kvt_sim_run(&c, &r[staged]));
		conservation(&c, &r[staged]);
	}
	CHECK_EQ(r[0].stage_hops, 0);
	CHECK(r[1].load_bytes[KVT_TIER_SSD] > 0);
	CHECK(r[1].stage_hops > 0);
	CHECK(r[1].ttft_ms.mean > r[0].ttft_ms.mean);
}

/* The demo's stores (store_top): every page a prefill computes is stored
 * into the top offload tier, though hbm holds it too (the index's copy in
 * hbm is not a copy in the offload tiers); a page loaded from a lower tier
 * is not stored again. With hbm big enough that nothing is evicted, the
 * bytes that reach dram are the stores'. */
static void test_store_top(void)
{
	kvt_sim_result r[2];

	for (int st = 0; st < 2; st++) {
		kvt_sim_config c;

		dram_ssd_docs(&c, 2, 2);
		c.hw.hbm_bytes = 2e12; /* nothing leaves hbm */
		c.write_policy = KVT_WRITE_BACK; /* the demo's */
		c.store_top = st;
		CHECK_OK(kvt_sim_run(&c, &r[st]));
		conservation(&c, &r[st]);
	}
	CHECK(r[0].store_bytes[KVT_TIER_DRAM] < 1);
	/* (before the fix the store placed nothing: every page had its
	 * copy in hbm) */
	CHECK(r[1].store_bytes[KVT_TIER_DRAM] > 0);
}

/* A store whose room is being made (store_room_wait): the copies out of
 * the tier it writes — its own insert's demotions, the background pass's
 * still reading the slots it got — hold the step's end and its first
 * tokens, as kvt_cache_store() holds the engine's thread. */
static void test_room_wait(void)
{
	kvt_sim_result r[2];

	for (int w = 0; w < 2; w++) {
		kvt_sim_config c;

		dram_ssd_docs(&c, 2, 2);
		c.write_policy = KVT_WRITE_BACK; /* the demo's */
		c.store_top = 1;
		c.bg_high = 0.5;
		c.bg_low = 0.4;
		c.store_room_wait = w;
		CHECK_OK(kvt_sim_run(&c, &r[w]));
		conservation(&c, &r[w]);
	}
	CHECK_EQ(r[0].room_waits, 0);
	CHECK(r[1].room_waits > 0);
	CHECK(r[1].room_wait_s > 0);
	CHECK(r[1].ttft_ms.mean > r[0].ttft_ms.mean);
}

static void test_bad_config(void)
{
	kvt_sim_config c;
	kvt_sim_result r;
	kvt_sweep *sw = calloc(1, sizeof(*sw));

	kvt_sim_config_init(&c);
	CHECK_ERR(kvt_sim_run(&c, &r), KVT_ECONFIG);
	CHECK(strstr(kvt_errdetail(), "no hardware profile"));
	small_agentic(&c, KVT_POLICY_KVTIER);
	c.tp = 8;
	CHECK_ERR(kvt_sim_run(&c, &r), KVT_ECONFIG);
	CHECK(strstr(kvt_errdetail(), "8 GPUs"));
	small_docs(&c, KVT_POLICY_KVTIER, KVT_WL_LOOGLE);
	c.offload[0] = KVT_TIER_FABRIC;
	CHECK_ERR(kvt_sim_run(&c, &r), KVT_ECONFIG);
	CHECK(strstr(kvt_errdetail(), "fabric"));
	small_agentic(&c, KVT_POLICY_KVTIER);
	snprintf(c.model, sizeof(c.model), "gpt-17");
	CHECK_ERR(kvt_sim_run(&c, &r), KVT_EPRESET);
	small_agentic(&c, KVT_POLICY_KVTIER);
	c.turns = 40;
	CHECK_ERR(kvt_sim_run(&c, &r), KVT_ECONFIG);
	CHECK(strstr(kvt_errdetail(), "do not fit"));
	small_agentic(&c, KVT_POLICY_KVTIER);
	CHECK_ERR(kvt_sim_sweep(&c, NULL, 0, 100, sw), KVT_ECONFIG);
	small_agentic(&c, KVT_POLICY_KVTIER);
	c.bg_high = 0.5;
	c.bg_low = 0.7; /* above high */
	CHECK_ERR(kvt_sim_run(&c, &r), KVT_ECONFIG);
	CHECK(strstr(kvt_errdetail(), "watermarks"));
	small_docs(&c, KVT_POLICY_KVTIER, KVT_WL_LOOGLE);
	c.requests = 10; /* all warm-up */
	CHECK_ERR(kvt_sim_run(&c, &r), KVT_ECONFIG);
	CHECK(strstr(kvt_errdetail(), "warm-up"));
	small_docs(&c, KVT_POLICY_KVTIER, KVT_WL_LOOGLE);
	snprintf(c.model, sizeof(c.model), "llama-3.1-70b"); /* 141 GB */
	CHECK_ERR(kvt_sim_run(&c, &r), KVT_ECONFIG);
	CHECK(strstr(kvt_errdetail(), "does not fit"));
	free(sw);
}

static void test_sweep(void)
{
	kvt_sim_config c;
	kvt_sweep *sw = calloc(1, sizeof(*sw));
	double rates[] = { 8, 0.5, 2 };

	small_docs(&c, KVT_POLICY_LMCACHE, KVT_WL_LOOGLE);
	CHECK_OK(kvt_sim_sweep(&c, rates, 3, 0, sw));
	CHECK_EQ(sw->n, 3);
	CHECK(sw->pt[0].rate == 0.5 && sw->pt[2].rate == 8);
	CHECK(!sw->have_target);
	/* a target between the first and the last point's TTFT */
	CHECK_OK(kvt_sim_sweep(&c, rates, 3,
			       sqrt(sw->pt[0].r.ttft_ms.mean *
				    sw->pt[2].r.ttft_ms.mean), sw));
	CHECK(sw->have_target && sw->met);
	CHECK_EQ(sw->n, 7); /* 3 + 4 bisection points */
	CHECK(sw->at_rate >= 0.5 && sw->at_rate < 8);
	CHECK(sw->at_ttft_ms <= sw->target_ms);
	CHECK(!sw->at_top);
	/* a target every rate meets: the answer is the top of the range */
	CHECK_OK(kvt_sim_sweep(&c, rates, 2, 1e9, sw));
	CHECK(sw->met && sw->at_top && sw->at_rate == 8);
	for (uint32_t i = 1; i < sw->n; i++)
		CHECK(sw->pt[i].rate > sw->pt[i - 1].rate);
	/* no rate meets an impossible target */
	CHECK_OK(kvt_sim_sweep(&c, rates, 1, 0.001, sw));
	CHECK(sw->have_target && !sw->met);
	free(sw);
}

static void test_alloc_faults(void)
{
	kvt_sim_config c;
	kvt_sim_result r;
	int ok = 0;

	small_agentic(&c, KVT_POLICY_KVTIER);
	c.sessions = 2;
	c.turns = 2;
	c.context = 2048;
	c.append = 256;
	c.output = 4;
	for (uint64_t n = 1; n < 20000 && !ok; n += n < 200 ? 1 : 97) {
		int64_t live = kvt_alloc_live();
		int err;

		kvt_alloc_fail_at(n);
		err = kvt_sim_run(&c, &r);
		kvt_alloc_fail_at(0);
		if (!err) {
			ok = 1;
			break;
		}
		if (err != -ENOMEM)
			fprintf(stderr, "fail at %llu: %s (%s)\n",
				(unsigned long long)n, kvt_strerror(err),
				kvt_errdetail());
		CHECK_ERR(err, -ENOMEM);
		CHECK_EQ(kvt_alloc_live(), live);
		if (err != -ENOMEM || kvt_alloc_live() != live) {
			fprintf(stderr, "failing allocation %llu of the run\n",
				(unsigned long long)n);
			break;
		}
	}
	CHECK(ok);
}

/* A page copied down holds hbm until its copy is done: with prefill-only
 * requests under hbm pressure the switch changes the run; the pages it
 * held all come free (the run finishes, nothing stalls). */
static void test_store_holds_hbm(void)
{
	kvt_sim_result r[2];

	for (int h = 0; h < 2; h++) {
		kvt_sim_config c;

		small_docs(&c, KVT_POLICY_HICACHE, KVT_WL_LOOGLE);
		c.output = 1;
		c.context = 8000;
		c.rate = 6;
		c.requests = 600;
		c.cache_distance = 64;
		c.hw.hbm_bytes = 30e9;
		c.store_holds_hbm = h;
		CHECK_OK(kvt_sim_run(&c, &r[h]));
		CHECK_EQ(r[h].finished, r[h].requests);
	}
	CHECK(r[0].ttft_ms.mean != r[1].ttft_ms.mean);
}

/* Throughput at equal TTFT: interpolation along a hand-made curve. */
static void test_equal_ttft(void)
{
	kvt_sweep *w = calloc(1, sizeof(*w));
	static const double thr[] = { 100, 200, 300, 400 };
	static const double ttft[] = { 10, 20, 80, 640 };
	double x;

	CHECK(w != NULL);
	if (!w)
		return;
	w->n = 4;
	for (int i = 0; i < 4; i++) {
		w->pt[i].rate = i + 1;
		w->pt[i].r.throughput_tok_s = thr[i];
		w->pt[i].r.ttft_ms.mean = ttft[i];
	}
	CHECK_EQ(kvt_sweep_throughput_at(w, 20, &x), 0);
	CHECK(fabs(x - 200) < 1e-9);
	CHECK_EQ(kvt_sweep_throughput_at(w, 40, &x), 0); /* half-way in log */
	CHECK(fabs(x - 250) < 1e-9);
	CHECK_EQ(kvt_sweep_throughput_at(w, 1000, &x), 1); /* a lower bound */
	CHECK(x == 400);
	CHECK_EQ(kvt_sweep_throughput_at(w, 5, &x), -ERANGE);
	CHECK_EQ(kvt_sweep_throughput_at(w, 0, &x), -EINVAL);
	/* TTFT is not monotone in the rate: the first crossing counts */
	w->pt[3].r.ttft_ms.mean = 15;
	CHECK_EQ(kvt_sweep_throughput_at(w, 40, &x), 0);
	CHECK(fabs(x - 250) < 1e-9);
	free(w);
}

/* The presets: each named baseline carries its engine's layout. */
static void test_presets(void)
{
	kvt_sim_config c;

	kvt_sim_config_init(&c);
	CHECK_OK(kvt_sim_config_policy(&c, KVT_POLICY_HICACHE_KERNEL));
	CHECK_EQ(c.page_tokens, 64);
	CHECK_EQ(c.sched.method, KVT_COPY_GATHER);
	CHECK(c.sched.features == KVT_SCHED_OVERLAP);
	CHECK_OK(kvt_sim_config_policy(&c, KVT_POLICY_HICACHE));
	CHECK_EQ(c.page_tokens, 16);
	CHECK_EQ(c.sched.method, KVT_COPY_MEMCPY);
	CHECK_OK(kvt_sim_config_policy(&c, KVT_POLICY_VLLM));
	CHECK_EQ(c.page_contig, 1);
	CHECK(!(c.sched.features & KVT_SCHED_OVERLAP));
	CHECK(!strcmp(kvt_sched_policy_name(KVT_POLICY_VLLM), "vllm"));
	/* page-contiguous chunks move a vLLM block far faster than one
	 * layer's slice of it: the same restore, both layouts */
	{
		kvt_sim_result r[2];

		for (int k = 0; k < 2; k++) {
			small_agentic(&c, KVT_POLICY_VLLM);
			c.page_contig = k;
			CHECK_OK(kvt_sim_run(&c, &r[k]));
		}
		CHECK(r[1].warm_ttft_ms.mean < r[0].warm_ttft_ms.mean / 2);
	}
}

int main(void)
{
	/* the profiles ship in the source tree: failing to read them is a
	 * regression (a parser or profile change), not a reason to skip */
	if (kvt_hw_load(&testbed_a, "testbed-a") ||
	    kvt_hw_load(&testbed_b, "testbed-b")) {
		fprintf(stderr, "profiles: %s\n", kvt_errdetail());
		return 1;
	}
	test_policies_workloads();
	test_determinism();
	test_monotonic();
	test_orderings();
	test_cpu_latency();
	test_host_prefill();
	test_equal_ttft();
	test_store_holds_hbm();
	test_presets();
	test_delay_hit();
	test_trace();
	test_short_output();
	test_ssd();
	test_watermarks();
	test_stage_hop();
	test_store_top();
	test_room_wait();
	test_bad_config();
	test_sweep();
	test_alloc_faults();
	TEST_DONE();
}
