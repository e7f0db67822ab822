/*
 * test_xfer_cuda — the cuda lane on a real GPU (exit 77 without one):
 * every cuda method (per-chunk cudaMemcpyAsync, cudaMemcpyBatchAsync, the
 * gather kernel on 1 and 2 blocks) moves pages between pinned dram and hbm
 * in both layouts, over presets, MLA, page sizes and an odd shape whose
 * chunks are not 16-byte multiples (the kernel's byte loop); each result
 * is compared with the reference conversion and with the cpu lane moving
 * the same pages into a hostdev tier (the ggml test-backend-ops idea).
 * Also hbm -> hbm, checksums, layer callbacks, the kernel refusing
 * unpinned memory, cancel, and the cudaMemcpy limit.
 */
#include "xfer_util.h"

static int cases;

static int same_pages(kvt_tier *a, kvt_tier *b, const char *what)
{
	const kvt_layout *l = kvt_tier_layout(a);
	unsigned char *x = tier_pages(a), *y = tier_pages(b);
	int ok = !memcmp(x, y, l->slots * l->page_bytes);

	if (!ok) {
		fprintf(stderr, "%s: GPU and CPU results differ\n", what);
		kvt_test_failures++;
	}
	free(x);
	free(y);
	return ok;
}

/* Move with @method and compare with the reference, page by page. */
static void check(kvt_xfer *x, kvt_tier *src, kvt_tier *dst, const uint32_t *ss,
		  const uint32_t *ds, size_t n, int method, const char *what)
{
	const kvt_layout *l = kvt_tier_layout(dst);
	unsigned char *want = expect_pages(src, dst, ss, ds, n), *got;
	kvt_xfer_desc d = { .src = src, .dst = dst, .src_slots = ss,
			    .dst_slots = ds, .npages = n, .method = method };
	int err = run_job(x, &d);

	cases++;
	if (err) {
		fprintf(stderr, "%s: %s (%s)\n", what, kvt_strerror(err),
			kvt_errdetail());
		kvt_test_failures++;
		free(want);
		return;
	}
	got = tier_pages(dst);
	if (memcmp(got, want, l->slots * l->page_bytes)) {
		fprintf(stderr, "%s: differs from the reference\n", what);
		kvt_test_failures++;
	}
	free(got);
	free(want);
}

static void matrix(const kvt_geom *g, int layout, uint64_t *seed)
{
	static const int methods[] = { KVT_XFER_CUDA_CHUNK, KVT_XFER_CUDA_BATCH,
				       KVT_XFER_CUDA_KERNEL };
	uint64_t page = kvt_geom_page_bytes(g);
	uint64_t slots = TMIN(TMAX((4u << 20) / page, 3), 64);
	const char *lay = layout ? ",layout=sglang" : "";
	char spec[5][128];
	kvt_tier *t[5] = { 0 };
	uint32_t ss[64], ds[64];
	size_t n = slots - 1;

	snprintf(spec[0], 128, "dram:%llu,pin", (unsigned long long)(slots * page));
	snprintf(spec[1], 128, "hbm:%llu%s", (unsigned long long)(slots * page), lay);
	snprintf(spec[2], 128, "dram:%llu,pin", (unsigned long long)(slots * page));
	snprintf(spec[3], 128, "hostdev:%llu%s", (unsigned long long)(slots * page), lay);
	snprintf(spec[4], 128, "hbm:%llu%s", (unsigned long long)(slots * page), lay);
	for (int i = 0; i < 5; i++)
		if (!(t[i] = tier_open(spec[i], g)))
			goto out;
	tier_fill(t[0], test_rand(seed));
	for (size_t mi = 0; mi < 3; mi++)
		for (unsigned blocks = 1; blocks <= (mi == 2 ? 2u : 1u); blocks++) {
			kvt_xfer_config cfg = { .cuda_blocks = blocks };
			kvt_xfer *x;
			char what[256];

			CHECK_OK(kvt_xfer_create(&x, &cfg));
			pick_slots(seed, ss, n, slots, 0);
			pick_slots(seed, ds, n, slots, (int)(mi % 3));
			snprintf(what, sizeof(what), "%s P=%u %s %s blocks %u load",
				 g->name, g->page_tokens, layout ? "sglang" : "vllm",
				 kvt_xfer_method_name(methods[mi]), blocks);
			tier_fill(t[3], 1);
			check(x, t[0], t[1], ss, ds, n, methods[mi], what);
			/* the same pages by the cpu lane into hostdev */
			{
				kvt_xfer_desc d = { .src = t[0], .dst = t[3],
						    .src_slots = ss, .dst_slots = ds,
						    .npages = n };
				tier_fill(t[3], 2);
				CHECK_OK(run_job(x, &d));
			}
			snprintf(what + strlen(what) - 4, 16, "store");
			check(x, t[1], t[2], ds, ss, n, methods[mi], what);
			same_pages(t[0], t[2], what);
			snprintf(what + strlen(what) - 5, 16, "hbm->hbm");
			check(x, t[1], t[4], ds, ds, n, KVT_XFER_AUTO, what);
			kvt_xfer_destroy(x);
		}
out:
	for (int i = 0; i < 5; i++)
		kvt_tier_close(t[i]);
}

struct lw {
	uint32_t next;
	int ok;
};

static void on_layer(kvt_xfer_job *j, uint32_t l, void *arg)
{
	struct lw *w = arg;

	w->ok &= l == w->next;
	w->next = l + 1;
}

static void extras(void)
{
	kvt_geom g;
	kvt_tier *pin, *hbm, *plain;
	enum { N = 16 };
	uint32_t s[N];
	uint64_t sums[N], again[N];
	struct lw w = { 0, 1 };
	kvt_xfer_status st;
	kvt_xfer_job *j;
	kvt_xfer *x;
	double sec;

	CHECK_OK(kvt_geom_preset(&g, "llama-3.1-8b", 32, 1, 0));
	pin = tier_open("dram:256M,pin", &g);
	plain = tier_open("dram:256M", &g);
	hbm = tier_open("hbm:256M", &g);
	CHECK_OK(kvt_xfer_create(&x, NULL));
	if (!pin || !hbm || !plain)
		goto out;
	for (int i = 0; i < N; i++)
		s[i] = (uint32_t)(N - 1 - i);
	tier_fill(pin, 9);
	/* default methods: kernel for loads, batch for stores; layers in order */
	kvt_xfer_desc d = { .src = pin, .dst = hbm, .src_slots = s,
			    .dst_slots = s, .npages = N, .layer = on_layer,
			    .arg = &w };
	CHECK_OK(kvt_xfer_submit(x, &d, &j));
	CHECK_OK(kvt_xfer_wait_layer(j, 0, -1));
	CHECK_OK(kvt_xfer_wait(j, -1));
	kvt_xfer_status_get(j, &st);
	CHECK_EQ(st.method, KVT_XFER_CUDA_KERNEL);
	CHECK_EQ(st.layers_ready, g.layers);
	kvt_xfer_job_free(j);
	CHECK(w.ok);
	CHECK_EQ(w.next, g.layers);
	/* checksums: SUM on the way out equals the host's, VERIFY on the way
	 * in passes, and catches a damaged page */
	d = (kvt_xfer_desc){ .src = hbm, .dst = plain, .src_slots = s,
			     .dst_slots = s, .npages = N, .flags = KVT_XFER_SUM,
			     .sums = sums };
	CHECK_OK(kvt_xfer_submit(x, &d, &j));
	CHECK_OK(kvt_xfer_wait(j, -1));
	kvt_xfer_status_get(j, &st);
	CHECK_EQ(st.method, KVT_XFER_CUDA_BATCH);
	kvt_xfer_job_free(j);
	for (int i = 0; i < N; i++)
		CHECK(sums[i] == page_xxh3(pin, s[i]));
	d = (kvt_xfer_desc){ .src = pin, .dst = hbm, .src_slots = s,
			     .dst_slots = s, .npages = N,
			     .flags = KVT_XFER_VERIFY, .sums = sums };
	CHECK_OK(run_job(x, &d));
	((unsigned char *)kvt_tier_slot_ptr(pin, s[5]))[100] ^= 1;
	CHECK_OK(kvt_xfer_submit(x, &d, &j));
	CHECK_ERR(kvt_xfer_wait(j, -1), KVT_ECORRUPT);
	kvt_xfer_status_get(j, &st);
	CHECK_EQ(st.bad_page, 5);
	kvt_xfer_job_free(j);
	(void)again;
	/* the kernel reads host memory directly: it refuses unpinned tiers */
	d = (kvt_xfer_desc){ .src = plain, .dst = hbm, .src_slots = s,
			     .dst_slots = s, .npages = N,
			     .method = KVT_XFER_CUDA_KERNEL };
	CHECK_ERR(kvt_xfer_submit(x, &d, &j), -EOPNOTSUPP);
	CHECK(strstr(kvt_errdetail(), "'pin'") != NULL);
	d.method = KVT_XFER_CUDA_CHUNK; /* DMA from pageable memory works */
	CHECK_OK(run_job(x, &d));
	/* cancel while paused */
	kvt_xfer_pause(x, 1);
	d.method = KVT_XFER_AUTO;
	d.src = pin;
	CHECK_OK(kvt_xfer_submit(x, &d, &j));
	CHECK_OK(kvt_xfer_cancel(j));
	CHECK_ERR(kvt_xfer_wait(j, -1), -ECANCELED);
	kvt_xfer_job_free(j);
	kvt_xfer_pause(x, 0);
	/* the limit */
	CHECK_OK(kvt_xfer_contig_copy(x, pin, hbm, 64u << 20, 0, &sec));
	CHECK(sec > 0);
	fprintf(stderr, "contiguous cudaMemcpy: %.1f GB/s\n", (64u << 20) / sec / 1e9);
out:
	kvt_xfer_destroy(x);
	kvt_tier_close(pin);
	kvt_tier_close(plain);
	kvt_tier_close(hbm);
}

int main(void)
{
	kvt_machine m;
	uint64_t seed = 7;
	kvt_xfer_info info;
	kvt_xfer *x;

	kvt_probe(&m);
	if (!m.cuda_built)
		SKIP("built without CUDA");
	if (m.ngpus < 1)
		SKIP(m.cuda_note);
	CHECK_OK(kvt_xfer_create(&x, NULL));
	kvt_xfer_info_get(x, &info);
	CHECK(info.cuda);
	fprintf(stderr, "GPU: %s; cudaMemcpyBatchAsync %s\n", m.gpus[0].name,
		info.cuda_batch ? "built" : "not built");
	kvt_xfer_destroy(x);
	{
		static const struct { const char *p; uint32_t tp, ptok; } shapes[] = {
			{ "llama-3.1-8b", 8, 1 }, { "llama-3.1-8b", 8, 16 },
			{ "llama-3.1-8b", 1, 32 }, { "deepseek-v3", 1, 16 },
			{ "qwen2.5-7b", 2, 256 },
		};
		for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
			for (int layout = 0; layout < 2; layout++) {
				kvt_geom g;
				CHECK_OK(kvt_geom_preset(&g, shapes[i].p,
							 shapes[i].ptok,
							 shapes[i].tp, 0));
				matrix(&g, layout, &seed);
			}
		/* chunks of 20 bytes: the kernel's byte loop */
		kvt_geom g = { .layers = 3, .kv_heads_total = 2, .head_dim = 5,
			       .dtype_bytes = 2, .page_tokens = 1, .tp_size = 1,
			       .q_heads = 2, .hidden = 10 };
		snprintf(g.name, sizeof(g.name), "tiny");
		CHECK_OK(kvt_geom_finish(&g));
		matrix(&g, 0, &seed);
	}
	extras();
	fprintf(stderr, "%d GPU transfers compared with the reference\n", cases);
	TEST_DONE();
}
