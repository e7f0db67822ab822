/*
 * test_cache — the node cache end to end on tiny pages: pages pushed down
 * hostdev -> fabric -> dram -> ssd and back come back bit-exact; demotion
 * chains inside one call keep their order (every copy is checksummed, so a
 * misordered copy shows); corruption in a tier is caught on load and by
 * kvt_cache_verify(); ssd staging; reset; bad configs; failed allocations
 * along open leave nothing behind.
 */
#include "harness.h"

#include <dirent.h>
#include <unistd.h>
#include <xxhash.h>

#define P 4

static kvt_geom geom;
static uint64_t page_bytes;
static char spec[1024];

/* A tiny model: 2 layers, 2 KV heads of 64, bf16: 4 KiB pages of 4 tokens. */
static void tiny_geom(void)
{
	CHECK_OK(kvt_geom_from_json(&geom, "{\"num_hidden_layers\":2,"
		"\"num_attention_heads\":2,\"hidden_size\":128,"
		"\"num_key_value_heads\":2,\"torch_dtype\":\"bfloat16\"}",
		"tiny", P, 1, 0));
	page_bytes = kvt_geom_page_bytes(&geom);
	CHECK_EQ(page_bytes, 4096);
}

/* Session s: tokens derived from (s, i); page bytes from the prefix hash. */
static uint32_t tok(uint32_t s, uint32_t i)
{
	uint64_t k[2] = { s, i };
	return (uint32_t)XXH3_64bits(k, sizeof(k));
}

static void page_of(const uint32_t *tokens, size_t page, unsigned char *out)
{
	uint64_t h = XXH3_64bits(tokens, (page + 1) * P * sizeof(uint32_t));
	for (uint64_t i = 0; i < page_bytes; i += 8) {
		h = h * 6364136223846793005ull + 1442695040888963407ull;
		memcpy(out + i, &h, 8);
	}
}

static int open_cache(kvt_cache **c, int write, int stage)
{
	kvt_cache_config cfg = { 0 };

	cfg.tiers = spec;
	cfg.geom = geom;
	cfg.write = write;
	cfg.stage_ssd = stage;
	return kvt_cache_open(c, &cfg);
}

/* Acquire tokens[0..n), put what needs computing, check every page's
 * bytes in hbm, release. Returns the fill. */
static kvt_cache_fill use(kvt_cache *c, const uint32_t *tokens, size_t n)
{
	kvt_prefix px = { .tenant = 0, .tokens = tokens, .ntokens = n };
	kvt_page_loc locs[256];
	unsigned char want[4096], got[4096];
	kvt_cache_fill f;
	int err;

	memset(&f, 0, sizeof(f));
	err = kvt_cache_acquire(c, &px, 1000 + n, &f, locs, 256);
	CHECK_OK(err);
	if (err)
		return f;
	for (size_t i = 0; i < n / P; i++) {
		page_of(tokens, i, want);
		if (locs[i].fresh && locs[i].src_tier == KVT_TIER_COUNT)
			CHECK_OK(kvt_cache_put(c, locs[i].slot, want));
		CHECK_OK(kvt_tier_read(kvt_cache_tier(c, KVT_TIER_HBM),
				       locs[i].slot, got));
		if (memcmp(want, got, page_bytes)) {
			fprintf(stderr, "page %zu differs in hbm slot %u\n", i,
				locs[i].slot);
			CHECK(0);
			break;
		}
	}
	CHECK_OK(kvt_cache_release(c, &px));
	CHECK_OK(kvt_index_check(kvt_cache_index(c)));
	return f;
}

static void test_round_trip(int write, int stage)
{
	enum { S = 12, LEN = 32 * P };
	static uint32_t t[S][LEN];
	kvt_cache *c;
	kvt_cache_check chk;
	kvt_cache_stat st;
	uint64_t from[KVT_TIER_COUNT] = { 0 };

	CHECK_OK(open_cache(&c, write, stage));
	for (uint32_t s = 0; s < S; s++)
		for (uint32_t i = 0; i < LEN; i++)
			t[s][i] = tok(s, i);
	/* three rounds over 12 sessions of 32 pages: 384 pages through a
	 * hostdev of 48, fabric 64, dram 96: the cycle pushes pages to ssd */
	for (int round = 0; round < 3; round++)
		for (uint32_t s = 0; s < S; s++) {
			kvt_cache_fill f = use(c, t[s], LEN - (round ? 0 : 2 * P));
			for (int k = 0; k < KVT_TIER_COUNT; k++)
				from[k] += f.from[k];
			if (round)
				CHECK_EQ(f.compute, round == 1 ? 2 : 0);
			CHECK_EQ(f.verified, f.bytes_loaded / page_bytes);
		}
	CHECK(from[KVT_TIER_FABRIC] > 0 || write == KVT_WRITE_THROUGH);
	CHECK(from[KVT_TIER_DRAM] > 0);
	CHECK(from[KVT_TIER_SSD] > 0);
	kvt_cache_stat_get(c, &st);
	CHECK_EQ(st.move_errors, 0);
	CHECK_EQ(st.corrupt, 0);
	CHECK(st.verified > 0);
	CHECK_OK(kvt_cache_verify(c, &chk));
	CHECK_EQ(chk.bad, 0);
	CHECK_EQ(chk.unsummed, 0);
	CHECK(chk.per_tier[KVT_TIER_SSD] > 0);

	/* reset: empty pools, and it runs again */
	CHECK_OK(kvt_cache_reset(c, KVT_EVICT_LFU, KVT_WRITE_BACK));
	for (int k = 0; k < KVT_TIER_COUNT; k++)
		if (kvt_cache_tier(c, (kvt_tier_kind)k))
			CHECK_EQ(kvt_pool_used(kvt_tier_pool(kvt_cache_tier(c,
						(kvt_tier_kind)k))), 0);
	{
		kvt_cache_fill f = use(c, t[0], LEN);
		CHECK_EQ(f.compute, LEN / P);
	}
	kvt_cache_close(c);
}

/* Flip a byte of a page in dram: the load that reads it fails, and the
 * final check names it. */
static void test_corruption(void)
{
	enum { S = 8, LEN = 32 * P };
	static uint32_t t[S][LEN];
	kvt_cache *c;
	kvt_cache_check chk;
	kvt_page_info info[LEN / P];
	kvt_prefix px = { .tenant = 0, .ntokens = LEN };
	kvt_cache_fill f;
	size_t found;
	int victim = -1;

	CHECK_OK(open_cache(&c, KVT_WRITE_BACK, 0));
	for (uint32_t s = 0; s < S; s++) {
		for (uint32_t i = 0; i < LEN; i++)
			t[s][i] = tok(100 + s, i);
		use(c, t[s], LEN);
	}
	/* find a session with a page whose only copy is in dram */
	for (uint32_t s = 0; s < S && victim < 0; s++) {
		px.tokens = t[s];
		CHECK_OK(kvt_index_inspect(kvt_cache_index(c), &px, info,
					   LEN / P, &found));
		for (size_t i = 0; i < found; i++)
			if (info[i].resident == 1u << KVT_TIER_DRAM) {
				unsigned char *p = kvt_tier_slot_ptr(
					kvt_cache_tier(c, KVT_TIER_DRAM),
					info[i].slot[KVT_TIER_DRAM]);
				p[100] ^= 0x40;
				victim = (int)s;
				break;
			}
	}
	CHECK(victim >= 0);
	CHECK_ERR(kvt_cache_verify(c, &chk), KVT_ECORRUPT);
	CHECK_EQ(chk.bad, 1);
	CHECK(strstr(kvt_errdetail(), "dram"));
	px.tokens = t[victim];
	CHECK_ERR(kvt_cache_acquire(c, &px, 99999, &f, NULL, 0), KVT_ECORRUPT);
	CHECK(strstr(kvt_errdetail(), "checksum"));
	/* nothing stays leased after the failure, and asking again fails the
	 * same way instead of serving the bad bytes */
	CHECK_OK(kvt_index_check(kvt_cache_index(c)));
	CHECK_ERR(kvt_cache_acquire(c, &px, 100000, &f, NULL, 0), KVT_ECORRUPT);
	kvt_cache_close(c);
}

static void test_bad_config(const char *dir)
{
	kvt_cache_config cfg = { 0 };
	kvt_cache *c;
	char s[600];

	cfg.geom = geom;
	CHECK_ERR(kvt_cache_open(&c, &cfg), KVT_ESPEC);
	cfg.tiers = "dram:1M";
	CHECK_ERR(kvt_cache_open(&c, &cfg), KVT_ESPEC);
	CHECK(strstr(kvt_errdetail(), "no hbm"));
	cfg.tiers = "hostdev:1M,dram:1M,dram:1M";
	CHECK_ERR(kvt_cache_open(&c, &cfg), KVT_ESPEC);
	CHECK(strstr(kvt_errdetail(), "two dram"));
	cfg.tiers = "hostdev:1M,remote:redis://127.0.0.1:1";
	CHECK_ERR(kvt_cache_open(&c, &cfg), KVT_ENOTBUILT);
	snprintf(s, sizeof(s), "hostdev:1M,ssd:%s/x,1K", dir);
	cfg.tiers = s;
	CHECK_ERR(kvt_cache_open(&c, &cfg), KVT_ESPEC);
}

static void test_open_faults(const char *dir)
{
	uint64_t before = kvt_alloc_count(), points;
	kvt_cache *c;
	int failed = 0;

	CHECK_OK(open_cache(&c, KVT_WRITE_BACK, 1));
	points = kvt_alloc_count() - before;
	kvt_cache_close(c);
	for (uint64_t n = 1; n <= points; n++) {
		int64_t live = kvt_alloc_live();
		int err;

		kvt_alloc_fail_at(n);
		err = open_cache(&c, KVT_WRITE_BACK, 1);
		kvt_alloc_fail_at(0);
		if (!err) {
			kvt_cache_close(c);
			continue;
		}
		failed++;
		CHECK(err == -ENOMEM || err == -ENOSPC || err == -EAGAIN);
		CHECK_EQ(kvt_alloc_live(), live);
		CHECK(test_count_entries(dir) <= 0); /* gone or empty */
	}
	CHECK(failed > 10);
	fprintf(stderr, "open: %llu acquisitions, %d failures injected\n",
		(unsigned long long)points, failed);
}

int main(void)
{
	const char *dir = test_dir("cache");
	char ssd[600];
	int64_t live = kvt_alloc_live();

	tiny_geom();
	snprintf(ssd, sizeof(ssd), "%s/ssd", dir);
	snprintf(spec, sizeof(spec), "hostdev:192K,fabric:memfd,256K,dram:384K,"
		 "ssd:%s,4M,temp", ssd);
	test_round_trip(KVT_WRITE_BACK, 0);
	test_round_trip(KVT_WRITE_THROUGH, 0);
	test_round_trip(KVT_WRITE_SELECTIVE, 1);
	test_corruption();
	test_bad_config(dir);
	test_open_faults(ssd);
	CHECK_EQ(kvt_alloc_live(), live);
	TEST_DONE();
}
