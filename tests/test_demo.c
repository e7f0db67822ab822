/*
 * test_demo — a reduced `kvtier demo` through the library: the serving
 * engine over the real cache under every policy, and its invariants:
 *
 *   - every request ran and got its first token after its arrival and its
 *     start, its last token after that; every checksum matched (in flight,
 *     in the engine's samples, and when every copy was re-read at the end);
 *   - the numbers add up: per request, tokens loaded + computed = prompt;
 *     per pass, the sums of the requests;
 *   - each policy does what it says: lmcache loads whole 256-token chunks
 *     only; vllm starts a request only once its loads are home; kvtier's
 *     load-or-recompute is counted;
 *   - an engine memory too small for the concurrent requests preempts, and
 *     every request still completes with correct bytes;
 *   - a failure mid-run (ssd files overwritten) is reported as such, with
 *     the counters of what failed, never as a clean run;
 *   - bad configurations are refused before anything is built.
 */
#include "harness.h"

#include <signal.h>
#include <unistd.h>

static void small(kvt_demo_config *c)
{
	kvt_demo_config_init(c);
	c->sessions = 3;
	c->turns = 3;
	c->system_tokens = 300; /* not a whole number of pages */
	c->context_tokens = 500;
	c->turn_tokens = 300;
	c->output_tokens = 8;
	c->rate = 8;
	c->think_s = 0.15;
	/* small memory tiers: warm turns restore from ssd too */
	c->fabric_bytes = 64ull << 20;
	c->dram_bytes = 48ull << 20;
}

/* A profile with the demo's three tiers: testbed-a's (fabric, dram) from
 * the source tree, plus an ssd tier. Into @path. */
static void predict_profile(char *path, size_t len)
{
	char src[4096], *slash;
	FILE *in, *out;
	size_t n;

	snprintf(src, sizeof(src), "%s", __FILE__);
	slash = strrchr(src, '/');
	snprintf(slash ? slash + 1 : src,
		 sizeof(src) - (size_t)(slash ? slash + 1 - src : 0),
		 "../profiles/testbed-a.prof");
	snprintf(path, len, "%s/predict.prof", test_dir("demo-prof"));
	in = fopen(src, "r");
	out = fopen(path, "w");
	CHECK(in && out);
	if (in && out)
		while ((n = fread(src, 1, sizeof(src), in)) > 0)
			fwrite(src, 1, n, out);
	if (out)
		fputs("ssd.bytes = 64e9\nssd.read_gbps = 0.5\n"
		      "ssd.write_gbps = 0.5\n", out);
	if (in)
		fclose(in);
	if (out)
		fclose(out);
}

static void on_alarm(int sig)
{
	static const char m[] = "test_demo: no progress in 240 s: a hang "
				"(in the engine or the cache?)\n";

	(void)sig;
	if (write(2, m, sizeof(m) - 1) < 0)
		_exit(1);
	_exit(1);
}

static void check_pass(const kvt_demo_pass *p, const kvt_demo_config *c)
{
	uint64_t prompt = 0, loaded = 0, computed = 0, lower = 0, checked = 0;

	CHECK_EQ(p->err, 0);
	CHECK_EQ(p->done, p->nreqs);
	CHECK_EQ(p->nreqs, (size_t)kvt_demo_sessions_at(c, p->rate) * c->turns);
	CHECK_EQ(p->cache.corrupt, 0);
	CHECK_EQ(p->cache.move_errors, 0);
	CHECK_EQ(p->check_err, 0);
	CHECK_EQ(p->check.bad, 0);
	CHECK(p->check.checked > 0);
	for (size_t i = 0; i < p->nreqs; i++) {
		const kvt_demo_req *q = &p->reqs[i];
		uint32_t l = 0;

		CHECK(q->done);
		CHECK(q->start >= q->arrival - 1e-9);
		CHECK(q->first_token > q->start);
		CHECK(q->finish >= q->first_token);
		CHECK(q->ttft_s > 0);
		if (q->output_tokens > 1)
			CHECK(q->tpot_s > 0);
		CHECK_EQ(q->engine_bad, 0);
		for (int t = 0; t < KVT_TIER_COUNT; t++)
			l += q->loaded_tokens[t];
		/* the engine's checks run late (in its slack) but run: a
		 * request that used loaded pages had them checked */
		if (l)
			CHECK(q->engine_checked > 0);
		checked += q->engine_checked;
		if (!q->preempted)
			CHECK_EQ(l + q->computed_tokens, q->prompt_tokens);
		if (!strcmp(p->policy, "lmcache") ||
		    !strcmp(p->policy, "lmcache-layerwise"))
			CHECK_EQ(l % 256, 0); /* whole chunks only */
		if (!strcmp(p->policy, "vllm") && l && q->loads_home > 0 &&
		    !q->preempted)
			CHECK(q->start >= q->loads_home - 1e-6);
		if (strcmp(p->policy, "kvtier"))
			for (int t = 0; t < KVT_TIER_COUNT; t++)
				CHECK_EQ(q->recomputed_tokens[t], 0);
		prompt += q->prompt_tokens;
		loaded += l;
		computed += q->computed_tokens;
		lower += q->loaded_tokens[KVT_TIER_DRAM] +
			 q->loaded_tokens[KVT_TIER_SSD];
	}
	CHECK_EQ(p->st.prompt_tokens, prompt);
	CHECK_EQ(p->st.computed_tokens, computed);
	CHECK(p->st.ttft_ms.n == p->nreqs);
	CHECK(p->st.ttft_ms.p50 <= p->st.ttft_ms.p90);
	CHECK(p->st.ttft_ms.p90 <= p->st.ttft_ms.p99);
	CHECK(p->st.tokens_per_s > 0);
	CHECK(p->st.steps > 0);
	CHECK(loaded > 0); /* warm turns found their prefix */
	CHECK(checked > 0);
	printf("%-18s TTFT p90 %7.1f ms, TPOT %5.2f ms, %6.0f tok/s, loaded "
	       "%llu (dram+ssd %llu), computed %llu, preempted %llu\n",
	       p->policy, p->st.ttft_ms.p90, p->st.tpot_ms.mean,
	       p->st.tokens_per_s, (unsigned long long)loaded,
	       (unsigned long long)lower, (unsigned long long)computed,
	       (unsigned long long)p->st.preemptions);
}

int main(void)
{
	kvt_demo_config c;
	kvt_demo_result *r = NULL;
	int err;

	setvbuf(stdout, NULL, _IONBF, 0);
	signal(SIGALRM, on_alarm);
	alarm(240);
	setenv("TMPDIR", test_dir("demo"), 1);

	/* every policy, side by side */
	small(&c);
	/* and each pass predicted, on a profile and on the data plane it
	 * measured (its mean load rates, its host time per step) */
	predict_profile(c.predict, sizeof(c.predict));
	CHECK_OK(kvt_demo_size(&c));
	CHECK_OK(kvt_demo_run(&c, &r));
	if (r) {
		CHECK_EQ(r->npasses, 4);
		CHECK_EQ(r->error[0], '\0');
		for (int i = 0; i < r->npasses; i++) {
			const kvt_demo_pass *p = &r->pass[i];

			check_pass(p, &c);
			CHECK(p->predicted);
			CHECK(p->predicted_env);
			CHECK_EQ(p->penv_ttft_ms.n, p->nreqs);
			CHECK(p->penv_cpu_f > 0);
			CHECK(p->st.load_gbps_mean[KVT_TIER_FABRIC] > 0);
			/* a mean load job: at least a page (llama-3.2-1b's
			 * 32 KiB a token), at most the engine's whole KV
			 * memory (a load lands in engine blocks) */
			CHECK(p->st.load_job_kib[KVT_TIER_FABRIC] >=
			      32.0 * c.page_tokens);
			CHECK(p->st.load_job_kib[KVT_TIER_FABRIC] <=
			      32.0 * c.page_tokens * (double)p->nblocks);
			CHECK(p->penv_ttft_ms.mean > 0 &&
			      p->penv_tokens_per_s > 0);
		}
		CHECK(!strcmp(r->pass[0].policy, "lmcache"));
		/* group 0 of the Latin square: 0, 1, 3, 2 */
		CHECK(!strcmp(r->pass[2].policy, "kvtier"));
		CHECK(!strcmp(r->pass[3].policy, "vllm"));
		kvt_demo_result_free(r);
		r = NULL;
	}

	/* engine memory for little more than one request, four sessions at
	 * once: the newest is preempted when decodes run out of blocks, and
	 * every request still completes, every byte right */
	small(&c);
	c.sessions = 4;
	c.rate = 100;
	c.output_tokens = 200;
	c.policies = KVT_DEMO_KVTIER | KVT_DEMO_VLLM;
	c.hbm_bytes = 40ull << 20; /* 80 pages: a request takes 23..69 */
	c.system_tokens = 64;
	c.context_tokens = 300;
	c.turn_tokens = 64;
	CHECK_OK(kvt_demo_size(&c));
	CHECK_OK(kvt_demo_run(&c, &r));
	if (r) {
		uint64_t pre = 0;

		for (int i = 0; i < r->npasses; i++) {
			check_pass(&r->pass[i], &c);
			pre += r->pass[i].st.preemptions;
		}
		CHECK(pre > 0);
		kvt_demo_result_free(r);
		r = NULL;
	}

	/* ssd files overwritten after the first turns: the run fails, and
	 * says what failed */
	small(&c);
	c.policies = KVT_DEMO_KVTIER;
	c.sessions = 4;
	c.rate = 100;
	c.fabric_bytes = c.dram_bytes = 48ull << 20;
	c.tamper_after = 2 * c.sessions; /* ssd holds pages by then */
	snprintf(c.dir, sizeof(c.dir), "%s", test_dir("demo-tamper"));
	err = kvt_demo_run(&c, &r);
	CHECK(err != 0);
	CHECK(r != NULL);
	if (r) {
		uint64_t bad = 0, failed = 0;

		CHECK(r->error[0] != '\0');
		for (int i = 0; i < r->npasses; i++) {
			const kvt_demo_pass *p = &r->pass[i];

			bad += p->cache.corrupt + p->check.bad;
			for (size_t j = 0; j < p->nreqs; j++)
				failed += p->reqs[j].failed_pages;
		}
		CHECK(bad > 0);
		printf("tampered: %s; %llu copies failed verification, %llu "
		       "restored pages failed\n", r->error,
		       (unsigned long long)bad, (unsigned long long)failed);
		kvt_demo_result_free(r);
	}

	/* a block spoiled in engine memory after its load landed (the cache's
	 * copies were right): only the engine's deferred check can see it,
	 * and it fails the pass */
	small(&c);
	c.policies = KVT_DEMO_KVTIER;
	c.sessions = 4;
	c.rate = 100;
	c.fabric_bytes = c.dram_bytes = 48ull << 20;
	c.tamper_engine_after = c.sessions; /* warm turns load by then */
	snprintf(c.dir, sizeof(c.dir), "%s", test_dir("demo-tamper-engine"));
	err = kvt_demo_run(&c, &r);
	CHECK_ERR(err, KVT_ECORRUPT);
	CHECK(r != NULL);
	if (r) {
		uint64_t bad = 0, cache_bad = 0;

		CHECK(strstr(r->error, "a restored block holds wrong bytes"));
		for (int i = 0; i < r->npasses; i++) {
			const kvt_demo_pass *p = &r->pass[i];

			cache_bad += p->cache.corrupt + p->check.bad;
			for (size_t j = 0; j < p->nreqs; j++)
				bad += p->reqs[j].engine_bad;
		}
		CHECK_EQ(bad, 1);
		CHECK_EQ(cache_bad, 0);
		printf("spoiled in engine memory: %s\n", r->error);
		kvt_demo_result_free(r);
		r = NULL;
	}

	/* the simulator runs the same workload through the same engine: no
	 * prefix cache of the engine's own (nothing reused from hbm), a
	 * store per step into the top tier, every request done */
	{
		static kvt_sim_config sc;
		static kvt_sim_result sr;
		kvt_hw hw;

		small(&c);
		CHECK_OK(kvt_demo_size(&c));
		CHECK_OK(kvt_hw_load(&hw, "testbed-b"));
		/* rates first: a tier's size needs them (the cross rules) */
		CHECK_OK(kvt_hw_set(&hw, "fabric.link_gbps", "54"));
		CHECK_OK(kvt_hw_set(&hw, "fabric.device_gbps", "76.8"));
		CHECK_OK(kvt_hw_set(&hw, "fabric.bytes", "16e9"));
		CHECK_OK(kvt_hw_set(&hw, "ssd.read_gbps", "6"));
		CHECK_OK(kvt_hw_set(&hw, "ssd.write_gbps", "6"));
		CHECK_OK(kvt_hw_set(&hw, "ssd.bytes", "1e12"));
		for (unsigned b = 1; b < KVT_DEMO_ALL; b <<= 1) {
			CHECK_OK(kvt_demo_sim_config(&c, b, c.rate, &hw, &sc));
			CHECK_OK(kvt_sim_run(&sc, &sr));
			CHECK_EQ(sr.finished, (uint64_t)c.sessions * c.turns);
			CHECK_EQ(sr.hit_tokens[KVT_TIER_HBM], 0);
			CHECK(sr.hit_tokens[KVT_TIER_FABRIC] +
			      sr.hit_tokens[KVT_TIER_DRAM] +
			      sr.hit_tokens[KVT_TIER_SSD] > 0);
			CHECK(sr.store_bytes[KVT_TIER_FABRIC] > 0);
			printf("simulated %-18s TTFT mean %.1f ms, %.0f tok/s\n",
			       kvt_demo_policy_name(b), sr.ttft_ms.mean,
			       sr.throughput_tok_s);
		}
	}

	/* bad configurations are refused before anything is built */
	kvt_demo_config_init(&c);
	c.sessions = 0;
	CHECK_ERR(kvt_demo_size(&c), -EINVAL);
	kvt_demo_config_init(&c);
	c.turns = KVT_DEMO_MAX_TURNS + 1;
	CHECK_ERR(kvt_demo_size(&c), -EINVAL);
	kvt_demo_config_init(&c);
	snprintf(c.model, sizeof(c.model), "gpt-17");
	CHECK_ERR(kvt_demo_size(&c), KVT_EPRESET);
	kvt_demo_config_init(&c);
	snprintf(c.hardware, sizeof(c.hardware), "no-such-box");
	CHECK(kvt_demo_size(&c) != 0);
	kvt_demo_config_init(&c);
	c.hbm_bytes = 4096;
	CHECK_ERR(kvt_demo_size(&c), -EINVAL);
	kvt_demo_config_init(&c);
	c.rate = 0;
	CHECK_ERR(kvt_demo_size(&c), -EINVAL);
	kvt_demo_config_init(&c);
	c.nrates = 2;
	c.rates[0] = 2;
	c.rates[1] = 1;
	CHECK_ERR(kvt_demo_size(&c), -EINVAL);
	{
		unsigned bits = 0;

		CHECK_OK(kvt_demo_policy_parse("vllm,kvtier", &bits));
		CHECK_EQ(bits, KVT_DEMO_VLLM | KVT_DEMO_KVTIER);
		CHECK_OK(kvt_demo_policy_parse("all", &bits));
		CHECK_EQ(bits, KVT_DEMO_ALL);
		CHECK_ERR(kvt_demo_policy_parse("fastest", &bits), -EINVAL);
		CHECK(!strcmp(kvt_demo_policy_name(KVT_DEMO_LMCACHE_LW),
			      "lmcache-layerwise"));
	}
	TEST_DONE();
}
