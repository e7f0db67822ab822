/*
 * test_cache_layers — layer-wise readiness with integrity: corrupt layer l
 * of one page's only copy in fabric, dram or ssd (bytes flipped in the
 * mapping, or rewritten through the tier's plain write path), then load:
 *
 *   - a load of that page alone never reports layer l (or any later one)
 *     ready: the wait returns the error, the block is on the failed list;
 *   - a load of its prefix reports every layer ready for the other blocks,
 *     each layer's bytes in place the moment it is reported (layers below
 *     l of the bad page included: they verified), and the bad page's block
 *     ends on the failed list with KVT_ECORRUPT;
 *   - the bad copy is dropped: lookup stops before it, a later load fails
 *     its block as absent and writes nothing there, kvt_cache_verify()
 *     passes again;
 *   - a corrupted page is caught when it is demoted, too, and never
 *     served from the tier it was demoted to.
 * Run with the default ssd path and with KVT_CACHE_STAGE_SSD.
 */
#include "cache_util.h"

#define P 4
#define L 6
#define NB 64
#define S 16   /* sessions */
#define SP 12  /* pages per session */

static kvt_geom geom;
static char spec[1024];
static kvt_page_key keys[S][SP];

/* The index's record of page @i of session @s. */
static int inspect(kvt_cache *c, int s, int i, kvt_page_info *out)
{
	kvt_page_info info[SP];
	kvt_prefix px = { .tenant = 0, .keys = keys[s], .nkeys = (size_t)i + 1 };
	size_t found = 0;
	int err = kvt_index_inspect(kvt_cache_index(c), &px, info, SP, &found);

	if (err || found < (size_t)i + 1)
		return err ? err : KVT_ENOTFOUND;
	*out = info[i];
	return 0;
}

/* A page (1 <= i) whose only copy is in tier @t, in a session not yet
 * used; marks the session used. */
static int pick(kvt_cache *c, kvt_tier_kind t, int *used, int *ps, int *pi)
{
	for (int s = 0; s < S; s++) {
		if (used[s])
			continue;
		for (int i = SP - 1; i >= 1; i--) {
			kvt_page_info in;
			if (inspect(c, s, i, &in) || in.resident != (1u << t))
				continue;
			used[s] = 1;
			*ps = s, *pi = i;
			return 0;
		}
	}
	fprintf(stderr, "no page whose only copy is in %s\n",
		kvt_tier_kind_name(t));
	kvt_test_failures++;
	return -1;
}

/* Flip one byte of layer @l (its K chunk) of page (s, i) in tier @t. */
static void corrupt(kvt_cache *c, kvt_tier_kind t, int s, int i, uint32_t l)
{
	kvt_tier *tier = kvt_cache_tier(c, t);
	const kvt_layout *lay = kvt_tier_layout(tier);
	uint64_t off = (uint64_t)l * lay->kv * lay->chunk_bytes + 37;
	unsigned char *want = malloc(lay->page_bytes), *p;
	kvt_page_info in;
	eng e0 = { .page = lay->page_bytes };

	CHECK_OK(inspect(c, s, i, &in));
	page_img(&e0, keys[s][i], want);
	if (t != KVT_TIER_SSD && (p = kvt_tier_slot_ptr(tier, in.slot[t]))) {
		CHECK(!memcmp(p, want, lay->page_bytes)); /* the right slot */
		p[off] ^= 0x5a;
	} else {
		unsigned char *buf = malloc(lay->page_bytes);
		CHECK_OK(kvt_tier_read(tier, in.slot[t], buf));
		CHECK(!memcmp(buf, want, lay->page_bytes));
		buf[off] ^= 0x5a;
		CHECK_OK(kvt_tier_write(tier, in.slot[t], buf));
		free(buf);
	}
	free(want);
}

static void store_sessions(kvt_cache *c, const eng *e, int from, int to)
{
	uint32_t b[SP];

	for (int s = from; s < to; s++) {
		for (int i = 0; i < SP; i++)
			b[i] = (uint32_t)((s * 13 + i) % NB);
		eng_fill(e, keys[s], SP, 0, b);
		CHECK_OK(cache_store_wait(c, 0, keys[s], SP, 0, b, NULL));
	}
	kvt_cache_quiesce(c);
}

/* Load page i of session s alone: layer @bad and later are never ready. */
static void load_alone(kvt_cache *c, const eng *e, int s, int i, uint32_t bad,
		       int want_err)
{
	uint32_t blk = 50, failed[1] = { 99 };
	kvt_cache_job *j;
	long nf;
	int err;

	eng_poison(e, blk);
	CHECK_OK(kvt_cache_load(c, 0, keys[s], (size_t)i + 1, (size_t)i, &blk,
				&j));
	for (uint32_t l = 0; l < L; l++) {
		err = kvt_cache_job_wait_layer(j, l, -1);
		if (l >= bad && err == 0) {
			fprintf(stderr, "layer %u of a page whose layer %u is "
				"corrupt reported ready\n", l, bad);
			kvt_test_failures++;
		}
		if (err)
			CHECK(want_err ? err == want_err :
			      err == KVT_ECORRUPT || err == KVT_ENOTFOUND ||
			      err == KVT_EBUSY);
		if (!err && l < bad) { /* ready: then its bytes are right */
			unsigned char img[32768];
			page_img(e, keys[s][i], img);
			CHECK(eng_layer_is(e, blk, l, img));
		}
	}
	err = job_finish(j, failed, 1, &nf);
	CHECK(want_err ? err == want_err :
	      err == KVT_ECORRUPT || err == KVT_ENOTFOUND || err == KVT_EBUSY);
	CHECK_EQ(nf, 1);
	CHECK_EQ(failed[0], blk);
}

/* Load pages 0..i of session s: every layer ready for the others, the bad
 * one on the failed list. */
static void load_prefix(kvt_cache *c, const eng *e, int s, int i,
			uint32_t bad, int want_err)
{
	uint32_t b[SP], failed[SP];
	unsigned char img[32768];
	kvt_cache_job_stat st;
	kvt_cache_job *j;
	size_t n = (size_t)i + 1;

	for (size_t k = 0; k < n; k++) {
		b[k] = (uint32_t)(NB - 1 - k * 2);
		eng_poison(e, b[k]);
	}
	uint64_t t0 = kvt_now_ns(), prev = 0;

	CHECK_OK(kvt_cache_load(c, 0, keys[s], n, 0, b, &j));
	for (uint32_t l = 0; l < L; l++) {
		uint64_t at;

		CHECK_OK(kvt_cache_job_wait_layer(j, l, -1));
		/* the instant it became ready: after the submit, before the
		 * waiter saw it, never before an earlier layer's */
		at = kvt_cache_job_layer_ns(j, l);
		CHECK(at >= t0 && at <= kvt_now_ns());
		CHECK(at >= prev);
		prev = at;
		for (size_t k = 0; k + 1 < n; k++) {
			page_img(e, keys[s][k], img);
			if (!eng_layer_is(e, b[k], l, img)) {
				fprintf(stderr, "session %d page %zu layer %u "
					"reported ready, not in place\n", s, k, l);
				kvt_test_failures++;
			}
		}
	}
	CHECK_ERR(kvt_cache_job_wait(j, -1), want_err);
	CHECK_EQ(kvt_cache_job_layer_ns(j, L), 0); /* out of range */
	CHECK_EQ(kvt_cache_job_failed(j, failed, SP), 1);
	CHECK_EQ(failed[0], b[i]);
	kvt_cache_job_stat_get(j, &st);
	CHECK_EQ(st.failed, 1);
	CHECK_EQ(st.copied + st.failed, n);
	CHECK_EQ(st.verified, n - 1);
	kvt_cache_job_free(j);
	for (size_t k = 0; k + 1 < n; k++)
		CHECK(eng_block_is(e, b[k], keys[s][k]));
	if (want_err == KVT_ENOTFOUND)
		CHECK(eng_block_poisoned(e, b[i]));
	(void)bad;
}

static void run(unsigned flags)
{
	static const kvt_tier_kind tiers[] = { KVT_TIER_FABRIC, KVT_TIER_DRAM,
					       KVT_TIER_SSD };
	static const uint32_t bad_layer[] = { 2, 3, L - 1 };
	kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
	kvt_cache_lookup_result r;
	kvt_cache_stat st;
	kvt_cache_check chk;
	kvt_cache *c = NULL;
	int used[S] = { 0 }, s, i, cs, ci;
	uint64_t corrupt0;
	eng e;

	fprintf(stderr, "flags %#x\n", flags);
	cfg.tiers = spec;
	cfg.geom = &geom;
	cfg.flags = flags;
	CHECK_OK(kvt_cache_open(&c, &cfg));
	if (!c)
		return;
	CHECK_OK(eng_init(&e, &geom, NB, ENG_KV_OUTER, 32, -1));
	CHECK_OK(eng_register(c, &e));
	for (s = 0; s < S; s++)
		CHECK_OK(session_keys(c, 0, (uint32_t)s, SP, keys[s]));
	store_sessions(c, &e, 0, 10);

	/* caught on demotion: corrupt a fabric page, push it down */
	if (pick(c, KVT_TIER_FABRIC, used, &cs, &ci))
		goto out;
	corrupt(c, KVT_TIER_FABRIC, cs, ci, 1);
	CHECK_ERR(kvt_cache_verify(c, &chk), KVT_ECORRUPT);
	CHECK(strstr(kvt_errdetail(), "fabric") != NULL);
	kvt_cache_stat_get(c, &st);
	corrupt0 = st.corrupt;
	store_sessions(c, &e, 10, S);
	kvt_cache_stat_get(c, &st);
	if (st.corrupt == corrupt0)
		fprintf(stderr, "warning: the corrupt page was not demoted\n");
	/* only the bad page is lost: every other page of every session is
	 * still served (the demotion batch it was in was not dropped) */
	for (s = 0; s < S; s++) {
		CHECK_OK(kvt_cache_lookup(c, 0, keys[s], SP, 0, &r));
		if (r.pages != (s == cs ? (uint64_t)ci : SP)) {
			fprintf(stderr, "session %d lost pages %llu.. in the "
				"demotion that caught the corrupt page of "
				"session %d\n", s, (unsigned long long)r.pages,
				cs);
			kvt_test_failures++;
		}
	}
	load_alone(c, &e, cs, ci, 1, 0);

	/* one page per tier: alone, then a prefix ending in another one */
	for (int t = 0; t < 3; t++) {
		if (pick(c, tiers[t], used, &s, &i))
			continue;
		fprintf(stderr, "  %s: session %d page %d layer %u alone\n",
			kvt_tier_kind_name(tiers[t]), s, i, bad_layer[t]);
		corrupt(c, tiers[t], s, i, bad_layer[t]);
		load_alone(c, &e, s, i, bad_layer[t], KVT_ECORRUPT);
		CHECK_OK(kvt_cache_lookup(c, 0, keys[s], SP, 0, &r));
		CHECK(r.pages <= (uint64_t)i);
		load_prefix(c, &e, s, i, bad_layer[t], KVT_ENOTFOUND);

		if (pick(c, tiers[t], used, &s, &i))
			continue;
		fprintf(stderr, "  %s: session %d page %d layer %u in a "
			"prefix\n", kvt_tier_kind_name(tiers[t]), s, i,
			bad_layer[t]);
		corrupt(c, tiers[t], s, i, bad_layer[t]);
		load_prefix(c, &e, s, i, bad_layer[t], KVT_ECORRUPT);
		/* dropped: not served again, nothing written */
		CHECK_OK(kvt_cache_lookup(c, 0, keys[s], SP, 0, &r));
		CHECK_EQ(r.pages, (uint64_t)i);
		load_prefix(c, &e, s, i, bad_layer[t], KVT_ENOTFOUND);
	}
	kvt_cache_stat_get(c, &st);
	CHECK(st.corrupt >= 6);
	CHECK(st.failed_blocks >= 10);
	CHECK_OK(kvt_cache_verify(c, &chk));
	CHECK_EQ(chk.bad, 0);
	CHECK(chk.per_tier[KVT_TIER_SSD] > 0);
	CHECK(eng_gaps_intact(&e));
out:
	kvt_cache_close(c);
	eng_free(&e);
}

int main(void)
{
	const char *dir = test_dir("cache_layers");
	int64_t live = kvt_alloc_live();

	small_geom(&geom, L, P); /* 12 KiB pages */
	/* 32 pages of fabric, 64 of dram, 512 of ssd */
	snprintf(spec, sizeof(spec), "fabric:memfd,384K dram:768K "
		 "ssd:%s/ssd,6M,temp", dir);
	run(0);
	run(KVT_CACHE_STAGE_SSD);
	CHECK_EQ(kvt_alloc_live(), live);
	TEST_DONE();
}
