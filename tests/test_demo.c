/*
 * test_demo — a reduced `kvtier demo` through the library, and its
 * invariants: every request ran, every checksum matched (in flight and when
 * every copy was re-read at the end), every warm turn found its whole
 * cached prefix, and the numbers add up (hits + computed = prompt; bytes
 * restored = pages loaded x page size; verified = loaded).
 */
#include "harness.h"

static void check_pass(const kvt_demo_result *r, const kvt_demo_pass *p)
{
	const kvt_demo_config *c = &r->config;
	const uint32_t P = c->page_tokens;
	uint64_t page = kvt_geom_page_bytes(&r->geom), loaded = 0, verified = 0;

	CHECK_EQ(p->nreqs, (size_t)c->sessions * c->turns);
	CHECK_EQ(p->check.bad, 0);
	CHECK_EQ(p->check.unsummed, 0);
	CHECK(p->check.checked > 0);
	CHECK_EQ(p->cache.move_errors, 0);
	CHECK_EQ(p->cache.corrupt, 0);
	for (size_t i = 0; i < p->nreqs; i++) {
		const kvt_demo_req *q = &p->reqs[i];
		uint64_t hit = 0, lower = 0;

		for (int t = 0; t < KVT_TIER_COUNT; t++) {
			hit += q->hit_tokens[t];
			if (t)
				lower += q->hit_tokens[t];
		}
		CHECK_EQ(hit + q->computed_tokens, q->prompt_tokens);
		CHECK_EQ(q->restore_bytes, lower / P * page);
		CHECK_EQ(q->verified_pages, lower / P);
		CHECK(q->prefill_s > 0 && q->decode_s > 0);
		CHECK(q->ttft_s >= q->restore_s);
		if (!strcmp(p->policy, "lmcache"))
			CHECK(q->ttft_s >= q->restore_s + q->prefill_s - 1e-12);
		else
			CHECK(q->ttft_s <= q->restore_s + q->prefill_s + 1e-12);
		if (q->turn > 0) {
			/* the whole previous context, prompt and answer */
			uint64_t prev = c->system_tokens + c->context_tokens +
					(uint64_t)(q->turn - 1) *
					(c->turn_tokens + c->output_tokens) +
					c->output_tokens;
			CHECK_EQ(hit, prev / P * P);
		} else if (q->session > 0) {
			/* the shared system prompt, cached by session 0 */
			CHECK_EQ(hit, c->system_tokens / P * P);
		}
		loaded += lower / P;
		verified += q->verified_pages;
	}
	CHECK_EQ(p->cache.load_pages, loaded);
	CHECK(verified == loaded);
}

int main(void)
{
	kvt_demo_config c;
	kvt_demo_result *r = NULL;
	uint64_t lower = 0;

	kvt_demo_config_init(&c);
	c.sessions = 3;
	c.turns = 4;
	c.system_tokens = 100; /* not a whole number of pages */
	c.context_tokens = 300;
	c.turn_tokens = 200;
	c.output_tokens = 40;
	c.dir[0] = '\0';
	setenv("TMPDIR", test_dir("demo"), 1);
	CHECK_OK(kvt_demo_size(&c));
	CHECK_OK(kvt_demo_run(&c, &r));
	if (!r)
		TEST_DONE();
	CHECK_EQ(r->npasses, 2);
	for (int i = 0; i < r->npasses; i++) {
		check_pass(r, &r->pass[i]);
		for (size_t j = 0; j < r->pass[i].nreqs; j++)
			for (int t = 1; t < KVT_TIER_COUNT; t++)
				lower += r->pass[i].reqs[j].hit_tokens[t];
	}
	/* the sizes push sessions out of hbm: warm turns restore */
	CHECK(lower > 0);
	CHECK(!strcmp(r->pass[0].policy, "lmcache"));
	CHECK(!strcmp(r->pass[1].policy, "kvtier"));
	kvt_demo_result_free(r);

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
