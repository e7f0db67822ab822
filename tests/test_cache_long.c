/*
 * test_cache_long — a context longer than the top tier, through the node
 * cache: 131,072 tokens (8,192 pages of 16 tokens) stored in one call into
 * a cache whose dram tier holds a quarter of them, over an ssd tier. The
 * store places the leading pages in dram and the rest straight in ssd
 * (nothing refused), and every page restores bit-exact into the engine's
 * blocks. Then the prompt grows: its first pages have been demoted to ssd
 * since, and a store of the pages that follow goes through without
 * bringing them back to dram (no promotion: they stay where they are).
 * Last, a store into tiers too small for it keeps its leading pages and
 * fails the rest per block. kvt_cache_verify() and kvt_index_check()
 * after each part.
 *
 * The model is tiny (2 layers, 1 KV head of 16, bf16: 2 KiB pages) so the
 * whole context is 16 MiB.
 */
#include "cache_util.h"

#define P 16
#define NP 8192             /* 131,072 tokens */
#define MORE 512            /* the next turn's pages */
#define DRAM_PAGES (NP / 4)

static kvt_geom geom;

static void tiny_geom(kvt_geom *g)
{
	const char *json = "{\"num_hidden_layers\":2,\"num_attention_heads\":1,"
			   "\"hidden_size\":16,\"num_key_value_heads\":1,"
			   "\"torch_dtype\":\"bfloat16\"}";

	CHECK_OK(kvt_geom_from_json(g, json, "tiny", P, 1, 0));
}

static kvt_cache *open_cache(const char *dir, uint64_t dram_pages,
			     uint64_t ssd_pages, unsigned flags)
{
	kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
	uint64_t pb = kvt_geom_page_bytes(&geom);
	kvt_cache *c = NULL;
	char spec[512];
	int err;

	snprintf(spec, sizeof(spec), "dram:%llu ssd:%s/ssd,%llu,temp",
		 (unsigned long long)(dram_pages * pb), dir,
		 (unsigned long long)(ssd_pages * 4096));
	cfg.tiers = spec;
	cfg.geom = &geom;
	cfg.flags = flags;
	if ((err = kvt_cache_open(&c, &cfg))) {
		fprintf(stderr, "open: %s (%s)\n", kvt_strerror(err),
			kvt_errdetail());
		kvt_test_failures++;
		return NULL;
	}
	return c;
}

static void settle_check(kvt_cache *c)
{
	kvt_cache_check chk;

	kvt_cache_quiesce(c);
	CHECK_OK(kvt_cache_verify(c, &chk));
	CHECK_EQ(chk.bad, 0);
	CHECK(chk.checked > 0);
	CHECK_OK(kvt_index_check(kvt_cache_index(c)));
}

/* Load keys[0..n) into blocks 0..n-1 (poisoned first), compare. */
static void restore_check(kvt_cache *c, eng *e, const kvt_page_key *k,
			  size_t n, uint32_t *blocks)
{
	uint32_t *failed = malloc(n * sizeof(*failed));
	long nf = -1;
	size_t bad = 0;

	for (size_t i = 0; i < n; i++)
		eng_poison(e, blocks[i]);
	CHECK_OK(cache_load_wait(c, 0, k, n, 0, blocks, failed, &nf, NULL));
	CHECK_EQ(nf, 0);
	for (size_t i = 0; i < n; i++)
		bad += !eng_block_is(e, blocks[i], k[i]);
	CHECK_EQ(bad, 0);
	free(failed);
}

static void test_long_context(const char *dir)
{
	kvt_page_key *k = malloc((NP + MORE) * sizeof(*k));
	uint32_t *b = malloc((NP + MORE) * sizeof(*b));
	kvt_cache_lookup_result r;
	kvt_cache_job_stat st;
	kvt_cache *c;
	eng e;

	test_phase = "a context four times the dram tier";
	if (!k || !b || !(c = open_cache(dir, DRAM_PAGES, 2 * NP, 0)))
		goto out;
	CHECK_OK(eng_init(&e, &geom, NP + MORE, ENG_KV_OUTER, 64, -1));
	CHECK_OK(eng_register(c, &e));
	for (uint32_t i = 0; i < NP + MORE; i++)
		b[i] = i;
	CHECK_OK(session_keys(c, 0, 1, NP + MORE, k));
	eng_fill(&e, k, NP + MORE, 0, b);
	CHECK_OK(cache_store_wait(c, 0, k, NP, 0, b, &st));
	CHECK_EQ(st.copied, NP);
	CHECK_EQ(st.failed, 0);
	kvt_cache_quiesce(c);
	CHECK_OK(kvt_cache_lookup(c, 0, k, NP, 0, &r));
	CHECK_EQ(r.pages, NP);
	CHECK(r.tier_pages[KVT_TIER_DRAM] > 0);
	CHECK(r.tier_pages[KVT_TIER_DRAM] <= DRAM_PAGES);
	CHECK_EQ(r.tier_pages[KVT_TIER_DRAM] + r.tier_pages[KVT_TIER_SSD], NP);
	fprintf(stderr, "stored %d pages: %llu in dram, %llu in ssd\n", NP,
		(unsigned long long)r.tier_pages[KVT_TIER_DRAM],
		(unsigned long long)r.tier_pages[KVT_TIER_SSD]);
	restore_check(c, &e, k, NP, b);
	settle_check(c);

	/* the next turn: the prompt's own first pages went to ssd since (the
	 * load touched them, then another prompt filled dram); the pages
	 * that follow are stored without them coming back up */
	test_phase = "the prompt grows while its start is in ssd";
	{
		kvt_page_key other[DRAM_PAGES];
		uint64_t in_ssd;

		CHECK_OK(session_keys(c, 0, 2, DRAM_PAGES, other));
		eng_fill(&e, other, DRAM_PAGES, 0, b);
		CHECK_OK(cache_store_wait(c, 0, other, DRAM_PAGES, 0, b, NULL));
		kvt_cache_quiesce(c);
		CHECK_OK(kvt_cache_lookup(c, 0, k, NP, 0, &r));
		CHECK_EQ(r.pages, NP);
		in_ssd = r.tier_pages[KVT_TIER_SSD];
		CHECK(in_ssd > NP - DRAM_PAGES);
		eng_fill(&e, k, NP + MORE, 0, b);
		CHECK_OK(cache_store_wait(c, 0, k, NP + MORE, NP, b + NP, &st));
		CHECK_EQ(st.copied, MORE);
		CHECK_EQ(st.failed, 0);
		kvt_cache_quiesce(c);
		CHECK_OK(kvt_cache_lookup(c, 0, k, NP, 0, &r));
		CHECK_EQ(r.pages, NP);
		/* none of the old pages was promoted for the store */
		CHECK(r.tier_pages[KVT_TIER_SSD] >= in_ssd);
		restore_check(c, &e, k, NP + MORE, b);
	}
	settle_check(c);
	kvt_cache_close(c);
	eng_free(&e);
out:
	free(k);
	free(b);
}

/* Tiers that cannot hold the prompt: its leading pages are stored, the
 * rest fail per block with KVT_EFULL, and what was stored restores. */
static void test_no_room(const char *dir)
{
	enum { N = 96, D = 32, S = 40 };
	kvt_page_key k[N];
	uint32_t b[N], failed[N];
	kvt_cache_lookup_result r;
	kvt_cache_job *j = NULL;
	kvt_cache *c;
	long nf;
	eng e;

	test_phase = "a prompt larger than every tier together";
	if (!(c = open_cache(dir, D, S, KVT_CACHE_NO_BACKGROUND)))
		return;
	CHECK_OK(eng_init(&e, &geom, N, ENG_BLOCK_OUTER, 16, -1));
	CHECK_OK(eng_register(c, &e));
	for (uint32_t i = 0; i < N; i++)
		b[i] = i;
	CHECK_OK(session_keys(c, 0, 3, N, k));
	eng_fill(&e, k, N, 0, b);
	CHECK_OK(kvt_cache_store(c, 0, k, N, 0, b, &j));
	CHECK_ERR(job_finish(j, failed, N, &nf), KVT_EFULL);
	CHECK_EQ(nf, N - D - S);
	CHECK_EQ(failed[0], D + S);
	CHECK_EQ(failed[nf - 1], N - 1);
	CHECK_OK(kvt_cache_lookup(c, 0, k, N, 0, &r));
	CHECK_EQ(r.pages, D + S);
	CHECK_EQ(r.tier_pages[KVT_TIER_DRAM], D);
	CHECK_EQ(r.tier_pages[KVT_TIER_SSD], S);
	restore_check(c, &e, k, D + S, b);
	settle_check(c);
	kvt_cache_close(c);
	eng_free(&e);
}

int main(void)
{
	const char *dir = test_dir("cache_long");
	int64_t live = kvt_alloc_live();

	test_watchdog(120);
	tiny_geom(&geom);
	test_long_context(dir);
	test_no_room(dir);
	CHECK_EQ(kvt_alloc_live(), live);
	TEST_DONE();
}
