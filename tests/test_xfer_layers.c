/*
 * test_xfer_layers.c — per-layer checksums (KVT_XFER_LSUM / LVERIFY), the
 * strided layout of an engine's own memory and kvt_tier_wrap().
 *
 * - kvt_layout_init_strided(): K/V-outer strides equal the vLLM layout
 *   chunk for chunk; block-outer strides (FlashInfer-like) place every
 *   chunk apart; overlapping or non-contiguous strides are refused.
 * - LSUM on every lane that can take it (cpu: page-first -> page-first,
 *   layer-first -> page-first; io: host -> ssd) writes sums[i * L + l] ==
 *   XXH3-64 of layer l's page-first bytes.
 * - LVERIFY into wrapped strided memory lands the same bytes as the
 *   reference conversion; one corrupted layer of one source page marks that
 *   page in bad[] (job succeeds, every other page exact); without bad[] the
 *   job fails with KVT_ECORRUPT; ssd -> strided memory the same way.
 * - argument checks: two sum flags, bad[] without LVERIFY.
 */
#include "harness.h"
#include "xfer_util.h"

#define NB 24 /* engine blocks */

static kvt_geom geom(void)
{
	kvt_geom g;

	CHECK_OK(kvt_geom_preset(&g, "llama-3.2-1b", 4, 1, 0));
	g.layers = 5;
	g.kv_heads = g.kv_heads_total = 2;
	g.head_dim = 32;
	CHECK_OK(kvt_geom_finish(&g));
	return g;
}

/* XXH3 of layer @l of page-first page @pf. */
static uint64_t layer_sum(const kvt_geom *g, const unsigned char *pf,
			  uint32_t l)
{
	uint64_t lb = kvt_geom_page_bytes(g) / g->layers;

	return XXH3_64bits(pf + l * lb, lb);
}

static void test_strided_layout(const kvt_geom *g)
{
	uint64_t c = kvt_geom_chunk_bytes(g);
	uint64_t tok = (uint64_t)g->kv_heads * g->head_dim * g->dtype_bytes;
	kvt_layout s, v;

	/* K/V outer, exactly vLLM's per-layer [2][blocks][P][H][D] */
	CHECK_OK(kvt_layout_init_strided(&s, g, NB, c, NB * c, tok));
	CHECK_OK(kvt_layout_init(&v, KVT_LAYOUT_VLLM, g, NB));
	CHECK_EQ(s.nbufs, v.nbufs);
	CHECK_EQ(s.buf_bytes, v.buf_bytes);
	for (uint32_t b = 0; b < NB; b++)
		for (uint32_t l = 0; l < g->layers; l++)
			for (uint32_t k = 0; k < 2; k++) {
				kvt_chunk_loc a = kvt_layout_chunk(&s, b, l, k);
				kvt_chunk_loc e = kvt_layout_chunk(&v, b, l, k);
				CHECK(a.buf == e.buf && a.off == e.off);
			}
	/* block outer with padding: [blocks][2][P][H][D] + 64 bytes */
	CHECK_OK(kvt_layout_init_strided(&s, g, NB, 2 * c + 64, c, tok));
	CHECK_EQ(s.buf_bytes, (NB - 1) * (2 * c + 64) + 2 * c);
	/* refused: token stride not H*D*s, overlapping chunks */
	CHECK_ERR(kvt_layout_init_strided(&s, g, NB, c, NB * c, tok * 2),
		  KVT_EGEOM);
	CHECK_ERR(kvt_layout_init_strided(&s, g, NB, c, c, tok), KVT_EGEOM);
	CHECK_ERR(kvt_layout_init_strided(&s, g, NB, c / 2, NB * c, tok),
		  KVT_EGEOM);
	CHECK_ERR(kvt_layout_init_strided(&s, g, NB, 2 * c, c / 2, tok),
		  KVT_EGEOM);
}

/* Engine memory: block-outer strides, per-layer buffers. */
static kvt_tier *engine_open(const kvt_geom *g, void **bufs)
{
	uint64_t c = kvt_geom_chunk_bytes(g);
	uint64_t tok = (uint64_t)g->kv_heads * g->head_dim * g->dtype_bytes;
	kvt_layout l;
	kvt_tier *t = NULL;

	CHECK_OK(kvt_layout_init_strided(&l, g, NB, 2 * c + 128, c, tok));
	for (uint32_t i = 0; i < g->layers; i++) {
		bufs[i] = malloc(l.buf_bytes);
		fill_rand(bufs[i], l.buf_bytes, 100 + i);
	}
	CHECK_ERR(kvt_tier_wrap(&t, &l, NULL, -1), -EINVAL);
	CHECK_OK(kvt_tier_wrap(&t, &l, bufs, -1));
	return t;
}

/* Record layer sums over a job, then check them against page-first
 * images of what the destination now holds. */
static void check_lsum(kvt_xfer *x, kvt_tier *src, kvt_tier *dst,
		       const kvt_geom *g, const char *what)
{
	uint32_t ss[6] = { 3, 0, 7, 1, 5, 2 }, ds[6] = { 1, 4, 2, 0, 6, 3 };
	uint64_t sums[6 * 8];
	unsigned char *page = malloc(kvt_geom_page_bytes(g));
	kvt_xfer_desc d = {
		.src = src, .dst = dst, .src_slots = ss, .dst_slots = ds,
		.npages = 6, .flags = KVT_XFER_LSUM, .sums = sums,
	};

	memset(sums, 0, sizeof(sums));
	CHECK_OK(run_job(x, &d));
	for (size_t i = 0; i < 6; i++) {
		CHECK_OK(kvt_tier_read(dst, ds[i], page));
		for (uint32_t l = 0; l < g->layers; l++)
			if (sums[i * g->layers + l] != layer_sum(g, page, l)) {
				fprintf(stderr, "%s: page %zu layer %u sum\n",
					what, i, l);
				kvt_test_failures++;
			}
	}
	free(page);
}

/* Sums of slots @ss of @t, per layer. */
static void sums_of(kvt_tier *t, const uint32_t *ss, size_t n,
		    const kvt_geom *g, uint64_t *sums)
{
	unsigned char *page = malloc(kvt_geom_page_bytes(g));

	for (size_t i = 0; i < n; i++) {
		CHECK_OK(kvt_tier_read(t, ss[i], page));
		for (uint32_t l = 0; l < g->layers; l++)
			sums[i * g->layers + l] = layer_sum(g, page, l);
	}
	free(page);
}

/* LVERIFY loads into the engine's strided memory from @src. */
static void check_lverify(kvt_xfer *x, kvt_tier *src, kvt_tier *eng,
			  const kvt_geom *g, const char *what)
{
	enum { N = 8 };
	uint32_t ss[N] = { 0, 1, 2, 3, 4, 5, 6, 7 };
	uint32_t ds[N] = { 9, 2, 17, 4, 0, 23, 11, 6 };
	uint64_t sums[N * 8], len = kvt_geom_page_bytes(g);
	uint8_t bad[N];
	unsigned char *want, *got, *page = malloc(len);
	kvt_xfer_desc d = {
		.src = src, .dst = eng, .src_slots = ss, .dst_slots = ds,
		.npages = N, .flags = KVT_XFER_LVERIFY, .sums = sums,
		.bad = bad,
	};

	/* clean: exact bytes, nothing bad */
	sums_of(src, ss, N, g, sums);
	memset(bad, 0, sizeof(bad));
	want = expect_pages(src, eng, ss, ds, N);
	CHECK_OK(run_job(x, &d));
	got = tier_pages(eng);
	CHECK(!memcmp(want, got, NB * len));
	for (int i = 0; i < N; i++)
		CHECK_EQ(bad[i], 0);
	free(want);
	free(got);

	/* layer 3 of source page 5 no longer matches its sum */
	CHECK_OK(kvt_tier_read(src, ss[5], page));
	page[3 * (len / g->layers) + 17] ^= 0x40;
	CHECK_OK(kvt_tier_write(src, ss[5], page));
	memset(bad, 0, sizeof(bad));
	CHECK_OK(run_job(x, &d));
	for (int i = 0; i < N; i++)
		if (bad[i] != (i == 5)) {
			fprintf(stderr, "%s: bad[%d] = %d\n", what, i, bad[i]);
			kvt_test_failures++;
		}
	/* every other page landed exactly */
	want = expect_pages(src, eng, ss, ds, N);
	got = tier_pages(eng);
	for (int i = 0; i < N; i++)
		if (i != 5)
			CHECK(!memcmp(want + ds[i] * len, got + ds[i] * len, len));
	free(want);
	free(got);
	/* without bad[]: the job fails */
	d.bad = NULL;
	CHECK_ERR(run_job(x, &d), KVT_ECORRUPT);
	free(page);
}

int main(void)
{
	kvt_geom g = geom();
	void *bufs[8];
	char spec[600];
	kvt_tier *eng, *dram, *fab, *ssd;
	kvt_xfer *x;
	uint64_t sums[8];
	uint8_t bad[1];
	uint32_t s0 = 0;

	test_strided_layout(&g);
	CHECK_OK(kvt_xfer_create(&x, NULL));
	eng = engine_open(&g, bufs);
	snprintf(spec, sizeof(spec), "dram:%llu",
		 (unsigned long long)(16 * kvt_geom_page_bytes(&g)));
	dram = tier_open(spec, &g);
	snprintf(spec, sizeof(spec), "fabric:memfd,%llu",
		 (unsigned long long)(16 * kvt_geom_page_bytes(&g)));
	fab = tier_open(spec, &g);
	snprintf(spec, sizeof(spec), "ssd:%s,%llu,temp",
		 test_dir("xfer_layers"),
		 (unsigned long long)(16 * kvt_geom_page_bytes(&g)));
	ssd = tier_open(spec, &g);
	if (!eng || !dram || !fab || !ssd)
		TEST_DONE();
	tier_fill(dram, 1);
	tier_fill(fab, 2);
	tier_fill(ssd, 3);

	/* argument checks */
	{
		kvt_xfer_desc d = { .src = dram, .dst = eng, .src_slots = &s0,
				    .dst_slots = &s0, .npages = 1,
				    .flags = KVT_XFER_LSUM | KVT_XFER_VERIFY,
				    .sums = sums };
		kvt_xfer_job *j;
		CHECK_ERR(kvt_xfer_submit(x, &d, &j), -EINVAL);
		d.flags = KVT_XFER_LSUM;
		d.bad = bad;
		CHECK_ERR(kvt_xfer_submit(x, &d, &j), -EINVAL);
	}

	check_lsum(x, dram, fab, &g, "cpu page-first");
	check_lsum(x, eng, dram, &g, "cpu engine -> dram");
	check_lsum(x, fab, ssd, &g, "io host -> ssd");
	check_lverify(x, dram, eng, &g, "cpu dram -> engine");
	check_lverify(x, ssd, eng, &g, "io ssd -> engine");

	kvt_xfer_destroy(x);
	kvt_tier_close(eng);
	kvt_tier_close(dram);
	kvt_tier_close(fab);
	kvt_tier_close(ssd);
	for (uint32_t i = 0; i < g.layers; i++)
		free(bufs[i]);
	TEST_DONE();
}
