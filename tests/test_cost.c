/*
 * test_cost — the scheduler's cost model: copy-rate curves and per-call
 * costs (against rates worked by hand from the fixture's figures),
 * the forward-pass roofline against a plain per-token reference, the
 * overlap formula, and the checks on bad figures.
 */
#include "harness.h"
#include "cost_fixture.h"

#include <math.h>

static int near(double a, double b, double rel)
{
	return fabs(a - b) <= rel * fabs(b);
}

/* The curve's own rate (no call cost): a per-job method's rate on a
 * copy of many chunks, recovered from kvt_cost_copy_s. */
static double curve_rate(const kvt_cost *c, kvt_copy_method m, uint64_t ch)
{
	kvt_cost x = *c;

	x.copy[m].call_us = 0;
	x.copy[KVT_COPY_BATCH] = x.copy[m]; /* priced as a batched method */
	return kvt_cost_copy_gbps(&x, KVT_COPY_BATCH, ch);
}

static void test_curves(void)
{
	kvt_cost c;
	kvt_copy_method m;
	double r8, r16, r64;

	CHECK_OK(fixture_cost(&c, "llama-3.1-8b", 1));
	CHECK_OK(kvt_cost_check(&c));
	/* a 16-token page of llama-3.1-8b: 16 * 8 heads * 128 * 2 B = 32 KiB */
	CHECK_EQ(c.chunk_bytes, 32768);
	CHECK_EQ(c.token_bytes, 131072);
	CHECK_EQ(kvt_cost_method_chunk(&c, KVT_COPY_MEMCPY, 0), 32768);
	CHECK_EQ(kvt_cost_method_chunk(&c, KVT_COPY_OBJECT, 256), 256 * 131072);

	/* batch: curve points are met exactly, between them monotone */
	CHECK(near(kvt_cost_copy_gbps(&c, KVT_COPY_BATCH, 4096), 4, 1e-9));
	CHECK(near(kvt_cost_copy_gbps(&c, KVT_COPY_BATCH, 65536), 38, 1e-9));
	r8 = kvt_cost_copy_gbps(&c, KVT_COPY_BATCH, 8192);
	r16 = kvt_cost_copy_gbps(&c, KVT_COPY_BATCH, 16384);
	r64 = kvt_cost_copy_gbps(&c, KVT_COPY_BATCH, 65536);
	CHECK(r8 > 4 && r8 < r16 && r16 < r64);
	/* ends are held, and nothing beats the link */
	CHECK(near(kvt_cost_copy_gbps(&c, KVT_COPY_BATCH, 1), 4, 1e-9));
	CHECK(near(kvt_cost_copy_gbps(&c, KVT_COPY_BATCH, 1ull << 40), 54,
		   1e-9));

	/* per-chunk calls: rate = chunk / (call + chunk / curve(chunk)),
	 * worked by hand from the fixture (memcpy 4K:4 16K:7 64K:50 1M:54,
	 * 3.34 us per call) at points on and between the curve's, so a
	 * wrong formula, interpolation or unit fails here. (The 22% of
	 * SPEC.md that profiles derive the call cost from is not checked:
	 * a figure a parameter was solved from cannot test the model.) */
	CHECK(near(kvt_cost_copy_gbps(&c, KVT_COPY_MEMCPY, 4096),
		   4096.0 / (3340 + 4096.0 / 4), 1e-9));
	CHECK(near(kvt_cost_copy_gbps(&c, KVT_COPY_MEMCPY, 16384),
		   16384.0 / (3340 + 16384.0 / 7), 1e-9));
	CHECK(near(kvt_cost_copy_gbps(&c, KVT_COPY_MEMCPY, 32768),
		   32768.0 / (3340 + 32768.0 / sqrt(7.0 * 50)), 1e-9));
	/* ... and that penalty makes it slower than one batched call over
	 * the same engines at every chunk size below the link's limit */
	for (uint64_t ch = 4096; ch <= 1 << 20; ch *= 2) {
		CHECK(kvt_cost_copy_gbps(&c, KVT_COPY_MEMCPY, ch) <
		      kvt_cost_copy_gbps(&c, KVT_COPY_MEMCPY, ch * 2));
		if (ch < 1 << 20)
			CHECK(kvt_cost_copy_gbps(&c, KVT_COPY_MEMCPY, ch) <
			      curve_rate(&c, KVT_COPY_MEMCPY, ch));
	}
	/* the gather kernel: a curve by chunk size, its launch paid once
	 * per job like the other batched method (fixture 4K:30, 64K:48) */
	CHECK(near(kvt_cost_copy_gbps(&c, KVT_COPY_GATHER, 4096), 30, 1e-9));
	CHECK(near(kvt_cost_copy_gbps(&c, KVT_COPY_GATHER, 16384),
		   30 * pow(48.0 / 30, 0.5), 1e-9));
	CHECK(near(kvt_cost_copy_s(&c, KVT_COPY_GATHER, 4096, 3000000000ull),
		   5e-6 + 0.1, 1e-9));
	/* per-job call cost is paid once for batched methods */
	CHECK(near(kvt_cost_copy_s(&c, KVT_COPY_BATCH, 65536, 38000000000ull),
		   1.0 + 10e-6, 1e-9));
	CHECK_EQ(kvt_cost_copy_s(&c, KVT_COPY_BATCH, 65536, 0), 0);
	c.copy[KVT_COPY_GATHER].n = 0;
	CHECK_EQ(kvt_cost_copy_gbps(&c, KVT_COPY_GATHER, 65536), 0);
	CHECK(kvt_cost_copy_s(&c, KVT_COPY_GATHER, 65536, 1) > 1e20);

	CHECK_OK(kvt_copy_method_parse("gather", &m));
	CHECK_EQ(m, KVT_COPY_GATHER);
	CHECK_ERR(kvt_copy_method_parse("teleport", &m), -EINVAL);
	CHECK(strstr(kvt_errdetail(), "teleport") != NULL);
	CHECK(!strcmp(kvt_copy_method_name(KVT_COPY_OBJECT), "object"));
	CHECK(kvt_copy_method_name(KVT_COPY_COUNT) == NULL);
}

/* The plain reference: every token of every prefill priced on its own. */
static double ref_step(const kvt_cost *c, const kvt_cost_prefill *p, size_t n,
		       uint32_t decodes, uint64_t dctx)
{
	double flops = 0, pairs = 0, tokens = decodes, gemm, attn, ar = 0;

	for (size_t i = 0; i < n; i++)
		for (uint32_t t = 0; t < p[i].tokens; t++) {
			flops += 2.0 * (double)c->active_params;
			pairs += p[i].context + t + 1; /* keys this query sees */
			tokens += 1;
		}
	flops += 2.0 * (double)c->active_params * decodes;
	if (tokens == 0)
		return 0;
	gemm = flops / (c->gpu_flops * c->tp * c->gemm_eff);
	if (gemm < c->weight_bytes / (c->hbm_gbps * 1e9 * c->hbm_eff))
		gemm = c->weight_bytes / (c->hbm_gbps * 1e9 * c->hbm_eff);
	attn = pairs * 4.0 * c->layers * c->q_heads * c->head_dim /
		       (c->gpu_flops * c->tp * c->attn_eff) +
	       (double)dctx * c->token_bytes / (c->hbm_gbps * 1e9 * c->hbm_eff);
	for (uint32_t l = 0; c->tp > 1 && l < 2 * c->layers; l++)
		ar += c->ar_us * 1e-6 + 2.0 * (c->tp - 1) / c->tp * tokens *
					       c->hidden * 2 / (c->ar_gbps * 1e9);
	return gemm + attn + ar + c->step_us * 1e-6;
}

static void test_step(void)
{
	kvt_cost c;
	kvt_cost_prefill p[4];
	uint64_t seed = 7;
	double a, b;

	CHECK_OK(fixture_cost(&c, "qwen2.5-32b", 4));
	CHECK_EQ(c.token_bytes, 65536); /* SPEC.md: 64 KiB per rank */
	CHECK_EQ(kvt_cost_step_s(&c, NULL, 0, 0, 0), 0);
	for (int round = 0; round < 200; round++) {
		size_t n = test_rand(&seed) % 4;
		uint32_t d = (uint32_t)(test_rand(&seed) % 64);
		uint64_t dctx = d * (test_rand(&seed) % 40000);

		for (size_t i = 0; i < n; i++) {
			p[i].tokens = (uint32_t)(1 + test_rand(&seed) % 3000);
			p[i].context = (uint32_t)(test_rand(&seed) % 30000);
		}
		a = kvt_cost_step_s(&c, p, n, d, dctx);
		b = ref_step(&c, p, n, d, dctx);
		CHECK(near(a, b, 1e-9));
	}
	/* big prefills are compute bound: twice the tokens, about twice the
	 * GEMM time; a lone decode is bound by streaming the weights */
	a = kvt_cost_prefill_s(&c, 4096, 0);
	b = kvt_cost_prefill_s(&c, 8192, 0);
	CHECK(b > 1.9 * a - 2 * c.step_us * 1e-6);
	CHECK(kvt_cost_step_s(&c, NULL, 0, 1, 100) >
	      c.weight_bytes / (c.hbm_gbps * 1e9));
	/* context makes a prefill dearer (the attention part) */
	CHECK(kvt_cost_prefill_s(&c, 1024, 30000) >
	      kvt_cost_prefill_s(&c, 1024, 0));
	/* the warm turn of the calibration case: 1280 new tokens after
	 * 29k cached on 4 x H200 sit in the tens of milliseconds */
	a = kvt_cost_prefill_s(&c, 1280, 29000);
	CHECK(a > 0.03 && a < 0.15);

	/* overlap */
	CHECK(near(kvt_cost_overlap_s(&c, 0.1, 0.05, 0), 0.15, 1e-12));
	CHECK(near(kvt_cost_overlap_s(&c, 0.1, 0.05, 1), 0.1 + 0.05 / 64,
		   1e-12));
	CHECK(near(kvt_cost_overlap_s(&c, 0.01, 0.2, 1), 0.2 + 0.01 / 64,
		   1e-12));
	CHECK_EQ(kvt_cost_overlap_s(&c, 0.1, 0, 1), 0.1);
}

static void test_checks(void)
{
	kvt_cost c, bad;
	kvt_geom g;

	CHECK_OK(fixture_cost(&c, "llama-3.1-8b", 1));
	bad = c;
	bad.gemm_eff = 1.5;
	CHECK_ERR(kvt_cost_check(&bad), KVT_ECONFIG);
	bad = c;
	bad.copy[KVT_COPY_CONTIG].n = 0;
	CHECK_ERR(kvt_cost_check(&bad), KVT_ECONFIG);
	CHECK(strstr(kvt_errdetail(), "contig") != NULL);
	bad = c;
	bad.copy[KVT_COPY_BATCH].chunk_bytes[2] = 1;
	CHECK_ERR(kvt_cost_check(&bad), KVT_ECONFIG);
	CHECK(strstr(kvt_errdetail(), "batch") != NULL);
	bad = c;
	bad.tp = 2;
	bad.ar_gbps = 0;
	CHECK_ERR(kvt_cost_check(&bad), KVT_ECONFIG);
	bad = c;
	bad.layers = 0;
	CHECK_ERR(kvt_cost_check(&bad), KVT_ECONFIG);

	CHECK_OK(kvt_geom_preset(&g, "llama-3.1-8b", 16, 1, 0));
	g.params = 0;
	CHECK_ERR(kvt_cost_set_model(&bad, &g), KVT_EGEOM);
}

int main(void)
{
	test_curves();
	test_step();
	test_checks();
	TEST_DONE();
}
