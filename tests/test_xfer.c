/*
 * test_xfer — every transfer path against one oracle (the ggml
 * test-backend-ops idea): for each geometry (presets, TP ranks, MLA, an
 * odd tiny shape whose chunks are not 16-byte multiples), page size
 * (1, 16, 32, 256), GPU layout (vLLM, SGLang), slot list (random and
 * unordered, consecutive, reversed, one page, empty) and engine setting
 * (threads, task size, streaming stores on/off/auto), move pages between
 * host tiers in every direction and compare the whole destination with
 * kvt_layout_convert_ref(): bit-exact, and nothing else touched. ssd paths
 * (io_uring and pread, direct and bounce) are compared the same way. Also
 * a huge job (many pages and tasks) and checksums on every path.
 */
#include "xfer_util.h"

struct engine {
	const char *name;
	kvt_xfer_config cfg;
	kvt_xfer *x;
};

static struct engine engines[] = {
	{ "default", { 0 }, NULL },
	{ "3 threads, 4 KiB tasks, nt on",
	  { .cpu_threads = 3, .task_bytes = 4096, .nt = KVT_XFER_NT_ON }, NULL },
	{ "1 thread, nt off", { .cpu_threads = 1, .nt = KVT_XFER_NT_OFF }, NULL },
};
#define NENGINES (sizeof(engines) / sizeof(engines[0]))

static int cases;

/* Move @n pages src -> dst with @x and compare with the reference. */
static void check_move(kvt_xfer *x, kvt_tier *src, kvt_tier *dst,
		       const uint32_t *ss, const uint32_t *ds, size_t n,
		       int method, const char *what)
{
	kvt_xfer_desc d = { .src = src, .dst = dst, .src_slots = ss,
			    .dst_slots = ds, .npages = n, .method = method };
	int mem = kvt_tier_bufs(dst) != NULL;
	unsigned char *want = mem ? expect_region(src, dst, ss, ds, n) :
				    expect_pages(src, dst, ss, ds, n);
	uint64_t len;
	unsigned char *got;
	int err = run_job(x, &d);

	cases++;
	if (err) {
		fprintf(stderr, "%s: job failed: %s (%s)\n", what,
			kvt_strerror(err), kvt_errdetail());
		kvt_test_failures++;
		free(want);
		return;
	}
	if (mem) {
		got = tier_mem(dst, &len);
		if (memcmp(got, want, len)) {
			uint64_t i = 0;
			while (got[i] == want[i])
				i++;
			fprintf(stderr, "%s: %zu pages: destination differs from "
				"the reference at byte %llu of %llu\n", what, n,
				(unsigned long long)i, (unsigned long long)len);
			kvt_test_failures++;
		}
	} else {
		const kvt_layout *l = kvt_tier_layout(dst);
		got = tier_pages(dst);
		if (memcmp(got, want, l->slots * l->page_bytes)) {
			fprintf(stderr, "%s: ssd contents differ from the "
				"reference\n", what);
			kvt_test_failures++;
		}
		free(got);
	}
	free(want);
}

struct shape {
	const char *preset;  /* NULL: a custom shape */
	uint32_t tp, rank, pmax;
	uint32_t layers, heads, dim, mla; /* custom */
};

static const struct shape shapes[] = {
	{ "llama-3.1-8b", 8, 3, 32, 0, 0, 0, 0 },  /* 1 KV head per rank */
	{ "llama-3.2-1b", 4, 2, 256, 0, 0, 0, 0 }, /* P=256: 2 MiB pages */
	{ "qwen2.5-7b", 2, 1, 32, 0, 0, 0, 0 },
	{ "deepseek-v3", 1, 0, 32, 0, 0, 0, 0 }, /* MLA; pages not 4 KiB multiples
					  (P=256 pages are 18 MB: see below) */
	{ NULL, 1, 0, 256, 5, 1, 36, 1 }, /* MLA, 72-byte rows, to P=256 */
	{ NULL, 1, 0, 256, 3, 2, 5, 0 },  /* 20-byte rows: no alignment */
};

static int shape_geom(const struct shape *sh, uint32_t p, kvt_geom *g)
{
	if (sh->preset)
		return kvt_geom_preset(g, sh->preset, p, sh->tp, sh->rank);
	memset(g, 0, sizeof(*g));
	snprintf(g->name, sizeof(g->name), "tiny%s", sh->mla ? "-mla" : "");
	g->layers = sh->layers;
	g->kv_heads_total = sh->heads;
	g->head_dim = sh->dim;
	g->mla = sh->mla;
	g->dtype_bytes = 2;
	g->page_tokens = p;
	g->tp_size = 1;
	g->q_heads = 2;
	g->hidden = 10;
	return kvt_geom_finish(g);
}

/* Host tiers: dram (page-first), a second dram, fabric (memfd), hostdev in
 * vLLM and SGLang layouts, another hostdev. */
static void host_matrix(const kvt_geom *g, uint64_t *seed)
{
	uint64_t page = kvt_geom_page_bytes(g);
	uint64_t slots = TMIN(TMAX((1u << 20) / page, 2), 40);
	char spec[6][96];
	kvt_tier *t[6];
	uint32_t ss[64], ds[64];
	size_t counts[] = { 0, 1, slots / 2, slots };

	snprintf(spec[0], 96, "dram:%llu", (unsigned long long)(slots * page));
	snprintf(spec[1], 96, "dram:%llu", (unsigned long long)(slots * page));
	snprintf(spec[2], 96, "fabric:memfd,%llu",
		 (unsigned long long)(slots * page));
	snprintf(spec[3], 96, "hostdev:%llu", (unsigned long long)(slots * page));
	snprintf(spec[4], 96, "hostdev:%llu,layout=sglang",
		 (unsigned long long)(slots * page));
	snprintf(spec[5], 96, "hostdev:%llu,layout=sglang",
		 (unsigned long long)(slots * page));
	for (int i = 0; i < 6; i++)
		if (!(t[i] = tier_open(spec[i], g)))
			goto out;
	for (int i = 0; i < 6; i++)
		tier_fill(t[i], test_rand(seed));

	/* (src, dst): load, store, page-first copy, layer-first copies */
	static const int pairs[][2] = { { 0, 3 }, { 2, 4 }, { 3, 1 }, { 4, 0 },
					{ 0, 1 }, { 1, 2 }, { 3, 5 }, { 4, 5 } };
	/* each pair twice, cycling engines, page counts and slot orders */
	for (size_t pi = 0; pi < sizeof(pairs) / sizeof(pairs[0]); pi++)
		for (size_t k = 0; k < 2; k++) {
			char what[256];
			size_t e = (pi + k + *seed) % NENGINES;
			size_t n = counts[(pi + k + *seed / 3) % 4];
			int mode = (int)((pi + 2 * k) % 3);
			int a = pairs[pi][0], b = pairs[pi][1];

			pick_slots(seed, ss, n, slots, mode);
			pick_slots(seed, ds, n, slots, (mode + 1) % 3);
			snprintf(what, sizeof(what), "%s P=%u %s -> %s, %zu "
				 "pages, order %d, engine %s", g->name,
				 g->page_tokens, spec[a], spec[b], n, mode,
				 engines[e].name);
			check_move(engines[e].x, t[a], t[b], ss, ds, n,
				   KVT_XFER_AUTO, what);
		}
out:
	for (int i = 0; i < 6; i++)
		kvt_tier_close(t[i]);
}

/* ssd paths: through io_uring and pread, to and from dram (direct when the
 * page is a 4 KiB multiple, bounce otherwise) and hostdev (bounce). */
static void ssd_matrix(const kvt_geom *g, uint64_t *seed, kvt_xfer *x,
		       const char *dir)
{
	uint64_t page = kvt_geom_page_bytes(g);
	uint64_t slot = (page + 4095) / 4096 * 4096;
	uint64_t slots = TMIN(TMAX((512u << 10) / page, 2), 24);
	char spec[3][400];
	kvt_tier *t[3] = { 0 };
	uint32_t ss[32], ds[32];

	snprintf(spec[0], sizeof(spec[0]), "dram:%llu",
		 (unsigned long long)(slots * page));
	snprintf(spec[1], sizeof(spec[1]), "ssd:%s/s,%llu,files=2,temp,fresh",
		 dir, (unsigned long long)(slots * slot));
	snprintf(spec[2], sizeof(spec[2]), "hostdev:%llu,layout=sglang",
		 (unsigned long long)(slots * page));
	for (int i = 0; i < 3; i++)
		if (!(t[i] = tier_open(spec[i], g)))
			goto out;
	for (int i = 0; i < 3; i++)
		tier_fill(t[i], test_rand(seed));
	for (int m = KVT_XFER_URING; m <= KVT_XFER_PREAD; m++) {
		static const int pairs[][2] = { { 0, 1 }, { 1, 0 }, { 2, 1 },
						{ 1, 2 } };
		for (size_t pi = 0; pi < 4; pi++) {
			char what[512];
			size_t n = slots - 1;

			pick_slots(seed, ss, n, slots, 0);
			pick_slots(seed, ds, n, slots, pi % 2 ? 2 : 0);
			snprintf(what, sizeof(what), "%s P=%u %s -> %s via %s",
				 g->name, g->page_tokens, spec[pairs[pi][0]],
				 spec[pairs[pi][1]], kvt_xfer_method_name(m));
			check_move(x, t[pairs[pi][0]], t[pairs[pi][1]], ss, ds, n,
				   m, what);
		}
	}
out:
	for (int i = 0; i < 3; i++)
		kvt_tier_close(t[i]);
}

/* Checksums on every path: SUM on a store gives XXH3 of the page-first
 * bytes; VERIFY on the way back accepts them; a flipped byte is caught
 * and named. */
static void sums_matrix(const kvt_geom *g, kvt_xfer *x, const char *dir)
{
	uint64_t page = kvt_geom_page_bytes(g), slot = (page + 4095) / 4096 * 4096;
	char s0[96], s1[96], s2[400], s3[96];
	kvt_tier *dram, *hd, *ssd, *dram2;
	enum { N = 5 };
	uint32_t ss[N] = { 4, 0, 2, 6, 1 }, ds[N] = { 1, 6, 3, 0, 5 };
	uint64_t sums[N], again[N];
	kvt_xfer_status st;
	kvt_xfer_job *j;

	snprintf(s0, sizeof(s0), "dram:%llu", (unsigned long long)(8 * page));
	snprintf(s1, sizeof(s1), "hostdev:%llu", (unsigned long long)(8 * page));
	snprintf(s2, sizeof(s2), "ssd:%s/sum,%llu,temp,fresh", dir,
		 (unsigned long long)(8 * slot));
	snprintf(s3, sizeof(s3), "dram:%llu", (unsigned long long)(8 * page));
	dram = tier_open(s0, g);
	hd = tier_open(s1, g);
	ssd = tier_open(s2, g);
	dram2 = tier_open(s3, g);
	if (!dram || !hd || !ssd || !dram2)
		goto out;
	tier_fill(hd, 77);
	/* store hostdev -> dram with SUM */
	kvt_xfer_desc d = { .src = hd, .dst = dram, .src_slots = ss,
			    .dst_slots = ds, .npages = N, .flags = KVT_XFER_SUM,
			    .sums = sums };
	CHECK_OK(run_job(x, &d));
	for (int i = 0; i < N; i++)
		CHECK(sums[i] == page_xxh3(hd, ss[i]));
	/* dram -> ssd with SUM: the same values */
	d = (kvt_xfer_desc){ .src = dram, .dst = ssd, .src_slots = ds,
			     .dst_slots = ss, .npages = N, .flags = KVT_XFER_SUM,
			     .sums = again };
	CHECK_OK(run_job(x, &d));
	CHECK(!memcmp(sums, again, sizeof(sums)));
	/* ssd -> dram2 and ssd -> hostdev with VERIFY */
	d = (kvt_xfer_desc){ .src = ssd, .dst = dram2, .src_slots = ss,
			     .dst_slots = ds, .npages = N,
			     .flags = KVT_XFER_VERIFY, .sums = sums };
	CHECK_OK(run_job(x, &d));
	d.dst = hd;
	CHECK_OK(run_job(x, &d));
	/* dram -> hostdev with VERIFY, then with page 3's source damaged */
	d = (kvt_xfer_desc){ .src = dram, .dst = hd, .src_slots = ds,
			     .dst_slots = ss, .npages = N,
			     .flags = KVT_XFER_VERIFY, .sums = sums };
	CHECK_OK(run_job(x, &d));
	((unsigned char *)kvt_tier_slot_ptr(dram, ds[3]))[page / 2] ^= 1;
	CHECK_OK(kvt_xfer_submit(x, &d, &j));
	CHECK_ERR(kvt_xfer_wait(j, -1), KVT_ECORRUPT);
	CHECK(strstr(kvt_errdetail(), "page 3") != NULL);
	kvt_xfer_status_get(j, &st);
	CHECK_EQ(st.bad_page, 3);
	kvt_xfer_job_free(j);
	/* and through the ssd: the damaged page goes out with SUM, the
	 * stored sum list (from before) no longer matches on the way back */
	d = (kvt_xfer_desc){ .src = dram, .dst = ssd, .src_slots = ds,
			     .dst_slots = ss, .npages = N };
	CHECK_OK(run_job(x, &d));
	d = (kvt_xfer_desc){ .src = ssd, .dst = dram2, .src_slots = ss,
			     .dst_slots = ds, .npages = N,
			     .flags = KVT_XFER_VERIFY, .sums = sums };
	CHECK_OK(kvt_xfer_submit(x, &d, &j));
	CHECK_ERR(kvt_xfer_wait(j, -1), KVT_ECORRUPT);
	kvt_xfer_status_get(j, &st);
	CHECK_EQ(st.bad_page, 3);
	kvt_xfer_job_free(j);
	cases += 8;
out:
	kvt_tier_close(dram);
	kvt_tier_close(hd);
	kvt_tier_close(ssd);
	kvt_tier_close(dram2);
}

/* A huge job: 100,000 small pages, hundreds of tasks per layer. */
static void huge_job(kvt_xfer *x, uint64_t *seed)
{
	kvt_geom g;
	kvt_tier *a, *b;
	enum { N = 100000 };
	uint32_t *ss = malloc(N * 4), *ds = malloc(N * 4);
	char spec[64];

	CHECK_OK(shape_geom(&shapes[5], 2, &g)); /* 240-byte pages */
	snprintf(spec, sizeof(spec), "dram:%llu",
		 (unsigned long long)(N * kvt_geom_page_bytes(&g)));
	a = tier_open(spec, &g);
	snprintf(spec, sizeof(spec), "hostdev:%llu",
		 (unsigned long long)(N * kvt_geom_page_bytes(&g)));
	b = tier_open(spec, &g);
	if (a && b) {
		tier_fill(a, 5);
		tier_fill(b, 6);
		pick_slots(seed, ss, N, N, 0);
		pick_slots(seed, ds, N, N, 0);
		check_move(x, a, b, ss, ds, N, KVT_XFER_CPU, "huge load");
		check_move(x, b, a, ds, ss, N, KVT_XFER_CPU, "huge store");
	}
	kvt_tier_close(a);
	kvt_tier_close(b);
	free(ss);
	free(ds);
}

int main(void)
{
	static const uint32_t ptoks[] = { 1, 16, 32, 256 };
	const char *dir = test_dir("xfer");
	int64_t live = kvt_alloc_live();
	kvt_xfer_config io1 = { .uring_depth = 4, .bounce_bytes = 1 << 20 };
	kvt_xfer *xio;
	uint64_t seed = 42;

	for (size_t e = 0; e < NENGINES; e++)
		CHECK_OK(kvt_xfer_create(&engines[e].x, &engines[e].cfg));
	CHECK_OK(kvt_xfer_create(&xio, &io1));
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
		for (size_t p = 0; p < 4; p++) {
			kvt_geom g;

			if (ptoks[p] > shapes[s].pmax)
				continue;
			CHECK_OK(shape_geom(&shapes[s], ptoks[p], &g));
			if (kvt_test_failures)
				break;
			host_matrix(&g, &seed);
			ssd_matrix(&g, &seed, p % 2 ? engines[0].x : xio, dir);
			if (p == 1)
				sums_matrix(&g, engines[s % NENGINES].x, dir);
		}
	huge_job(engines[1].x, &seed);
	for (size_t e = 0; e < NENGINES; e++)
		kvt_xfer_destroy(engines[e].x);
	kvt_xfer_destroy(xio);
	fprintf(stderr, "%d transfers compared with the reference\n", cases);
	CHECK_EQ(kvt_alloc_live(), live);
	TEST_DONE();
}
