/*
 * test_sim_workload — the simulator's workloads: agentic turns extend
 * their session's prefix exactly; questions on one document share the
 * document and nothing after it; the cache distance is what was asked;
 * trace blocks with one hash id are one token run; arrivals are Poisson
 * at the asked rate; lengths stay in their clips; the seed decides all.
 */
#include "harness.h"
#include "sim/sim_impl.h"

#include <math.h>

static uint32_t *tokens(struct wl *w, const struct wl_item *it)
{
	uint32_t *t = malloc((size_t)it->prompt * sizeof(*t));

	kvti_wl_tokens(w, it, t);
	return t;
}

static uint32_t common(const uint32_t *a, uint32_t na, const uint32_t *b,
		       uint32_t nb)
{
	uint32_t i = 0;

	while (i < na && i < nb && a[i] == b[i])
		i++;
	return i;
}

static void test_agentic(void)
{
	kvt_sim_config c;
	struct wl w;
	struct wl_item *it, cur, next;
	uint32_t n, *prev = NULL, prev_n = 0;

	kvt_sim_config_init(&c);
	c.context = 32768;
	c.output = 256;
	CHECK_OK(kvti_wl_init(&w, &c, 1));
	CHECK_OK(kvti_wl_initial(&w, &it, &n));
	CHECK_EQ(n, 10);
	CHECK_EQ(it[0].prompt, 32768 - 5 * (1024 + 256));
	cur = it[0];
	for (uint32_t k = 0; k < 6; k++) {
		uint32_t *t = tokens(&w, &cur);

		CHECK_EQ(cur.turn, k);
		CHECK_EQ(cur.warm, k > 0);
		if (prev) /* the previous prompt is a prefix of this one */
			CHECK_EQ(common(prev, prev_n, t, cur.prompt), prev_n);
		free(prev);
		prev = t;
		prev_n = cur.prompt;
		if (!kvti_wl_next(&w, &cur, 10.0 * k, &next))
			break;
		CHECK(next.arrival >= 10.0 * k);
		cur = next;
	}
	CHECK_EQ(prev_n, 32768);
	CHECK_EQ(cur.turn, 5);
	CHECK(!kvti_wl_next(&w, &cur, 99, &next));
	/* another session shares nothing */
	{
		uint32_t *t = tokens(&w, &it[1]);

		CHECK(common(prev, prev_n, t, it[1].prompt) < 4);
		free(t);
	}
	free(prev);
	kvt_free(it);
	kvti_wl_fini(&w);
}

/* The demo's agentic workload: a system prompt every session shares and
 * nothing after it, sessions arriving as a Poisson process, each with a
 * pace of its own; with none of it, exactly the draws of before. */
static void test_agentic_sessions(void)
{
	kvt_sim_config c;
	struct wl w, w0;
	struct wl_item *it, *it0, next;
	uint32_t n, n0, *a, *b;
	double gaps = 0, prev = 0, pace[2] = { 0 };

	kvt_sim_config_init(&c);
	c.sessions = 400;
	c.turns = 2;
	c.context = 6000;
	c.append = 500;
	c.output = 100;
	c.system = 1000;
	c.session_rate = 50;
	c.think_s = 2;
	c.think_sigma = 0.8;
	CHECK_OK(kvti_wl_init(&w, &c, 1));
	CHECK_OK(kvti_wl_initial(&w, &it, &n));
	CHECK_EQ(n, 400);
	a = tokens(&w, &it[0]);
	b = tokens(&w, &it[1]);
	CHECK_EQ(common(a, it[0].prompt, b, it[1].prompt), 1000);
	free(a);
	free(b);
	for (uint32_t i = 0; i < n; i++) {
		CHECK(it[i].arrival >= prev);
		gaps += it[i].arrival - prev;
		prev = it[i].arrival;
	}
	/* mean gap 1/50 s within 20% over 400 sessions */
	CHECK(fabs(gaps / n - 0.02) < 0.004);
	/* two sessions' paces differ: their mean think times are their own
	 * (200 turns each: the draws are per (session, turn)) */
	w.turns = 202;
	for (int s = 0; s < 2; s++) {
		struct wl_item cur = it[s];

		for (int k = 0; k < 200; k++) {
			cur.turn = (uint32_t)k;
			CHECK_EQ(kvti_wl_next(&w, &cur, 10.0, &next), 1);
			pace[s] += next.arrival - 10.0;
		}
		pace[s] /= 200;
	}
	CHECK(fabs(pace[0] - pace[1]) > 0.05 * (pace[0] + pace[1]));
	/* a think time depends on (seed, session, turn) alone, not on the
	 * order turns finish in (policies and runs finish them in their own
	 * order): session 1's next turn, drawn before and after many other
	 * draws, arrives at the same time; another session's does not */
	{
		struct wl_item a1, a2, b1;

		w.turns = 2;
		CHECK_EQ(kvti_wl_next(&w, &it[1], 10.0, &a1), 1);
		for (uint32_t s = 2; s < n; s++)
			CHECK_EQ(kvti_wl_next(&w, &it[s], 10.0, &next), 1);
		CHECK_EQ(kvti_wl_next(&w, &it[1], 10.0, &a2), 1);
		CHECK(a1.arrival == a2.arrival);
		CHECK_EQ(kvti_wl_next(&w, &it[2], 10.0, &b1), 1);
		CHECK(b1.arrival != a1.arrival);
	}
	kvt_free(it);
	kvti_wl_fini(&w);

	/* without them: every session at 0, the old token streams */
	c.system = 0;
	c.session_rate = 0;
	c.think_sigma = 0;
	CHECK_OK(kvti_wl_init(&w0, &c, 1));
	CHECK_OK(kvti_wl_initial(&w0, &it0, &n0));
	CHECK_EQ(it0[n0 - 1].arrival, 0);
	a = tokens(&w0, &it0[0]);
	b = tokens(&w0, &it0[1]);
	CHECK(common(a, it0[0].prompt, b, it0[1].prompt) < 8);
	free(a);
	free(b);
	kvt_free(it0);
	kvti_wl_fini(&w0);
	c.system = 6000;
	CHECK_ERR(kvti_wl_init(&w0, &c, 1), KVT_ECONFIG);
}

static void test_documents(void)
{
	static const kvt_workload kinds[] = { KVT_WL_LOOGLE,
					      KVT_WL_NARRATIVEQA,
					      KVT_WL_REVIEWMT };

	for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
		kvt_sim_config c;
		struct wl w;
		struct wl_item *it;
		uint32_t n, last[4096];
		double mean_gap;

		kvt_sim_config_init(&c);
		c.workload = kinds[k];
		c.requests = 2000;
		c.cache_distance = 9;
		CHECK_OK(kvti_wl_init(&w, &c, 4.0));
		CHECK_OK(kvti_wl_initial(&w, &it, &n));
		CHECK_EQ(n, 2000);
		memset(last, 0xff, sizeof(last));
		for (uint32_t i = 0; i < n; i++) {
			uint32_t d = it[i].source;

			CHECK(it[i].prompt > it[i].doc_tokens ||
			      kinds[k] == KVT_WL_REVIEWMT);
			CHECK(it[i].output >= 1);
			CHECK_EQ(it[i].measure, i >= 2 * 10);
			/* between two questions on one document: 9 others */
			if (d < 4096 && last[d] != UINT32_MAX)
				CHECK_EQ(i - last[d], 10);
			if (d < 4096)
				last[d] = i;
		}
		/* two questions on one document share exactly the document
		 * (reviewmt: the paper and every earlier turn) */
		for (uint32_t i = 0; i + 10 < n && i < 200; i++) {
			if (it[i + 10].source != it[i].source)
				continue;
			{
				uint32_t *a = tokens(&w, &it[i]);
				uint32_t *b = tokens(&w, &it[i + 10]);
				uint32_t m = common(a, it[i].prompt, b,
						    it[i + 10].prompt);

				if (kinds[k] == KVT_WL_REVIEWMT)
					CHECK_EQ(m, it[i].prompt);
				else
					CHECK(m >= it[i].doc_tokens &&
					      m < it[i].doc_tokens + 4);
				free(a);
				free(b);
			}
		}
		/* Poisson arrivals at 4/s: mean gap 0.25 s within 10% */
		mean_gap = it[n - 1].arrival / n;
		CHECK(fabs(mean_gap - 0.25) < 0.025);
		kvt_free(it);
		kvti_wl_fini(&w);
	}
}

static void test_trace_tokens(void)
{
	const char *text =
		"{\"timestamp\": 0, \"input_length\": 1100, \"output_length\": 5, \"hash_ids\": [7, 8, 9]}\n"
		"{\"timestamp\": 10, \"input_length\": 700, \"output_length\": 5, \"hash_ids\": [7, 4]}\n";
	const char *dir = test_dir("sim-workload");
	char path[600];
	kvt_sim_config c;
	struct wl w;
	struct wl_item *it;
	uint32_t n, *a, *b;
	FILE *f;

	snprintf(path, sizeof(path), "%s/t.jsonl", dir);
	f = fopen(path, "w");
	fputs(text, f);
	fclose(f);
	kvt_sim_config_init(&c);
	c.workload = KVT_WL_TRACE;
	snprintf(c.trace_path, sizeof(c.trace_path), "%s", path);
	CHECK_OK(kvti_wl_init(&w, &c, 1));
	CHECK_OK(kvti_wl_initial(&w, &it, &n));
	CHECK_EQ(n, 2);
	CHECK_EQ(it[1].prompt, 700);
	CHECK(fabs(it[1].arrival - 0.010) < 1e-12);
	a = tokens(&w, &it[0]);
	b = tokens(&w, &it[1]);
	CHECK_EQ(common(a, 1100, b, 700), 512); /* block 7 only */
	free(a);
	free(b);
	kvt_free(it);
	kvti_wl_fini(&w);
}

static void test_sharegpt_seed(void)
{
	kvt_sim_config c;
	struct wl w1, w2;
	struct wl_item *a, *b;
	uint32_t n1, n2, same = 1;

	kvt_sim_config_init(&c);
	c.workload = KVT_WL_SHAREGPT;
	c.requests = 500;
	CHECK_OK(kvti_wl_init(&w1, &c, 2));
	CHECK_OK(kvti_wl_initial(&w1, &a, &n1));
	CHECK_OK(kvti_wl_init(&w2, &c, 2));
	CHECK_OK(kvti_wl_initial(&w2, &b, &n2));
	CHECK_EQ(n1, n2);
	for (uint32_t i = 0; i < n1; i++) {
		same &= a[i].prompt == b[i].prompt && a[i].arrival == b[i].arrival;
		CHECK(a[i].prompt >= 4 && a[i].prompt <= 4096);
		CHECK(a[i].output >= 4 && a[i].output <= 1024);
	}
	CHECK(same);
	kvt_free(a);
	kvt_free(b);
	kvti_wl_fini(&w1);
	kvti_wl_fini(&w2);
}

int main(void)
{
	test_agentic();
	test_agentic_sessions();
	test_documents();
	test_trace_tokens();
	test_sharegpt_seed();
	TEST_DONE();
}
