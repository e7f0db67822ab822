/*
 * test_cache_workers_threads — jobs finish in parallel, and a staged ssd
 * load reports its layers as they land (run under TSan in CI).
 *
 * A long prompt is stored into ssd (dram holds a handful of pages) and
 * loaded back through the ssd bounce (KVT_CACHE_STAGE_SSD: the staged path
 * that GPU memory takes, here into host memory). While that load runs on
 * one worker, short loads of another prompt from dram are started and
 * waited for, one after the other: they must finish while the long load is
 * still running (with one worker for all jobs they waited for it). The
 * long load's progress callback must see layers ready before the last one
 * (with rounds waited to the end it saw 0, then all of them), in order;
 * every byte of both is checked at the end.
 *
 * Then one page in a middle round of the bounce and one in its last round
 * are damaged on the ssd and the prompt is loaded again: exactly those two
 * blocks fail (KVT_ECORRUPT), and every other block holds its page (the
 * rounds after a bad page still run and land).
 */
#include "cache_util.h"

#include <pthread.h>
#include <stdatomic.h>

#define P 16
#define L 4
#define N 4096              /* the long prompt (16 MiB) */
#define S 8                 /* the short one */

static kvt_geom geom;
static atomic_uint reports[64];
static atomic_int nreports, partial, order_bad;

static void on_progress(void *arg, const kvt_cache_progress *p)
{
	int i = atomic_fetch_add(&nreports, 1);
	unsigned prev = i ? atomic_load(&reports[(i - 1) % 64]) : 0;

	(void)arg;
	atomic_store(&reports[i % 64], p->layers);
	if (!p->done && p->layers > 0 && p->layers < L)
		atomic_fetch_add(&partial, 1);
	if (p->layers < prev)
		atomic_fetch_add(&order_bad, 1);
}

int main(void)
{
	const char *dir = test_dir("cache_workers");
	kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
	kvt_cache_io io = KVT_CACHE_IO_INIT;
	kvt_page_key *a = malloc(N * sizeof(*a)), b[S];
	uint32_t *ab = malloc(N * sizeof(*ab)), bb[S], bl[S], failed[S];
	int64_t live = kvt_alloc_live();
	kvt_cache_lookup_result r;
	int during = 0, shorts = 0;
	kvt_cache_job *j = NULL;
	kvt_cache *c = NULL;
	char spec[512];
	char json[256];
	size_t bad = 0;
	long nf = -1;
	eng e;

	test_watchdog(200);
	snprintf(json, sizeof(json), "{\"num_hidden_layers\":%d,"
		 "\"num_attention_heads\":1,\"hidden_size\":16,"
		 "\"num_key_value_heads\":1,\"torch_dtype\":\"bfloat16\"}", L);
	CHECK_OK(kvt_geom_from_json(&geom, json, "tiny", P, 1, 0));
	snprintf(spec, sizeof(spec), "dram:%llu ssd:%s/ssd,%llu,temp",
		 (unsigned long long)(2 * S * kvt_geom_page_bytes(&geom)), dir,
		 (unsigned long long)(2ull * N * 4096));
	cfg.tiers = spec;
	cfg.geom = &geom;
	cfg.flags = KVT_CACHE_STAGE_SSD | KVT_CACHE_NO_BACKGROUND;
	CHECK_OK(kvt_cache_open(&c, &cfg));
	if (!c || !a || !ab)
		goto out;
	CHECK_OK(eng_init(&e, &geom, N + 2 * S, ENG_KV_OUTER, 64, -1));
	CHECK_OK(eng_register(c, &e));

	test_phase = "the long prompt into ssd, the short one into dram";
	for (uint32_t i = 0; i < N; i++)
		ab[i] = i;
	for (uint32_t i = 0; i < S; i++) {
		bb[i] = N + i;
		bl[i] = N + S + i;
	}
	CHECK_OK(session_keys(c, 0, 1, N, a));
	CHECK_OK(session_keys(c, 0, 2, S, b));
	eng_fill(&e, a, N, 0, ab);
	eng_fill(&e, b, S, 0, bb);
	CHECK_OK(cache_store_wait(c, 0, a, N, 0, ab, NULL));
	CHECK_OK(cache_store_wait(c, 0, b, S, 0, bb, NULL));
	CHECK_OK(kvt_cache_lookup(c, 0, a, N, 0, &r));
	CHECK_EQ(r.pages, N);
	CHECK(r.tier_pages[KVT_TIER_SSD] >= N - 2 * S);
	CHECK_OK(kvt_cache_lookup(c, 0, b, S, 0, &r));
	CHECK_EQ(r.tier_pages[KVT_TIER_DRAM], S);

	test_phase = "short loads while the long one runs";
	for (uint32_t i = 0; i < N; i++)
		eng_poison(&e, ab[i]);
	io.progress = on_progress;
	CHECK_OK(kvt_cache_load_ex(c, 0, a, N, 0, ab, &io, &j));
	for (int k = 0; k < 64 && kvt_cache_job_poll(j) == -EINPROGRESS;
	     k++) {
		for (int i = 0; i < S; i++)
			eng_poison(&e, bl[i]);
		CHECK_OK(cache_load_wait(c, 0, b, S, 0, bl, failed, &nf, NULL));
		CHECK_EQ(nf, 0);
		for (int i = 0; i < S; i++)
			CHECK(eng_block_is(&e, bl[i], b[i]));
		shorts++;
		during += kvt_cache_job_poll(j) == -EINPROGRESS;
	}
	CHECK_OK(job_finish(j, failed, S, &nf));
	CHECK_EQ(nf, 0);
	fprintf(stderr, "%d short loads done while the long one ran (of %d); "
		"%d progress reports, %d with 0 < layers < %d\n", during, shorts,
		atomic_load(&nreports), atomic_load(&partial), L);
	CHECK(during > 0);
	CHECK(atomic_load(&partial) > 0);
	CHECK_EQ(atomic_load(&order_bad), 0);
	for (uint32_t i = 0; i < N; i++)
		bad += !eng_block_is(&e, ab[i], a[i]);
	CHECK_EQ(bad, 0);
	CHECK(eng_gaps_intact(&e));

	test_phase = "a damaged page in a middle round and in the last one";
	{
		const uint32_t dmg[2] = { N / 2 + 5, N - 3 };
		kvt_tier *ssd = kvt_cache_tier(c, KVT_TIER_SSD);
		const kvt_layout *lay = kvt_tier_layout(ssd);
		unsigned char *buf = malloc(lay->page_bytes);
		kvt_page_info in[N];
		kvt_prefix px = { .tenant = 0, .keys = a, .nkeys = N };
		size_t found = 0;
		uint32_t fl[4];
		int hit = 0;

		CHECK(buf != NULL);
		CHECK_OK(kvt_index_inspect(kvt_cache_index(c), &px, in, N,
					   &found));
		CHECK_EQ(found, N);
		for (int d = 0; d < 2 && buf; d++) {
			uint32_t s = in[dmg[d]].slot[KVT_TIER_SSD];

			CHECK(s != KVT_SLOT_NONE);
			CHECK_OK(kvt_tier_read(ssd, s, buf));
			buf[lay->chunk_bytes + 11] ^= 0x5a; /* layer 0's V */
			CHECK_OK(kvt_tier_write(ssd, s, buf));
		}
		free(buf);
		for (uint32_t i = 0; i < N; i++)
			eng_poison(&e, ab[i]);
		CHECK_OK(kvt_cache_load(c, 0, a, N, 0, ab, &j));
		CHECK_ERR(job_finish(j, fl, 4, &nf), KVT_ECORRUPT);
		CHECK_EQ(nf, 2);
		for (long f = 0; f < nf && f < 4; f++)
			hit += fl[f] == ab[dmg[0]] || fl[f] == ab[dmg[1]];
		CHECK_EQ(hit, 2);
		bad = 0;
		for (uint32_t i = 0; i < N; i++)
			if (i != dmg[0] && i != dmg[1])
				bad += !eng_block_is(&e, ab[i], a[i]);
		CHECK_EQ(bad, 0);
	}
	kvt_cache_close(c);
	eng_free(&e);
out:
	free(a);
	free(ab);
	CHECK_EQ(kvt_alloc_live(), live);
	TEST_DONE();
}
