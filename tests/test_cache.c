/*
 * test_cache — the node cache through its engine-facing calls, trying to
 * break them: engine memory from malloc in vLLM-like (K/V outer) and
 * FlashInfer-like (block outer) strides with gaps between chunks; owned
 * tiers fabric (memfd) -> dram -> ssd, small enough that pages are pushed
 * down to ssd and come back bit-exact; registration errors; lookup counts
 * by tier; loads of absent pages (failed list, nothing written); stores
 * cancelled before they ran are never served; stores whose parents are
 * missing; cancel, abort and job handles; kvt_cache_verify() after all of
 * it.
 *
 * Bad arguments and failed allocations are in test_cache_faults.c, tenant
 * isolation in test_cache_tenants.c (the same small cache: cache_small.h),
 * layer readiness and corruption in test_cache_layers.c, threads in
 * test_cache_threads.c, GPU memory in test_cache_cuda.c.
 */
#include "cache_small.h"

#include <dirent.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

/* ---- KVT_LOOKUP_EACH: keys that are one-page prefixes of their own ----- */

static void test_lookup_each(void)
{
	kvt_page_key a[6];
	uint32_t b[6] = { 5, 1, 9, 2, 40, 33 };
	kvt_cache_lookup_result r;
	kvt_cache *c;
	eng e;

	if (!(c = setup(&e, ENG_KV_OUTER, 0, 0)))
		return;
	CHECK_OK(session_keys(c, 0, 700, 6, a));
	eng_fill(&e, a, 6, 0, b);
	/* pages 0, 1, 2 and 4 stored each as a prefix of one page */
	for (int i = 0; i < 6; i++)
		if (i != 3 && i != 5)
			CHECK_OK(cache_store_wait(c, 0, a + i, 1, 0, b + i,
						  NULL));
	memset(&r, 0xff, sizeof(r));
	CHECK_OK(kvt_cache_lookup(c, 0, a, 6, KVT_LOOKUP_EACH |
				  KVT_LOOKUP_TOUCH, &r));
	CHECK_EQ(r.pages, 3); /* the leading run; page 4 is after a hole */
	CHECK_EQ(r.tier_pages[KVT_TIER_FABRIC] + r.tier_pages[KVT_TIER_DRAM] +
		 r.tier_pages[KVT_TIER_SSD], 3);
	CHECK_EQ(r.inflight, 0);
	/* as a chain only page 0 is there (1 is not a child of 0) */
	lookup_n(c, 0, a, 6, &r);
	CHECK_EQ(r.pages, 1);
	CHECK_OK(kvt_cache_lookup(c, 0, a + 4, 2, KVT_LOOKUP_EACH, &r));
	CHECK_EQ(r.pages, 1);
	CHECK_OK(kvt_cache_lookup(c, 0, a + 3, 3, KVT_LOOKUP_EACH, &r));
	CHECK_EQ(r.pages, 0);
	CHECK_OK(kvt_cache_lookup(c, 0, a, 0, KVT_LOOKUP_EACH, &r));
	CHECK_EQ(r.pages, 0);
	CHECK_ERR(kvt_cache_lookup(c, 7, a, 2, KVT_LOOKUP_EACH, &r),
		  KVT_ENOTFOUND);
	CHECK_ERR(kvt_cache_lookup(c, 0, a, 2, 1u << 7, &r), -EINVAL);

	/* KVT_CACHE_IO_EACH jobs: many one-page prefixes in one job */
	kvt_cache_io io = KVT_CACHE_IO_INIT;
	kvt_page_key x[6];
	uint32_t xb[6] = { 20, 21, 22, 23, 24, 25 }, yb[6], failed[6];
	kvt_cache_job_stat st;
	kvt_cache_job *j;
	long nf = -1;

	io.flags = KVT_CACHE_IO_EACH;
	CHECK_OK(session_keys(c, 0, 701, 6, x));
	eng_fill(&e, x, 6, 0, xb);
	/* x[1] and x[4] stored: page 0 fills them, the rest in one job */
	CHECK_OK(kvt_cache_store_ex(c, 0, x + 1, 1, 0, xb + 1, &io, &j));
	CHECK_OK(kvt_cache_job_wait(j, -1));
	kvt_cache_job_free(j);
	CHECK_OK(kvt_cache_store_ex(c, 0, x, 6, 0, xb, &io, &j));
	CHECK_OK(kvt_cache_job_wait(j, -1));
	kvt_cache_job_stat_get(j, &st);
	CHECK_EQ(st.copied, 5);
	CHECK_EQ(st.skipped, 1);
	CHECK_EQ(st.failed, 0);
	kvt_cache_job_free(j);
	CHECK_OK(kvt_cache_lookup(c, 0, x, 6, KVT_LOOKUP_EACH, &r));
	CHECK_EQ(r.pages, 6);
	lookup_n(c, 0, x, 6, &r); /* not a chain */
	CHECK_EQ(r.pages, 1);
	/* load them with two absent keys between: those two fail alone */
	kvt_page_key y[6] = { x[5], a[3], x[0], x[2], a[5], x[4] };
	for (int i = 0; i < 6; i++) {
		yb[i] = 40 + i;
		eng_poison(&e, yb[i]);
	}
	CHECK_OK(kvt_cache_load_ex(c, 0, y, 6, 0, yb, &io, &j));
	CHECK_ERR(job_finish(j, failed, 6, &nf), KVT_ENOTFOUND);
	CHECK_EQ(nf, 2);
	CHECK_EQ(failed[0], 41);
	CHECK_EQ(failed[1], 44);
	CHECK(eng_block_is(&e, 40, x[5]));
	CHECK(eng_block_is(&e, 42, x[0]));
	CHECK(eng_block_is(&e, 43, x[2]));
	CHECK(eng_block_is(&e, 45, x[4]));
	CHECK(eng_block_poisoned(&e, 41));
	CHECK(eng_block_poisoned(&e, 44));
	/* first must be 0; unknown flags refused */
	CHECK_ERR(kvt_cache_load_ex(c, 0, y, 6, 1, yb, &io, &j), -EINVAL);
	io.flags = 1u << 5;
	CHECK_ERR(kvt_cache_load_ex(c, 0, y, 6, 0, yb, &io, &j), -EINVAL);
	kvt_cache_close(c);
	eng_free(&e);
}

/* ---- configuration and registration --------------------------------- */

/* The threads of this process other than the caller (at most @max). */
static int task_ids(long *tids, int max)
{
	long me = syscall(SYS_gettid);
	DIR *d = opendir("/proc/self/task");
	struct dirent *de;
	int n = 0;

	while (d && (de = readdir(d))) {
		long tid = atol(de->d_name);

		if (tid > 0 && tid != me && n < max)
			tids[n++] = tid;
	}
	if (d)
		closedir(d);
	return n;
}

/* Thread @tid's nice value (field 19 of its stat), or -100 once gone. */
static int nice_of(long tid)
{
	char path[300], buf[1024], *p;
	int f;
	FILE *fp;

	snprintf(path, sizeof(path), "/proc/self/task/%ld/stat", tid);
	if (!(fp = fopen(path, "r")))
		return -100;
	p = fgets(buf, sizeof(buf), fp);
	fclose(fp);
	if (!p || !(p = strrchr(buf, ')')))
		return -100;
	for (p += 2, f = 3; *p && f < 19; p++) /* fields from 3, after the name */
		if (*p == ' ')
			f++;
	return atoi(p);
}

/* kvt_cache_config.thread_nice: refused out of 0..19; every thread the
 * cache starts takes it, the caller's thread keeps its own. */
static void test_thread_nice(void)
{
	kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
	int before, others = 0, at = 0, nold;
	long old[64];
	kvt_cache *c = NULL;

	cfg.geom = &geom;
	cfg.tiers = "dram:1M";
	cfg.thread_nice = 20;
	CHECK_ERR(kvt_cache_open(&c, &cfg), -EINVAL);
	CHECK(strstr(kvt_errdetail(), "thread_nice") != NULL);
	cfg.thread_nice = -1;
	CHECK_ERR(kvt_cache_open(&c, &cfg), -EINVAL);
	CHECK(c == NULL);
	before = getpriority(PRIO_PROCESS, 0);
	nold = task_ids(old, 64); /* a sanitizer's or harness's own threads */
	cfg.thread_nice = 7;
	CHECK_OK(kvt_cache_open(&c, &cfg));
	/* the cache's threads set it as they start: wait for them (5 s) */
	for (int i = 0; i < 500; i++) {
		long cur[64];
		int n = task_ids(cur, 64);

		others = at = 0;
		for (int k = 0; k < n; k++) {
			int seen = 0;

			for (int o = 0; o < nold && !seen; o++)
				seen = old[o] == cur[k];
			if (seen)
				continue;
			others++;
			at += nice_of(cur[k]) == 7;
		}
		if (others >= 3 && at == others)
			break;
		usleep(10000);
	}
	CHECK(others >= 3); /* cpu workers, job workers, room, background */
	CHECK_EQ(at, others);
	CHECK_EQ(getpriority(PRIO_PROCESS, 0), before);
	kvt_cache_close(c);
}

static void test_config(const char *dir)
{
	kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
	kvt_cache *c = NULL;
	char s[700];

	cfg.geom = &geom;
	cfg.tiers = "dram:1M";
	cfg.size = 0;
	CHECK_ERR(kvt_cache_open(&c, &cfg), -EINVAL);
	cfg.size = sizeof(cfg);
	CHECK_ERR(kvt_cache_open(NULL, &cfg), -EINVAL);
	CHECK_ERR(kvt_cache_open(&c, NULL), -EINVAL);
	cfg.tiers = NULL;
	CHECK_ERR(kvt_cache_open(&c, &cfg), KVT_ESPEC);
	cfg.tiers = "hostdev:1M";
	CHECK_ERR(kvt_cache_open(&c, &cfg), KVT_ESPEC);
	cfg.tiers = "hostdev:1M dram:1M";
	CHECK_ERR(kvt_cache_open(&c, &cfg), KVT_ESPEC);
	cfg.tiers = "hbm:1M dram:1M";
	CHECK_ERR(kvt_cache_open(&c, &cfg), KVT_ESPEC);
	cfg.tiers = "dram:1M dram:1M";
	CHECK_ERR(kvt_cache_open(&c, &cfg), KVT_ESPEC);
	cfg.tiers = "dram:1M,bogus";
	CHECK_ERR(kvt_cache_open(&c, &cfg), KVT_ESPEC);
	snprintf(s, sizeof(s), "dram:1M ssd:%s/x,1K", dir);
	cfg.tiers = s; /* holds no page */
	CHECK_ERR(kvt_cache_open(&c, &cfg), KVT_ESPEC);
	cfg.tiers = "dram:1M";
	cfg.high = 0.5, cfg.low = 0.7;
	CHECK_ERR(kvt_cache_open(&c, &cfg), -EINVAL);
	cfg.high = 1.5, cfg.low = 0.5;
	CHECK_ERR(kvt_cache_open(&c, &cfg), -EINVAL);
	cfg.high = cfg.low = 0;
	cfg.evict = 9;
	CHECK_ERR(kvt_cache_open(&c, &cfg), -EINVAL);
	cfg.evict = 0, cfg.write = 9;
	CHECK_ERR(kvt_cache_open(&c, &cfg), -EINVAL);
	cfg.write = 0;
	cfg.geom = NULL, cfg.model = "no-such-model";
	CHECK_ERR(kvt_cache_open(&c, &cfg), KVT_EPRESET);
	CHECK(c == NULL);
	/* a preset by name: llama-3.1-8b, P = 16 by default: 2 MiB pages */
	cfg.model = "llama-3.1-8b";
	cfg.tiers = "dram:16M";
	CHECK_OK(kvt_cache_open(&c, &cfg));
	if (c) {
		CHECK_EQ(kvt_cache_geom(c)->layers, 32);
		CHECK_EQ(kvt_cache_geom(c)->page_tokens, 16);
		CHECK(kvt_cache_tier(c, KVT_TIER_DRAM) != NULL);
		CHECK(kvt_cache_tier(c, KVT_TIER_FABRIC) == NULL);
		CHECK(kvt_cache_tier(c, KVT_TIER_HBM) == NULL);
		CHECK(kvt_cache_index(c) && kvt_cache_xfer(c));
	}
	kvt_cache_close(c);
	/* a size smaller than the first version's */
	memset(&cfg, 0, sizeof(cfg));
	cfg.size = (uint32_t)offsetof(kvt_cache_config, xfer_threads);
	cfg.tiers = "dram:1M";
	cfg.geom = &geom;
	CHECK_ERR(kvt_cache_open(&c, &cfg), -EINVAL);
	kvt_cache_close(NULL);
}

static void test_register(void)
{
	kvt_cache *c;
	eng e;
	void *base[ENG_MAXL];
	uint64_t ch, ts;

	CHECK_OK(open_cache(&c, 0, 0));
	if (!c)
		return;
	CHECK_OK(eng_init(&e, &geom, NB, ENG_KV_OUTER, 0, -1));
	ch = e.chunk, ts = e.ts;
	memcpy(base, e.base, sizeof(base));
	CHECK_ERR(kvt_cache_register(c, e.base, e.L - 1, NB, e.bs, e.ks, ts, -1),
		  KVT_EGEOM);
	CHECK_ERR(kvt_cache_register(c, e.base, e.L + 1, NB, e.bs, e.ks, ts, -1),
		  KVT_EGEOM);
	/* tokens padded apart (heads packed): kept in rows, accepted */
	{
		kvt_cache_mem *m = NULL;

		CHECK_OK(kvt_cache_attach(c, e.base, e.L, NB, 2 * ch,
					  NB * 2 * ch, 2 * ts, -1, &m));
		kvt_cache_detach(m);
	}
	/* tokens closer than a token's H*D elements */
	CHECK_ERR(kvt_cache_register(c, e.base, e.L, NB, e.bs, e.ks, ts / 2, -1),
		  KVT_EGEOM);
	/* blocks overlap (block stride below a chunk) */
	CHECK_ERR(kvt_cache_register(c, e.base, e.L, NB, ch / 2, NB * ch, ts, -1),
		  KVT_EGEOM);
	/* K and V of different blocks overlap: neither K/V outer nor block
	 * outer */
	CHECK_ERR(kvt_cache_register(c, e.base, e.L, NB, ch, ch, ts, -1),
		  KVT_EGEOM);
	CHECK_ERR(kvt_cache_register(c, e.base, e.L, NB, ch, (NB - 1) * ch, ts,
				     -1), KVT_EGEOM);
	/* block outer with V inside the next block */
	CHECK_ERR(kvt_cache_register(c, e.base, e.L, NB, ch + 1, ch, ts, -1),
		  KVT_EGEOM);
	/* no blocks, no bases */
	CHECK(kvt_cache_register(c, e.base, e.L, 0, e.bs, e.ks, ts, -1) != 0);
	CHECK(kvt_cache_register(c, NULL, e.L, NB, e.bs, e.ks, ts, -1) != 0);
	base[1] = NULL;
	CHECK(kvt_cache_register(c, base, e.L, NB, e.bs, e.ks, ts, -1) != 0);
	/* GPU memory on a machine without CUDA or GPU */
	{
		kvt_machine m;
		kvt_probe(&m);
		if (!m.cuda_built)
			CHECK_ERR(kvt_cache_register(c, e.base, e.L, NB, e.bs,
						     e.ks, ts, 0), KVT_ENOTBUILT);
		else if (m.ngpus == 0)
			CHECK_ERR(kvt_cache_register(c, e.base, e.L, NB, e.bs,
						     e.ks, ts, 0), KVT_ENODEV);
	}
	/* none of the failures registered anything: now it works, once */
	CHECK_OK(eng_register(c, &e));
	CHECK_ERR(eng_register(c, &e), KVT_EBUSY);
	kvt_cache_close(c);
	eng_free(&e);

	/* block outer, no gaps, and a separate cache */
	CHECK_OK(open_cache(&c, 0, 0));
	CHECK_OK(eng_init(&e, &geom, NB, ENG_BLOCK_OUTER, 0, -1));
	if (c)
		CHECK_OK(eng_register(c, &e));
	kvt_cache_close(c);
	eng_free(&e);
}

/* ---- round trip through every tier ----------------------------------- */

#define S 14     /* sessions */
#define SP 20    /* pages per session */

static void blocks_of(uint32_t *b, size_t n, uint32_t start)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (uint32_t)((start + i * 3) % NB); /* distinct: NB % 3 */
}

static void load_check(kvt_cache *c, const eng *e, uint32_t tenant,
		       const kvt_page_key *keys, size_t n, uint32_t start,
		       uint64_t *from)
{
	uint32_t b[NB], failed[NB];
	kvt_cache_job *j;
	kvt_cache_job_stat st;
	int err;

	blocks_of(b, n, start);
	for (size_t i = 0; i < n; i++)
		eng_poison(e, b[i]);
	err = kvt_cache_load(c, tenant, keys, n, 0, b, &j);
	CHECK_OK(err);
	if (err)
		return;
	for (uint32_t l = 0; l < e->L; l++) {
		CHECK_OK(kvt_cache_job_wait_layer(j, l, -1));
		/* layer l is in place the moment it is reported */
		for (size_t i = 0; i < n; i++) {
			unsigned char img[16384];
			page_img(e, keys[i], img);
			if (!eng_layer_is(e, b[i], l, img)) {
				fprintf(stderr, "layer %u of page %zu not in "
					"place when reported ready\n", l, i);
				kvt_test_failures++;
				break;
			}
		}
	}
	CHECK_OK(kvt_cache_job_wait(j, -1));
	CHECK_OK(kvt_cache_job_poll(j));
	CHECK_EQ(kvt_cache_job_failed(j, failed, NB), 0);
	kvt_cache_job_stat_get(j, &st);
	CHECK_EQ(st.pages, n);
	CHECK_EQ(st.copied, n);
	CHECK_EQ(st.failed, 0);
	CHECK_EQ(st.verified, n);
	CHECK_EQ(st.bytes, n * e->page);
	CHECK(st.layer0_s > 0); /* when layer 0 was ready: not when asked */
	CHECK(st.layer0_s <= st.total_s);
	{
		uint64_t sum = 0;
		for (int k = 0; k < KVT_TIER_COUNT; k++) {
			sum += st.from[k];
			from[k] += st.from[k];
		}
		CHECK_EQ(sum, n);
		CHECK_EQ(st.from[KVT_TIER_HBM], 0);
	}
	kvt_cache_job_free(j);
	for (size_t i = 0; i < n; i++)
		if (!eng_block_is(e, b[i], keys[i])) {
			fprintf(stderr, "page %zu differs in block %u\n", i, b[i]);
			kvt_test_failures++;
			break;
		}
}

/* kvt_cache_lookup_runs(): the runs add up to the lookup, tier by tier,
 * neighbours differ; with room for one run, one run of the slowest tier. */
static void check_runs(kvt_cache *c, const kvt_page_key *k, size_t n)
{
	kvt_cache_run runs[KVT_CACHE_MAX_RUNS];
	kvt_cache_lookup_result r, r1;
	uint64_t by[KVT_TIER_COUNT] = { 0 }, sum = 0;
	size_t nr = 99;
	uint32_t slowest = 0;

	CHECK_OK(kvt_cache_lookup_runs(c, 0, k, n, 0, &r, runs,
				       KVT_CACHE_MAX_RUNS, &nr));
	CHECK(nr >= 1 && nr <= KVT_CACHE_MAX_RUNS);
	for (size_t i = 0; i < nr; i++) {
		CHECK(runs[i].pages > 0);
		CHECK(runs[i].tier > KVT_TIER_HBM &&
		      runs[i].tier < KVT_TIER_REMOTE);
		if (i)
			CHECK(runs[i].tier != runs[i - 1].tier);
		by[runs[i].tier] += runs[i].pages;
		sum += runs[i].pages;
		if (runs[i].tier > slowest)
			slowest = runs[i].tier;
	}
	CHECK_EQ(sum, r.pages);
	for (int t = 0; t < KVT_TIER_COUNT; t++)
		CHECK_EQ(by[t], r.tier_pages[t]);
	CHECK_OK(kvt_cache_lookup_runs(c, 0, k, n, 0, &r1, runs, 1, &nr));
	CHECK_EQ(nr, 1);
	CHECK_EQ(runs[0].pages, r1.pages);
	CHECK_EQ(runs[0].tier, slowest);
	CHECK_ERR(kvt_cache_lookup_runs(c, 0, k, n, 0, &r1, runs, 0, &nr),
		  -EINVAL);
}

/* kvt_cache_rates(): every tier loads came from was measured (the ssd's
 * staged loads too: KVT_CACHE_STAGE_SSD), and stores. */
static void check_rates(kvt_cache *c, const uint64_t *from, uint64_t page)
{
	static kvt_xfer_rate rt[KVT_TIER_COUNT][KVT_TIER_COUNT];

	CHECK_OK(kvt_cache_rates(c, rt));
	for (int t = KVT_TIER_FABRIC; t < KVT_TIER_REMOTE; t++) {
		const kvt_xfer_rate *x = &rt[t][KVT_TIER_HBM];

		/* staged (two hops, ssd -> bounce -> engine) too: the cache
		 * notes the whole run under ssd -> engine */
		if (!from[t])
			continue;
		CHECK(x->jobs > 0);
		CHECK(x->total_bytes >= (double)page);
		CHECK(x->gbps > 0 && x->gbps < 1e4);
		CHECK(x->bytes > 0 && x->busy_s > 0);
	}
	CHECK(rt[KVT_TIER_HBM][KVT_TIER_FABRIC].jobs > 0);
	CHECK_EQ(rt[KVT_TIER_SSD][KVT_TIER_SSD].jobs, 0);
	CHECK_ERR(kvt_cache_rates(c, NULL), -EINVAL);
}

static void test_round_trip(int outer, unsigned flags, int write)
{
	static kvt_page_key keys[S][SP + 4];
	uint64_t from[KVT_TIER_COUNT] = { 0 }, where[KVT_TIER_COUNT] = { 0 };
	uint32_t b[NB];
	kvt_cache_lookup_result r;
	kvt_cache_job_stat st;
	kvt_cache_stat cs;
	kvt_cache_check chk;
	kvt_cache *c;
	eng e;

	fprintf(stderr, "round trip: %s, flags %#x, %s\n",
		outer ? "block outer" : "kv outer", flags,
		kvt_write_policy_name(write));
	if (!(c = setup(&e, outer, flags, write)))
		return;
	for (uint32_t s = 0; s < S; s++) {
		CHECK_OK(session_keys(c, 0, s, SP + 4, keys[s]));
		blocks_of(b, SP, s * 5);
		eng_fill(&e, keys[s], SP, 0, b);
		CHECK_OK(cache_store_wait(c, 0, keys[s], SP, 0, b, &st));
		CHECK_EQ(st.pages, SP);
		CHECK_EQ(st.copied, SP);
		CHECK_EQ(st.skipped, 0);
		CHECK_EQ(st.failed, 0);
		CHECK_EQ(st.bytes, SP * e.page);
		lookup_n(c, 0, keys[s], SP + 4, &r);
		CHECK_EQ(r.pages, SP);
		CHECK_EQ(r.inflight, 0);
		CHECK_EQ(r.tier_pages[KVT_TIER_HBM], 0);
		CHECK_EQ(r.tier_pages[KVT_TIER_FABRIC] + r.tier_pages[KVT_TIER_DRAM] +
			 r.tier_pages[KVT_TIER_SSD], SP);
		if (s == 0) {
			/* stored again: every page skipped, nothing copied */
			CHECK_OK(cache_store_wait(c, 0, keys[s], SP, 0, b, &st));
			CHECK_EQ(st.skipped, SP);
			CHECK_EQ(st.copied, 0);
			/* the prefix extended: only the new pages */
			blocks_of(b, 4, 40);
			eng_fill(&e, keys[s], SP + 4, SP, b);
			CHECK_OK(cache_store_wait(c, 0, keys[s], SP + 4, SP, b,
						  &st));
			CHECK_EQ(st.copied, 4);
			CHECK_EQ(st.pages, 4);
			lookup_n(c, 0, keys[s], SP + 4, &r);
			CHECK_EQ(r.pages, SP + 4);
			/* a prefix whose parents are not cached */
			{
				kvt_page_key k2[8];
				kvt_cache_job *j = NULL;
				CHECK_OK(session_keys(c, 0, 999, 8, k2));
				CHECK_ERR(kvt_cache_store(c, 0, k2, 8, 4, b, &j),
					  KVT_ENOTFOUND);
				CHECK(j == NULL);
				lookup_n(c, 0, k2, 8, &r);
				CHECK_EQ(r.pages, 0);
			}
		}
	}
	kvt_cache_quiesce(c);
	for (uint32_t s = 0; s < S; s++) {
		size_t n = s ? SP : SP + 4;
		lookup_n(c, 0, keys[s], n, &r);
		CHECK_EQ(r.pages, n);
		for (int k = 0; k < KVT_TIER_COUNT; k++)
			where[k] += r.tier_pages[k];
	}
	tier_counts_print("after quiesce", where);
	CHECK(where[KVT_TIER_FABRIC] > 0);
	CHECK(where[KVT_TIER_DRAM] > 0);
	CHECK(where[KVT_TIER_SSD] > 0);
	for (uint32_t s = 0; s < S; s++)
		check_runs(c, keys[s], s ? SP : SP + 4);
	for (uint32_t s = 0; s < S; s++)
		load_check(c, &e, 0, keys[s], s ? SP : SP + 4, s * 7 + 1, from);
	CHECK(from[KVT_TIER_FABRIC] > 0);
	CHECK(from[KVT_TIER_DRAM] > 0);
	CHECK(from[KVT_TIER_SSD] > 0);
	check_rates(c, from, e.page);
	CHECK(eng_gaps_intact(&e));
	kvt_cache_stat_get(c, &cs);
	CHECK_EQ(cs.corrupt, 0);
	CHECK_EQ(cs.move_errors, 0);
	CHECK_EQ(cs.failed_blocks, 0);
	CHECK(cs.stores >= S + 1);
	CHECK_EQ(cs.store_pages, S * SP + 4);
	CHECK_EQ(cs.loads, S);
	CHECK_EQ(cs.load_pages, S * SP + 4);
	CHECK(cs.moves > 0 && cs.move_pages >= where[KVT_TIER_SSD]);
	CHECK(cs.verified > 0);
	if (!(flags & KVT_CACHE_NO_BACKGROUND))
		CHECK(cs.bg_passes > 0);
	CHECK_OK(kvt_cache_verify(c, &chk));
	CHECK_EQ(chk.bad, 0);
	CHECK(chk.checked >= S * SP + 4);
	CHECK_EQ(chk.per_tier[KVT_TIER_FABRIC] + chk.per_tier[KVT_TIER_DRAM] +
		 chk.per_tier[KVT_TIER_SSD], chk.checked);
	CHECK(chk.per_tier[KVT_TIER_SSD] > 0);
	kvt_cache_close(c);
	eng_free(&e);
}

/* ---- absent pages ------------------------------------------------------ */

static void test_absent(void)
{
	kvt_page_key a[8], z[8];
	uint32_t b[8] = { 9, 3, 12, 0, 63, 31, 30, 7 }, failed[8];
	kvt_cache_lookup_result r;
	kvt_cache_job_stat st;
	kvt_cache_job *j;
	kvt_cache *c;
	long nf = -1;
	eng e;

	if (!(c = setup(&e, ENG_KV_OUTER, 0, 0)))
		return;
	CHECK_OK(session_keys(c, 0, 500, 8, a));
	CHECK_OK(session_keys(c, 0, 501, 8, z));
	eng_fill(&e, a, 4, 0, b);
	CHECK_OK(cache_store_wait(c, 0, a, 4, 0, b, NULL));
	lookup_n(c, 0, a, 8, &r);
	CHECK_EQ(r.pages, 4);
	CHECK_EQ(r.inflight, 0);

	/* half there: the rest fail, in request order, untouched */
	for (int i = 0; i < 8; i++)
		eng_poison(&e, b[i]);
	CHECK_OK(kvt_cache_load(c, 0, a, 8, 0, b, &j));
	for (uint32_t l = 0; l < e.L; l++)
		CHECK_OK(kvt_cache_job_wait_layer(j, l, -1));
	CHECK_ERR(kvt_cache_job_wait(j, -1), KVT_ENOTFOUND);
	CHECK_EQ(kvt_cache_job_failed(j, failed, 8), 4);
	CHECK_EQ(kvt_cache_job_failed(j, NULL, 0), 4);
	for (int i = 0; i < 4; i++)
		CHECK_EQ(failed[i], b[4 + i]);
	kvt_cache_job_stat_get(j, &st);
	CHECK_EQ(st.pages, 8);
	CHECK_EQ(st.copied, 4);
	CHECK_EQ(st.failed, 4);
	CHECK_EQ(st.absent, 4); /* never stored: no copy */
	CHECK_EQ(st.busy, 0);
	kvt_cache_job_free(j);
	for (int i = 0; i < 4; i++)
		CHECK(eng_block_is(&e, b[i], a[i]));
	for (int i = 4; i < 8; i++)
		CHECK(eng_block_poisoned(&e, b[i]));

	/* nothing there: every block fails, layers report the error */
	for (int i = 0; i < 8; i++)
		eng_poison(&e, b[i]);
	CHECK_OK(kvt_cache_load(c, 0, z, 8, 0, b, &j));
	CHECK_ERR(kvt_cache_job_wait_layer(j, 0, -1), KVT_ENOTFOUND);
	CHECK_ERR(kvt_cache_job_wait_layer(j, e.L - 1, -1), KVT_ENOTFOUND);
	CHECK_ERR(job_finish(j, failed, 8, &nf), KVT_ENOTFOUND);
	CHECK_EQ(nf, 8);
	for (int i = 0; i < 8; i++) {
		CHECK_EQ(failed[i], b[i]);
		CHECK(eng_block_poisoned(&e, b[i]));
	}

	/* a slice of the prefix: pages 2..3 into two blocks */
	eng_poison(&e, 40);
	eng_poison(&e, 41);
	CHECK_OK(cache_load_wait(c, 0, a, 4, 2, (uint32_t[]){ 41, 40 }, failed,
				 &nf, &st));
	CHECK_EQ(nf, 0);
	CHECK_EQ(st.pages, 2);
	CHECK(eng_block_is(&e, 41, a[2]));
	CHECK(eng_block_is(&e, 40, a[3]));
	/* first == nkeys: an empty job */
	CHECK_OK(cache_load_wait(c, 0, a, 4, 4, b, failed, &nf, &st));
	CHECK_EQ(nf, 0);
	CHECK_EQ(st.pages, 0);
	CHECK(eng_gaps_intact(&e));
	{
		kvt_cache_stat cs;
		kvt_cache_stat_get(c, &cs);
		CHECK_EQ(cs.failed_blocks, 12);
	}
	kvt_cache_close(c);
	eng_free(&e);
}

/* ---- cancel, abort, job handles ------------------------------------------ */

static int fd_ready(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

/* Calls run in a helper thread, to tell a call that blocks from one that
 * returns (and to get out of it). */
struct bg_load {
	kvt_cache *c;
	const kvt_page_key *keys;
	size_t n;
	const uint32_t *blocks;
	kvt_cache_job *job;
	int err;
	atomic_int done;
};

static void *bg_load_main(void *arg)
{
	struct bg_load *b = arg;

	b->err = kvt_cache_load(b->c, 0, b->keys, b->n, 0, b->blocks, &b->job);
	atomic_store(&b->done, 1);
	return NULL;
}

struct bg_close {
	kvt_cache *c;
	atomic_int done;
};

static void *bg_close_main(void *arg)
{
	struct bg_close *b = arg;

	kvt_cache_close(b->c);
	atomic_store(&b->done, 1);
	return NULL;
}

/* 1 once *@flag is set, 0 after @ms milliseconds. */
static int bg_wait(atomic_int *flag, int ms)
{
	for (int i = 0; i < ms && !atomic_load(flag); i++)
		usleep(1000);
	return atomic_load(flag);
}

static void test_cancel(void)
{
	kvt_page_key k[6], d[6];
	uint32_t b[6] = { 1, 2, 3, 4, 5, 6 }, b2[6] = { 10, 11, 12, 13, 14, 15 };
	uint32_t failed[6];
	kvt_cache_lookup_result r;
	kvt_cache_job_stat st;
	kvt_cache_job *j, *lj;
	kvt_cache *c;
	kvt_xfer *x;
	uint64_t used;
	long nf;
	eng e;

	if (!(c = setup(&e, ENG_BLOCK_OUTER, 0, 0)))
		return;
	x = kvt_cache_xfer(c);
	CHECK_OK(session_keys(c, 0, 600, 6, k));
	CHECK_OK(session_keys(c, 0, 601, 6, d));
	eng_fill(&e, k, 6, 0, b);
	used = cache_used(c);

	/* a store caught before it runs */
	kvt_xfer_pause(x, 1);
	CHECK_OK(kvt_cache_store(c, 0, k, 6, 0, b, &j));
	CHECK_ERR(kvt_cache_job_poll(j), -EINPROGRESS);
	CHECK_ERR(kvt_cache_job_failed(j, failed, 6), -EINPROGRESS);
	CHECK_ERR(kvt_cache_job_wait(j, 1000000), -ETIMEDOUT);
	CHECK_ERR(kvt_cache_job_wait_layer(j, 0, 1000000), -ETIMEDOUT);
	CHECK_ERR(kvt_cache_job_wait_layer(j, e.L, 0), -ERANGE);
	CHECK(kvt_cache_job_fd(j) >= 0);
	CHECK(!fd_ready(kvt_cache_job_fd(j)));
	/* not committed: in flight, not loadable */
	lookup_n(c, 0, k, 6, &r);
	CHECK_EQ(r.pages, 0);
	CHECK_EQ(r.inflight, 6);
	/* a load of those pages now: they are not committed, so its blocks
	 * fail; the call itself must not wait for the store (asynchronous) */
	for (int i = 0; i < 6; i++)
		eng_poison(&e, b2[i]);
	{
		struct bg_load bl = { .c = c, .keys = k, .n = 6, .blocks = b2 };
		pthread_t t;

		CHECK(pthread_create(&t, NULL, bg_load_main, &bl) == 0);
		if (!bg_wait(&bl.done, 2000)) {
			fprintf(stderr, "kvt_cache_load() blocks while a page of "
				"its prefix is being stored (still waiting after "
				"2 s with the transfer engine paused)\n");
			kvt_test_failures++;
		}
		CHECK_OK(kvt_cache_job_cancel(j));
		kvt_xfer_pause(x, 0);
		pthread_join(t, NULL);
		CHECK_OK(bl.err);
		lj = bl.job;
	}
	CHECK_ERR(kvt_cache_job_wait(j, -1), -ECANCELED);
	CHECK_ERR(kvt_cache_job_cancel(j), -EALREADY);
	CHECK(fd_ready(kvt_cache_job_fd(j)));
	kvt_cache_job_free(j);
	CHECK_ERR(kvt_cache_job_wait(lj, -1), KVT_EBUSY);
	kvt_cache_job_stat_get(lj, &st);
	CHECK_EQ(st.failed, 6);
	CHECK_EQ(st.busy, 6); /* being stored: counted apart from absent */
	CHECK_EQ(st.absent, 0);
	CHECK_ERR(job_finish(lj, failed, 6, &nf), KVT_EBUSY); /* being stored */
	CHECK_EQ(nf, 6);
	for (int i = 0; i < 6; i++)
		CHECK(eng_block_poisoned(&e, b2[i]));
	/* never served */
	lookup_n(c, 0, k, 6, &r);
	CHECK_EQ(r.pages, 0);
	CHECK_EQ(r.inflight, 0);
	CHECK(cache_used(c) >= used);
	CHECK_ERR(cache_load_wait(c, 0, k, 6, 0, b2, failed, &nf, NULL),
		  KVT_ENOTFOUND);
	CHECK_EQ(nf, 6);
	for (int i = 0; i < 6; i++)
		CHECK(eng_block_poisoned(&e, b2[i]));

	/* stored again for real: copied (not skipped) and served */
	CHECK_OK(cache_store_wait(c, 0, k, 6, 0, b, &st));
	CHECK_EQ(st.copied, 6);
	CHECK_EQ(st.skipped, 0);
	CHECK_OK(cache_load_wait(c, 0, k, 6, 0, b2, failed, &nf, NULL));
	CHECK_EQ(nf, 0);
	for (int i = 0; i < 6; i++)
		CHECK(eng_block_is(&e, b2[i], k[i]));

	/* a load cancelled before it runs: every block failed, leases go */
	for (int i = 0; i < 6; i++)
		eng_poison(&e, b2[i]);
	kvt_xfer_pause(x, 1);
	CHECK_OK(kvt_cache_load(c, 0, k, 6, 0, b2, &lj));
	CHECK_OK(kvt_cache_job_cancel(lj));
	kvt_xfer_pause(x, 0);
	CHECK_ERR(kvt_cache_job_wait_layer(lj, 0, -1), -ECANCELED);
	CHECK_ERR(job_finish(lj, failed, 6, &nf), -ECANCELED);
	CHECK_EQ(nf, 6);
	lookup_n(c, 0, k, 6, &r);
	CHECK_EQ(r.pages, 6);
	CHECK_OK(cache_load_wait(c, 0, k, 6, 0, b2, failed, &nf, NULL));
	CHECK_EQ(nf, 0);
	for (int i = 0; i < 6; i++)
		CHECK(eng_block_is(&e, b2[i], k[i]));

	/* a job freed before it ran is cancelled */
	eng_fill(&e, d, 6, 0, b);
	kvt_xfer_pause(x, 1);
	CHECK_OK(kvt_cache_store(c, 0, d, 6, 0, b, &j));
	kvt_cache_job_free(j);
	kvt_xfer_pause(x, 0);
	lookup_n(c, 0, d, 6, &r);
	CHECK_EQ(r.pages, 0);
	CHECK_EQ(r.inflight, 0);

	/* a job outlives the cache: close cancels it, the handle stays */
	kvt_xfer_pause(x, 1);
	CHECK_OK(kvt_cache_store(c, 0, d, 6, 0, b, &j));
	{
		struct bg_close bc = { .c = c };
		pthread_t t;

		CHECK(pthread_create(&t, NULL, bg_close_main, &bc) == 0);
		if (!bg_wait(&bc.done, 2000)) {
			fprintf(stderr, "kvt_cache_close() does not cancel a job "
				"that has not started: it waits for it (still "
				"waiting after 2 s with the engine paused)\n");
			kvt_test_failures++;
			kvt_cache_job_cancel(j); /* unblocks it */
		}
		pthread_join(t, NULL);
	}
	CHECK_ERR(kvt_cache_job_poll(j), -ECANCELED);
	CHECK_ERR(kvt_cache_job_wait(j, -1), -ECANCELED);
	kvt_cache_job_free(j);
	kvt_cache_job_free(NULL);
	eng_free(&e);
}

int main(void)
{
	char ssd[600];
	const char *dir = cache_small_init("cache", ssd, sizeof(ssd));
	int64_t live = kvt_alloc_live();

	test_phase = "thread nice";
	test_thread_nice();
	test_phase = "config";
	test_config(dir);
	test_phase = "register";
	test_register();
	test_phase = "round trip";
	test_round_trip(ENG_KV_OUTER, 0, KVT_WRITE_BACK);
	test_round_trip(ENG_BLOCK_OUTER, 0, KVT_WRITE_BACK);
	test_round_trip(ENG_BLOCK_OUTER, KVT_CACHE_NO_BACKGROUND |
			KVT_CACHE_STAGE_SSD, KVT_WRITE_BACK);
	test_round_trip(ENG_KV_OUTER, 0, KVT_WRITE_THROUGH);
	test_phase = "absent";
	test_absent();
	test_phase = "lookup each";
	test_lookup_each();
	test_phase = "cancel";
	test_cancel();
	CHECK_EQ(kvt_alloc_live(), live);
	TEST_DONE();
}
