/*
 * cache_util.h — helpers shared by the node cache tests: an engine's own KV
 * memory (host memory from malloc, or cudaMalloc'ed on a GPU) in two stride
 * sets, page images that depend only on a page's key, and the checks that
 * a load left exactly those bytes in the blocks and nothing else touched.
 *
 *   engine memory, per layer l (one allocation each):
 *
 *   kv-outer (vLLM flash-attn)       block-outer (FlashInfer)
 *   +-- K: blk0 pad blk1 pad ... --+  +-- blk0: K pad V pad | blk1: ... --+
 *   +-- pad                        |  |                                   |
 *   +-- V: blk0 pad blk1 pad ... --+  +-----------------------------------+
 *
 * The pads hold a canary byte: a copy that writes outside the chunks shows.
 * The page image is in page-first order ([layer][kv][P][H][D]), the order
 * the cache's checksums are defined over.
 */
#ifndef KVT_TEST_CACHE_UTIL_H
#define KVT_TEST_CACHE_UTIL_H

#include "harness.h"
#include "core/cuda.h"
#include "dev/dev.h"

#include <signal.h>
#include <unistd.h>
#include <xxhash.h>

#define ENG_MAXL 64
#define ENG_CANARY 0xA5
#define ENG_POISON 0xEE

enum { ENG_KV_OUTER = 0, ENG_BLOCK_OUTER = 1 };

typedef struct eng {
	kvt_geom g;
	uint32_t L, kv;
	uint64_t chunk, page;
	uint64_t nblocks;
	int outer;      /* ENG_KV_OUTER or ENG_BLOCK_OUTER */
	int device;     /* -1 host, else a device id (a GPU, emu:N) */
	struct kvti_dev *dev; /* device memory: its device */
	uint64_t bs, ks, ts, len;
	unsigned char *mem[ENG_MAXL];
	void *base[ENG_MAXL];
} eng;

/* A small model: @layers layers, 2 KV heads of 64, bf16, P tokens a page:
 * chunk = P * 256 bytes. */
static inline void small_geom(kvt_geom *g, uint32_t layers, uint32_t P)
{
	char json[256];

	snprintf(json, sizeof(json), "{\"num_hidden_layers\":%u,"
		 "\"num_attention_heads\":2,\"hidden_size\":128,"
		 "\"num_key_value_heads\":2,\"torch_dtype\":\"bfloat16\"}",
		 layers);
	CHECK_OK(kvt_geom_from_json(g, json, "small", P, 1, 0));
}

static inline unsigned char *eng_chunk(const eng *e, uint32_t l, uint64_t b,
				       uint32_t k)
{
	return e->mem[l] + b * e->bs + (uint64_t)k * e->ks;
}

/* Copy @n bytes into / out of engine memory (host or device). */
static inline int eng_h2e(const eng *e, void *dst, const void *src, size_t n)
{
	if (e->device < 0) {
		memcpy(dst, src, n);
		return 0;
	}
	return kvti_dev_copy_sync(e->dev, dst, src, n);
}

static inline int eng_e2h(const eng *e, void *dst, const void *src, size_t n)
{
	if (e->device < 0) {
		memcpy(dst, src, n);
		return 0;
	}
	return kvti_dev_copy_sync(e->dev, dst, src, n);
}

/* Allocate @nblocks blocks of engine memory with @pad bytes between
 * chunks; fill everything with the canary. 0 or an error. */
static inline int eng_init(eng *e, const kvt_geom *g, uint64_t nblocks,
			   int outer, uint64_t pad, int device)
{
	memset(e, 0, sizeof(*e));
	e->g = *g;
	e->L = g->layers;
	e->kv = kvt_geom_kv(g);
	e->chunk = kvt_geom_chunk_bytes(g);
	e->page = kvt_geom_page_bytes(g);
	e->nblocks = nblocks;
	e->outer = outer;
	e->device = device;
	e->ts = (uint64_t)g->kv_heads * g->head_dim * g->dtype_bytes;
	if (outer == ENG_KV_OUTER) {
		e->bs = e->chunk + pad;
		e->ks = nblocks * e->bs + pad;
		e->len = e->kv * e->ks;
	} else {
		e->ks = e->chunk + pad;
		e->bs = e->kv * e->ks + pad;
		e->len = nblocks * e->bs;
	}
	if (e->L > ENG_MAXL)
		return -E2BIG;
	if (device >= 0) {
		int err = kvti_dev_get(device, &e->dev);

		if (err)
			return err;
	}
	for (uint32_t l = 0; l < e->L; l++) {
		unsigned char *fill;
		int err = 0;

		if (device < 0) {
			e->mem[l] = malloc(e->len);
			if (!e->mem[l])
				return -ENOMEM;
			memset(e->mem[l], ENG_CANARY, e->len);
		} else {
			void *p = NULL;
			if ((err = e->dev->ops->alloc(e->dev, e->len, &p)))
				return err;
			e->mem[l] = p;
			fill = malloc(e->len);
			if (!fill)
				return -ENOMEM;
			memset(fill, ENG_CANARY, e->len);
			err = kvti_dev_copy_sync(e->dev, p, fill, e->len);
			free(fill);
			if (err)
				return err;
		}
		e->base[l] = e->mem[l];
	}
	return 0;
}

static inline void eng_free(eng *e)
{
	for (uint32_t l = 0; l < e->L; l++) {
		if (e->device < 0)
			free(e->mem[l]);
		else if (e->mem[l])
			e->dev->ops->free(e->dev, e->mem[l]);
		e->mem[l] = NULL;
	}
	kvti_dev_put(e->dev);
	e->dev = NULL;
}

static inline int eng_register(kvt_cache *c, const eng *e)
{
	return kvt_cache_register(c, e->base, e->L, e->nblocks, e->bs, e->ks,
				  e->ts, e->device);
}

/* The page-first image of the page named @key: bytes from the key alone,
 * the same in every test and thread. */
static inline void page_img(const eng *e, kvt_page_key key, unsigned char *out)
{
	uint64_t s = key.lo ^ (key.hi * 0x9e3779b97f4a7c15ull) ^ 0x5bd1e995ull;

	if (!s)
		s = 1;
	for (uint64_t i = 0; i < e->page; i += 8) {
		uint64_t v = test_rand(&s);
		memcpy(out + i, &v, 8);
	}
}

/* Write a page image into block @b / read block @b as a page image. */
static inline void eng_put(const eng *e, uint64_t b, const unsigned char *img)
{
	for (uint32_t l = 0; l < e->L; l++)
		for (uint32_t k = 0; k < e->kv; k++)
			CHECK_OK(eng_h2e(e, eng_chunk(e, l, b, k),
					 img + ((uint64_t)l * e->kv + k) * e->chunk,
					 e->chunk));
}

static inline void eng_get(const eng *e, uint64_t b, unsigned char *img)
{
	for (uint32_t l = 0; l < e->L; l++)
		for (uint32_t k = 0; k < e->kv; k++)
			CHECK_OK(eng_e2h(e, img + ((uint64_t)l * e->kv + k) * e->chunk,
					 eng_chunk(e, l, b, k), e->chunk));
}

/* Fill block @b's chunks with the poison byte (what a load must replace). */
static inline void eng_poison(const eng *e, uint64_t b)
{
	unsigned char *p = malloc(e->page);

	memset(p, ENG_POISON, e->page);
	eng_put(e, b, p);
	free(p);
}

/* 1 if layer @l of block @b holds layer @l of @img. */
static inline int eng_layer_is(const eng *e, uint64_t b, uint32_t l,
			       const unsigned char *img)
{
	unsigned char *p = malloc(e->chunk);
	int same = 1;

	for (uint32_t k = 0; k < e->kv && same; k++) {
		CHECK_OK(eng_e2h(e, p, eng_chunk(e, l, b, k), e->chunk));
		same = !memcmp(p, img + ((uint64_t)l * e->kv + k) * e->chunk,
			       e->chunk);
	}
	free(p);
	return same;
}

/* 1 if block @b holds the page named @key, every layer. */
static inline int eng_block_is(const eng *e, uint64_t b, kvt_page_key key)
{
	unsigned char *want = malloc(e->page), *got = malloc(e->page);
	int same;

	page_img(e, key, want);
	eng_get(e, b, got);
	same = !memcmp(want, got, e->page);
	free(want);
	free(got);
	return same;
}

/* 1 if every byte of block @b is the poison byte (nothing was written). */
static inline int eng_block_poisoned(const eng *e, uint64_t b)
{
	unsigned char *got = malloc(e->page);
	int ok = 1;

	eng_get(e, b, got);
	for (uint64_t i = 0; i < e->page && ok; i++)
		ok = got[i] == ENG_POISON;
	free(got);
	return ok;
}

/* Store page images for keys[first..n) into blocks[0..n-first). */
static inline void eng_fill(const eng *e, const kvt_page_key *keys, size_t n,
			    size_t first, const uint32_t *blocks)
{
	unsigned char *img = malloc(e->page);

	for (size_t i = first; i < n; i++) {
		page_img(e, keys[i], img);
		eng_put(e, blocks[i - first], img);
	}
	free(img);
}

/* Every pad byte still holds the canary (GPU memory: read back first). */
static inline int eng_gaps_intact(const eng *e)
{
	unsigned char *host = e->device >= 0 ? malloc(e->len) : NULL;
	int ok = 1;

	for (uint32_t l = 0; l < e->L && ok; l++) {
		const unsigned char *m = e->mem[l];

		if (host) {
			CHECK_OK(kvti_dev_copy_sync(e->dev, host, e->mem[l],
						    e->len));
			m = host;
		}
		for (uint64_t off = 0; off < e->len && ok; off++) {
			uint64_t k, b, in;
			int chunk_byte = 0;

			if (e->outer == ENG_KV_OUTER) {
				k = off / e->ks;
				in = off % e->ks;
				b = in / e->bs;
				chunk_byte = k < e->kv && b < e->nblocks &&
					     in % e->bs < e->chunk;
			} else {
				b = off / e->bs;
				in = off % e->bs;
				k = in / e->ks;
				chunk_byte = k < e->kv && in % e->ks < e->chunk;
			}
			if (!chunk_byte && m[off] != ENG_CANARY) {
				fprintf(stderr, "engine layer %u byte %llu "
					"outside every chunk was written\n", l,
					(unsigned long long)off);
				ok = 0;
			}
		}
	}
	free(host);
	return ok;
}

/* Tokens of session @s (deterministic), @n of them. */
static inline void session_tokens(uint32_t s, uint32_t *t, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		uint64_t k[2] = { s, i };
		t[i] = (uint32_t)XXH3_64bits(k, sizeof(k));
	}
}

/* The keys of @npages pages of session @s for @tenant. */
static inline int session_keys(kvt_cache *c, uint32_t tenant, uint32_t s,
			       size_t npages, kvt_page_key *keys)
{
	uint32_t P = kvt_cache_geom(c)->page_tokens;
	uint32_t *t = malloc(npages * P * sizeof(*t) + 1);
	int err;

	session_tokens(s, t, npages * P);
	err = kvt_cache_hash_tokens(c, tenant, t, npages * P, keys);
	free(t);
	return err;
}

/* Run a job to its end: its result; @failed (optional, room for @max)
 * gets the failed blocks, *@nfailed how many. Frees the job. */
static inline int job_finish(kvt_cache_job *j, uint32_t *failed, size_t max,
			     long *nfailed)
{
	int err = kvt_cache_job_wait(j, -1);
	long n = kvt_cache_job_failed(j, failed, failed ? max : 0);

	if (nfailed)
		*nfailed = n;
	kvt_cache_job_free(j);
	return err;
}

/* store / load and wait: the job's result (or the call's error). */
static inline int cache_store_wait(kvt_cache *c, uint32_t tenant,
				   const kvt_page_key *keys, size_t n,
				   size_t first, const uint32_t *blocks,
				   kvt_cache_job_stat *st)
{
	kvt_cache_job *j;
	int err = kvt_cache_store(c, tenant, keys, n, first, blocks, &j);

	if (err)
		return err;
	err = kvt_cache_job_wait(j, -1);
	if (st)
		kvt_cache_job_stat_get(j, st);
	kvt_cache_job_free(j);
	return err;
}

static inline int cache_load_wait(kvt_cache *c, uint32_t tenant,
				  const kvt_page_key *keys, size_t n,
				  size_t first, const uint32_t *blocks,
				  uint32_t *failed, long *nfailed,
				  kvt_cache_job_stat *st)
{
	kvt_cache_job *j;
	int err = kvt_cache_load(c, tenant, keys, n, first, blocks, &j);

	if (err)
		return err;
	err = kvt_cache_job_wait(j, -1);
	if (st)
		kvt_cache_job_stat_get(j, st);
	if (nfailed)
		*nfailed = kvt_cache_job_failed(j, failed,
						failed ? n - first : 0);
	kvt_cache_job_free(j);
	return err;
}

/* "  <what>: fabric F dram D ssd S pages" */
static inline void tier_counts_print(const char *what, const uint64_t *n)
{
	fprintf(stderr, "  %s: fabric %llu dram %llu ssd %llu pages\n", what,
		(unsigned long long)n[KVT_TIER_FABRIC],
		(unsigned long long)n[KVT_TIER_DRAM],
		(unsigned long long)n[KVT_TIER_SSD]);
}

/* Used slots of every owned tier, summed. */
static inline uint64_t cache_used(kvt_cache *c)
{
	uint64_t n = 0;

	for (int k = 0; k < KVT_TIER_COUNT; k++) {
		kvt_tier *t = kvt_cache_tier(c, (kvt_tier_kind)k);
		if (t && k != KVT_TIER_HBM)
			n += kvt_pool_used(kvt_tier_pool(t));
	}
	return n;
}

/* A hang is a failure: exit 1 after @seconds, naming the last phase. */
static const char *volatile test_phase = "start";

static void test_watchdog_fire(int sig)
{
	static const char msg[] = "watchdog: the test hung in phase ";
	(void)sig;
	if (write(2, msg, sizeof(msg) - 1) < 0 ||
	    write(2, test_phase, strlen(test_phase)) < 0 || write(2, "\n", 1) < 0)
		_exit(1);
	_exit(1);
}

static inline void test_watchdog(unsigned seconds)
{
	signal(SIGALRM, test_watchdog_fire);
	alarm(seconds);
}

#endif
