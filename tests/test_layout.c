/*
 * test_layout — KV layouts: address arithmetic against an independent
 * formula, and the reference conversion's round trip page-first -> vLLM ->
 * SGLang -> page-first, bit-exact, for every preset, page sizes 1/16/32/256,
 * TP 1/2/4 and MLA.
 */
#include "harness.h"

/* Byte offset of element (slot, layer, kv, t, h, d) written straight from
 * the shapes in geom.h, without kvt_layout_chunk(). */
static uint64_t formula(const kvt_layout *l, uint32_t *buf, uint64_t slot,
			uint32_t layer, uint32_t k, uint32_t t, uint32_t h,
			uint32_t d)
{
	const kvt_geom *g = &l->geom;
	uint64_t L = g->layers, K = l->kv, P = g->page_tokens, H = g->kv_heads,
		 D = g->head_dim, s = g->dtype_bytes, S = l->slots;

	switch (l->kind) {
	case KVT_LAYOUT_VLLM:
		*buf = layer;
		return ((((k * S + slot) * P + t) * H + h) * D + d) * s;
	case KVT_LAYOUT_SGLANG:
		*buf = layer * (uint32_t)K + k;
		return (((slot * P + t) * H + h) * D + d) * s;
	default:
		*buf = 0;
		return (((((slot * L + layer) * K + k) * P + t) * H + h) * D + d) * s;
	}
}

static void fill(unsigned char *p, uint64_t n, uint64_t seed)
{
	uint64_t s = seed | 1;
	for (uint64_t i = 0; i < n; i += 8) {
		uint64_t v = test_rand(&s);
		memcpy(p + i, &v, n - i < 8 ? n - i : 8);
	}
}

static unsigned char *regions[4];
static uint64_t region_cap;

static void region_reserve(uint64_t n)
{
	if (n <= region_cap)
		return;
	for (int i = 0; i < 4; i++) {
		free(regions[i]);
		regions[i] = malloc(n);
		if (!regions[i]) {
			fprintf(stderr, "out of memory\n");
			exit(1);
		}
	}
	region_cap = n;
}

static int one_case(const char *model, uint32_t P, uint32_t tp)
{
	enum { SLOTS = 3, NPAGES = 2 };
	kvt_layout pf, vl, sg, pf2;
	kvt_geom g;
	void *b_pf[1], *b_pf2[1], **b_vl, **b_sg;
	unsigned char *r_pf, *r_vl, *r_sg, *r_pf2;
	const uint64_t src[NPAGES] = { 2, 0 };
	const uint64_t mid[NPAGES] = { 1, 2 };
	const uint64_t mid2[NPAGES] = { 0, 1 };
	const uint64_t dst[NPAGES] = { 1, 2 };
	uint64_t seed = P * 131 + tp;
	int err;

	err = kvt_geom_preset(&g, model, P, tp, tp - 1);
	if (err == KVT_EGEOM)
		return 0; /* this model cannot split over tp ranks */
	CHECK_OK(err);
	CHECK_OK(kvt_layout_init(&pf, KVT_LAYOUT_PAGE_FIRST, &g, SLOTS));
	CHECK_OK(kvt_layout_init(&vl, KVT_LAYOUT_VLLM, &g, SLOTS));
	CHECK_OK(kvt_layout_init(&sg, KVT_LAYOUT_SGLANG, &g, SLOTS));
	pf2 = pf;
	CHECK_EQ(kvt_layout_region_bytes(&pf), SLOTS * kvt_geom_page_bytes(&g));
	CHECK_EQ(kvt_layout_region_bytes(&vl), kvt_layout_region_bytes(&pf));
	CHECK_EQ(kvt_layout_region_bytes(&sg), kvt_layout_region_bytes(&pf));
	CHECK_EQ(vl.nbufs, g.layers);
	CHECK_EQ(sg.nbufs, g.layers * kvt_geom_kv(&g));

	/* page faults are slow in VMs: reuse the regions across cases */
	region_reserve(kvt_layout_region_bytes(&pf));
	r_pf = regions[0], r_vl = regions[1], r_sg = regions[2], r_pf2 = regions[3];
	memset(r_vl, 0, kvt_layout_region_bytes(&pf));
	memset(r_sg, 0, kvt_layout_region_bytes(&pf));
	memset(r_pf2, 0, kvt_layout_region_bytes(&pf));
	b_vl = malloc(vl.nbufs * sizeof(void *));
	b_sg = malloc(sg.nbufs * sizeof(void *));
	if (!b_vl || !b_sg) {
		fprintf(stderr, "out of memory\n");
		exit(1);
	}
	fill(r_pf, kvt_layout_region_bytes(&pf), seed);
	b_pf[0] = r_pf;
	b_pf2[0] = r_pf2;
	kvt_layout_bufs_carve(&vl, r_vl, b_vl);
	kvt_layout_bufs_carve(&sg, r_sg, b_sg);

	CHECK_OK(kvt_layout_convert_ref(&pf, b_pf, src, &vl, b_vl, mid, NPAGES));
	CHECK_OK(kvt_layout_convert_ref(&vl, b_vl, mid, &sg, b_sg, mid2, NPAGES));
	CHECK_OK(kvt_layout_convert_ref(&sg, b_sg, mid2, &pf2, b_pf2, dst, NPAGES));

	/* round trip bit-exact, page by page */
	for (int i = 0; i < NPAGES; i++)
		if (memcmp(r_pf + src[i] * pf.page_bytes,
			   r_pf2 + dst[i] * pf.page_bytes, pf.page_bytes)) {
			fprintf(stderr, "%s P=%u tp=%u: page %d differs\n", model,
				P, tp, i);
			CHECK(0);
		}
	/* untouched slot stays zero */
	for (uint64_t b = 0; b < pf.page_bytes; b++)
		if (r_pf2[b]) {
			CHECK(!"slot 0 of the destination was written");
			break;
		}

	/* address arithmetic and placement against the formula, sampled */
	uint64_t rs = seed * 7 + 1;
	for (int n = 0; n < 2000; n++) {
		int i = (int)(test_rand(&rs) % NPAGES);
		uint32_t layer = (uint32_t)(test_rand(&rs) % g.layers);
		uint32_t k = (uint32_t)(test_rand(&rs) % kvt_geom_kv(&g));
		uint32_t t = (uint32_t)(test_rand(&rs) % P);
		uint32_t h = (uint32_t)(test_rand(&rs) % g.kv_heads);
		uint32_t d = (uint32_t)(test_rand(&rs) % g.head_dim);
		uint64_t inner = (((uint64_t)t * g.kv_heads + h) * g.head_dim + d) *
				 g.dtype_bytes;
		const kvt_layout *ls[3] = { &pf, &vl, &sg };
		void **bs[3] = { b_pf, b_vl, b_sg };
		const uint64_t *slots[3] = { src, mid, mid2 };
		unsigned char want[4], got[4];

		for (int li = 0; li < 3; li++) {
			uint32_t fb;
			uint64_t fo = formula(ls[li], &fb, slots[li][i], layer, k,
					      t, h, d);
			kvt_chunk_loc c = kvt_layout_chunk(ls[li], slots[li][i],
							   layer, k);
			if (c.buf != fb || c.off + inner != fo) {
				fprintf(stderr, "%s %s: chunk address mismatch\n",
					model, kvt_layout_name(ls[li]->kind));
				CHECK(0);
				break;
			}
			memcpy(li ? got : want, (unsigned char *)bs[li][fb] + fo,
			       g.dtype_bytes);
			if (li && memcmp(want, got, g.dtype_bytes)) {
				fprintf(stderr, "%s %s: element misplaced\n", model,
					kvt_layout_name(ls[li]->kind));
				CHECK(0);
				break;
			}
		}
	}

	/* errors: shape mismatch, slot out of range */
	{
		kvt_geom g2 = g;
		kvt_layout other;
		uint64_t bad[1] = { SLOTS };
		g2.page_tokens = P + 1;
		CHECK_OK(kvt_layout_init(&other, KVT_LAYOUT_PAGE_FIRST, &g2, 1));
		CHECK_ERR(kvt_layout_convert_ref(&pf, b_pf, src, &other, b_pf2,
						 dst, 1), KVT_EGEOM);
		CHECK_ERR(kvt_layout_convert_ref(&pf, b_pf, bad, &vl, b_vl, dst, 1),
			  -ERANGE);
	}
	free(b_vl);
	free(b_sg);
	return 1;
}

int main(void)
{
	static const uint32_t pages[] = { 1, 16, 32, 256 };
	static const uint32_t tps[] = { 1, 2, 4 };
	int cases = 0;
	kvt_layout l;
	kvt_geom g;

	for (size_t m = 0; kvt_geom_preset_name(m); m++)
		for (size_t p = 0; p < 4; p++)
			for (size_t t = 0; t < 3; t++) {
				/* the byte-at-a-time oracle over 256-token pages
				 * of the largest models is slow: TP 4 covers
				 * them there */
				kvt_geom big;
				kvt_geom_preset(&big, kvt_geom_preset_name(m), 1, 1, 0);
				if (pages[p] == 256 && tps[t] < 4 &&
				    kvt_geom_token_bytes(&big) > 64 * 1024)
					continue;
				cases += one_case(kvt_geom_preset_name(m), pages[p],
						  tps[t]);
			}
	fprintf(stderr, "%d layout cases\n", cases);
	for (int i = 0; i < 4; i++)
		free(regions[i]);
	CHECK(cases > 60);

	CHECK_OK(kvt_geom_preset(&g, "llama-3.1-8b", 16, 1, 0));
	CHECK_ERR(kvt_layout_init(&l, KVT_LAYOUT_VLLM, &g, 0), -EINVAL);
	CHECK_ERR(kvt_layout_init(&l, (kvt_layout_kind)7, &g, 4), -EINVAL);
	CHECK_ERR(kvt_layout_init(&l, KVT_LAYOUT_VLLM, &g, UINT64_MAX / 2),
		  -EOVERFLOW);
	{
		kvt_layout_kind k;
		CHECK_OK(kvt_layout_parse("sglang", &k));
		CHECK_EQ(k, KVT_LAYOUT_SGLANG);
		CHECK(kvt_layout_parse("flashinfer", &k) == -EINVAL);
	}
	TEST_DONE();
}
