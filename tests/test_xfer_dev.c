/*
 * test_xfer_dev — the device lane (src/xfer/dev_lane.c) on every device
 * this machine has: the emulated device always (CI), each CUDA GPU when
 * there is one. Every method (one copy per chunk, batched copies, the
 * gather kernel on 1 and 2 blocks) moves pages between registered dram and
 * device memory (hbm) in both layouts, over presets, MLA, page sizes and
 * an odd shape whose chunks are not 16-byte multiples (the kernel's byte
 * loop); each result is compared with the reference conversion and with
 * the cpu lane moving the same pages into a hostdev tier (the ggml
 * test-backend-ops idea). Also hbm -> hbm, layer callbacks, cancel, the
 * device's limit, and checksums taken on the device: whole-page and
 * per-layer sums of what landed (loads) or of the device's blocks
 * (stores) equal the CPU's XXH3; a damaged page fails its layer (marked
 * bad, or the job fails); unregistered host memory is refused; the
 * counters say the device moved and hashed the bytes and no CPU thread
 * hashed any.
 */
#include "xfer_util.h"
#include "dev/dev.h"

static int cases;
static int DEV;                 /* the device under test */
static kvti_dev *D;             /* held while its tiers are open */

/* A host tier the device lane may move: CUDA pins it (the spec's 'pin'),
 * the emulated device registers it with itself. */
static kvt_tier *host_tier(const char *spec, const kvt_geom *g)
{
	char s[160];
	kvt_tier *t;
	uint64_t len;

	snprintf(s, sizeof(s), "%s%s", spec, kvti_dev_is_emu(DEV) ? "" : ",pin");
	if (!(t = tier_open(s, g)))
		return NULL;
	if (kvti_dev_is_emu(DEV))
		CHECK_OK(D->ops->host_register(D, tier_mem(t, &len),
					       kvt_layout_region_bytes(
						       kvt_tier_layout(t)),
					       KVTI_DEV_HOST_PORTABLE));
	return t;
}

static void host_close(kvt_tier *t)
{
	uint64_t len;

	if (t && kvti_dev_is_emu(DEV))
		D->ops->host_unregister(D, tier_mem(t, &len));
	kvt_tier_close(t);
}

static const char *devspec(void)
{
	static char b[32];

	if (kvti_dev_is_emu(DEV))
		snprintf(b, sizeof(b), ",device=emu:%d", DEV - KVT_DEVICE_EMU);
	else
		snprintf(b, sizeof(b), ",device=%d", DEV);
	return b;
}

/* Slots @slots of two page-first tiers hold the same pages. */
static int same_pages(kvt_tier *a, kvt_tier *b, const uint32_t *slots,
		      size_t n, const char *what)
{
	const kvt_layout *l = kvt_tier_layout(a);
	int ok = 1;

	for (size_t i = 0; i < n && ok; i++)
		ok = !memcmp(kvt_tier_slot_ptr(a, slots[i]),
			     kvt_tier_slot_ptr(b, slots[i]), l->page_bytes);
	if (!ok) {
		fprintf(stderr, "%s: the pages stored back differ from the "
			"pages loaded\n", what);
		kvt_test_failures++;
	}
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

	snprintf(spec[0], 128, "dram:%llu", (unsigned long long)(slots * page));
	snprintf(spec[1], 128, "hbm:%llu%s%s", (unsigned long long)(slots * page),
		 lay, devspec());
	snprintf(spec[2], 128, "dram:%llu", (unsigned long long)(slots * page));
	snprintf(spec[3], 128, "hostdev:%llu%s", (unsigned long long)(slots * page), lay);
	snprintf(spec[4], 128, "hbm:%llu%s%s", (unsigned long long)(slots * page),
		 lay, devspec());
	for (int i = 0; i < 5; i++)
		if (!(t[i] = i == 0 || i == 2 ? host_tier(spec[i], g) :
			     tier_open(spec[i], g)))
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
			same_pages(t[0], t[2], ss, n, what);
			snprintf(what + strlen(what) - 5, 16, "hbm->hbm");
			check(x, t[1], t[4], ds, ds, n, KVT_XFER_AUTO, what);
			kvt_xfer_destroy(x);
		}
out:
	for (int i = 0; i < 5; i++)
		if (i == 0 || i == 2)
			host_close(t[i]);
		else
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

/* XXH3 of layer @l of page-first slot @s of host tier @t. */
static uint64_t layer_xxh3(kvt_tier *t, uint32_t s, uint32_t l)
{
	const kvt_layout *lay = kvt_tier_layout(t);
	uint64_t lb = lay->page_bytes / lay->geom.layers;

	return XXH3_64bits((char *)kvt_tier_slot_ptr(t, s) + l * lb, lb);
}

static void extras(void)
{
	kvt_geom g;
	kvt_tier *pin, *hbm, *plain, *pin2;
	enum { N = 16 };
	uint32_t s[N];
	uint64_t sums[N], *lsums;
	uint8_t bad[N];
	struct lw w = { 0, 1 };
	kvt_xfer_status st;
	kvt_xfer_stat xs0, xs1;
	kvt_xfer_job *j;
	kvt_xfer *x;
	char spec[64];
	double sec;

	CHECK_OK(kvt_geom_preset(&g, "llama-3.1-8b", 32, 1, 0));
	lsums = calloc((size_t)N * g.layers, sizeof(*lsums));
	pin = host_tier("dram:64M", &g);
	pin2 = host_tier("dram:64M", &g);
	plain = tier_open("dram:64M", &g);
	snprintf(spec, sizeof(spec), "hbm:64M%s", devspec());
	hbm = tier_open(spec, &g);
	CHECK_OK(kvt_xfer_create(&x, NULL));
	if (!pin || !pin2 || !hbm || !plain || !lsums)
		goto out;
	for (int i = 0; i < N; i++)
		s[i] = (uint32_t)(N - 1 - i);
	tier_fill(pin, 9);
	kvt_xfer_stat_get(x, &xs0);
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
	/* whole-page sums: SUM on the way out (the device's blocks hashed
	 * on the device) equals the host's; VERIFY on the way in passes and
	 * catches a damaged page */
	d = (kvt_xfer_desc){ .src = hbm, .dst = pin2, .src_slots = s,
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
	((unsigned char *)kvt_tier_slot_ptr(pin, s[5]))[100] ^= 1;
	/* per-layer sums: LSUM of a store equals the host's layer sums;
	 * LVERIFY of a load with a damaged layer marks that page bad, the
	 * others land verified, every layer is reported */
	CHECK_OK(run_job(x, &(kvt_xfer_desc){ .src = pin, .dst = hbm,
			.src_slots = s, .dst_slots = s, .npages = N }));
	d = (kvt_xfer_desc){ .src = hbm, .dst = pin2, .src_slots = s,
			     .dst_slots = s, .npages = N, .flags = KVT_XFER_LSUM,
			     .sums = lsums };
	CHECK_OK(run_job(x, &d));
	for (int i = 0; i < N; i++)
		for (uint32_t l = 0; l < g.layers; l += 7)
			CHECK(lsums[i * g.layers + l] == layer_xxh3(pin, s[i], l));
	((unsigned char *)kvt_tier_slot_ptr(pin, s[3]))[
		kvt_tier_layout(pin)->page_bytes / g.layers * 5 + 9] ^= 4;
	memset(bad, 0, sizeof(bad));
	w = (struct lw){ 0, 1 };
	d = (kvt_xfer_desc){ .src = pin, .dst = hbm, .src_slots = s,
			     .dst_slots = s, .npages = N,
			     .flags = KVT_XFER_LVERIFY, .sums = lsums,
			     .bad = bad, .layer = on_layer, .arg = &w };
	CHECK_OK(run_job(x, &d));
	for (int i = 0; i < N; i++)
		CHECK_EQ(bad[i], i == 3);
	CHECK(w.ok);
	CHECK_EQ(w.next, g.layers);
	/* without @bad the damaged layer fails the job */
	d.bad = NULL;
	CHECK_OK(kvt_xfer_submit(x, &d, &j));
	CHECK_ERR(kvt_xfer_wait(j, -1), KVT_ECORRUPT);
	CHECK(strstr(kvt_errdetail(), "layer 5") != NULL);
	kvt_xfer_job_free(j);
	((unsigned char *)kvt_tier_slot_ptr(pin, s[3]))[
		kvt_tier_layout(pin)->page_bytes / g.layers * 5 + 9] ^= 4;
	/* what is verified is what LANDED, not the source: on the emulated
	 * device one copy lands damaged (its source intact) and, by every
	 * load method, exactly one page fails its layer — a checksum of the
	 * source (the old cuda lane's layer_src_sums) would pass it */
	for (int m = KVT_XFER_CUDA_CHUNK; kvti_dev_is_emu(DEV) &&
	     m <= KVT_XFER_CUDA_KERNEL; m++) {
		int nbad = 0;

		memset(bad, 0, sizeof(bad));
		d = (kvt_xfer_desc){ .src = pin, .dst = hbm, .src_slots = s,
				     .dst_slots = s, .npages = N, .method = m,
				     .flags = KVT_XFER_LVERIFY, .sums = lsums,
				     .bad = bad };
		kvti_dev_emu_set_damage(D, 1);
		CHECK_OK(run_job(x, &d));
		kvti_dev_emu_set_damage(D, 0);
		for (int i = 0; i < N; i++)
			nbad += bad[i];
		CHECK_EQ(nbad, 1);
		for (int i = 0; i < N; i++) /* the source is intact */
			for (uint32_t l = 0; l < g.layers; l += 5)
				CHECK(lsums[i * g.layers + l] ==
				      layer_xxh3(pin, s[i], l));
		/* clean again: every page lands verified */
		memset(bad, 0, sizeof(bad));
		CHECK_OK(run_job(x, &d));
		for (int i = 0; i < N; i++)
			CHECK_EQ(bad[i], 0);
	}
	/* the counters: the device moved and hashed; no CPU thread hashed
	 * a byte of the restore path */
	kvt_xfer_stat_get(x, &xs1);
	CHECK(xs1.bytes[KVT_XFER_MOVER_KERNEL][KVT_XFER_FLOW_RESTORE] >
	      xs0.bytes[KVT_XFER_MOVER_KERNEL][KVT_XFER_FLOW_RESTORE]);
	CHECK(xs1.bytes[KVT_XFER_MOVER_COPY_ENGINE][KVT_XFER_FLOW_SAVE] >
	      xs0.bytes[KVT_XFER_MOVER_COPY_ENGINE][KVT_XFER_FLOW_SAVE]);
	CHECK_EQ(xs1.bytes[KVT_XFER_MOVER_CPU][KVT_XFER_FLOW_RESTORE], 0);
	CHECK_EQ(xs1.cpu_hashed[KVT_XFER_FLOW_RESTORE], 0);
	CHECK_EQ(xs1.cpu_hashed[KVT_XFER_FLOW_SAVE], 0);
	CHECK(xs1.dev_hashed[KVT_XFER_FLOW_RESTORE] > 0);
	CHECK(xs1.dev_failed >= 2);
	CHECK(xs1.dev_verified > 0);
	/* a device without batched copies (CUDA < 12.8): a store the
	 * engine chose the method for goes one copy per chunk, counted; a
	 * forced cuda-batch is refused, not substituted */
	if (kvti_dev_is_emu(DEV)) {
		unsigned caps = D->caps;

		D->caps &= ~(unsigned)KVTI_DEV_CAP_BATCH;
		d = (kvt_xfer_desc){ .src = hbm, .dst = pin2, .src_slots = s,
				     .dst_slots = s, .npages = N };
		CHECK_OK(kvt_xfer_submit(x, &d, &j));
		CHECK_OK(kvt_xfer_wait(j, -1));
		kvt_xfer_status_get(j, &st);
		CHECK_EQ(st.method, KVT_XFER_CUDA_CHUNK);
		kvt_xfer_job_free(j);
		kvt_xfer_stat_get(x, &xs1);
		CHECK_EQ(xs1.method_substituted - xs0.method_substituted, 1);
		d.method = KVT_XFER_CUDA_BATCH;
		if (!kvt_xfer_submit(x, &d, &j)) {
			CHECK_ERR(kvt_xfer_wait(j, -1), KVT_ENOTBUILT);
			kvt_xfer_job_free(j);
		}
		kvt_xfer_stat_get(x, &xs1);
		CHECK_EQ(xs1.method_substituted - xs0.method_substituted, 1);
		D->caps = caps;
	}
	/* unregistered host memory is refused, for every method */
	for (int m = KVT_XFER_CUDA_CHUNK; m <= KVT_XFER_CUDA_KERNEL; m++) {
		d = (kvt_xfer_desc){ .src = plain, .dst = hbm, .src_slots = s,
				     .dst_slots = s, .npages = N, .method = m };
		if (m == KVT_XFER_CUDA_BATCH && !kvti_dev_is_emu(DEV) &&
		    !(D->caps & KVTI_DEV_CAP_BATCH))
			continue;
		CHECK_ERR(kvt_xfer_submit(x, &d, &j), -EINVAL);
		CHECK(strstr(kvt_errdetail(), "not registered") != NULL);
	}
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
	CHECK_OK(kvt_xfer_contig_copy(x, pin, hbm, 32u << 20, 0, &sec));
	CHECK(sec > 0);
	fprintf(stderr, "%s: one contiguous copy: %.1f GB/s\n", D->name,
		(32u << 20) / sec / 1e9);
out:
	kvt_xfer_destroy(x);
	host_close(pin);
	host_close(pin2);
	kvt_tier_close(plain);
	kvt_tier_close(hbm);
	free(lsums);
}

static void run_device(uint64_t *seed)
{
	static const struct { const char *p; uint32_t tp, ptok; } shapes[] = {
		{ "llama-3.1-8b", 8, 1 }, { "llama-3.1-8b", 8, 16 },
		{ "llama-3.1-8b", 1, 32 }, { "deepseek-v3", 1, 16 },
		{ "qwen2.5-7b", 2, 256 },
	};

	fprintf(stderr, "device %s\n", D->name);
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
		for (int layout = 0; layout < 2; layout++) {
			kvt_geom g;
			CHECK_OK(kvt_geom_preset(&g, shapes[i].p, shapes[i].ptok,
						 shapes[i].tp, 0));
			matrix(&g, layout, seed);
		}
	/* chunks of 20 bytes: the kernel's byte loop */
	kvt_geom g = { .layers = 3, .kv_heads_total = 2, .head_dim = 5,
		       .dtype_bytes = 2, .page_tokens = 1, .tp_size = 1,
		       .q_heads = 2, .hidden = 10 };
	snprintf(g.name, sizeof(g.name), "tiny");
	CHECK_OK(kvt_geom_finish(&g));
	matrix(&g, 0, seed);
	extras();
}

int main(void)
{
	uint64_t seed = 7;
	kvt_xfer_info info;
	kvt_xfer *x;

	CHECK_OK(kvt_xfer_create(&x, NULL));
	kvt_xfer_info_get(x, &info);
	fprintf(stderr, "CUDA: %s; cudaMemcpyBatchAsync %s\n", info.cuda_note,
		info.cuda_batch ? "built" : "not built");
	kvt_xfer_destroy(x);
	DEV = KVT_DEVICE_EMU;
	CHECK_OK(kvti_dev_get(DEV, &D));
	run_device(&seed);
	kvti_dev_put(D);
	for (DEV = 0; DEV < 16 && !kvti_dev_get(DEV, &D); DEV++) {
		run_device(&seed);
		kvti_dev_put(D);
	}
	fprintf(stderr, "%d device transfers compared with the reference\n",
		cases);
	TEST_DONE();
}
