/*
 * bytes.c — the demo engine's KV memory, and what every page holds.
 *
 * The engine owns its KV memory the way vLLM does: per layer one buffer
 * [2][nblocks][P][H][D] (K/V outer). A page's bytes are a function of its
 * chained key, so identical prefixes hold identical bytes and any restored
 * block can be checked by the engine without keeping anything:
 *
 *   chunk (block, layer, kv) = a 32-word splitmix64 pattern seeded by
 *   mix(page seed, layer, kv), repeated to the chunk's end
 *
 * distinct for every (prefix, layer, kv). The engine checks 16 words (the
 * first and last four, eight more at positions the seed picks) of the K and
 * V chunks of three layers of every restored block; the cache's per-layer
 * XXH3 covers every byte it moves. So the emulated GPU writes those 16 words of each chunk it
 * computes, of the three layers the engine checks (the first, the middle,
 * the last), and leaves the rest as the block held it: a real GPU's writes
 * cost the CPU nothing, and writing 512 KiB per page on the host's two
 * cores would charge every computed token a CPU cost no engine pays (on
 * this machine about the modeled compute time itself), penalising the
 * policies that compute more. A block restored from the wrong page, layer
 * or K/V, or cut short, still fails the check; a copy that changed any
 * byte fails the cache's sums.
 */
#include "demo/demo_impl.h"

#include <errno.h>
#include <string.h>

#define GAMMA 0x9e3779b97f4a7c15ull
#define PATTERN_WORDS 32u /* a chunk's words repeat with this period */

static inline uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t chunk_seed(uint64_t page_seed, uint32_t layer, uint32_t kv)
{
	return mix64(page_seed ^ ((2ull * layer + kv + 1) * GAMMA));
}

static inline uint64_t chunk_word(uint64_t seed, uint64_t i)
{
	return mix64(seed + (i % PATTERN_WORDS + 1) * GAMMA);
}

/* The j-th of a chunk's 16 checked words (j < 16): the first and last
 * four, eight others where the seed puts them. */
static inline uint64_t checked_word(uint64_t words, uint64_t seed, uint64_t j)
{
	return j < 4 ? j : j < 8 ? words - 8 + j : mix64(seed ^ j) % words;
}

/* A block from the wrong page, layer or K/V, or a copy cut short, fails. */
static int chunk_bad(const uint64_t *p, uint64_t words, uint64_t seed)
{
	for (uint64_t j = 0; j < 16; j++) {
		uint64_t i = checked_word(words, seed, j);

		if (i < words && p[i] != chunk_word(seed, i))
			return 1;
	}
	return 0;
}

static void chunk_mark(uint64_t *p, uint64_t words, uint64_t seed)
{
	for (uint64_t j = 0; j < 16; j++) {
		uint64_t i = checked_word(words, seed, j);

		if (i < words)
			p[i] = chunk_word(seed, i);
	}
}

static uint64_t *chunk_at(const struct dmem *m, uint32_t block, uint32_t layer,
			  uint32_t kv)
{
	return (uint64_t *)((char *)m->base[layer] +
			    ((uint64_t)kv * m->nblocks + block) * m->chunk);
}

int kvti_dmem_open(struct dmem *m, const kvt_geom *g, uint64_t nblocks,
		   void *const *shared)
{
	memset(m, 0, sizeof(*m));
	m->layers = g->layers;
	m->kv = kvt_geom_kv(g);
	m->chunk = kvt_geom_chunk_bytes(g);
	m->nblocks = nblocks;
	m->base = kvt_calloc(m->layers, sizeof(*m->base));
	if (!m->base)
		return -ENOMEM;
	m->shared = shared != NULL;
	for (uint32_t l = 0; l < m->layers; l++) {
		size_t n = (size_t)(m->kv * m->nblocks * m->chunk);

		if (shared)
			m->base[l] = shared[l];
		else if (!(m->base[l] = kvti_aligned_alloc(4096, n)))
			return -ENOMEM;
		memset(m->base[l], 0, n); /* fault it in now, not in a request */
	}
	return 0;
}

void kvti_dmem_close(struct dmem *m)
{
	for (uint32_t l = 0; m->base && !m->shared && l < m->layers; l++)
		kvt_free(m->base[l]);
	kvt_free(m->base);
	memset(m, 0, sizeof(*m));
}

void kvti_dmem_write_layer(const struct dmem *m, uint32_t block, uint32_t l,
			   uint64_t seed)
{
	if (l != 0 && l != m->layers / 2 && l != m->layers - 1)
		return; /* kvti_dmem_check() reads these three layers alone */
	for (uint32_t kv = 0; kv < m->kv; kv++)
		chunk_mark(chunk_at(m, block, l, kv), m->chunk / 8,
			   chunk_seed(seed, l, kv));
}


void kvti_dmem_spoil(const struct dmem *m, uint32_t block)
{
	uint64_t *p = chunk_at(m, block, 0, 0);

	for (uint64_t i = 0; i < m->chunk / 8; i++)
		p[i] = ~p[i];
}

/* The first, the middle and the last layer, K and V: a block of the wrong
 * page or a copy cut short shows in any of them; the cache's sums cover
 * every layer's every byte. (Every chunk cost the engine thread, which runs
 * the step loop, 6% of the demo's CPU at 32 sessions.) */
int kvti_dmem_check(const struct dmem *m, uint32_t block, uint64_t seed)
{
	uint32_t ls[3] = { 0, m->layers / 2, m->layers - 1 };

	for (uint32_t i = 0; i < 3; i++)
		for (uint32_t kv = 0, l = ls[i]; kv < m->kv; kv++)
			if (chunk_bad(chunk_at(m, block, l, kv), m->chunk / 8,
				      chunk_seed(seed, l, kv)))
				return 1;
	return 0;
}
