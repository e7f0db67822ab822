/*
 * test_layout_rows.c — engine memory whose chunks are kept in rows
 * (kvt_layout_init_rows(), include/kvtier/geom.h "ROWS"): every KV layout
 * the pinned engines hand a connector, through the transfer engine, against
 * kvt_layout_convert_ref().
 *
 * - kvt_layout_init_rows(): packed strides give kvt_layout_init_strided()'s
 *   layout (rows == 1); heads-before-tokens and layer-interleaved strides
 *   give rows == P*H; overlapping rows, overlapping chunks and strides
 *   above 4 GiB are refused with KVT_EGEOM; the new fields sit in old
 *   alignment holes (every ABI-1 field keeps its offset, the size is kept).
 * - For each layout (vLLM FlashAttention NHD/HND, FlashInfer NHD/HND, the
 *   CPU backend, MLA; SGLang layer_first, page_first, page_first_direct,
 *   page_head, and the MLA pool's three): random engine memory is stored
 *   into a dram tier with per-layer sums (cpu lane) and into an ssd tier
 *   (io lane, bounce buffers); the tier's pages must be the reference
 *   conversion of the engine memory, the sums those of the page-first
 *   bytes; the pages are then loaded (LVERIFY) into memory of the next
 *   layout in the list, which must then hold exactly what the reference
 *   conversion from the first layout writes there — and nothing else.
 */
#include "harness.h"
#include "xfer_util.h"

#include <stddef.h>

#define NB 6 /* engine blocks */
#define L 3

/* kvt_layout as ABI 1 had it: the new fields must not move these. */
struct layout_v1 {
	kvt_layout_kind kind;
	kvt_geom geom;
	uint64_t slots;
	uint32_t kv;
	uint64_t chunk_bytes;
	uint64_t page_bytes;
	uint32_t nbufs;
	uint64_t buf_bytes;
	uint64_t block_stride, kv_stride;
};
#define SAME_OFF(f) \
	_Static_assert(offsetof(kvt_layout, f) == offsetof(struct layout_v1, f), \
		       "kvt_layout." #f " moved")
SAME_OFF(kind);
SAME_OFF(geom);
SAME_OFF(slots);
SAME_OFF(kv);
SAME_OFF(chunk_bytes);
SAME_OFF(page_bytes);
SAME_OFF(nbufs);
SAME_OFF(buf_bytes);
SAME_OFF(block_stride);
SAME_OFF(kv_stride);
_Static_assert(sizeof(kvt_layout) == sizeof(struct layout_v1),
	       "kvt_layout grew");

/* One engine layout: strides and per-layer offsets into one region. */
struct eng {
	const char *name;
	uint64_t bs, ks, ts, hs, bytes;
	uint64_t off[L];
};

static kvt_geom geom(int mla)
{
	kvt_geom g;

	CHECK_OK(kvt_geom_preset(&g, "llama-3.2-1b", 4, 1, 0));
	g.layers = L;
	g.kv_heads = g.kv_heads_total = mla ? 1 : 2;
	g.head_dim = mla ? 24 : 8;
	g.mla = (uint32_t)mla;
	CHECK_OK(kvt_geom_finish(&g));
	return g;
}

/* Every layout of the engines, for geometry @g (MLA: the latent ones). */
static size_t layouts(const kvt_geom *g, struct eng *e)
{
	uint64_t r = (uint64_t)g->head_dim * g->dtype_bytes;
	uint64_t P = g->page_tokens, H = g->kv_heads, N = NB * P;
	size_t n = 0;

#define ADD(nm, b, k, t, h, tot, o)                                        \
	do {                                                                \
		e[n] = (struct eng){ .name = nm, .bs = b, .ks = k, .ts = t, \
				     .hs = h, .bytes = tot };               \
		for (uint64_t l = 0; l < L; l++)                            \
			e[n].off[l] = (o);                                  \
		n++;                                                        \
	} while (0)
	if (!g->mla) {
		/* vLLM FlashAttention (2, NB, P, H, D) */
		ADD("vllm flash-attn NHD", P * H * r, NB * P * H * r, H * r, r,
		    L * 2 * N * H * r, l * 2 * N * H * r);
		/* its HND cache layout, and the CPU backend's (2, NB, H, P, D) */
		ADD("vllm flash-attn HND / cpu", H * P * r, NB * H * P * r, r,
		    P * r, L * 2 * N * H * r, l * 2 * N * H * r);
		/* FlashInfer (NB, 2, P, H, D) and its HND */
		ADD("vllm flashinfer NHD", 2 * P * H * r, P * H * r, H * r, r,
		    L * 2 * N * H * r, l * 2 * N * H * r);
		ADD("vllm flashinfer HND", 2 * H * P * r, H * P * r, r, P * r,
		    L * 2 * N * H * r, l * 2 * N * H * r);
		/* SGLang host pools, one buffer for every layer */
		ADD("sglang layer_first", P * H * r, L * N * H * r, H * r, r,
		    2 * L * N * H * r, l * N * H * r);
		ADD("sglang page_first", P * L * H * r, N * L * H * r,
		    L * H * r, r, 2 * N * L * H * r, l * H * r);
		ADD("sglang page_first_direct", L * P * H * r, NB * L * P * H * r,
		    H * r, r, 2 * NB * L * P * H * r, l * P * H * r);
		ADD("sglang page_head", H * P * L * r, NB * H * P * L * r,
		    L * r, P * L * r, 2 * NB * H * P * L * r, l * r);
	} else {
		ADD("vllm mla (NB, P, latent)", P * r, 0, r, r, L * N * r,
		    l * N * r);
		ADD("sglang mla layer_first", P * r, 0, r, r, L * N * r,
		    l * N * r);
		ADD("sglang mla page_first", P * L * r, 0, L * r, r, N * L * r,
		    l * r);
		ADD("sglang mla page_first_direct", L * P * r, 0, r, r,
		    NB * L * P * r, l * P * r);
	}
#undef ADD
	return n;
}

static void test_init(const kvt_geom *g)
{
	uint64_t r = (uint64_t)g->head_dim * g->dtype_bytes;
	uint64_t P = g->page_tokens, H = g->kv_heads, c = P * H * r;
	kvt_layout a, b;

	/* packed strides: the strided layout, one piece per chunk */
	CHECK_OK(kvt_layout_init_rows(&a, g, NB, c, NB * c, H * r, r));
	CHECK_OK(kvt_layout_init_strided(&b, g, NB, c, NB * c, H * r));
	CHECK(!memcmp(&a, &b, offsetof(kvt_layout, kv_stride) + 8));
	CHECK_EQ(kvt_layout_rows(&a), 1);
	/* heads first: rows */
	CHECK_OK(kvt_layout_init_rows(&a, g, NB, c, NB * c, r, P * r));
	CHECK_EQ(kvt_layout_rows(&a), P * H);
	CHECK_EQ(kvt_layout_row_off(&a, 1), P * r);     /* t 0, h 1 */
	CHECK_EQ(kvt_layout_row_off(&a, (uint32_t)H), r); /* t 1, h 0 */
	/* rows that overlap, in both orders */
	CHECK_ERR(kvt_layout_init_rows(&a, g, NB, c, NB * c, r, r), KVT_EGEOM);
	CHECK_ERR(kvt_layout_init_rows(&a, g, NB, c, NB * c, H * r, r / 2),
		  KVT_EGEOM);
	CHECK_ERR(kvt_layout_init_rows(&a, g, NB, c, NB * c, r, (P - 1) * r),
		  KVT_EGEOM);
	/* padded tokens: chunks then span more than a packed block stride */
	CHECK_ERR(kvt_layout_init_rows(&a, g, NB, c, NB * c, 2 * H * r, r),
		  KVT_EGEOM);
	CHECK_OK(kvt_layout_init_rows(&a, g, NB, 2 * c, 2 * NB * c, 2 * H * r,
				      r));
	CHECK_EQ(kvt_layout_rows(&a), P * H);
	/* over 4 GiB */
	CHECK_ERR(kvt_layout_init_rows(&a, g, NB, c << 33, 0, 5ull << 30, r),
		  KVT_EGEOM);
}

static int wrap(const kvt_geom *g, const struct eng *e, unsigned char *m,
		kvt_tier **t, kvt_layout *l)
{
	void *bufs[L];
	int err;

	if ((err = kvt_layout_init_rows(l, g, NB, e->bs, e->ks, e->ts, e->hs)))
		return err;
	for (uint32_t i = 0; i < L; i++) {
		bufs[i] = m + e->off[i];
		CHECK(e->off[i] + l->buf_bytes <= e->bytes);
	}
	return kvt_tier_wrap(t, l, bufs, -1);
}

/* @e's memory @m as page-first pages (slots 0..NB-1), by the oracle. */
static unsigned char *ref_pages(const kvt_geom *g, const struct eng *e,
				unsigned char *m)
{
	kvt_layout el, pf;
	uint64_t ss[NB];
	void *bufs[L], *pb[1];
	unsigned char *out;

	CHECK_OK(kvt_layout_init_rows(&el, g, NB, e->bs, e->ks, e->ts, e->hs));
	CHECK_OK(kvt_layout_init(&pf, KVT_LAYOUT_PAGE_FIRST, g, NB));
	out = calloc(NB, pf.page_bytes);
	pb[0] = out;
	for (uint32_t i = 0; i < L; i++)
		bufs[i] = m + e->off[i];
	for (int i = 0; i < NB; i++)
		ss[i] = (uint64_t)i;
	CHECK_OK(kvt_layout_convert_ref(&el, bufs, ss, &pf, pb, ss, NB));
	return out;
}

/* Store @a's blocks (in order) into @tier, check pages and sums there;
 * load them back (LVERIFY) into @b's memory at blocks ds[], compare with
 * the oracle. */
static void round_trip(kvt_xfer *x, const kvt_geom *g, const struct eng *a,
		       const struct eng *b, kvt_tier *tier, const char *via)
{
	uint32_t ss[NB], ds[NB] = { 3, 0, 5, 1, 4, 2 };
	uint64_t sums[NB * L], ds64[NB], ss64[NB];
	unsigned char *ma = malloc(a->bytes), *mb = malloc(b->bytes);
	unsigned char *want = malloc(b->bytes), *pages, *got;
	kvt_layout la, lb;
	kvt_tier *ta = NULL, *tb = NULL;
	uint64_t lb_bytes = kvt_geom_page_bytes(g) / L;
	void *abufs[L], *bbufs[L];

	for (int i = 0; i < NB; i++)
		ss[i] = (uint32_t)i, ss64[i] = (uint64_t)i, ds64[i] = ds[i];
	fill_rand(ma, a->bytes, 7);
	fill_rand(mb, b->bytes, 8);
	memcpy(want, mb, b->bytes);
	CHECK_OK(wrap(g, a, ma, &ta, &la));
	CHECK_OK(wrap(g, b, mb, &tb, &lb));
	if (!ta || !tb)
		goto out;

	/* store: engine -> tier, per-layer sums of what landed */
	kvt_xfer_desc st = { .src = ta, .dst = tier, .src_slots = ss,
			     .dst_slots = ss, .npages = NB,
			     .flags = KVT_XFER_LSUM, .sums = sums };
	CHECK_OK(run_job(x, &st));
	pages = ref_pages(g, a, ma);
	got = tier_pages(tier);
	for (int i = 0; i < NB; i++) {
		const unsigned char *p = pages + i * kvt_geom_page_bytes(g);
		if (memcmp(got + i * kvt_geom_page_bytes(g), p,
			   kvt_geom_page_bytes(g))) {
			fprintf(stderr, "%s via %s: page %d differs from the "
				"reference\n", a->name, via, i);
			kvt_test_failures++;
		}
		for (uint32_t l = 0; l < L; l++)
			CHECK(sums[i * L + l] ==
			      XXH3_64bits(p + l * lb_bytes, lb_bytes));
	}
	free(got);
	free(pages);

	/* load: tier -> the other layout, verified layer by layer */
	kvt_xfer_desc ld = { .src = tier, .dst = tb, .src_slots = ss,
			     .dst_slots = ds, .npages = NB,
			     .flags = KVT_XFER_LVERIFY, .sums = sums };
	CHECK_OK(run_job(x, &ld));
	for (uint32_t i = 0; i < L; i++)
		abufs[i] = ma + a->off[i], bbufs[i] = want + b->off[i];
	CHECK_OK(kvt_layout_convert_ref(&la, abufs, ss64, &lb, bbufs, ds64, NB));
	if (memcmp(want, mb, b->bytes)) {
		fprintf(stderr, "%s -> %s via %s: memory differs from the "
			"reference conversion\n", a->name, b->name, via);
		kvt_test_failures++;
	}
out:
	kvt_tier_close(ta);
	kvt_tier_close(tb);
	free(ma);
	free(mb);
	free(want);
}

static void run_geom(kvt_xfer *x, int mla)
{
	kvt_geom g = geom(mla);
	struct eng e[16];
	size_t n = layouts(&g, e);
	char spec[600];
	kvt_tier *dram, *ssd;

	if (!mla)
		test_init(&g);
	snprintf(spec, sizeof(spec), "dram:%llu",
		 (unsigned long long)(NB * kvt_geom_page_bytes(&g)));
	dram = tier_open(spec, &g);
	/* ssd slots are whole 4 KiB blocks */
	snprintf(spec, sizeof(spec), "ssd:%s,%llu,temp",
		 test_dir(mla ? "layout_rows_mla" : "layout_rows"),
		 (unsigned long long)(NB * ((kvt_geom_page_bytes(&g) + 4095) /
					    4096 * 4096)));
	ssd = tier_open(spec, &g);
	if (!dram || !ssd)
		return;
	for (size_t i = 0; i < n; i++) {
		round_trip(x, &g, &e[i], &e[(i + 1) % n], dram, "dram");
		round_trip(x, &g, &e[i], &e[(i + 2) % n], ssd, "ssd");
	}
	kvt_tier_close(dram);
	kvt_tier_close(ssd);
}

int main(void)
{
	kvt_xfer *x;

	CHECK_OK(kvt_xfer_create(&x, NULL));
	run_geom(x, 0);
	run_geom(x, 1);
	kvt_xfer_destroy(x);
	TEST_DONE();
}
