/*
 * test_cache_dev — the cache over an engine's device memory, on the
 * emulated device always and on each CUDA GPU when there is one:
 * per-layer device buffers registered with the device, in vLLM-like (K/V
 * outer) and block-outer strides with gaps. Pages are
 * stored out of GPU blocks, pushed down fabric -> dram -> ssd, and loaded
 * back into other GPU blocks bit-exact, layer by layer (each layer's bytes
 * read back from the GPU the moment it is reported ready), ssd -> GPU
 * included (staged through a pinned bounce tier). A page corrupted in dram
 * is never reported ready past its bad layer; a load cancelled before it
 * ran fails every block; kvt_cache_verify() passes at the end. The
 * cache registers its host tiers with the device itself (tiers opened
 * without 'pin', and with it on a GPU); the counters show the device
 * moved and hashed the restores and no CPU thread did.
 */
#include "cache_util.h"

#define P 16
#define L 8
#define NB 48
#define S 12
#define SP 16

static kvt_geom geom;
static kvt_page_key keys[S][SP];

static void store_all(kvt_cache *c, const eng *e)
{
	uint32_t b[SP];
	kvt_cache_job_stat st;

	for (int s = 0; s < S; s++) {
		for (int i = 0; i < SP; i++)
			b[i] = (uint32_t)((s * 7 + i) % NB);
		eng_fill(e, keys[s], SP, 0, b);
		CHECK_OK(cache_store_wait(c, 0, keys[s], SP, 0, b, &st));
		CHECK_EQ(st.copied, SP);
	}
	kvt_cache_quiesce(c);
}

/* Load session s into GPU blocks, checking each layer as it is reported. */
static void load_session(kvt_cache *c, const eng *e, int s, uint64_t *from)
{
	uint32_t b[SP];
	unsigned char *img = malloc(e->page);
	kvt_cache_job_stat st;
	kvt_cache_job *j;

	for (int i = 0; i < SP; i++) {
		b[i] = (uint32_t)(NB - 1 - (s * 5 + i) % NB);
		eng_poison(e, b[i]);
	}
	CHECK_OK(kvt_cache_load(c, 0, keys[s], SP, 0, b, &j));
	if (!j)
		goto out;
	for (uint32_t l = 0; l < L; l++) {
		CHECK_OK(kvt_cache_job_wait_layer(j, l, -1));
		for (int i = 0; i < SP; i++) {
			page_img(e, keys[s][i], img);
			if (!eng_layer_is(e, b[i], l, img)) {
				fprintf(stderr, "session %d page %d layer %u: "
					"ready but not in GPU memory\n", s, i, l);
				kvt_test_failures++;
				break;
			}
		}
	}
	CHECK_OK(kvt_cache_job_wait(j, -1));
	CHECK_EQ(kvt_cache_job_failed(j, NULL, 0), 0);
	kvt_cache_job_stat_get(j, &st);
	for (int k = 0; k < KVT_TIER_COUNT; k++)
		from[k] += st.from[k];
	CHECK_EQ(st.copied, SP);
	kvt_cache_job_free(j);
	for (int i = 0; i < SP; i++)
		CHECK(eng_block_is(e, b[i], keys[s][i]));
out:
	free(img);
}

/* A page whose only copy is in dram: flip a byte of layer 2, load it
 * alone into GPU memory: layers 2.. never ready, the block fails. */
static void corrupt_dram(kvt_cache *c, const eng *e)
{
	kvt_tier *dram = kvt_cache_tier(c, KVT_TIER_DRAM);
	const kvt_layout *lay = kvt_tier_layout(dram);

	for (int s = 0; s < S; s++) {
		kvt_page_info info[SP];
		kvt_prefix px = { .keys = keys[s], .nkeys = SP };
		size_t found = 0;

		if (kvt_index_inspect(kvt_cache_index(c), &px, info, SP, &found))
			continue;
		for (size_t i = 1; i < found; i++) {
			uint32_t blk = 3, failed[1];
			kvt_cache_job *j;
			unsigned char *p;
			long nf;

			if (info[i].resident != 1u << KVT_TIER_DRAM)
				continue;
			p = kvt_tier_slot_ptr(dram, info[i].slot[KVT_TIER_DRAM]);
			CHECK(p != NULL);
			if (!p)
				return;
			p[2 * lay->kv * lay->chunk_bytes + 5] ^= 1;
			eng_poison(e, blk);
			CHECK_OK(kvt_cache_load(c, 0, keys[s], i + 1, i, &blk, &j));
			if (!j)
				return;
			for (uint32_t l = 2; l < L; l++)
				CHECK(kvt_cache_job_wait_layer(j, l, -1) != 0);
			CHECK_ERR(job_finish(j, failed, 1, &nf), KVT_ECORRUPT);
			CHECK_EQ(nf, 1);
			fprintf(stderr, "  corrupt dram page caught on its way to "
				"the GPU\n");
			return;
		}
	}
	fprintf(stderr, "no page only in dram\n");
	kvt_test_failures++;
}

static void cancel_load(kvt_cache *c, const eng *e)
{
	uint32_t b[SP], failed[SP];
	kvt_cache_job *j;
	long nf;

	for (int i = 0; i < SP; i++)
		b[i] = (uint32_t)i;
	kvt_xfer_pause(kvt_cache_xfer(c), 1);
	CHECK_OK(kvt_cache_load(c, 0, keys[S - 1], SP, 0, b, &j));
	if (j)
		CHECK_OK(kvt_cache_job_cancel(j));
	kvt_xfer_pause(kvt_cache_xfer(c), 0);
	if (!j)
		return;
	CHECK_ERR(job_finish(j, failed, SP, &nf), -ECANCELED);
	CHECK_EQ(nf, SP);
}

static int DEVICE;

/* @load_m: the cache's device load method (0: the default, the gather
 * kernel); stores then go one copy per chunk instead of batched. */
static void run(const char *spec, int outer, int pinned, int load_m)
{
	kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
	uint64_t from[KVT_TIER_COUNT] = { 0 };
	kvt_cache_check chk;
	kvt_cache *c = NULL;
	eng e;
	int err;

	fprintf(stderr, "%s, %s%s\n", spec, outer ? "block outer" : "kv outer",
		load_m ? ", loads by copy engines, stores per chunk" : "");
	cfg.tiers = spec;
	cfg.geom = &geom;
	cfg.dev_load = load_m;
	cfg.dev_store = load_m ? KVT_XFER_CUDA_CHUNK : 0;
	CHECK_OK(kvt_cache_open(&c, &cfg));
	if (!c)
		return;
	CHECK_OK(eng_init(&e, &geom, NB, outer, 256, DEVICE));
	err = eng_register(c, &e);
	if (!pinned && err) {
		fprintf(stderr, "  unpinned tiers refused: %s (%s)\n",
			kvt_strerror(err), kvt_errdetail());
		goto out;
	}
	CHECK_OK(err);
	for (int s = 0; s < S; s++)
		CHECK_OK(session_keys(c, 0, (uint32_t)s, SP, keys[s]));
	store_all(c, &e);
	for (int s = 0; s < S; s++)
		load_session(c, &e, s, from);
	tier_counts_print("loaded from", from);
	CHECK(from[KVT_TIER_SSD] > 0);
	CHECK(from[KVT_TIER_DRAM] > 0);
	if (pinned) {
		corrupt_dram(c, &e);
		cancel_load(c, &e);
	}
	CHECK_OK(kvt_cache_verify(c, &chk));
	CHECK_EQ(chk.bad, 0);
	CHECK(eng_gaps_intact(&e));
	{
		kvt_xfer_stat xs;

		kvt_xfer_stat_get(kvt_cache_xfer(c), &xs);
		CHECK_EQ(xs.bytes[KVT_XFER_MOVER_CPU][KVT_XFER_FLOW_RESTORE], 0);
		CHECK_EQ(xs.cpu_hashed[KVT_XFER_FLOW_RESTORE], 0);
		/* who moved the restores: the method asked for */
		CHECK_EQ(xs.bytes[load_m ? KVT_XFER_MOVER_COPY_ENGINE :
				  KVT_XFER_MOVER_KERNEL][KVT_XFER_FLOW_RESTORE] > 0, 1);
		CHECK_EQ(xs.bytes[load_m ? KVT_XFER_MOVER_KERNEL :
				  KVT_XFER_MOVER_COPY_ENGINE][KVT_XFER_FLOW_RESTORE], 0);
		CHECK(xs.bytes[KVT_XFER_MOVER_COPY_ENGINE][KVT_XFER_FLOW_SAVE] > 0);
		CHECK(xs.dev_hashed[KVT_XFER_FLOW_RESTORE] > 0);
	}
out:
	kvt_cache_close(c);
	eng_free(&e);
}

/* An ssd-only cache: stores from device memory go through the bounce
 * (summed on the device), loads come back through it bit-exact. */
static void ssd_only(const char *dir)
{
	kvt_cache_config cfg = KVT_CACHE_CONFIG_INIT;
	uint64_t from[KVT_TIER_COUNT] = { 0 };
	kvt_cache *c = NULL;
	char spec[700];
	eng e;

	snprintf(spec, sizeof(spec), "ssd:%s/ssd1,16M,temp", dir);
	fprintf(stderr, "%s (device memory through the bounce both ways)\n",
		spec);
	cfg.tiers = spec;
	cfg.geom = &geom;
	CHECK_OK(kvt_cache_open(&c, &cfg));
	if (!c)
		return;
	CHECK_OK(eng_init(&e, &geom, NB, ENG_KV_OUTER, 64, DEVICE));
	CHECK_OK(eng_register(c, &e));
	for (int s = 0; s < 3; s++)
		CHECK_OK(session_keys(c, 0, (uint32_t)s, SP, keys[s]));
	for (int s = 0; s < 3; s++) {
		uint32_t b[SP];
		kvt_cache_job_stat st;

		for (int i = 0; i < SP; i++)
			b[i] = (uint32_t)((s * 7 + i) % NB);
		eng_fill(&e, keys[s], SP, 0, b);
		CHECK_OK(cache_store_wait(c, 0, keys[s], SP, 0, b, &st));
		CHECK_EQ(st.copied, SP);
	}
	for (int s = 0; s < 3; s++)
		load_session(c, &e, s, from);
	CHECK_EQ(from[KVT_TIER_SSD], 3 * SP);
	kvt_cache_close(c);
	eng_free(&e);
}

static void run_device(const char *dir, int device)
{
	char spec[700];

	DEVICE = device;
	fprintf(stderr, "device %d\n", device);
	/* 16 pages of fabric, 48 of dram, 256 of ssd for 192 */
	if (!kvti_dev_is_emu(device)) {
		snprintf(spec, sizeof(spec), "fabric:memfd,1M,pin dram:3M,pin "
			 "ssd:%s/ssd,16M,temp", dir);
		run(spec, ENG_KV_OUTER, 1, 0);
	}
	snprintf(spec, sizeof(spec), "fabric:memfd,1M dram:3M "
		 "ssd:%s/ssd,16M,temp", dir);
	run(spec, ENG_KV_OUTER, 1, 0);
	run(spec, ENG_BLOCK_OUTER, 1, 0);
	run(spec, ENG_KV_OUTER, 1, KVT_XFER_CUDA_BATCH);
	ssd_only(dir);
}

int main(void)
{
	kvti_dev *d;
	const char *dir;

	dir = test_dir("cache_dev");
	small_geom(&geom, L, P); /* 64 KiB pages */
	run_device(dir, KVT_DEVICE_EMU);
	for (int g = 0; g < 16 && !kvti_dev_get(g, &d); g++) {
		fprintf(stderr, "GPU: %s\n", d->name);
		kvti_dev_put(d);
		run_device(dir, g);
	}
	TEST_DONE();
}
