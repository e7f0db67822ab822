/*
 * test_demo — a reduced `kvtier demo` through the library, and its
 * invariants:
 *
 *   - every request ran, every checksum matched (in flight, in the
 *     engine's samples, and when every copy was re-read at the end);
 *   - TTFT is never less than the request's measured critical path: for
 *     every layer, its prefill ended at least its modeled time after its
 *     data was ready, layers ran in order after their data, the TTFT ends
 *     after the last layer; lmcache computed nothing before the whole
 *     prefix was in; the components add up to no more than the TTFT;
 *   - the numbers add up (hits + computed = prompt, bytes = pages x page
 *     size, verified = loaded), every warm turn found its whole prefix;
 *   - a failure mid-run (ssd files overwritten) is reported as such, with
 *     the counters of what failed, never as a clean run.
 */
#include "harness.h"

#include <signal.h>
#include <unistd.h>

struct timeline {
	size_t calls;
	double worst_gap; /* most TTFT not covered by the components */
};

static void on_layers(void *arg, const char *policy, const kvt_demo_req *r,
		      uint32_t L, const double *ready, const double *end,
		      const double *model)
{
	struct timeline *tl = arg;
	const double eps = 1e-9;
	double sum_model = 0, parts;
	int lm = !strcmp(policy, "lmcache");

	tl->calls++;
	CHECK(L > 0);
	for (uint32_t l = 0; l < L; l++) {
		sum_model += model[l];
		CHECK(model[l] > 0);
		CHECK(ready[l] >= 0);
		/* layer l's compute started after its data and after layer
		 * l-1, and spent at least its modeled time */
		CHECK(end[l] - ready[l] >= model[l] - eps);
		if (l) {
			CHECK(ready[l] >= end[l - 1] - eps);
			CHECK(end[l] >= end[l - 1] + model[l] - eps);
		}
		/* lmcache: nothing before the whole prefix was in */
		if (lm && r->loaded_pages)
			CHECK(ready[l] >= ready[0] - eps &&
			      ready[0] >= r->load_wait_s - eps);
	}
	CHECK(r->ttft_s >= end[L - 1] - eps);
	CHECK(r->ttft_s >= sum_model - eps);
	CHECK(r->ttft_s >= r->prefill_model_s - eps);
	CHECK(r->prefill_s >= sum_model - eps);
	CHECK(r->ready_s <= end[L - 1] + eps);
	/* the load (submitted after arrival) ended before the first token */
	CHECK(r->restore_s <= r->ttft_s + 1e-6);
	if (lm && r->loaded_pages) /* the load was waited for in full */
		CHECK(ready[0] >= r->lookup_s - eps);
	parts = r->lookup_s + r->block_wait_s + r->load_wait_s + r->prefill_s +
		r->recompute_s + r->save_s;
	CHECK(parts <= r->ttft_s + 1e-6);
	if (r->ttft_s - parts > tl->worst_gap)
		tl->worst_gap = r->ttft_s - parts;
}

static void check_pass(const kvt_demo_result *r, const kvt_demo_pass *p,
		       uint64_t *warm_hit, uint64_t *warm_prev)
{
	const kvt_demo_config *c = &r->config;
	const uint32_t P = c->page_tokens;
	uint64_t page = kvt_geom_page_bytes(&r->geom), loaded = 0, failed = 0;

	CHECK_EQ(p->nreqs, (size_t)c->sessions * c->turns);
	CHECK_EQ(p->done, p->nreqs);
	CHECK_EQ(p->check_err, 0);
	CHECK_EQ(p->check.bad, 0);
	CHECK(p->check.checked > 0);
	CHECK_EQ(p->cache.move_errors, 0);
	CHECK_EQ(p->cache.corrupt, 0);
	CHECK(p->nblocks > 0);
	for (size_t i = 0; i < p->nreqs; i++) {
		const kvt_demo_req *q = &p->reqs[i];
		uint64_t hit = 0;

		for (int t = 0; t < KVT_TIER_COUNT; t++)
			hit += q->hit_tokens[t];
		CHECK_EQ(q->hit_tokens[KVT_TIER_HBM], 0); /* no engine cache */
		/* a page evicted or moving at the load is recomputed, not an
		 * error; then hits and computed tokens overlap */
		CHECK_EQ(q->load_err, 0);
		CHECK_EQ(q->store_err, 0);
		failed += q->failed_pages;
		if (q->failed_pages) {
			CHECK(hit + q->computed_tokens >= q->prompt_tokens);
			loaded += q->loaded_pages;
			continue;
		}
		CHECK_EQ(hit + q->computed_tokens, q->prompt_tokens);
		CHECK_EQ(q->loaded_pages, hit / P);
		CHECK_EQ(q->restore_bytes, q->loaded_pages * page);
		CHECK_EQ(q->verified_pages, q->loaded_pages);
		CHECK_EQ(q->engine_checked, q->loaded_pages);
		CHECK_EQ(q->engine_bad, 0);
		CHECK(q->stored_pages > 0 || q->turn > 0 || q->session > 0);
		CHECK(q->prefill_model_s > 0 && q->decode_s > 0);
		CHECK(q->ttft_s > 0);
		if (!strcmp(p->policy, "kvtier")) /* asynchronous save */
			CHECK(q->save_s < q->ttft_s);
		if (q->turn > 0) {
			/* the whole previous context, prompt and answer;
			 * with background demotion, pages moving between
			 * tiers at the lookup are computed instead */
			uint64_t prev = c->system_tokens + c->context_tokens +
					(uint64_t)(q->turn - 1) *
					(c->turn_tokens + c->output_tokens) +
					c->output_tokens;

			CHECK(hit <= prev / P * P);
			if (!c->background)
				CHECK_EQ(hit, prev / P * P);
			*warm_hit += hit;
			*warm_prev += prev / P * P;
		} else if (q->session > 0) {
			/* the shared system prompt, cached by session 0 */
			CHECK(hit <= c->system_tokens / P * P);
			if (!c->background)
				CHECK_EQ(hit, c->system_tokens / P * P);
		}
		loaded += q->loaded_pages;
	}
	CHECK_EQ(p->cache.load_pages, loaded);
	/* a rare event: most of the restores must have been whole */
	CHECK(failed * 10 <= loaded);
}

static void small(kvt_demo_config *c)
{
	kvt_demo_config_init(c);
	c->sessions = 3;
	c->turns = 4;
	c->system_tokens = 100; /* not a whole number of pages */
	c->context_tokens = 300;
	c->turn_tokens = 200;
	c->output_tokens = 40;
	/* small memory tiers: warm turns restore from ssd too */
	c->fabric_bytes = 48ull << 20;
	c->dram_bytes = 32ull << 20;
}

static void on_alarm(int sig)
{
	static const char m[] = "test_demo: no progress in 240 s: a hang "
				"(in the cache?)\n";

	(void)sig;
	if (write(2, m, sizeof(m) - 1) < 0)
		_exit(1);
	_exit(1);
}

/* One reduced run under @background; checks every request and layer. */
static void run_checked(unsigned background)
{
	kvt_demo_config c;
	kvt_demo_result *r = NULL;
	struct timeline tl = { 0 };
	uint64_t lower = 0, ssd = 0, warm_hit = 0, warm_prev = 0;

	small(&c);
	c.background = background;
	c.layers = on_layers;
	c.layers_arg = &tl;
	CHECK_OK(kvt_demo_size(&c));
	CHECK_OK(kvt_demo_run(&c, &r));
	if (!r)
		return;
	CHECK_EQ(r->npasses, 2);
	CHECK_EQ(tl.calls, 2 * (size_t)c.sessions * c.turns);
	CHECK_EQ(r->error[0], '\0');
	for (int i = 0; i < r->npasses; i++) {
		check_pass(r, &r->pass[i], &warm_hit, &warm_prev);
		for (size_t j = 0; j < r->pass[i].nreqs; j++) {
			for (int t = KVT_TIER_FABRIC; t < KVT_TIER_COUNT; t++)
				lower += r->pass[i].reqs[j].hit_tokens[t];
			ssd += r->pass[i].reqs[j].hit_tokens[KVT_TIER_SSD];
		}
	}
	CHECK(lower > 0);
	CHECK(ssd > 0);
	/* most of every warm turn's prefix came back */
	CHECK(warm_hit * 2 >= warm_prev);
	CHECK(!strcmp(r->pass[0].policy, "lmcache"));
	CHECK(!strcmp(r->pass[1].policy, "kvtier"));
	printf("background %u: largest TTFT not in a component: %.3f ms; "
	       "warm turns restored %llu of %llu cached tokens\n", background,
	       tl.worst_gap * 1e3, (unsigned long long)warm_hit,
	       (unsigned long long)warm_prev);
	kvt_demo_result_free(r);
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
	/* evictions inside the stores, then in the background (the default) */
	run_checked(0);
	run_checked(KVT_DEMO_LMCACHE | KVT_DEMO_KVTIER);

	/* ssd files overwritten after the first turn of both policies: the
	 * run fails, and says what failed */
	small(&c);
	c.background = 0;
	c.tamper_after = 4 * c.sessions; /* after turn 1: ssd holds pages */
	snprintf(c.dir, sizeof(c.dir), "%s", test_dir("demo-tamper"));
	r = NULL;
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
		/* what failed was counted, not dropped from the summary */
		CHECK(bad > 0);
		CHECK(err != KVT_ECORRUPT || bad > 0);
		printf("tampered: %s; %llu copies failed verification, %llu "
		       "restored pages failed\n", r->error,
		       (unsigned long long)bad, (unsigned long long)failed);
		kvt_demo_result_free(r);
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
	TEST_DONE();
}
